"""pytest-benchmark view of benchmarks/crop_offsets.py: one benchmark per case (a crop of a
parent on the device at an offset, or the whole-buffer call it is compared with), each round a
loop of a few calls; few rounds. Nothing here asserts about time: the tests check that every
case computes what numpy computes, and that each crop's launches are staged only where the
kernel casts the buffer to a vector pointer.

    python -m pytest benchmarks/test_crop_offsets.py --benchmark-enable --benchmark-group-by=param:key

For the table with ratios against the issue's target, run the script itself.
"""

import pytest

import crop_offsets


@pytest.fixture(scope="module")
def bench(opencl):
    bench = crop_offsets.Bench()
    yield bench
    bench.close()


def test_outputs_match_numpy_and_only_vector_casts_stage(bench):
    assert bench.check() == []


@pytest.mark.parametrize("key", [case.key for case in crop_offsets.CASES])
def test_crop_offsets(benchmark, bench, key):
    iterations = max(1, crop_offsets.ITERATIONS[key.split(".")[1]] // 10)
    seconds = benchmark.pedantic(bench.seconds, kwargs={"key": key, "iterations": iterations},
                                 rounds=3, iterations=1, warmup_rounds=1)
    assert seconds > 0
    benchmark.extra_info["calls per round"] = iterations
