#!/usr/bin/env bash
# The CUDA checks, for a machine with an NVIDIA GPU: the CUDA test suite, the conformance
# table on the CUDA backend, and the GPU pipeline benchmark against Halide's stock runtime.
# About two minutes; every step prints as it goes.
#
#   pip install -e ".[test,cuda]"      # once, where the machine has network access
#   bash benchmarks/cuda_check.sh [OUT_DIR]
#
# OUT_DIR (default: build/cuda-check) receives the logs.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-build/cuda-check}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1

step() { echo; echo "== $*"; }

step "devices"
nvidia-smi -L 2>&1 | tee "$out/devices.txt"
python -c "import shim; print(shim.devices())" 2>&1 | tee -a "$out/devices.txt"

step "build the sample pipelines for CUDA"
python -m pipelines.build --target cuda 2>&1 | tee "$out/build.txt"

step "CUDA tests"
python -m pytest -q -rs tests/test_cuda.py "tests/test_device_conformance.py::test_shim_matches_the_table[cuda]" 2>&1 | tee "$out/tests.txt"
status=${PIPESTATUS[0]}

step "benchmark: GPU pipelines, shim vs stock runtime"
python benchmarks/gpu_pipelines.py --device cuda --repeats 7 2>&1 | tee "$out/benchmark.txt"

exit "$status"
