"""Attacks on Halide's profiler read per pipeline call (shim/profiling/halide_profiler.py): profiles that
start or stop around calls in flight, one pipeline name in two libraries, failing, interrupted,
cropped, prepared, dask and worker-thread calls, many and oddly named Funcs, fork, and Halide's
report at exit.

Reference figures come from the schedules, never from the code under test: in ``hpa_gate``,
``blur_x`` (compute_root) is W x (H+2) floats, ``blur_y`` (compute_root) W x H floats and
``gate`` (an extern stage, compute_root) one float, one heap allocation each. ``gate`` lets a
test hold a call in flight: with the scalar ``gate_id`` k > 0 it waits until the test opens
gate k (``hpa_gate_open``, exported by the pipeline's own library), with k < 0 it sleeps -k ms.
With k >= 64 it calls the function given to ``hpa_set_callback``.
``fail`` = 1 makes ``out`` fail a ``require`` once blur_x and blur_y are computed.

Tests that fork, interrupt or exit run in a child process (a hang there fails the test through
the child's generous timeout instead of blocking the suite).
"""

import ctypes
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import shim
from shim.profiling import halide_profiler
from shim.native import ffi, lib

REPO = Path(__file__).resolve().parent.parent
NAME = "hpa_gate"
TWIN = "hpa_twin"
MANY = "hpa_many"
MANY_FUNCS = 200
LONG_NAME = "stage_" + "x" * 400
ODD_NAMES = (LONG_NAME, "blür_ßtage", "naïve·Func")
# A child process or thread that hangs fails its test after this long: a hang guard, as the
# suite's other child processes have (tests/test_fork.py, test_reliability.py...), never a check
# of speed (nothing here waits near it when nothing hangs).
HANG_GUARD_S = 300

GATE_C = r"""
#include <stdint.h>
#include <unistd.h>
#include "HalideRuntime.h"
static int gates[64], entered[64];
static int (*callback)(int);
int hpa_wait(int32_t id, halide_buffer_t *out) {
    if (out->host == NULL) return 0; /* a bounds query */
    if (id >= 64) {
        int result = callback ? callback(id) : 0;
        if (result) return result;
    } else if (id > 0) {
        __atomic_add_fetch(&entered[id], 1, __ATOMIC_SEQ_CST);
        while (!__atomic_load_n(&gates[id], __ATOMIC_SEQ_CST)) usleep(200);
    } else if (id < 0) {
        usleep(-id * 1000);
    }
    for (int i = 0; i < out->dim[0].extent; i++) ((float *)out->host)[i] = 0.0f;
    return 0;
}
void hpa_set_callback(int (*f)(int)) { callback = f; }
void hpa_gate_open(int id) { __atomic_store_n(&gates[id], 1, __ATOMIC_SEQ_CST); }
int hpa_gate_entered(int id) { return __atomic_load_n(&entered[id], __ATOMIC_SEQ_CST); }
"""

BUILD = r'''
import os, subprocess, sys
import halide as hl

work, feature, what = sys.argv[1:]
include = os.path.join(hl.install_dir(), "include")
target = hl.Target("host-" + feature)
x, y, i = hl.Var("x"), hl.Var("y"), hl.Var("i")


def link(library, out, args, name, extra=()):
    obj = os.path.join(work, library + ".o")
    out.compile_to({hl.OutputFileType.object: obj}, args, name, target)
    subprocess.run(["cc", "-shared", "-fPIC", "-I", include, "-o",
                    os.path.join(work, library + ".so"), obj, *extra, "-lpthread", "-ldl"],
                   check=True)


def blurs(inp):
    blur_x, blur_y = hl.Func("blur_x"), hl.Func("blur_y")
    blur_x[x, y] = (inp[x, y] + inp[x + 1, y] + inp[x + 2, y]) / 3
    blur_y[x, y] = (blur_x[x, y] + blur_x[x, y + 1] + blur_x[x, y + 2]) / 3
    blur_x.compute_root()
    blur_y.compute_root()
    return blur_y


if what == "gate":
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    gate_id, fail = hl.Param(hl.Int(32), "gate_id", 0), hl.Param(hl.Int(32), "fail", 0)
    gate = hl.Func("gate")
    gate.define_extern("hpa_wait", [gate_id], hl.Float(32), [i])
    gate.compute_root()
    out = hl.Func("out")
    out[x, y] = hl.require(fail == 0, blurs(inp)[x, y] + gate[0], fail)
    link("gate", out, [inp, gate_id, fail], "hpa_gate", [os.path.join(work, "gate.c")])
elif what == "par":  # the gate once per row of out, in a parallel loop: on Halide's workers
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    gate_id, fail = hl.Param(hl.Int(32), "gate_id", 0), hl.Param(hl.Int(32), "fail", 0)
    gate = hl.Func("gate")
    gate.define_extern("hpa_wait", [gate_id], hl.Float(32), [i])
    out = hl.Func("out")
    out[x, y] = hl.require(fail == 0, blurs(inp)[x, y] + gate[0], fail)
    gate.compute_at(out, y)
    out.parallel(y)
    link("par", out, [inp, gate_id, fail], "hpa_par", [os.path.join(work, "gate.c")])
elif what == "twin_a":  # the same pipeline name in two libraries, other Funcs in each
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    out = hl.Func("out")
    out[x, y] = blurs(inp)[x, y]
    link("twin_a", out, [inp], "hpa_twin")
elif what == "twin_b":
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    wide, out = hl.Func("wide"), hl.Func("out")
    wide[x, y] = inp[x, y] * 2
    wide.compute_root()
    out[x, y] = wide[x, y] + wide[x + 2, y + 2]
    link("twin_b", out, [inp], "hpa_twin")
elif what == "many":
    # a chain of compute_root Funcs, W x H floats each, some with long or non-ASCII names
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    n = int(os.environ["HPA_MANY"])
    names = os.environ["HPA_ODD"].split("\n")
    names += ["chain%d" % k for k in range(n - len(names))]
    prev = inp
    for name in names:
        f = hl.Func(name)
        f[x, y] = prev[x, y] + 1
        f.compute_root()
        prev = f
    out = hl.Func("out")
    out[x, y] = prev[x, y]
    link("many", out, [inp], "hpa_many")
'''


