"""pytest-benchmark view of benchmarks/crop_offsets.py: one benchmark per backend and case (a
crop of a parent on the device at an offset, the whole-buffer call it is compared with, or that
call with the copies a staged crop needs), each round a loop of a few calls; few rounds. Nothing
here asserts about time: the tests check that every case computes what numpy computes, and on
OpenCL that each crop's launches are staged only where the kernel casts the buffer to a vector
pointer.

    python -m pytest benchmarks/test_crop_offsets.py --benchmark-enable --benchmark-group-by=param:key

For the table with ratios against the issue's target, run the script itself.
"""

import pytest

import crop_offsets

CASES = [(backend, case.key) for backend in crop_offsets.BACKENDS
         for case in crop_offsets.cases_of(backend)]


@pytest.fixture(scope="module")
def bench(request):
    """The Bench of the backend the test names (indirectly), made once per module."""
    import shim

    try:
        bench = crop_offsets.Bench(request.param)
    except shim.DeviceUnavailable as e:
        pytest.skip(f"no {request.param} device: {e}")
    yield bench
    bench.close()


@pytest.mark.parametrize("bench", crop_offsets.BACKENDS, indirect=True)
def test_outputs_match_numpy_and_only_what_must_stage_stages(bench):
    assert bench.check() == []


@pytest.mark.parametrize("bench, key", CASES, indirect=["bench"])
def test_crop_offsets(benchmark, bench, key):
    iterations = max(1, crop_offsets.ITERATIONS[bench.backend][key.split(".")[1]] // 10)
    seconds = benchmark.pedantic(bench.seconds, kwargs={"key": key, "iterations": iterations},
                                 rounds=3, iterations=1, warmup_rounds=1)
    assert seconds > 0
    benchmark.extra_info["calls per round"] = iterations
