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
def folders():
    return copy_stages.libraries()


@pytest.fixture(scope="module")
def runners(folders):
    runners = copy_stages.start(folders, 3)
    yield runners
    runners["stock"].close()


@pytest.mark.parametrize("schedule", list(copy_stages.SCHEDULES))
@pytest.mark.parametrize("runtime", ["stock", "shim bundled", "shim no_runtime"])
def test_copy_stages(benchmark, folders, runners, runtime, schedule):
    if schedule not in folders:
        pytest.skip("the GPU producer needs an OpenCL device, and this machine has none")
    seconds = benchmark.pedantic(runners[runtime].seconds, kwargs={"schedule": schedule},
                                 rounds=5, iterations=1, warmup_rounds=1)
    assert seconds > 0