def _build(work: Path, feature: str, what: str) -> None:
    pytest.importorskip("halide", reason="compiling test pipelines needs halide")
    (work / "gate.c").write_text(GATE_C)
    env = dict(os.environ, HPA_MANY=str(MANY_FUNCS), HPA_ODD="\n".join(ODD_NAMES))
    subprocess.run([sys.executable, "-c", BUILD, str(work), feature, what], check=True, env=env)


class Gated:
    """The gate pipeline and its library's gates."""

    _ids = itertools.count(1)

    def __init__(self, path: Path, feature: str):
        self.path, self.feature = path, feature
        self.pipeline = shim.load(path)
        self._gates = ctypes.CDLL(str(path))  # the library the pipeline runs: its gates

    def new_gate(self) -> int:
        gate = next(self._ids)
        assert gate < 64, "out of gates"
        return gate

    def open(self, gate: int) -> None:
        self._gates.hpa_gate_open(gate)

    def entered(self, gate: int) -> int:
        return self._gates.hpa_gate_entered(gate)

    def wait_entered(self, gate: int, count: int = 1) -> None:
        while self.entered(gate) < count:
            time.sleep(0.001)

    def run(self, width, height, gate=0, fail=0):
        inp = np.random.default_rng(width * height).random((height + 2, width + 2), np.float32)
        return self.pipeline(inp, gate, fail, out=np.empty((height, width), np.float32))


@pytest.fixture(scope="module", params=["profile", "profile_by_timer"])
def gated(request, tmp_path_factory):
    work = tmp_path_factory.mktemp(f"hpa_{request.param}")
    _build(work, request.param, "gate")
    return Gated(work / "gate.so", request.param)


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """Two libraries, each with a pipeline called hpa_twin (built by two processes: one
    process would give the second's Funcs other names)."""
    work = tmp_path_factory.mktemp("hpa_twins")
    _build(work, "profile", "twin_a")
    _build(work, "profile", "twin_b")
    return shim.load(work / "twin_a.so"), shim.load(work / "twin_b.so")


@pytest.fixture(scope="module")
def par(tmp_path_factory):
    """hpa_par: the gate pipeline with its extern stage once per row of out, rows in parallel."""
    work = tmp_path_factory.mktemp("hpa_par")
    _build(work, "profile", "par")
    return work / "par.so"


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    work = tmp_path_factory.mktemp("hpa_many")
    _build(work, "profile", "many")
    return shim.load(work / "many.so")


def _thread(target, *args, **kwargs) -> threading.Thread:
    """A started thread; what target raised is kept on it (``.error``)."""
    def work():
        try:
            target(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            thread.error = e

    thread = threading.Thread(target=work)
    thread.error = None
    thread.start()
    return thread


def _join(*threads) -> None:
    for t in threads:
        t.join(HANG_GUARD_S)
        assert not t.is_alive(), "a call never finished (deadlock?)"
        if t.error is not None:
            raise t.error


def _is_blur_call(stages, width, height) -> bool:
    """Whether ``stages`` are exactly one call of the gate pipeline at this size."""
    bx, by, gate = (stages.stage(n) for n in ("blur_x", "blur_y", "gate"))
    return ((bx.memory_total, bx.memory_peak, bx.num_allocs) == (width * (height + 2) * 4,) * 2 + (1,)
            and (by.memory_total, by.memory_peak, by.num_allocs) == (width * height * 4,) * 2 + (1,)
            and (gate.memory_total, gate.num_allocs) == (4, 1)
            and stages.num_allocs == 3
            and stages.memory_total == bx.memory_total + by.memory_total + 4)


def _check_blur_call(stages, width, height) -> None:
    assert stages is not None
    bx, by = stages.stage("blur_x"), stages.stage("blur_y")
    assert (bx.memory_total, bx.num_allocs) == (width * (height + 2) * 4, 1), (width, height)
    assert (by.memory_total, by.num_allocs) == (width * height * 4, 1), (width, height)
    assert _is_blur_call(stages, width, height), stages


def _entries(name: str) -> list:
    state = lib.halide_profiler_get_state()
    found, p = [], state.pipelines
    while p != ffi.NULL:
        if ffi.string(p.name) == name.encode():
            found.append(p)
        p = ffi.cast("struct halide_profiler_pipeline_stats *", p.next)
    return found


def _runs(name: str) -> int:
    return sum(p.runs for p in _entries(name))


def _pipeline_calls(prof, name=NAME) -> list:
    return [r for r in prof.records if r.kind == "pipeline" and r.name == name]


# --- profiles that start or stop around calls in flight ----------------------------------------

@pytest.mark.parametrize("way", ["call", "prepared"])
def test_a_profile_started_during_an_unprofiled_call_gives_each_profiled_call_its_own(gated, way):
    """A call of the pipeline runs, unprofiled, as a profile starts; a profiled call of it
    begins, and the first one ends while the profiled one is under way. Halide merges a call's
    figures into its totals as it ends: the profiled call must not be given the other's."""
    gated.run(8, 8)  # (the fast path's plan, the bounds cache)
    first, second = gated.new_gate(), gated.new_gate()
    runs = _runs(NAME)
    inp = np.ones((402, 602), np.float32)
    if way == "prepared":  # run in C (native_stubs/fast/prepared_call.c)
        prepared = gated.pipeline.prepare(inp, first, 0, out=np.empty((400, 600), np.float32))
        unprofiled = _thread(prepared)
    else:
        unprofiled = _thread(gated.run, 600, 400, first)
    gated.wait_entered(first)
    with shim.profile() as prof:
        profiled = _thread(gated.run, 100, 80, second)
        time.sleep(0.5)  # (lets a profiled call that does not wait get inside its gate)
        gated.open(first)
        _join(unprofiled)
        gated.open(second)
        _join(profiled)
    if way == "prepared":
        prepared.close()
    [record] = _pipeline_calls(prof)
    _check_blur_call(record.stages, 100, 80)
    assert _runs(NAME) == runs + 2  # Halide counted both calls


def test_a_profile_stopped_mid_call_attributes_no_later_call_to_it(gated):
    """A profiled call is in flight when its profile stops; an unprofiled call then runs whole
    inside it. Both runs end inside the profiled call: its figures are none, never the sum of
    both."""
    gated.run(8, 8)
    gate = gated.new_gate()
    prof = shim.profile().start()
    profiled = _thread(gated.run, 100, 80, gate)
    gated.wait_entered(gate)
    prof.stop()
    gated.run(600, 400)  # outside any profile, while the profiled call is still running
    gated.open(gate)
    _join(profiled)
    [record] = _pipeline_calls(prof)
    assert record.stages is None, record.stages


def test_a_profile_stopped_mid_call_still_gets_that_calls_figures(gated):
    gate = gated.new_gate()
    prof = shim.profile().start()
    profiled = _thread(gated.run, 120, 90, gate)
    gated.wait_entered(gate)
    prof.stop()
    gated.open(gate)
    _join(profiled)
    [record] = _pipeline_calls(prof)
    _check_blur_call(record.stages, 120, 90)


def test_a_new_profile_while_the_last_ones_call_is_in_flight_takes_turns_without_deadlock(gated):
    """The call of an old profile holds the pipeline's turn; the next profile's call of the
    same pipeline waits for it, then runs, and each gets its own figures."""
    gate = gated.new_gate()
    old = shim.profile().start()
    first = _thread(gated.run, 300, 200, gate)
    gated.wait_entered(gate)
    old.stop()
    opener = threading.Timer(0.3, gated.open, (gate,))
    with shim.profile() as new:
        opener.start()
        gated.run(100, 80)  # waits for the old profile's call
    opener.join()
    _join(first)
    [old_record] = _pipeline_calls(old)
    [new_record] = _pipeline_calls(new)
    _check_blur_call(old_record.stages, 300, 200)
    _check_blur_call(new_record.stages, 100, 80)


@pytest.mark.parametrize("outer_profiled", [True, False])
def test_a_call_made_from_inside_a_call_of_the_same_pipeline_does_not_wait_for_it(gated,
                                                                                  outer_profiled):
    """An extern stage calls back into Python, which calls the same pipeline on the same
    thread: the inner call cannot wait for the outer one to end (it never would). Its figures
    are its own; the outer call's hold both runs, so it has none."""
    entered, go = threading.Event(), threading.Event()
    inner = []

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)
    def callback(_):
        entered.set()
        go.wait()
        try:
            gated.run(30, 20)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            inner.append(e)
            return -1
        inner.append("done")
        return 0

    gated._gates.hpa_set_callback(callback)
    try:
        prof = shim.profile()
        if outer_profiled:
            prof.start()
        outer = _thread(gated.run, 150, 100, 64)
        if not outer_profiled:
            while not entered.wait(0.01):  # (the outer call in flight, unprofiled)
                assert outer.is_alive(), "the outer call ended before its extern stage"
            prof.start()
        go.set()
        _join(outer)
        prof.stop()
    finally:
        gated._gates.hpa_set_callback(None)
    assert inner == ["done"]
    records = _pipeline_calls(prof)
    inner_record = next(r for r in records if r.stages is not None
                        and _is_blur_call(r.stages, 30, 20))
    assert inner_record.result == 0
    assert len(records) == (2 if outer_profiled else 1)
    for record in records:
        if record is not inner_record:  # the outer call: Halide added both runs
            assert record.stages is None, record.stages


