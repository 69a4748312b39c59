"""``python -m shim profile`` (and ``run --profile``) on pipelines built with Halide's profiler
(-profile) or its tracing (-trace_realizations): the summary's Stages and Realizations tables,
the trace file, and what Halide itself prints (its report at exit, its printed trace)."""

import json
import math
import os
import re
import subprocess
import sys

import pytest

from shim.profiling import halide_profiler
from support.summary_tables import table

NAME = "pcli_blur"
# A child process (a build, a command) that hangs fails its test after this long: a hang guard,
# as the suite's other child processes have, never a check of speed.
HANG_GUARD_S = 300
FUNCS = ("blur_x", "blur_y", "out")
STRIP = 32  # rows of out per strip; blur_y is computed per strip
SOURCE = """
import subprocess, sys
import halide as hl
x, y, yo, yi = hl.Var("x"), hl.Var("y"), hl.Var("yo"), hl.Var("yi")
inp = hl.ImageParam(hl.Float(32), 2, "inp")
blur_x, blur_y, out = hl.Func("blur_x"), hl.Func("blur_y"), hl.Func("out")
blur_x[x, y] = (inp[x, y] + inp[x + 1, y] + inp[x + 2, y]) / 3
blur_y[x, y] = (blur_x[x, y] + blur_x[x, y + 1] + blur_x[x, y + 2]) / 3
out[x, y] = hl.sqrt(hl.abs(blur_y[x, y])) + 1
blur_x.compute_root().parallel(y).vectorize(x, 8)
out.split(y, yo, yi, %d).parallel(yo).vectorize(x, 8)
blur_y.compute_at(out, yo).vectorize(x, 8)
obj, lib, features = sys.argv[1:]
out.compile_to({hl.OutputFileType.object: obj}, [inp], "%s", hl.Target("host-" + features))
subprocess.run(["cc", "-shared", "-o", lib, obj, "-lpthread", "-ldl", "-lm"], check=True)
""" % (STRIP, NAME)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{features: path of the .so}: blur_x compute_root (parallel rows), out in strips of STRIP
    rows (parallel), blur_y computed per strip. Compiled in subprocesses, in parallel (halide's
    compiler stays out of this process)."""
    pytest.importorskip("halide", reason="compiling test pipelines needs halide")
    work = tmp_path_factory.mktemp("profile_cli")
    paths, jobs = {}, []
    for features in ("profile", "trace_realizations"):
        paths[features] = work / f"{NAME}-{features}.so"
        jobs.append(subprocess.Popen([sys.executable, "-c", SOURCE, str(work / f"{features}.o"),
                                      str(paths[features]), features]))
    assert all(job.wait(timeout=HANG_GUARD_S) == 0 for job in jobs)
    return paths


def _env(**settings):
    env = dict(os.environ)
    env.pop(halide_profiler.ENV_VAR, None)
    env.pop("HL_TRACE_FILE", None)
    env.update(settings)
    return env


def shim_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "shim", *map(str, args)], capture_output=True,
                          text=True, timeout=HANG_GUARD_S, env=env or _env())


def _sizes(width, height):
    return f"inp=random:0:[{width + 2},{height + 2}]", f"out=:[{width},{height}]"


def test_profile_shows_every_func_of_a_profile_build_with_a_time(built, tmp_path):
    # Halide's profiler samples every millisecond: enough calls of enough work that each
    # Func gets a few dozen samples (about 200 in all)
    width, height, calls = 3072, 2048, 32
    trace = tmp_path / "trace.json"
    done = shim_cli("profile", built["profile"], *_sizes(width, height), "--iterations", calls,
                    "--profile", trace)
    assert done.returncode == 0, done.stderr
    title, rows = table(done.stdout, f"Stages of {NAME} ")
    assert f"(Halide's profiler: {calls} calls, " in title
    funcs = {row["func"]: row for row in rows}
    assert set(FUNCS) <= set(funcs), rows
    for name in FUNCS:  # every Func ran long enough to be sampled: a time and a share
        assert float(funcs[name]["total ms"]) > 0, rows
        assert float(funcs[name]["share"].rstrip("%")) > 0, rows
    # blur_x: one allocation per call (compute_root); blur_y: one per strip; out: none
    assert int(funcs["blur_x"]["allocs"]) == calls
    assert int(funcs["blur_y"]["allocs"]) == calls * math.ceil(height / STRIP)
    assert int(funcs["out"]["allocs"]) == 0
    assert float(funcs["blur_x"]["peak mem"].split()[0]) > 0
    # Halide's report at exit would repeat the table: the command leaves it out
    assert "total time:" not in done.stderr, done.stderr

    events = json.loads(trace.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X" and e["name"] == NAME]
    assert len(slices) == calls  # the timed runs; the warm-up is not in the profile
    for e in slices:
        figures = e["args"]["halide profiler"]
        assert set(FUNCS) <= set(figures["stages"])
        assert figures["stages"]["blur_x"]["memory peak"] == width * (height + 2) * 4
        assert figures["stages"]["blur_x"]["allocs"] == 1
        assert 0 < figures["time ns"] <= e["dur"] * 1000


def test_profile_counts_the_realizations_the_schedule_makes(built, tmp_path):
    width, height, calls = 640, 480, 3
    strips = math.ceil(height / STRIP)
    trace = tmp_path / "trace.json"
    done = shim_cli("profile", built["trace_realizations"], *_sizes(width, height),
                    "--iterations", calls, "--profile", trace)
    assert done.returncode == 0, done.stderr
    title, rows = table(done.stdout, f"Realizations of {NAME} ")
    assert title == f"Realizations of {NAME} (Halide's tracing)"
    funcs = {row["func"]: row for row in rows}
    assert set(funcs) == set(FUNCS), rows
    expected = {"blur_x": calls, "blur_y": calls * strips, "out": calls}
    for name, count in expected.items():
        assert (int(funcs[name]["realizations"]), int(funcs[name]["productions"])) == (count, count)
    assert funcs["blur_x"]["largest box"] == f"[0, {width}) x [0, {height + 2})"
    # (every strip's box is as large: any one of them, as the parallel strips ran)
    strip = re.fullmatch(rf"\[0, {width}\) x \[(\d+), (\d+)\)", funcs["blur_y"]["largest box"])
    assert strip, funcs["blur_y"]["largest box"]
    low, high = int(strip.group(1)), int(strip.group(2))
    assert low % STRIP == 0 and high - low == STRIP and high <= height, (low, high)
    assert funcs["out"]["largest box"] == f"[0, {width}) x [0, {height})"
    assert "Stages of" not in done.stdout  # (not a -profile build)
    # the warm-up ran outside the recorded runs: its trace is not printed either
    assert "Begin realization" not in done.stderr and "Produce" not in done.stderr, done.stderr

    events = json.loads(trace.read_text())["traceEvents"]
    def named(name):
        return [e for e in events if e["ph"] == "X" and e["name"] == name]
    assert len(named(NAME)) == calls
    for name, count in expected.items():
        assert len(named(f"realize {name}")) == count
        assert len(named(f"produce {name}")) == count
    assert {tuple(map(tuple, e["args"]["box"])) for e in named("realize blur_x")} == \
        {((0, width), (0, height + 2))}
    # blur_y's realizations tile the output's rows, once per call
    rows_covered = sorted(tuple(e["args"]["box"][1]) for e in named("realize blur_y"))
    assert rows_covered == sorted([(min(s * STRIP, height - STRIP), STRIP)
                                   for s in range(strips)] * calls)
    # each realization lies in its call's slice, and names that call
    calls_by_id = {e["args"]["call"]: e for e in named(NAME)}
    for e in named("realize blur_y"):
        call = calls_by_id[e["args"]["call"]]
        assert call["ts"] <= e["ts"] and e["ts"] + e["dur"] <= call["ts"] + call["dur"] + 1


def test_run_keeps_what_halide_prints(built, tmp_path):
    """``run`` is RunGen: Halide's report at exit and its printed trace are left as they are."""
    done = shim_cli("run", built["profile"], *_sizes(200, 100), "--iterations", 2)
    assert done.returncode == 0, done.stderr
    assert f"{NAME}\n total time:" in done.stderr and "runs: 3" in done.stderr
    done = shim_cli("run", built["trace_realizations"], *_sizes(200, 100))
    assert done.returncode == 0, done.stderr
    # (on stdout, as RunGen prints what a pipeline prints: one run, no warm-up)
    assert done.stdout.count("halide_print: Begin realization blur_y") == math.ceil(100 / STRIP)
    # --profile records the timed runs (their events are kept, not printed) and the warm-up is
    # not printed either
    trace = tmp_path / "trace.json"
    done = shim_cli("run", built["trace_realizations"], *_sizes(200, 100), "--profile", trace)
    assert done.returncode == 0, done.stderr
    assert "Begin realization" not in done.stderr, done.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(e["name"] == "realize blur_y" for e in events) == math.ceil(100 / STRIP)


