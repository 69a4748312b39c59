"""pytest-benchmark view of benchmarks/profiling_off.py (issue 17: profiling off costs nothing
measurable): per build of one small pipeline (plain, -profile, -trace_all with HL_TRACE_FILE on
both sides), each round is one sample of the shim's calls, and before it, untimed (pedantic's
setup), one sample of the stock runtime's: the runtimes take turns. The rounds' times
hold one pipe round trip to the shim's child; the figures that count are the children's own,
in extra_info: per call, min and median over the rounds for each runtime, and the ratios shim /
stock ("ratio min", "ratio median"). Nothing here asserts about time: the tests check that both runtimes compute what
numpy computes, write the same trace events and, for the -profile build, leave Halide's
profiler report at exit in a file. Not part of CI (pytest's testpaths are tests/).

    python -m pytest benchmarks/test_profiling_off.py --benchmark-enable --benchmark-json=out.json

(without --benchmark-enable, the project's default, each case takes one sample per runtime.)
For the table, run the script itself: python benchmarks/profiling_off.py.
"""

import statistics

import pytest

import profiling_off

# Rounds per build: a round of the plain and -profile builds takes about 1 ms per runtime, one
# of the trace build about 30 ms per runtime.
ROUNDS = {"plain": 41, "profile": 41, "trace": 15}


def _bench():
    try:
        return profiling_off.Bench()
    except profiling_off.MissingLibrary as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def bench():
    bench = _bench()
    yield bench
    bench.cleanup()


def test_both_runtimes_compute_the_same_and_write_the_same_trace(bench):
    checks = bench.check()
    assert all(answer["correct"] for sides in checks.values() for answer in sides.values()), checks
    trace = checks["trace"]
    assert trace["stock"]["trace packets"] == trace["shim"]["trace packets"] > 100_000, trace
    assert trace["stock"]["trace bytes"] == trace["shim"]["trace bytes"], trace
    for case in ("plain", "profile"):
        assert all(answer["trace packets"] == 0 for answer in checks[case].values()), checks


def test_halides_profiler_report_at_exit_goes_to_a_file_on_both_sides():
    bench = _bench()
    try:
        bench.check()
        bench.close()
        reports = bench.profiler_reports()
    finally:
        bench.cleanup()
    for which, text in reports.items():
        assert profiling_off.pipeline_name("profile") in text, (which, text)
        assert profiling_off.pipeline_name("plain") not in text, (which, text)


@pytest.mark.parametrize("case", list(profiling_off.CASES))
def test_profiling_off(benchmark, bench, case):
    calls = profiling_off.CASES[case].calls
    shim = bench.sides["shim"]
    others = {"stock": bench.sides["stock"]}
    samples = {name: [] for name in ("shim", *others)}
    for runner in (shim, *others.values()):
        runner.seconds(case, calls)  # warm up

    def other_samples():
        for name, runner in others.items():
            samples[name].append(runner.seconds(case, calls) / calls)

    def shim_sample():
        seconds = shim.seconds(case, calls)
        samples["shim"].append(seconds / calls)
        return seconds

    benchmark.pedantic(shim_sample, setup=other_samples, rounds=ROUNDS[case], iterations=1)
    assert all(len(v) == len(samples["shim"]) > 0 for v in samples.values())
    stats = {name: {"min": min(v), "median": statistics.median(v)} for name, v in samples.items()}
    figures = profiling_off.ratios(stats["stock"], stats["shim"])
    line = (f"{case}: shim/stock min {figures['ratio min']:.3f}x, median {figures['ratio median']:.3f}x "
            f"({figures['shim us min']:.1f} / {figures['stock us min']:.1f} us per call, "
            f"{len(samples['shim'])} samples)")
    benchmark.extra_info.update({key: round(value, 4) for key, value in figures.items()})
    benchmark.extra_info["samples per runtime"] = len(samples["shim"])
    benchmark.extra_info["calls per round"] = calls
    print(line)