# --- calls that wait on each other: no wait of the profiler's may hang them ---------------------

WAITS_SCRIPT = r'''
import ctypes, json, os, sys, threading
import numpy as np
import shim
from shim.profiling import halide_profiler

path, name, mode = sys.argv[1:4]
p, gates = shim.load(path), ctypes.CDLL(path)
CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)
failures = []


def run(w, h, gate=0):
    inp = np.ones((h + 2, w + 2), np.float32)
    return p(inp, gate, 0, out=np.empty((h, w), np.float32))


def guarded(target, *args):
    def work():
        try:
            target(*args)
        except BaseException as e:
            failures.append(repr(e))
    t = threading.Thread(target=work)
    t.start()
    return t


def figures(record):
    s = record.stages
    return None if s is None else [s.stage("blur_x").memory_total,
                                   s.stage("blur_y").memory_total, s.num_allocs]


run(8, 8)
prof = shim.profile()
entered, go = threading.Event(), threading.Event()
if mode.startswith("parallel"):
    # The extern stage runs once per row of a parallel loop; on a row that one of Halide's
    # worker threads runs (in the outer call's context), it calls the same pipeline. The outer
    # call waits for that row in its loop: the inner call must not wait for the outer one. The
    # profiler's waits never give up here.
    halide_profiler.PATIENCE_S = float("inf")
    outer, inner_started, claimed, claim = [], threading.Event(), [], threading.Lock()

    @CALLBACK
    def callback(_):
        entered.set()
        go.wait()
        if threading.get_ident() in outer:
            inner_started.wait()  # (the outer thread waits: Halide's workers take the rows)
            return 0
        with claim:
            if claimed:
                return 0
            claimed.append(threading.get_ident())
        inner_started.set()
        run(30, 20)
        return 0

    gates.hpa_set_callback(callback)

    def outer_call():
        outer.append(threading.get_ident())
        run(150, 100, 64)

    if mode == "parallel profiled":
        prof.start()
    thread = guarded(outer_call)
    entered.wait()
    if mode == "parallel unprofiled":
        prof.start()  # (while the outer call is in flight)
    go.set()
    thread.join()
else:
    # An earlier call of the pipeline, in flight from before the profile ("in flight") or
    # holding its turn in the profile ("turn"), waits in its extern stage for this thread's
    # call of the same pipeline to end: this thread's call waits for it only while calls of
    # the pipeline keep ending, then goes ahead.
    halide_profiler.PATIENCE_S = 0.5
    mine_done = threading.Event()

    @CALLBACK
    def callback(_):
        entered.set()
        mine_done.wait()
        return 0

    gates.hpa_set_callback(callback)
    if mode == "turn":
        prof.start()
    thread = guarded(run, 90, 60, 64)
    entered.wait()
    if mode == "in flight":
        prof.start()
    try:
        run(50, 40)
    finally:
        mine_done.set()
    thread.join()
prof.stop()
gates.hpa_set_callback(None)
print(json.dumps({"failures": failures,
                  "calls": [figures(r) for r in prof.records
                            if r.kind == "pipeline" and r.name == name]}))
'''