@pytest.mark.parametrize("setting", ["file", "/dev/stderr", ""])
def test_profile_leaves_halides_exit_report_where_the_environment_sends_it(built, tmp_path,
                                                                           setting):
    report = tmp_path / "report.txt"
    value = str(report) if setting == "file" else setting
    done = shim_cli("profile", built["profile"], *_sizes(200, 100), "--iterations", 2,
                    env=_env(**{halide_profiler.ENV_VAR: value}))
    assert done.returncode == 0, done.stderr
    assert f"Stages of {NAME}" in done.stdout
    if setting == "file":
        assert "total time:" not in done.stderr
        text = report.read_text()
        assert f"{NAME}\n total time:" in text and "runs: 3" in text  # the warm-up too
    elif setting == "/dev/stderr":
        assert f"{NAME}\n total time:" in done.stderr
    else:  # set but empty: as unset, off
        assert "total time:" not in done.stderr, done.stderr


CHOOSING_PROGRAM = """
import sys
from shim.cli import main as cli
from shim.profiling import halide_profiler
halide_profiler.set_exit_report(sys.argv[1])
sys.exit(cli.main(sys.argv[2:]))
"""


def test_profile_keeps_the_exit_report_destination_a_program_chose(built, tmp_path):
    """A program that sends Halide's report at exit somewhere (set_exit_report) and then runs
    the profile command keeps its choice: the command silences only the report nobody chose
    a place for."""
    report = tmp_path / "report.txt"
    done = subprocess.run([sys.executable, "-c", CHOOSING_PROGRAM, str(report), "profile",
                           str(built["profile"]), *_sizes(200, 100), "--iterations", "2"],
                          capture_output=True, text=True, timeout=HANG_GUARD_S, env=_env())
    assert done.returncode == 0, done.stderr
    assert f"Stages of {NAME}" in done.stdout
    assert "total time:" not in done.stderr, done.stderr
    text = report.read_text()
    assert f"{NAME}\n total time:" in text and "runs: 3" in text


