"""Halide 22's profiler, served to Halide 22 libraries beside Halide 21's
(native_stubs/profiling/halide_profiler.c, shim/profiling/halide_profiler.py).

The Halide 22 pipeline is tests/support/halide22_instrumented.c's h22_prof: hand-written as
Halide 22's generated code drives the profiler (the instance on its stack, instance_end on
every exit, its own counters added inline, heap and stack memory, a parallel loop whose tasks
take the sampling token), so every figure the shim reports is known from its own numbers
(``expected``). Halide 21's is the sample blur3x3 built with -profile, whose figures are those
tests/test_halide_profiler.py expects of a compute_root stage. Scenarios that end the process
(the report at exit, a fork, an exit with a call in flight) run in a child process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import shim
from shim.native import ffi, lib
from shim.pipelines.build import RUNTIMES, Build, build
from shim.profiling import halide_profiler
from shim.profiling.halide_profiler import Counters
from support.releases import halide22_instrumented
from support.threads import run_threads

# A child process that hangs fails its test after this long: a hang guard, never a check of
# speed (they take a few seconds).
HANG_GUARD_S = 300
# Iterations h22_prof spins per row (stage_b's): enough that a call lasts several samples.
WORK = 2_000_000
CHUNK, VECTOR = 64, 16  # h22_prof's stage_b chunk and vector width
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    return halide22_instrumented(tmp_path_factory.mktemp("h22_profiler"))


@pytest.fixture(scope="module")
def prof22(library):
    return shim.load(library, name="h22_prof")


@pytest.fixture(scope="module", params=RUNTIMES)
def blur21(request):
    """(path, Pipeline): Halide 21's blur3x3 built with its profiler, its runtime bundled or
    not."""
    path = build(Build("blur3x3", "host", request.param, features=("profile",)))
    return path, shim.load(path)


def _image(width, height, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (height, width), dtype=np.uint8)


def run22(pipeline, width, height, work=WORK, fail_at=0, hold=0):
    image = _image(width, height, width * 1000 + height)
    out = pipeline(image, work, fail_at, hold, image.shape).numpy()
    np.testing.assert_array_equal(out, (2 * image.astype(np.int64) + 4) % 256)


def run21(pipeline, width, height):
    image = np.random.default_rng(height).integers(0, 1000, (height + 2, width + 2),
                                                   dtype=np.uint16)
    pipeline(image, output=(height, width))


def expected(width: int, height: int) -> dict:
    """Every entry's figures for one call of h22_prof on a width x height image, from what its
    code does: (memory_peak, memory_total, num_allocs, stack_peak, parent, kind, counters)."""
    points = width * height
    chunks = [CHUNK] * (width // CHUNK) + ([width % CHUNK] if width % CHUNK else [])
    vectors = height * sum(n // VECTOR for n in chunks)
    scalars = height * sum(n % VECTOR for n in chunks)
    none = Counters(*[0] * 12)
    return {
        "overhead": (0, 0, 0, 0, -1, "overhead", none),
        "thread idle": (0, 0, 0, 0, -1, "thread idle", none),
        "malloc": (0, 0, 0, 0, -1, "malloc", none),
        "free": (0, 0, 0, 0, -1, "free", none),
        "stage_a": (2 * points, 2 * points, 1, 0, -1, "func",
                    Counters(0, 0, points, points, points, 0, 0, points, points % VECTOR,
                             points // VECTOR, 0, 2 * points)),
        "out": (0, 0, 0, 0, -1, "func",
                Counters(1, height, points, points, scalars, vectors, 0, 2 * points, scalars,
                         vectors, 0, points)),
        "stage_b": (0, 0, 0, CHUNK * 2, 5, "func",
                    Counters(0, 0, points, points, 0, 0, points, 2 * points, points, 0, 0,
                             2 * points, frozenset({"gathers"}))),
    }


def check22(stages, width, height):
    """One call's figures are those its code gave."""
    assert stages is not None and stages.pipeline == "h22_prof"
    figures = expected(width, height)
    assert [s.name for s in stages.stages] == list(figures)
    for s in stages.stages:
        assert (s.memory_peak, s.memory_total, s.num_allocs, s.stack_peak, s.parent, s.kind,
                s.counters) == figures[s.name], s.name
    points = width * height
    assert (stages.memory_peak, stages.memory_total, stages.num_allocs) == \
        (2 * points, 2 * points, 1)