def _waits(path, name, mode):
    done = subprocess.run([sys.executable, "-c", WAITS_SCRIPT, str(path), name, mode],
                          capture_output=True, text=True, timeout=HANG_GUARD_S,
                          env=dict(os.environ, HL_NUM_THREADS="4",
                                   **{halide_profiler.ENV_VAR: "off"}))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["failures"] == []
    return report["calls"]


def _blur(width, height, per_row=False):
    """blur_x's and blur_y's memory, the call's allocations (hpa_par: a gate per row)."""
    return [width * (height + 2) * 4, width * height * 4, 2 + (height if per_row else 1)]


@pytest.mark.parametrize("outer_profiled", [True, False])
def test_a_call_from_an_extern_stage_in_a_parallel_loop_does_not_wait_for_the_outer_call(
        par, outer_profiled):
    """The call context reaches Halide's worker threads: a call of the same pipeline made there
    is inside the outer call, which cannot end before it. It takes no turn and waits for no
    call in flight; its figures are its own, the outer call's hold both runs (None)."""
    calls = _waits(par, "hpa_par", "parallel profiled" if outer_profiled else
                   "parallel unprofiled")
    inner = _blur(30, 20, per_row=True)
    assert calls == ([None, inner] if outer_profiled else [inner])


@pytest.mark.parametrize("mode", ["in flight", "turn"])
def test_a_call_ahead_that_waits_for_the_profiled_call_does_not_hang_it(gated, mode):
    """A call of the pipeline in flight from before the profile, or holding the pipeline's
    turn, waits (in its extern stage) for the profiled call of the same pipeline on another
    thread to end. Without a profile both end: with one too. The profiled call goes ahead once
    no call of the pipeline has ended for a while (halide_profiler.PATIENCE_S); its figures are
    its own (the earlier call ends after it), the earlier profiled call's hold both runs."""
    calls = _waits(gated.path, NAME, mode)
    assert calls == ([_blur(50, 40)] if mode == "in flight" else [None, _blur(50, 40)])


# --- one name, two libraries -------------------------------------------------------------------

def _check_twin(pipeline, stages, width, height) -> None:
    """twin_a: blur_x W x (H+2), blur_y W x H; twin_b: wide (W+2) x (H+2)."""
    funcs = {s.name: (s.memory_total, s.num_allocs) for s in stages.funcs() if s.index >= 4}
    if pipeline.path.endswith("twin_a.so"):
        assert funcs == {"blur_x": (width * (height + 2) * 4, 1),
                         "blur_y": (width * height * 4, 1), "out": (0, 0)}, funcs
    else:
        assert funcs == {"wide": ((width + 2) * (height + 2) * 4, 1), "out": (0, 0)}, funcs


def test_two_libraries_with_a_pipeline_of_one_name_called_alternately_and_at_once(twins):
    a, b = twins
    sizes = [(200, 150), (90, 70), (310, 120)]
    inp = {s: np.ones((s[1] + 2, s[0] + 2), np.float32) for s in sizes}

    def call(pipeline, size):
        return pipeline(inp[size], out=np.empty((size[1], size[0]), np.float32))

    call(a, sizes[0]), call(b, sizes[0])
    runs_before = {e.num_funcs: e.runs for e in _entries(TWIN)}
    assert len(runs_before) == 2  # Halide keeps one entry per library
    plan = [(a, s) for s in sizes] + [(b, s) for s in sizes]
    barrier = threading.Barrier(2)

    def worker(calls):
        barrier.wait()
        for pipeline, size in calls:
            call(pipeline, size)

    with shim.profile() as prof:
        for call_a, call_b in zip(plan[:3], plan[3:]):  # alternately, on one thread
            call(*call_a), call(*call_b)
        threads = [_thread(worker, plan[i::2]) for i in range(2)]  # at once
        _join(*threads)
    records = _pipeline_calls(prof, TWIN)
    assert len(records) == 12
    # (the records do not say which library: the stage names do)
    for record in records:
        stages = record.stages
        assert stages is not None
        names = {s.name for s in stages.funcs()}
        pipeline = a if "blur_x" in names else b
        matching = [s for s in sizes if _fits_twin(pipeline, stages, *s)]
        assert matching, stages
        _check_twin(pipeline, stages, *matching[0])
    runs_after = {e.num_funcs: e.runs for e in _entries(TWIN)}
    assert {k: runs_after[k] - runs_before[k] for k in runs_after} == {
        e: 6 for e in runs_before}


def _fits_twin(pipeline, stages, width, height) -> bool:
    try:
        _check_twin(pipeline, stages, width, height)
    except AssertionError:
        return False
    return True


# --- calls that fail, queries, crops, prepared calls, dask, worker threads -----------------------

def test_a_failing_call_reports_what_it_did_and_gives_back_its_turn(gated):
    with shim.profile() as prof:
        with pytest.raises(shim.PipelineError):
            gated.run(100, 80, fail=1)
        # the pipeline's turn was given back: another thread's call goes ahead
        _join(_thread(gated.run, 50, 40))
    failed, ok = _pipeline_calls(prof)
    assert failed.result != 0 and ok.result == 0
    # it failed in out, after computing blur_x and blur_y: those it did
    _check_blur_call(failed.stages, 100, 80)
    _check_blur_call(ok.stages, 50, 40)


def test_a_call_refused_for_a_too_small_input_and_a_bounds_query_hold_no_turn(gated):
    with shim.profile() as prof:
        with pytest.raises(shim.BoundsError):
            gated.pipeline(np.ones((10, 10), np.float32), 0, 0,
                           out=np.empty((80, 100), np.float32))
        regions = gated.pipeline.required_regions({"out": ((0, 100), (0, 80))}, gate_id=0,
                                                  fail=0)
        _join(_thread(gated.run, 60, 40))
    assert regions["inp"] == ((0, 102), (0, 82))  # (from the stencil)
    stages = [r.stages for r in prof.records if r.kind == "pipeline" and r.stages is not None]
    assert len(stages) == 1
    _check_blur_call(stages[0], 60, 40)


def test_a_call_on_crops(gated):
    image = np.random.default_rng(3).random((300, 400), np.float32)
    result = np.zeros((300, 400), np.float32)
    inp = shim.Buffer(image).cropped([(11, 202), (21, 102)])  # (what out's crop reads)
    out = shim.Buffer(result).cropped([(11, 200), (21, 100)])
    with shim.profile() as prof:
        gated.pipeline(inp, 0, 0, out=out)
    [record] = _pipeline_calls(prof)
    _check_blur_call(record.stages, 200, 100)


