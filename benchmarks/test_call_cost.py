"""pytest-benchmark view of benchmarks/call_cost.py: one benchmark per measurement (the shim's
calls, Halide's bindings, the stock runtime in its child process), each round a loop of a few
calls; few rounds, so that CI runs it in seconds. Nothing here asserts about time: the tests
check that every measured call computes what numpy computes, and that the stock runtime runs on
the shim's OpenCL platform and device.

    python -m pytest benchmarks/test_call_cost.py --benchmark-enable --benchmark-group-by=param:key

For the table with ratios against the issue's targets, run the script itself.
"""

import pytest

import call_cost

KEYS = list(dict.fromkeys(key for row in call_cost.ROWS for key in (row.shim, row.reference)
                          if not key.startswith("first.")))


@pytest.fixture(scope="module")
def bench():
    bench = call_cost.Bench()
    yield bench
    bench.close()


def test_outputs_match_numpy(bench):
    assert bench.check() == []


def test_stock_runs_on_the_shims_opencl_device(bench):
    if bench.opencl_skipped:
        pytest.skip(bench.opencl_skipped)
    assert call_cost.same_device(bench.identities["shim"], bench.identities["stock"]), bench.identities


@pytest.mark.parametrize("key", KEYS)
def test_call_cost(benchmark, bench, key):
    if key not in bench.loops:
        pytest.skip(bench.opencl_skipped or f"{key} not measured here")
    iterations = max(1, call_cost.iterations_of(key) // 10)
    seconds = benchmark.pedantic(bench.seconds, kwargs={"key": key, "iterations": iterations},
                                 rounds=3, iterations=1, warmup_rounds=1)
    assert seconds > 0
    benchmark.extra_info["calls per round"] = iterations


def test_first_call_in_a_fresh_process(opencl):
    """One fresh process per side after one that builds: both compute the right output on the
    same device (the times are for the script to compare)."""
    platform = call_cost.opencl_identity(opencl.context.int_ptr).get("platform")
    first = call_cost.first_calls(1, platform)
    assert first["correct"]
    assert call_cost.same_device(first["identities"]["shim"], first["identities"]["stock"])
