"""pytest-benchmark view of benchmarks/pool_overhead.py: per case and runtime (the shim's pool,
Halide's in its stock runtime in a child process), each round a loop of calls. Nothing here
asserts about time: both sides compute numpy's outputs (the stock child checks its own before
it serves).

    python -m pytest benchmarks/test_pool_overhead.py --benchmark-enable

For the table with ratios, run the script itself.
"""

import os

import pytest

import pool_overhead

CALLS = 20


@pytest.fixture(scope="module")
def runners():
    runners = pool_overhead.start(pool_overhead.libraries(), os.cpu_count())
    yield runners
    runners["stock"].close()


def test_the_shims_outputs_are_numpys(runners):
    assert pool_overhead.wrong_outputs(runners["shim"].runners) == []


@pytest.mark.parametrize("case", list(pool_overhead.CASES))
@pytest.mark.parametrize("runtime", ["stock", "shim"])
def test_pool_overhead(benchmark, runners, runtime, case):
    seconds = benchmark.pedantic(runners[runtime].seconds, kwargs={"case": case, "calls": CALLS},
                                 rounds=5, iterations=1, warmup_rounds=1)
    assert seconds > 0
    benchmark.extra_info["calls per round"] = CALLS