def test_prepared_calls_are_profiled_each_with_its_own_figures(gated):
    """A PreparedCall runs in C outside a profile (native_stubs/fast/prepared_call.c); inside one it
    runs in Python, where the stages are read."""
    sizes = [(220, 130), (60, 50)]
    calls = [gated.pipeline.prepare(np.ones((h + 2, w + 2), np.float32), 0, 0,
                                    out=np.empty((h, w), np.float32)) for w, h in sizes]
    try:
        for call in calls:
            call()  # outside: in C
        with shim.profile() as prof:
            for _ in range(2):
                for call in calls:
                    call()
    finally:
        for call in calls:
            call.close()
    records = _pipeline_calls(prof)
    assert len(records) == 4
    for record, (width, height) in zip(records, sizes * 2):
        _check_blur_call(record.stages, width, height)


def test_calls_from_dask_tasks_each_get_their_chunks_figures(gated):
    da = pytest.importorskip("dask.array")
    from shim.dask import map_pipeline

    height, width, chunk = 90, 130, (40, 50)
    src = np.random.default_rng(5).random((height + 2, width + 2), np.float32)
    with shim.profile() as prof:
        result = map_pipeline(gated.pipeline, da.from_array(src), shape=(height, width),
                              chunks=chunk, gate_id=0, fail=0).compute(scheduler="threads", num_workers=4)
    assert result.shape == (height, width)
    expected = sorted((min(chunk[1], width - x), min(chunk[0], height - y))
                      for y in range(0, height, chunk[0]) for x in range(0, width, chunk[1]))
    records = _pipeline_calls(prof)
    got = []
    for record in records:
        by = record.stages.stage("blur_y").memory_total // 4
        size = next(s for s in expected if s[0] * s[1] == by and _is_blur_call(record.stages, *s))
        got.append(size)
    assert sorted(got) == expected


def test_many_worker_threads_each_call_gets_its_own_figures(gated):
    from concurrent.futures import ThreadPoolExecutor

    sizes = [(w, h) for w in (40, 170, 330) for h in (30, 120)] * 2
    with shim.profile() as prof, ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda s: gated.run(*s), sizes))
    records = _pipeline_calls(prof)
    assert len(records) == len(sizes)
    got = []
    for record in records:
        by = record.stages.stage("blur_y").memory_total // 4
        got.append(next(s for s in set(sizes) if s[0] * s[1] == by))
        _check_blur_call(record.stages, *got[-1])
    assert sorted(got) == sorted(sizes)


# --- Funcs: many of them, long and non-ASCII names ----------------------------------------------

def test_hundreds_of_funcs_with_long_and_non_ascii_names(many):
    width, height = 37, 23
    inp = np.zeros((height, width), np.float32)
    with shim.profile() as prof:
        result = many(inp, out=np.empty((height, width), np.float32))
        many(inp, out=np.empty((height, width), np.float32))
    assert (result == MANY_FUNCS).all()  # the chain adds 1 per Func
    records = _pipeline_calls(prof, MANY)
    assert len(records) == 2
    for record in records:
        funcs = [s for s in record.stages.stages if s.index >= 4 and s.name != "out"]
        assert len(funcs) == MANY_FUNCS
        names = [s.name for s in funcs]
        for name in ODD_NAMES:
            assert name in names
        for stage in funcs:
            assert (stage.memory_total, stage.memory_peak, stage.num_allocs) == (
                width * height * 4, width * height * 4, 1), stage
    summary = prof.summary()
    assert f"Stages of {MANY}" in summary
    assert "blür_ßtage" in summary and LONG_NAME in summary


# --- Halide's totals and peaks, compared with its stock runtime ----------------------------------

READ_STATS = '''
def read_stats(ffi, lib, name):
    """Halide's profiler entry of pipeline ``name``, as JSON-able figures (times aside)."""
    state = lib.halide_profiler_get_state()
    p = state.pipelines
    found = []
    while p != ffi.NULL:
        if ffi.string(p.name) == name.encode():
            funcs = {}
            for i in range(p.num_funcs):
                f = p.funcs[i]
                funcs[ffi.string(f.name).decode()] = [f.memory_peak, f.memory_total,
                                                      f.memory_current, f.num_allocs,
                                                      f.stack_peak]
            found.append({"runs": p.runs, "num_allocs": p.num_allocs,
                          "memory_total": p.memory_total, "memory_peak": p.memory_peak,
                          "memory_current": p.memory_current, "funcs": funcs})
        p = ffi.cast("struct halide_profiler_pipeline_stats *", p.next)
    return found
'''

SHIM_SCENARIO = READ_STATS + '''
import ctypes, json, sys, threading, time
import numpy as np
import shim
from shim.native import ffi, lib

path = sys.argv[1]
p, gates = shim.load(path), ctypes.CDLL(path)
calls = []


def run(w, h, gate=0, fail=0):
    calls.append((w, h, fail))
    inp = np.random.default_rng(w * h).random((h + 2, w + 2), np.float32)
    try:
        p(inp, gate, fail, out=np.empty((h, w), np.float32))
    except shim.PipelineError:
        assert fail


def started(target, *args):
    t = threading.Thread(target=target, args=args)
    t.start()
    return t


def wait_entered(gate):
    while gates.hpa_gate_entered(gate) < 1:
        time.sleep(0.001)


run(300, 200)                                   # outside any profile
u = started(run, 500, 400, 1)                   # in flight as a profile starts
wait_entered(1)
prof = shim.profile().start()
t = started(run, 100, 80, 2)
time.sleep(0.3)
gates.hpa_gate_open(1); u.join(); gates.hpa_gate_open(2); t.join()
run(50, 40)
run(60, 50, 0, 1)                               # fails
t = started(run, 120, 90, 3)                    # in flight as the profile stops
wait_entered(3)
prof.stop()
run(700, 500)                                   # unprofiled, inside that call: the peaks
gates.hpa_gate_open(3); t.join()
with shim.profile():
    threads = [started(run, 30 + 7 * k, 20 + 5 * k) for k in range(4)]
    for t in threads:
        t.join()
print("STATS", json.dumps({"calls": calls, "stats": read_stats(ffi, lib, sys.argv[2])}))
'''

