"""pytest-benchmark view of benchmarks/noop_copies.py: one benchmark per runtime, operation
and thread count, each round timing ITERATIONS no-op calls per thread from C.

    python -m pytest benchmarks/test_noop_copies.py --benchmark-enable --benchmark-group-by=param:operation

The stock runtime runs in a child process without the shim (its rounds include one pipe
round trip, about 0.1 ms against the tens of ms a round takes). For a table with ratios, run
the script itself.
"""

import pytest

import noop_copies

ITERATIONS = 2_000_000


@pytest.fixture(scope="module")
def loops():
    child = noop_copies.stock_process()
    loop = noop_copies.shim_loop()
    yield {"stock": child, "shim": loop, "shim-profiling": noop_copies.ProfiledLoop(loop)}
    child.close()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("operation", noop_copies.OPERATIONS)
@pytest.mark.parametrize("runtime", ["stock", "shim", "shim-profiling"])
def test_noop_copy(benchmark, loops, runtime, operation, threads):
    loop = loops[runtime]
    seconds = benchmark.pedantic(loop.seconds, kwargs={"operation": operation, "threads": threads,
                                                       "iterations": ITERATIONS},
                                 rounds=9, iterations=1, warmup_rounds=1)
    assert seconds > 0
    benchmark.extra_info["calls per round"] = threads * ITERATIONS
