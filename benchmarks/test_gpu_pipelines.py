"""pytest-benchmark view of benchmarks/gpu_pipelines.py: per runtime, case and sync mode,
each round is ITERATIONS[case] calls of the pipeline on resident data.

    python -m pytest benchmarks/test_gpu_pipelines.py --benchmark-enable --benchmark-group-by=param:case

For the table with ratios, run the script itself.
"""

import sys

import pytest

import gpu_pipelines
from sidebyside import ChildProcess


@pytest.fixture(scope="module")
def runners(opencl):
    child = ChildProcess([sys.executable, gpu_pipelines.__file__, "--serve", "--device", "opencl"])
    ours, profiling = gpu_pipelines.ShimRunner("opencl"), gpu_pipelines.ProfilingRunner("opencl")
    yield {"stock": child, "shim": ours, "shim-profiling": profiling}
    ours.close()
    profiling.close()
    child.close()


@pytest.mark.parametrize("sync_each", [False, True], ids=["sync-at-end", "sync-each-call"])
@pytest.mark.parametrize("case", sorted(gpu_pipelines.CASES))
@pytest.mark.parametrize("runtime", ["stock", "shim", "shim-profiling"])
def test_gpu_pipeline(benchmark, runners, runtime, case, sync_each):
    request = {"case": case, "iterations": gpu_pipelines.ITERATIONS[case], "sync_each": sync_each}
    seconds = benchmark.pedantic(runners[runtime].seconds, kwargs=request, rounds=7, iterations=1,
                                 warmup_rounds=1)
    assert seconds > 0
    benchmark.extra_info["calls per round"] = request["iterations"]