STOCK_SCENARIO = READ_STATS + '''
import json, os, sys
import cffi
import numpy as np
sys.path.insert(0, sys.argv[3])
from pipelines.stock import ABI, StockPipeline

path, name = sys.argv[1], sys.argv[2]
calls = json.loads(sys.stdin.read())
pipeline = StockPipeline(path, name)
for w, h, fail in calls:
    inp = np.random.default_rng(w * h).random((h + 2, w + 2), np.float32)
    pipeline.bind({"inp": inp, "gate_id": 0, "fail": fail, "out": np.empty((h, w), np.float32)})
    try:
        pipeline.run()
    except RuntimeError:
        assert fail
ffi = cffi.FFI()
ffi.cdef((ABI.parent / "halide_profiler.h").read_text())
stats = ffi.dlopen(path)  # (the same library: Halide's runtime bundled in it)
print("STATS", json.dumps(read_stats(ffi, stats, name)), flush=True)
# (Halide's stock profile_by_timer runtime waits forever at exit for a timer that never fires
# on Linux: leave without its destructors)
os._exit(0)
'''


def _stats_line(stdout: str):
    [line] = [line for line in stdout.splitlines() if line.startswith("STATS ")]
    return json.loads(line.removeprefix("STATS "))


def test_halides_totals_and_peaks_end_as_with_its_stock_runtime(gated):
    """Calls in and out of profiles, in flight as profiles start and stop, at once on several
    threads, one failing: Halide's own figures (runs, allocations, memory totals, peaks per
    pipeline and per Func) end as Halide's stock runtime leaves them after the same calls."""
    env = dict(os.environ, **{halide_profiler.ENV_VAR: "off"})
    done = subprocess.run([sys.executable, "-c", SHIM_SCENARIO, str(gated.path), NAME],
                          capture_output=True, text=True, env=env, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr
    with_shim = _stats_line(done.stdout)
    stock = subprocess.run([sys.executable, "-c", STOCK_SCENARIO, str(gated.path), NAME,
                            str(REPO)], input=json.dumps(with_shim["calls"]),
                           capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert stock.returncode == 0, stock.stderr
    reference = _stats_line(stock.stdout)
    assert len(reference) == 1 and reference[0]["runs"] == len(with_shim["calls"])
    assert with_shim["stats"] == reference


# --- Ctrl-C -------------------------------------------------------------------------------------

INTERRUPT_SCRIPT = '''
import ctypes, json, os, signal, sys, threading, time
import numpy as np
import shim

path = sys.argv[1]
p, gates = shim.load(path), ctypes.CDLL(path)
opened = set()


def run(w, h, gate=0):
    inp = np.ones((h + 2, w + 2), np.float32)
    return p(inp, gate, 0, out=np.empty((h, w), np.float32))


def figures(record):
    s = record.stages
    return None if s is None else [s.stage("blur_x").memory_total, s.stage("blur_y").memory_total]


def open_gate(gate):
    opened.add(gate)
    gates.hpa_gate_open(gate)


def wait_entered(gate):
    while gates.hpa_gate_entered(gate) < 1:
        time.sleep(0.001)


report = {}
run(8, 8)
# 0. Ctrl-C while the main thread waits for a call of the pipeline in flight from before the
# profile
early = threading.Thread(target=run, args=(90, 60, 3))
early.start()
wait_entered(3)
with shim.profile() as first:
    def interrupt_then_open_3():
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)  # (only a main thread that cannot be interrupted waits this long)
        open_gate(3)

    threading.Thread(target=interrupt_then_open_3, daemon=True).start()
    try:
        run(50, 40)
        report["in flight"] = "not interrupted"
    except KeyboardInterrupt:
        report["in flight"] = "interrupted while the other call ran" if 3 not in opened else \
            "interrupted only after the other call"
    open_gate(3)
    early.join()
    run(20, 10)  # the pipeline's turn was given back
report["first"] = [figures(r) for r in first.records if r.kind == "pipeline"
                   and r.name == "hpa_gate"]
with shim.profile() as prof:
    # 1. Ctrl-C while the main thread waits for another thread's profiled call of the pipeline
    other = threading.Thread(target=run, args=(100, 80, 1))
    other.start()
    wait_entered(1)

    def interrupt_then_open():
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)  # (only a main thread that cannot be interrupted waits this long)
        open_gate(1)

    helper = threading.Thread(target=interrupt_then_open, daemon=True)
    helper.start()
    try:
        run(50, 40)
        report["waiting"] = "not interrupted"
    except KeyboardInterrupt:
        report["waiting"] = "interrupted while the other call ran" if 1 not in opened else \\
            "interrupted only after the other call"
    open_gate(1)
    other.join()

    # 2. Ctrl-C during the main thread's own profiled call: it lands once the call is over
    def interrupt_inside():
        wait_entered(2)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        open_gate(2)

    helper = threading.Thread(target=interrupt_inside)
    helper.start()
    try:
        run(70, 60, 2)
        report["inside"] = "not interrupted"
    except KeyboardInterrupt:
        report["inside"] = "interrupted"
    helper.join()
    # the pipeline's turn is free: another thread's call goes ahead
    last = threading.Thread(target=run, args=(30, 20))
    last.start()
    last.join()
report["calls"] = [figures(r) for r in prof.records if r.kind == "pipeline"
                   and r.name == "hpa_gate"]
print(json.dumps(report))
'''


def test_ctrl_c_while_waiting_for_the_pipelines_turn_or_inside_a_profiled_call(gated):
    done = subprocess.run([sys.executable, "-c", INTERRUPT_SCRIPT, str(gated.path)],
                          capture_output=True, text=True, timeout=HANG_GUARD_S,
                          env=dict(os.environ, **{halide_profiler.ENV_VAR: "off"}))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["in flight"] == "interrupted while the other call ran"
    assert report["waiting"] == "interrupted while the other call ran"
    assert report["inside"] == "interrupted"

    def blur(w, h):
        return [w * (h + 2) * 4, w * h * 4]

    # (the interrupted waits made no call)
    assert report["first"] == [blur(20, 10)]
    # the other thread's call, the interrupted call of the main thread (completed), the last
    assert report["calls"] == [blur(100, 80), blur(70, 60), blur(30, 20)]


# --- fork ----------------------------------------------------------------------------------------

FORK_SCRIPT = '''
import ctypes, json, os, sys, threading, time
import numpy as np
import shim
from shim.native import lib

path, mode = sys.argv[1:3]
p, gates = shim.load(path), ctypes.CDLL(path)


def run(w, h, gate=0):
    inp = np.ones((h + 2, w + 2), np.float32)
    return p(inp, gate, 0, out=np.empty((h, w), np.float32))


def figures(stages):
    return None if stages is None else [stages.stage("blur_x").memory_total,
                                        stages.stage("blur_y").memory_total,
                                        stages.num_allocs, stages.samples]


run(8, 8)
prof = shim.profile().start()
release = threading.Event()
if mode == "call":  # a profiled call holds the pipeline's turn (and runs in Halide) at fork
    holder = threading.Thread(target=run, args=(100, 80, 1))
    holder.start()
    while gates.hpa_gate_entered(1) < 1:
        time.sleep(0.001)
else:  # another thread is inside Halide's profiler lock at fork (its sampler, a snapshot...)
    held = threading.Event()

    def hold():
        state = lib.halide_profiler_get_state()
        lib.halide_profiler_lock(state)
        held.set()
        release.wait()
        lib.halide_profiler_unlock(state)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()

pid = os.fork()
if pid == 0:
    prof.stop()
    with shim.profile() as child:
        run(90, 70, -60)  # 60 ms in the gate stage: Halide samples it
        run(40, 30)
    calls = [figures(r.stages) for r in child.records if r.kind == "pipeline"
             and r.name == "hpa_gate"]
    with open(sys.argv[3], "w") as f:
        json.dump(calls, f)
    sys.exit(0)  # an ordinary exit: Halide's destructors run
_, status = os.waitpid(pid, 0)
gates.hpa_gate_open(1)
release.set()
holder.join()
prof.stop()
parent = [figures(r.stages) for r in prof.records if r.kind == "pipeline" and r.name == "hpa_gate"]
print(json.dumps({"status": status, "parent": parent}))
'''


@pytest.mark.parametrize("mode", ["call", "halide-lock"])
def test_a_child_forked_while_the_profiler_is_busy_profiles_the_pipeline(gated, tmp_path, mode):
    """Fork while another thread holds the pipeline's turn in a profiled call, or Halide's
    profiler lock: the child profiles the same pipeline (no deadlock), gets its own figures,
    Halide samples its calls, and it exits normally (no hang in Halide's destructors)."""
    out = tmp_path / "child.json"
    done = subprocess.run([sys.executable, "-c", FORK_SCRIPT, str(gated.path), mode, str(out)],
                          capture_output=True, text=True, timeout=HANG_GUARD_S,
                          env=dict(os.environ, **{halide_profiler.ENV_VAR: "off"}))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["status"] == 0, done.stderr
    # the parent's call in flight on another thread is not the child's to wait for at exit
    assert "still running at exit" not in done.stderr, done.stderr
    child = json.loads(out.read_text())
    (x1, y1, n1, samples), (x2, y2, n2, _) = child
    assert (x1, y1, n1) == (90 * 72 * 4, 90 * 70 * 4, 3)
    assert (x2, y2, n2) == (40 * 32 * 4, 40 * 30 * 4, 3)
    assert samples >= 1  # the child has a sampler of its own
    if mode == "call":
        [(x, y, n, _)] = report["parent"]
        assert (x, y, n) == (100 * 82 * 4, 100 * 80 * 4, 3)


FORK_IN_CALL_SCRIPT = r'''
import ctypes, json, os, sys, threading, time
import numpy as np
import shim
from shim.profiling import halide_profiler
from shim.native import ffi, lib

path, out = sys.argv[1:3]
p, gates = shim.load(path), ctypes.CDLL(path)
CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)


def run(w, h, gate=0):
    inp = np.ones((h + 2, w + 2), np.float32)
    return p(inp, gate, 0, out=np.empty((h, w), np.float32))


run(8, 8)
# Another thread's call is in flight (Halide lists every call of a -profile build, profiled or
# not), then this thread's call starts (first in Halide's list, the other's next) and its
# extern stage forks.
other = threading.Thread(target=run, args=(100, 80, 1))
other.start()
while gates.hpa_gate_entered(1) < 1:
    time.sleep(0.001)
forked = []


@CALLBACK
def fork(_):
    forked.append(os.fork())
    return 0


gates.hpa_set_callback(fork)
run(60, 50, 64)
gates.hpa_set_callback(None)
if forked[0] == 0:  # the child: its call has ended; the other thread's never will
    ctypes.CDLL(None).prctl(1, 9)  # (PR_SET_PDEATHSIG, SIGKILL: a hang ends with the parent)
    halide_profiler.PATIENCE_S = float("inf")  # (a wait for a call in flight never gives up)
    state = lib.halide_profiler_get_state()
    report = {"in flight": state.instances != ffi.NULL}
    with shim.profile() as prof:
        run(40, 30)
    [stages] = [r.stages for r in prof.records if r.kind == "pipeline" and r.name == p.name]
    report["figures"] = [stages.stage("blur_x").memory_total, stages.stage("blur_y").memory_total]
    with open(out, "w") as f:
        json.dump(report, f)
    os._exit(0)
_, status = os.waitpid(forked[0], 0)
gates.hpa_gate_open(1)
other.join()
print(json.dumps({"status": status}))
'''


def test_a_child_forked_inside_a_call_lists_only_its_own_calls(gated, tmp_path):
    """The forking thread's own call is in Halide's list of calls in flight, ahead of another
    thread's (which never ends in the child). In the child, once its call ends, nothing is in
    flight: a profiled call of the pipeline neither waits for the parent's call nor hangs."""
    out = tmp_path / "child.json"
    done = subprocess.run([sys.executable, "-c", FORK_IN_CALL_SCRIPT, str(gated.path), str(out)],
                          capture_output=True, text=True, timeout=HANG_GUARD_S,
                          env=dict(os.environ, **{halide_profiler.ENV_VAR: "off"}))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["status"] == 0, done.stderr
    child = json.loads(out.read_text())
    assert child == {"in flight": False, "figures": [40 * 32 * 4, 40 * 30 * 4]}


# --- Halide's report at exit ---------------------------------------------------------------------

EXIT_SCRIPT = '''
import atexit, ctypes, os, sys, threading, time
import numpy as np
import shim
import shim.core.shutdown
from shim.profiling import halide_profiler

path, mode = sys.argv[1:3]
p, gates = shim.load(path), ctypes.CDLL(path)


def run(w, h, gate=0):
    inp = np.ones((h + 2, w + 2), np.float32)
    return p(inp, gate, 0, out=np.empty((h, w), np.float32))


run(50, 40)
if mode == "chdir":
    os.chdir(sys.argv[3])
elif mode == "thread":
    os.chdir(sys.argv[3])  # a relative path names a file in the directory it was given in
    t = threading.Thread(target=halide_profiler.set_exit_report, args=(sys.argv[4],))
    t.start()
    t.join()
    os.chdir(sys.argv[5])
elif mode.startswith("stuck"):  # a call that never ends, on a daemon thread
    shim.core.shutdown.CALLS_TIMEOUT = 0.2
    if mode == "stuck profiled":
        shim.profile().start()
    threading.Thread(target=run, args=(100, 80, 1), daemon=True).start()
    while gates.hpa_gate_entered(1) < 1:
        time.sleep(0.001)
elif mode == "late":  # a profiled call that ends while the interpreter exits
    shim.profile().start()
    threading.Thread(target=run, args=(100, 80, 1), daemon=True).start()
    while gates.hpa_gate_entered(1) < 1:
        time.sleep(0.001)
    atexit.register(gates.hpa_gate_open, 1)  # (the first exit handler: the call ends during exit)
print("done", flush=True)
'''


def _exit_run(gated, mode, setting, *args, cwd=None):
    env = dict(os.environ)
    env.pop(halide_profiler.ENV_VAR, None)
    if setting is not None:
        env[halide_profiler.ENV_VAR] = setting
    return subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(gated.path), mode, *map(str, args)],
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=HANG_GUARD_S)