def check_times(stages):
    """Sampled times, scaled by Halide 22 to the call's duration: they add up to it, up to a
    rounding per entry."""
    if stages.samples == 0:  # (a call between two samples has no times: Halide's own way)
        assert stages.time_ns == 0 and all(s.time_ns == 0 for s in stages.stages)
        return
    total = sum(s.time_ns for s in stages.stages)
    assert abs(total - stages.time_ns) <= len(stages.stages)
    assert sum(s.samples for s in stages.stages) == stages.samples
    threads = len(os.listdir("/proc/self/task"))  # (Halide's pool may have more workers than
    for s in stages.stages:                         # it now lets work: a bound, the process's)
        assert (s.threads is None) == (s.samples == 0)
        assert s.threads is None or 0 <= s.threads <= threads


def check21(stages, width, height):
    """Halide 21's figures of blur3x3's call, as tests/test_halide_profiler.py expects them of a
    compute_root stage: blur_x, width x (height + 2) uint16 on the heap."""
    assert stages is not None and stages.pipeline == "blur3x3"
    blur_x = stages.stage("blur_x")
    size = width * (height + 2) * 2
    assert (blur_x.memory_peak, blur_x.memory_total, blur_x.num_allocs) == (size, size, 1)
    assert (stages.memory_peak, stages.memory_total, stages.num_allocs) == (size, size, 1)
    assert blur_x.counters is None and blur_x.parent is None and blur_x.kind is None


def _names(abi: int) -> list[str]:
    """The pipelines the state of profiler ABI ``abi`` holds."""
    layout = halide_profiler._LAYOUTS[abi]
    with halide_profiler._Locked(abi) as state:
        return [ffi.string(p.name).decode() for p in _each(state, layout)]


def _each(state, layout):
    p = ffi.cast(layout.pipelines, state.pipelines)
    while p != ffi.NULL:
        yield p
        p = ffi.cast(layout.pipelines, p.next)


def _in_flight(abi: int) -> int:
    with halide_profiler._Locked(abi) as state:
        n, instance = 0, state.instances
        while instance != ffi.NULL:
            n, instance = n + 1, instance.next
        return n


# --- one call ---------------------------------------------------------------------------------

def test_a_halide22_library_is_served_by_halide22s_profiler(prof22):
    assert prof22.release == "22" and halide_profiler.builds_profile(prof22.target)
    assert prof22._runner.halide_profiler_abi == 1


def test_one_call_reports_what_its_code_counted(prof22):
    width, height = 70, 40
    # Several milliseconds of work; where a loaded machine kept the sampler from running during
    # the call, again with twice the work (a call the sampler never saw has no times, as
    # Halide's own).
    for doubling in range(6):
        with shim.profile() as prof:
            run22(prof22, width, height, work=WORK << doubling)
        [(record, stages)] = prof.stages
        assert record.name == "h22_prof" and record.stages is stages
        check22(stages, width, height)
        check_times(stages)
        if stages.samples:
            break
    assert stages.samples >= 1
    assert 0 < stages.time_ns <= record.duration_ns


