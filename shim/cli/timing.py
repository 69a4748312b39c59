"""Timing pipeline runs for the command line: a fixed number of iterations (``--iterations``),
or RunGen's adaptive benchmark (``--benchmarks=all``, halide_benchmark.h's algorithm), which
reports the best time."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from shim.base.progress import Progress

# halide_benchmark.h's BenchmarkConfig defaults.
DEFAULT_MIN_TIME = 0.1
_MAX_ITERATIONS_PER_SAMPLE = 1_000_000
_ACCURACY = 0.03
_MIN_SAMPLES = 3


@dataclass(frozen=True)
class Timings:
    """Seconds per iteration of a fixed number of runs."""

    seconds: list

    @property
    def best(self) -> float:
        return min(self.seconds)

    def describe(self) -> str:
        ms = [s * 1e3 for s in self.seconds]
        return (f"{len(ms)} iteration{'s' if len(ms) != 1 else ''}: min {min(ms):.3f} ms, "
                f"median {statistics.median(ms):.3f} ms, mean {statistics.fmean(ms):.3f} ms")

    def parsable(self) -> list[tuple[str, object]]:
        return [("BEST_TIME_MSEC_PER_ITER", self.best * 1e3),
                ("MEDIAN_TIME_MSEC_PER_ITER", statistics.median(self.seconds) * 1e3),
                ("MEAN_TIME_MSEC_PER_ITER", statistics.fmean(self.seconds) * 1e3),
                ("ITERATIONS", len(self.seconds))]


def time_iterations(run, iterations: int, progress: Progress) -> Timings:
    """Call ``run`` (a run, and the device finishing its work) ``iterations`` times."""
    samples = []
    for i in range(iterations):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
        progress.update(i + 1)
    progress.finish()
    return Timings(samples)


@dataclass(frozen=True)
class Benchmark:
    """halide_benchmark.h's BenchmarkResult: the best sample's seconds per iteration, how many
    samples and iterations it took, and how far the third best sample was from the best."""

    best: float
    samples: int
    iterations: int
    accuracy: float

    def describe(self) -> str:
        return (f"best case of {self.best:.6g} sec/iter (over {self.samples} samples, "
                f"{self.iterations} iterations, accuracy {self.accuracy * 100:.2g}%)")

    def parsable(self) -> list[tuple[str, object]]:
        return [("BEST_TIME_MSEC_PER_ITER", self.best * 1e3), ("SAMPLES", self.samples),
                ("ITERATIONS", self.iterations), ("TIMING_ACCURACY", self.accuracy)]


def benchmark(run, min_time: float = DEFAULT_MIN_TIME) -> Benchmark:
    """Halide's adaptive benchmark of ``run``, as RunGen runs it (max_time = 4 * min_time):
    grow the iterations per sample until three samples take ``min_time``, then take more
    samples until the best three agree within 3% or ``max_time`` has gone by."""
    min_time, max_time = max(1e-5, min_time), max(min_time, 4 * min_time)
    per_sample = 1
    while True:
        times = sorted(_sample(run, per_sample) for _ in range(_MIN_SAMPLES))
        samples, iterations = _MIN_SAMPLES, _MIN_SAMPLES * per_sample
        total = sum(times) * per_sample
        if times[0] < 1e-9:
            per_sample *= 2
        elif times[0] * _MIN_SAMPLES * per_sample >= min_time:
            break
        else:
            # (Capped here, not only below: a huge min_time over a fast run is beyond any float.)
            per_sample = int(min(max(min_time / (times[0] * _MIN_SAMPLES), per_sample * 2.0),
                                 _MAX_ITERATIONS_PER_SAMPLE) + 0.5)
        if per_sample >= _MAX_ITERATIONS_PER_SAMPLE:
            per_sample = _MAX_ITERATIONS_PER_SAMPLE
            break
    while (times[0] * (1 + _ACCURACY) < times[_MIN_SAMPLES - 1] or total < min_time) \
            and total < max_time:
        sample = _sample(run, per_sample)
        samples, iterations, total = samples + 1, iterations + per_sample, total + sample * per_sample
        times = sorted(times + [sample])[:_MIN_SAMPLES + 1]
    return Benchmark(times[0], samples, iterations, times[_MIN_SAMPLES - 1] / times[0] - 1)


def _sample(run, iterations: int) -> float:
    """Seconds per iteration of ``iterations`` back-to-back runs."""
    start = time.perf_counter()
    for _ in range(iterations):
        run()
    return (time.perf_counter() - start) / iterations