@pytest.mark.parametrize("where", ["directory", "proc"])
def test_an_unwritable_report_path_says_so_and_keeps_the_report(gated, tmp_path, where):
    path = str(tmp_path) if where == "directory" else "/proc/version"
    done = _exit_run(gated, "plain", path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert f"cannot write Halide's profiler report to {path}" in done.stderr
    # not lost: Halide prints it, as it does without a destination
    assert f"{NAME}\n total time:" in done.stderr and "runs: 1" in done.stderr


def test_a_relative_report_path_is_where_the_process_started_after_chdir(gated, tmp_path):
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir(), elsewhere.mkdir()
    done = _exit_run(gated, "chdir", "report.txt", elsewhere, cwd=start)
    assert done.returncode == 0, done.stderr
    assert not (elsewhere / "report.txt").exists()
    text = (start / "report.txt").read_text()
    assert f"{NAME}\n total time:" in text and "runs: 1" in text
    assert "total time" not in done.stderr


def test_set_exit_report_from_a_thread_with_a_relative_path(gated, tmp_path):
    given, later = tmp_path / "given", tmp_path / "later"
    given.mkdir(), later.mkdir()
    done = _exit_run(gated, "thread", None, given, "from_thread.txt", later)
    assert done.returncode == 0, done.stderr
    assert not (later / "from_thread.txt").exists()
    text = (given / "from_thread.txt").read_text()
    assert f"{NAME}\n total time:" in text and "runs: 1" in text
    assert "total time" not in done.stderr


@pytest.mark.parametrize("setting", [None, "off", "file"])
@pytest.mark.parametrize("profiled", [True, False])
def test_exit_with_a_call_stuck_on_a_daemon_thread_does_not_hang(gated, tmp_path, setting,
                                                                profiled):
    """The shim stops waiting for calls still running at exit (shim/core/shutdown.py); Halide's
    profiler must not wait for them either, and the report still goes where it is sent."""
    report = tmp_path / "report.txt"
    mode = "stuck profiled" if profiled else "stuck"
    done = _exit_run(gated, mode, str(report) if setting == "file" else setting)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("done")
    if setting is None:
        assert f"{NAME}\n total time:" in done.stderr and "runs: 1" in done.stderr
    else:
        assert "total time" not in done.stderr, done.stderr
    if setting == "file":
        text = report.read_text()
        assert f"{NAME}\n total time:" in text and "runs: 1" in text
    else:
        assert not report.exists()


def test_a_call_that_ends_while_the_interpreter_exits_is_in_the_report(gated, tmp_path):
    """The shim waits for calls still running at exit before Halide's report is written."""
    report = tmp_path / "report.txt"
    done = _exit_run(gated, "late", str(report))
    assert done.returncode == 0, done.stderr
    text = report.read_text()
    assert f"{NAME}\n total time:" in text and "runs: 2" in text
    assert "total time" not in done.stderr


# --- the declaration of Halide's record of a call in flight --------------------------------------

INSTANCE_FIELDS = ("billed_time", "start_time", "memory_current", "memory_peak", "memory_total",
                   "active_threads_numerator", "active_threads_denominator", "next", "prev_next",
                   "pipeline_stats", "funcs", "current_func", "active_threads", "samples",
                   "num_allocs", "should_collect_statistics")


def test_the_instance_state_layout_matches_halides_header(tmp_path):
    """abi/halide_profiler.h declares struct halide_profiler_instance_state for the calls in
    flight: byte for byte Halide 21's (tests/test_abi.py checks the other structs)."""
    halide = pytest.importorskip("halide")
    struct = "struct halide_profiler_instance_state"
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "HalideRuntime.h"',
             "int main(void) {", f'printf("-|%zu\\n", sizeof({struct}));']
    lines += [f'printf("{f}|%zu\\n", offsetof({struct}, {f}));' for f in INSTANCE_FIELDS]
    lines += ["return 0;", "}"]
    (tmp_path / "layout.c").write_text("\n".join(lines))
    include = os.path.join(halide.install_dir(), "include")
    subprocess.run(["cc", "-std=c11", "-I", include, "-o", str(tmp_path / "layout"),
                    str(tmp_path / "layout.c")], check=True)
    out = subprocess.run([str(tmp_path / "layout")], check=True, capture_output=True,
                         text=True).stdout
    real = dict(line.split("|") for line in out.splitlines())
    assert ffi.sizeof(struct) == int(real["-"])
    for field in INSTANCE_FIELDS:
        assert ffi.offsetof(struct, field) == int(real[field]), field