def test_each_call_gets_its_own_figures_not_the_running_totals(prof22):
    run22(prof22, 33, 9)  # outside the profile: counted in the state only
    sizes = [(130, 20), (16, 3), (64, 11)]
    with shim.profile() as prof:
        for width, height in sizes:
            run22(prof22, width, height, work=WORK // 20)
    assert len(prof.stages) == len(sizes)
    for (_, stages), (width, height) in zip(prof.stages, sizes):
        check22(stages, width, height)
        check_times(stages)


def test_a_bounds_query_adds_no_run(prof22):
    image = _image(24, 10)
    with shim.profile() as prof:
        out = prof22(image, WORK // 20, 0, 0)  # the output omitted: sized by a bounds query
    np.testing.assert_array_equal(out.numpy(), (2 * image.astype(np.int64) + 4) % 256)
    [(_, stages)] = prof.stages
    check22(stages, 24, 10)
    [entry] = [p for p in _each(lib.shim_profiler_state(1), halide_profiler._LAYOUTS[1])
               if ffi.string(p.name) == b"h22_prof"]
    runs = entry.runs
    with pytest.raises(shim.ShimError):  # refused by its own bounds check, in its instance
        prof22(np.zeros((4, 4), np.uint8), 0, 0, 0, np.zeros((8, 8), np.uint8))
    assert entry.runs == runs and _in_flight(1) == 0


@pytest.mark.parametrize("fail_at", [1, 2])
def test_a_call_failing_midway_ends_its_instance_and_reports_what_it_did(prof22, fail_at):
    width, height = 40, 12
    image = _image(width, height)
    with shim.profile() as prof:
        with pytest.raises(shim.PipelineError, match="on purpose"):
            prof22(image, WORK // 20, fail_at, 0, image.shape)
    assert _in_flight(1) == 0
    [(_, stages)] = prof.stages
    # it got past the marker: Halide 22 counts the run, with what its code counted
    a = stages.stage("stage_a")
    figures = expected(width, height)
    assert (a.memory_peak, a.memory_total, a.num_allocs, a.counters) == \
        figures["stage_a"][:3] + (figures["stage_a"][6],)
    out = stages.stage("out").counters
    if fail_at == 1:  # before the parallel loop
        assert out.parallel_loops == 0 and stages.stage("stage_b").counters.points_computed == 0
    else:  # the tasks that ran whole counted their rows (Halide's pool starts no more once
        # one failed), the failed one none
        assert out.parallel_loops == 1 and out.parallel_tasks == height
        b = stages.stage("stage_b").counters
        rows = b.points_computed // width
        assert b.points_computed == rows * width and rows < height
        assert (out.points_computed, out.bytes_stored, b.bytes_stored) == \
            (rows * width, rows * width, 2 * rows * width)
    with shim.profile() as prof:  # and the next call is whole
        run22(prof22, width, height, work=WORK // 20)
    check22(prof.stages[0][1], width, height)


# --- beside Halide 21's ---------------------------------------------------------------------

def test_each_state_holds_only_its_releases_pipelines(prof22, blur21):
    _, blur = blur21
    run22(prof22, 16, 4, work=0)
    run21(blur, 20, 10)
    assert "h22_prof" in _names(1) and "blur3x3" not in _names(1)
    assert "blur3x3" in _names(0) and "h22_prof" not in _names(0)


def test_halide21_and_22_profiled_calls_at_once_from_threads(prof22, blur21):
    _, blur = blur21
    sizes22 = [(70, 24), (16, 5), (130, 9)]
    sizes21 = [(300, 200), (40, 30), (120, 90)]
    barrier = threading.Barrier(4)

    def work(index):
        barrier.wait()
        for i in range(6):
            if index % 2:
                run22(prof22, *sizes22[(i + index) % 3], work=WORK // 20)
            else:
                run21(blur, *sizes21[(i + index) % 3])

    with shim.profile() as prof:
        run_threads(4, work)
    calls = {"h22_prof": [], "blur3x3": []}
    for _, stages in prof.stages:
        calls[stages.pipeline].append(stages)
    assert len(calls["h22_prof"]) == 12 and len(calls["blur3x3"]) == 12
    for stages in calls["h22_prof"]:
        size = [s for s in sizes22 if s[0] * s[1] == stages.stage("out").counters.points_computed]
        assert len(size) == 1
        check22(stages, *size[0])
        check_times(stages)
    for stages in calls["blur3x3"]:
        width = [w for w, h in sizes21 if stages.stage("blur_x").num_allocs and
                 stages.stage("blur_x").memory_total == w * (h + 2) * 2]
        assert len(width) == 1
        check21(stages, width[0], dict(sizes21)[width[0]])
    assert _in_flight(0) == 0 and _in_flight(1) == 0


# --- the report at exit, a fork, an exit with a call in flight ---------------------------------

CHILD = """
import ctypes, os, sys, threading
import numpy as np
import shim
from shim.profiling import halide_profiler
p22 = shim.load(sys.argv[1], name="h22_prof")
p21 = shim.load(sys.argv[2])
library = ctypes.CDLL(sys.argv[1])
def run22(width, height, work=0, hold=0):
    image = np.full((height, width), 3, np.uint8)
    return p22(image, work, 0, hold, image.shape).numpy()
def run21(width, height):
    p21(np.ones((height + 2, width + 2), np.uint16), output=(height, width))
"""

REPORT = CHILD + """
for _ in range(3):
    run22(40, 30)
run22(40, 30, work=3000000)  # sampled
run21(20, 10)
"""


def _child(script: str, library, blur_path, env_changes=None, *args):
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop(halide_profiler.ENV_VAR, None)
    env.update(env_changes or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), str(library),
                           str(blur_path), *args], capture_output=True, text=True, env=env,
                          timeout=HANG_GUARD_S)


def _report22(text: str) -> dict:
    """Halide 22's report of h22_prof as the shim prints it: its header lines and
    {entry: [cells]} of each of its two tables."""
    section = text[text.index("\nh22_prof\n") + 1:]
    section = section.split("\n-----")[0]
    lines = section.splitlines()
    tables, rows = [], None
    for line in lines[1:]:
        cells = [c.strip() for c in line.split("\u2502")]
        if cells[0] == "name":
            rows = {}
            tables.append(rows)
        elif rows is not None and cells[0] and len(cells) > 2:
            rows[cells[0].lstrip("\u2514\u251c\u2502 ")] = cells[1:-1]
    return {"header": lines[:4], "tables": tables}


@pytest.mark.parametrize("setting", [None, "file", "off"])
def test_the_report_at_exit_has_halide22s_pipelines_and_halide21s(library, blur21, tmp_path,
                                                                   setting):
    blur_path, _ = blur21
    report = tmp_path / "report.txt"
    env = {} if setting is None else \
        {halide_profiler.ENV_VAR: str(report) if setting == "file" else setting}
    done = _child(REPORT, library, blur_path, env)
    assert done.returncode == 0, done.stderr
    text = report.read_text() if setting == "file" else done.stderr
    if setting == "off":
        assert "total time" not in done.stderr and not report.exists()
        return
    assert "blur3x3\n total time:" in text  # Halide 21's report, its own runtime's
    parsed = _report22(text)
    header = parsed["header"]
    assert header[0] == "h22_prof"
    runs = re.search(r"runs: (\d+)(?: \((\d+) timed\))?", header[1])
    # (the runs timed: those the sampler reached, as Halide 22 counts them; "4 timed" unsaid)
    assert int(runs.group(1)) == 4 and 0 <= int(runs.group(2) or 0) < 4
    assert header[2].startswith(" average threads used:")
    assert header[2].endswith("parallel loops: 1  parallel tasks: 30")
    assert header[3] == " heap allocations: 4  peak heap usage: 2400"
    main, counters = parsed["tables"]
    # in tree order, the bookkeeping entries without time left out: stage_b under out
    assert [name for name in main if name not in ("overhead", "thread idle")] == \
        ["malloc", "free", "stage_a", "out", "stage_b"]
    assert "\u2514stage_b" in text
    # time, percent | threads | loops | tasks | allocs | peak mem | avg mem | recompute
    assert main["stage_a"][4:] == ["1", "2400", "2400", "1.00"]
    assert main["out"][2:] == ["1", "30", "", "", "", "1.00"]
    assert main["stage_b"][2:] == ["", "", "", "128", "", "1.00"]
    figures = expected(40, 30)
    for name in ("stage_a", "out", "stage_b"):
        c = figures[name][6]
        shown = [c.points_computed, c.scalar_loads, c.vector_loads, c.gathers, c.bytes_loaded,
                 c.scalar_stores, c.vector_stores, c.scatters, c.bytes_stored]
        cells = [("<" if name == "stage_b" and i == 3 else "") + str(v) if v else ""
                 for i, v in enumerate(shown)]
        assert counters[name] == cells, name


FORK = CHILD + """
import time
held = threading.Thread(target=run22, args=(64, 8, 0, 1))
held.start()
while library.h22_held() == 0:  # its task of row 0 waits, its call in flight
    time.sleep(0.01)
pid = os.fork()
if pid == 0:
    import signal
    signal.alarm(60)  # (a hang guard)
    code = 0
    with halide_profiler._Locked(1) as state:
        if halide_profiler._in_flight(state, halide_profiler._LAYOUTS[1], b"h22_prof"):
            code = 3  # another thread's call listed in the child
    with shim.profile() as prof:
        out = run22(48, 6, 100000)
        run21(30, 20)
    stages = {s.pipeline: s for _, s in prof.stages}
    s22, s21 = stages["h22_prof"], stages["blur3x3"]
    if (s22.stage("stage_a").memory_total, s22.stage("out").counters.parallel_tasks,
            s22.stage("stage_b").counters.points_computed) != (48 * 6 * 2, 6, 48 * 6):
        code = 4
    if s21.stage("blur_x").memory_total != 30 * 22 * 2 or (out != 10).any():
        code = 5
    os._exit(code)
_, status = os.waitpid(pid, 0)
library.h22_release()
held.join()
with shim.profile() as prof:
    run22(64, 8)
tasks = prof.stages[0][1].stage("out").counters.parallel_tasks
print("child", os.waitstatus_to_exitcode(status), tasks)
"""


def test_a_fork_with_a_halide22_call_in_flight(library, blur21):
    """The child lists none of the parent's other threads' calls in flight, profiles both
    releases' pipelines right; the parent's held call ends, and the next is whole."""
    blur_path, _ = blur21
    done = _child(FORK, library, blur_path, {halide_profiler.ENV_VAR: "off"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["child", "0", "8"], done.stdout + done.stderr


EXIT_IN_FLIGHT = CHILD + """
import time
import shim.core.shutdown
shim.core.shutdown.CALLS_TIMEOUT = 0.2  # (the call is held for good: exit stops waiting)
run22(40, 30)
threading.Thread(target=run22, args=(40, 30, 0, 1), daemon=True).start()
while library.h22_held() == 0:
    time.sleep(0.01)
print("exiting", flush=True)
"""


def test_an_exit_with_a_halide22_call_in_flight_reports_the_calls_that_ended(library, blur21):
    blur_path, _ = blur21
    done = _child(EXIT_IN_FLIGHT, library, blur_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "exiting\n"
    assert "pipeline calls still running at exit" in done.stderr
    header = _report22(done.stderr)["header"]
    assert "runs: 1" in header[1] and header[3] == " heap allocations: 1  peak heap usage: 2400"