def test_kernel_compilation_is_labelled_as_such(tmp_path):
    """A GPU pipeline's first call compiles its kernels, inside whichever call comes first (its
    bounds query): the summary's Pipeline calls table says how much of that call was
    compiling, and the timeline names the slice. A child with a fresh program cache compiles
    inside its profile."""
    import shim
    from shim.pipelines.build import Build, build

    try:
        shim.device("opencl")
    except shim.DeviceUnavailable as e:
        pytest.skip(f"no OpenCL device: {e}")
    library = build(Build("brighten", "opencl", "no_runtime"))
    trace = tmp_path / "trace.json"
    code = ("import sys, numpy as np, shim\n"
            "p = shim.load(sys.argv[1])\n"
            "with shim.profile() as profile:\n"
            "    p(np.ones((48, 64), np.float32), scale=2.0, offset=1.0)\n"
            "print(profile.summary()); profile.save_trace(sys.argv[2])\n")
    done = subprocess.run([sys.executable, "-c", code, str(library), str(trace)],
                          capture_output=True, text=True, timeout=HANG_GUARD_S,
                          env=_env(HALIDE_SHIM_CACHE=str(tmp_path / "programs")))
    assert done.returncode == 0, done.stderr
    _, rows = table(done.stdout, "Pipeline calls")
    compiled = {row["pipeline"]: float(row["compiling ms"]) for row in rows}
    assert compiled["brighten (bounds query)"] > 0 and compiled["brighten"] == 0
    events = json.loads(trace.read_text())["traceEvents"]
    compiles = [e for e in events if e.get("name") == "compiling GPU code (initialize_kernels)"]
    assert len(compiles) == 1 and compiles[0]["dur"] > 0
