"""pytest-benchmark view of benchmarks/concurrent_callers.py: per runtime and thread count,
each round is CALLS calls per thread of a CPU-bound pipeline on a shared device-resident input.

    python -m pytest benchmarks/test_concurrent_callers.py --benchmark-enable

For the table with ratios and scaling, run the script itself.
"""

import sys

import pytest

import concurrent_callers
from sidebyside import ChildProcess


CALLS = 40


@pytest.fixture(scope="module")
def runners(opencl):
    child = ChildProcess([sys.executable, concurrent_callers.__file__, "--serve"])
    yield {"stock": child, "shim": concurrent_callers.ShimRunner()}
    child.close()


@pytest.mark.parametrize("threads", concurrent_callers.THREADS)
@pytest.mark.parametrize("runtime", ["stock", "shim"])
def test_concurrent_callers(benchmark, runners, runtime, threads):
    seconds = benchmark.pedantic(runners[runtime].seconds, kwargs={"threads": threads, "calls": CALLS},
                                 rounds=7, iterations=1, warmup_rounds=1)
    assert seconds > 0
    benchmark.extra_info["calls per round"] = threads * CALLS
