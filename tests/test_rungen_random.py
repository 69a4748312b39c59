"""``random:SEED:EXTENTS`` gives RunGen's data bit for bit (issue 27): RunGen fills such an
input from a std::mt19937 seeded with SEED, one draw per element (two for 64-bit types) from
a distribution per element type (tools/RunGen.h, FillWithRandom). The reference is a small
C++ program doing exactly that with this machine's C++ library (tests/support/rungen_random.cpp),
compiled here; the shim's values come from numpy. Then end to end through ``python -m shim
run``: a float32 input, scaled by 1, comes out as the reference's values."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shim.cli.run_values import make_input, parse_input
from shim.calls.metadata import Argument, ArgumentKind
from shim.base.types import HalideType

REFERENCE = Path(__file__).parent / "support" / "rungen_random.cpp"
TYPES = ["float32", "float64", "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32",
         "int64", "uint64"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler for RunGen's reference generator")
    program = tmp_path_factory.mktemp("rungen") / "rungen_random"
    subprocess.run([compiler, "-O2", "-std=c++17", str(REFERENCE), "-o", str(program)],
                   check=True, capture_output=True)

    def values(type_name: str, seed: int, count: int) -> bytes:
        return subprocess.run([str(program), type_name, str(seed), str(count)], check=True,
                              capture_output=True).stdout
    return values


def _argument(type_name: str, dimensions: int) -> Argument:
    dtype = np.dtype(np.bool_ if type_name == "bool" else type_name)
    return Argument("input", ArgumentKind.INPUT_BUFFER, dimensions, HalideType.from_dtype(dtype))


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("seed", [0, 1, 4711, 2**31 - 1, -1, -2**31])
def test_random_inputs_are_runGens_values(reference, type_name, seed):
    arg = _argument(type_name, 3)
    spec = parse_input(arg, f"random:{seed}:[37,11,3]")
    box = ((0, 37), (0, 11), (0, 3))
    made = make_input(arg, spec, box, "host")
    assert made.shape == (3, 11, 37) and made.flags.c_contiguous
    assert made.tobytes() == reference(type_name, seed, 37 * 11 * 3)


def test_the_cli_runs_a_pipeline_on_runGens_random_data(reference, host_pipelines, tmp_path):
    out = tmp_path / "out.npy"
    done = subprocess.run([sys.executable, "-m", "shim", "run",
                           str(host_pipelines["brighten", "no_runtime"]), "input=random:42:[64,48]",
                           "scale=1", "offset=0", f"output={out}"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    expected = np.frombuffer(reference("float32", 42, 64 * 48), np.float32).reshape(48, 64)
    np.testing.assert_array_equal(np.load(out), expected)
