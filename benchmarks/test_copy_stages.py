"""pytest-benchmark view of benchmarks/copy_stages.py: per schedule and runtime (the shim on
the library built bundled and with no_runtime, Halide's stock runtime in a child process), each
round one call. Nothing here asserts about time: every side's output is numpy's (each runner
checks its own before it serves).

    python -m pytest benchmarks/test_copy_stages.py --benchmark-enable

For the table with ratios, run the script itself.
"""

import pytest

import copy_stages


@pytest.fixture(scope="module")
def runners():
    runners = copy_stages.start(copy_stages.libraries(), 3)
    yield runners
    runners["stock"].close()


@pytest.mark.parametrize("schedule", list(copy_stages.SCHEDULES))
@pytest.mark.parametrize("runtime", ["stock", "shim bundled", "shim no_runtime"])
def test_copy_stages(benchmark, runners, runtime, schedule):
    seconds = benchmark.pedantic(runners[runtime].seconds, kwargs={"schedule": schedule},
                                 rounds=5, iterations=1, warmup_rounds=1)
    assert seconds > 0
