"""Halide's tracing inside shim.profile() (native_stubs/profiling/tracing.c, shim/profiling/halide_trace.py).

The test pipelines are compiled once per module in a child process (halide's compiler stays
out of this process), each in its own forked child so that every one gets the Func names it
asks for. References come from numpy, from the schedule (how many realizations, which boxes,
how many loads and stores) and, for what Halide prints, from Halide's stock runtime
(pipelines/stock.py) in a child process. Scenarios that could crash the interpreter run in a
child process, so that a crash is a failed test."""

import collections
import ctypes
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import shim
import shim.native.threads
from shim.profiling import halide_trace
from shim.native import ffi, lib

ROOT = Path(__file__).resolve().parent.parent
SPAN_KINDS = ("realization", "production", "consumption", "halide pipeline")
LONG_NAME = "long_" + "n" * 6000
TILE = 8  # tr_blur and tr_par split out's rows by 8 and compute blur_y per tile

BUILD = r'''
import os, subprocess, sys
import halide as hl

out_dir = sys.argv[1]
x, y, yo, yi = hl.Var("x"), hl.Var("y"), hl.Var("yo"), hl.Var("yi")


def blur(schedule):
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    blur_x, blur_y, out = hl.Func("blur_x"), hl.Func("blur_y"), hl.Func("out")
    blur_x[x, y] = (inp[x, y] + inp[x + 1, y] + inp[x + 2, y]) / 3
    blur_y[x, y] = (blur_x[x, y] + blur_x[x, y + 1] + blur_x[x, y + 2]) / 3
    out[x, y] = blur_y[x, y] * 2
    schedule(blur_x, blur_y, out)
    return out, [inp]


def tiles(parallel=False, vectorize=False):
    def schedule(blur_x, blur_y, out):
        blur_x.compute_root()
        if vectorize:
            blur_x.vectorize(x, 8)
        out.split(y, yo, yi, %(tile)d)
        if parallel:
            out.parallel(yo)
        blur_y.compute_at(out, yo)
    return schedule


def rows(blur_x, blur_y, out):
    blur_x.compute_root()
    blur_y.compute_at(out, y)


def slow():
    # one Func, so one realization whose begins all come at the start and ends at the end
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    e = inp[x, y]
    for _ in range(40):
        e = e * hl.f32(0.999) + hl.sin(e) * hl.f32(0.001)
    out = hl.Func("slow")
    out[x, y] = e
    return out, [inp]


def types():
    a = hl.ImageParam(hl.UInt(8), 2, "a")
    h = hl.ImageParam(hl.Float(16), 2, "h")
    b = hl.ImageParam(hl.Bool(), 2, "b")
    mid = hl.Func("mid")
    mid[x, y] = (h[x, y] * hl.cast(hl.Float(16), 2), b[x, y] ^ (x %% 2 == 0))
    mid.compute_root()
    res = hl.Func("res")
    res[x, y] = (hl.f32(mid[x, y][0]) + hl.f32(a[x, y]), hl.select(mid[x, y][1], a[x, y], hl.u8(7)))
    return res, [a, h, b]


def gated():
    # tr_par with an extern stage per tile (gate: a 0 for each row, added to out), through
    # which a test holds the parallel tasks: see GATE_C
    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    which = hl.Param(hl.Int(32), "which", 0)
    blur_x, blur_y, gate, out = hl.Func("blur_x"), hl.Func("blur_y"), hl.Func("gate"), hl.Func("out")
    blur_x[x, y] = (inp[x, y] + inp[x + 1, y] + inp[x + 2, y]) / 3
    blur_y[x, y] = (blur_x[x, y] + blur_x[x, y + 1] + blur_x[x, y + 2]) / 3
    gate.define_extern("tr_gate_wait", [which], hl.Float(32), [y])
    out[x, y] = blur_y[x, y] * 2 + gate[y]
    tiles(parallel=True)(blur_x, blur_y, out)
    gate.compute_at(out, yo)
    return out, [inp, which]


def dims():
    v = [hl.Var("v%%d" %% i) for i in range(10)]
    a = hl.ImageParam(hl.Int(16), 1, "a")
    g = hl.Func("g10")  # 10 dimensions: 20 coordinates in its realization events
    g[v] = hl.i32(a[v[0]]) + v[1] + 2 * v[2] + 3 * v[3] + 4 * v[4] + 5 * v[5] + 6 * v[6] + 7 * v[7] + 8 * v[8] + 9 * v[9]
    g.compute_root()
    long = hl.Func("%(long)s")
    long[x] = a[x] * 2
    long.compute_root()
    out = hl.Func("dout")
    out[x] = g[[x] + [hl.Expr(0)] * 8 + [hl.Expr(1)]] + g[[x] + [hl.Expr(1)] * 9] + hl.i32(long[x])
    return out, [a]


BUILDS = {
    "tr_blur": (lambda: blur(tiles()), "trace_realizations-trace_pipeline"),
    "tr_par": (lambda: blur(tiles(parallel=True)), "trace_realizations-trace_pipeline"),
    "tr_all": (lambda: blur(tiles(vectorize=True)), "trace_all"),
    "tr_rows": (lambda: blur(rows), "trace_all"),
    "tr_slow": (slow, "trace_realizations-trace_pipeline"),
    "tr_types": (types, "trace_all"),
    "tr_dims": (dims, "trace_all"),
    "tr_gate": (gated, "trace_realizations-trace_pipeline"),
}
EXTRA = {"tr_gate": [os.path.join(out_dir, "gate.c"), "-I", os.path.join(hl.install_dir(), "include")]}
children = {}
for name, (make, features) in BUILDS.items():
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            out, args = make()
            obj = os.path.join(out_dir, name + ".o")
            out.compile_to({hl.OutputFileType.object: obj}, args, name, hl.Target("host-" + features))
            subprocess.run(["cc", "-shared", "-fPIC", "-o", os.path.join(out_dir, name + ".so"), obj,
                            *EXTRA.get(name, []), "-lpthread", "-ldl"], check=True)
            code = 0
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            os._exit(code)
    children[pid] = name
failed = [children[pid] for pid in children if os.waitpid(pid, 0)[1] != 0]
assert not failed, failed
''' % {"tile": TILE, "long": LONG_NAME}


# tr_gate's extern stage, one call per tile, which_ says what it does: 0 nothing; 3 holds the
# task until tr_gate_release(); 1 and 2, the calls of threads A and B (tr_gate_threads), set
# up a thread that runs another call's task while its own call waits for its parallel loop:
# A's task on A's thread waits until one of B's tasks has begun, A's tasks elsewhere and B's
# tasks off A's thread until one of B's tasks runs on A's thread. A gives up after two minutes
# (the call fails) rather than hang.
GATE_C = r"""
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "HalideRuntime.h"

enum { A_ON_A, A_ELSEWHERE, B_OFF_A, B_ON_A, HELD, RELEASED, COUNTS };
static int counts[COUNTS];
static int a_thread;

static int wait_for(int what) {
    for (int i = 0; i < 600000 && !__atomic_load_n(&counts[what], __ATOMIC_SEQ_CST); i++) {
        usleep(200);
    }
    return __atomic_load_n(&counts[what], __ATOMIC_SEQ_CST) ? 0 : -1;
}

static void count(int what) {
    __atomic_add_fetch(&counts[what], 1, __ATOMIC_SEQ_CST);
}

int tr_gate_wait(int32_t which_, halide_buffer_t *out) {
    if (out->host == NULL) {
        return 0; /* a bounds query */
    }
    int me = (int)syscall(SYS_gettid), result = 0;
    if (which_ == 1 && me == a_thread) {
        count(A_ON_A);
        result = wait_for(B_OFF_A);
    } else if (which_ == 1) {
        count(A_ELSEWHERE);
        result = wait_for(B_ON_A);
    } else if (which_ == 2 && me == a_thread) {
        count(B_ON_A);
    } else if (which_ == 2) {
        count(B_OFF_A);
        result = wait_for(B_ON_A);
    } else if (which_ == 3) {
        count(HELD);
        result = wait_for(RELEASED);
    }
    for (int i = 0; i < out->dim[0].extent; i++) {
        ((float *)out->host)[i] = 0.0f;
    }
    return result;
}

void tr_gate_thread_a(int a) {
    a_thread = a;
}
int tr_gate_count(int what) {
    return __atomic_load_n(&counts[what], __ATOMIC_SEQ_CST);
}
void tr_gate_release(void) {
    count(RELEASED);
}
void tr_gate_reset(void) {
    for (int i = 0; i < COUNTS; i++) {
        __atomic_store_n(&counts[i], 0, __ATOMIC_SEQ_CST);
    }
}
"""
GATE_COUNTS = {name: i for i, name in enumerate(("A on A", "A elsewhere", "B off A", "B on A", "held"))}


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    """{name: path of the .so}; each library carries Halide's runtime (a plain object linked
    into a shared library), so that pipelines/stock.py can run it as well."""
    pytest.importorskip("halide", reason="compiling test pipelines needs halide")
    work = tmp_path_factory.mktemp("halide_trace")
    (work / "gate.c").write_text(GATE_C)
    subprocess.run([sys.executable, "-c", BUILD, str(work)], check=True)
    return {path.stem: path for path in work.glob("*.so")}


@pytest.fixture(scope="module")
def load(libs):
    loaded = {}

    def get(name):
        if name not in loaded:
            loaded[name] = shim.load(libs[name])
        return loaded[name]
    return get


# --- references --------------------------------------------------------------------------------

def _input(width, height, seed=0):
    return np.random.default_rng(seed).random((height + 2, width + 2), dtype=np.float32)


def _blur(inp):
    """(blur_x, out) as the blur pipelines compute them, in numpy."""
    w = inp.shape[1] - 2
    blur_x = (inp[:, 0:w] + inp[:, 1:w + 1] + inp[:, 2:w + 2]) / np.float32(3)
    blur_y = (blur_x[:-2] + blur_x[1:-1] + blur_x[2:]) / np.float32(3)
    return blur_x, blur_y * 2


def _run_blur(pipeline, inp):
    h, w = inp.shape[0] - 2, inp.shape[1] - 2
    out = pipeline(inp, out=np.empty((h, w), np.float32))
    np.testing.assert_allclose(out, _blur(inp)[1], rtol=1e-5)
    return out


# --- helpers -----------------------------------------------------------------------------------

def _spans(prof, call=None):
    return [r for r in prof.records if r.kind in SPAN_KINDS and (call is None or r.call == call.id)]


def _calls(prof, name):
    return [r for r in prof.records if r.kind == "pipeline" and r.name == name]


def _end(r):
    return r.start_ns + r.duration_ns


def _inside(inner, outer):
    return outer.start_ns <= inner.start_ns and _end(inner) <= _end(outer)


def _check_nesting(intervals, where):
    """``intervals``: [(start, end, label)] on one track: any two are disjoint or one holds the
    other (no partial overlap)."""
    stack = []
    for start, end, label in sorted(intervals, key=lambda i: (i[0], -i[1])):
        assert end >= start, (where, label)
        while stack and stack[-1][1] <= start:
            stack.pop()
        if stack:
            assert end <= stack[-1][1], f"{where}: {label} [{start}, {end}] overlaps " \
                                        f"{stack[-1][2]} [{stack[-1][0]}, {stack[-1][1]}] partly"
        stack.append((start, end, label))


def _check_records_nest(prof):
    tracks = collections.defaultdict(list)
    for r in prof.records:
        tracks[r.thread].append((r.start_ns, _end(r), f"{r.kind} {r.name} #{r.id}"))
    for thread, intervals in tracks.items():
        _check_nesting(intervals, f"records of thread {thread}")


def _strict_json(text):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def _check_json_nests(path):
    """The "X" slices of each (pid, tid) track nest (times back in integer ns); returns the
    trace."""
    trace = _strict_json(Path(path).read_text())
    tracks = collections.defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            start = round(e["ts"] * 1000)
            tracks[e["pid"], e["tid"]].append((start, start + round(e["dur"] * 1000), e["name"]))
    for track, intervals in tracks.items():
        _check_nesting(intervals, f"trace track {track}")
    return trace


def _unfinished(prof):
    """Spans whose end the profile did not see: they are drawn to the profile's end, or to
    their call's where that came first (a span's real end comes before its call record's)."""
    calls = {r.id: r for r in prof.records if r.kind == "pipeline"}
    return [r for r in _spans(prof)
            if _end(r) == prof.duration_ns or r.call in calls and _end(r) == _end(calls[r.call])]


def _child(script, *args, env=None):
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, env=env)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


# --- 1. nesting and boxes, as the schedule says ------------------------------------------------

def test_realizations_nest_with_the_boxes_the_schedule_gives(load, tmp_path):
    width, height = 40, 4 * TILE
    inp = _input(width, height)
    with shim.profile() as prof:
        _run_blur(load("tr_blur"), inp)
    [call] = _calls(prof, "tr_blur")
    spans = _spans(prof)
    assert spans and all(r.call == call.id for r in spans)
    assert all(r.thread == call.thread and _inside(r, call) for r in spans)
    by_id = {r.id: r for r in prof.records}

    def one(kind, name):
        [r] = [r for r in spans if r.kind == kind and r.name == name]
        return r

    pipeline = one("halide pipeline", "tr_blur")
    assert pipeline.parent == call.id
    realize_x, produce_x = one("realization", "blur_x"), one("production", "blur_x")
    assert realize_x.box == produce_x.box == ((0, width), (0, height + 2))
    realize_out, produce_out = one("realization", "out"), one("production", "out")
    assert realize_out.box == produce_out.box == ((0, width), (0, height))
    for production, realization in ((produce_x, realize_x), (produce_out, realize_out)):
        assert _inside(production, realization)
    assert produce_x.parent == realize_x.id
    assert _inside(realize_x, realize_out) and _inside(realize_out, pipeline)
    realize_y = sorted((r for r in spans if r.kind == "realization" and r.name == "blur_y"),
                       key=lambda r: r.box[1][0])
    assert [r.box for r in realize_y] == [((0, width), (k * TILE, TILE)) for k in range(height // TILE)]
    produce_y = [r for r in spans if r.kind == "production" and r.name == "blur_y"]
    assert len(produce_y) == len(realize_y)
    for r in realize_y:
        assert r.parent == produce_out.id and _inside(r, produce_out)
        [p] = [p for p in produce_y if p.parent == r.id]
        assert p.box == r.box and _inside(p, r)
    # every span's parent is the innermost span enclosing it on its thread, else the call
    for r in spans:
        enclosing = [s for s in spans if s is not r and _inside(r, s) and not _inside(s, r)]
        innermost = max(enclosing, key=lambda s: s.start_ns, default=None)
        assert r.parent == (innermost.id if innermost else call.id), r
        assert r.parent in by_id
    _check_records_nest(prof)
    text = prof.summary()
    table = text.split("Realizations of tr_blur (Halide's tracing)")[1].split("\n\n")[0]
    assert [line.split()[:3] for line in table.splitlines()[3:]] == \
        [["out", "1", "1"], ["blur_x", "1", "1"], ["blur_y", str(height // TILE), str(height // TILE)]]

    trace = _check_json_nests(prof.save_trace(tmp_path / "trace.json"))
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    realize_slices = sorted((e for e in slices if e["name"] == "realize blur_y"),
                            key=lambda e: e["args"]["box"][1][0])
    assert [e["args"]["box"] for e in realize_slices] == [[list(d) for d in r.box] for r in realize_y]
    assert all(e["tid"] == call.thread and e["args"]["call"] == call.id for e in realize_slices)
    assert [e["name"] for e in slices].count("produce blur_x") == 1
    assert [e["name"] for e in slices].count("pipeline tr_blur") == 1


# --- 2. parallel calls from two threads --------------------------------------------------------

def _another_calls_span_around(prof):
    """Spans run by a thread while it waited in a parallel loop of another call (Halide's
    pool lets a thread waiting for its own tasks run any): the innermost span enclosing them
    on their thread belongs to another call."""
    spans = _spans(prof)
    found = []
    for r in spans:
        around = [s for s in spans if s.thread == r.thread and s is not r and _inside(r, s)]
        if around and max(around, key=lambda s: s.start_ns).call != r.call:
            found.append(r)
    return found


def test_parallel_calls_from_two_threads_each_get_their_own_spans(libs, load, tmp_path):
    """Threads A and B call tr_gate at once; its gate (GATE_C) makes sure of what the pool's
    scheduling would otherwise leave to chance: tasks of A's call run on Halide's workers, and
    A's thread, waiting in its parallel loop inside its own call's spans, runs tasks of B's
    call. Every span belongs to the call whose task it ran in."""
    pipeline, gates = load("tr_gate"), ctypes.CDLL(str(libs["tr_gate"]))
    gates.tr_gate_reset()
    height = 32 * TILE
    widths = {1: 1536, 2: 2048}  # A's and B's: tells their calls apart by their boxes
    inputs = {i: _input(w, height, seed=i) for i, w in widths.items()}
    native, errors = {}, []
    ready = threading.Barrier(3)
    go = {i: threading.Event() for i in widths}

    def work(i):
        native[i] = threading.get_native_id()
        ready.wait()
        go[i].wait()
        try:
            out = pipeline(inputs[i], i, out=np.empty((height, widths[i]), np.float32))
            np.testing.assert_allclose(out, _blur(inputs[i])[1], rtol=1e-5)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    previous = shim.native.threads.set_num_threads(3)  # (two workers)
    try:
        with shim.profile() as prof:
            threads = [threading.Thread(target=work, args=(i,)) for i in widths]
            for t in threads:
                t.start()
            ready.wait()
            gates.tr_gate_thread_a(native[1])
            go[1].set()
            # B's call begins once A's thread and a worker are each in one of A's tasks
            while not (gates.tr_gate_count(GATE_COUNTS["A on A"])
                       and gates.tr_gate_count(GATE_COUNTS["A elsewhere"])):
                time.sleep(0.001)
            go[2].set()
            for t in threads:
                t.join()
    finally:
        shim.native.threads.set_num_threads(previous)
    assert not errors
    assert gates.tr_gate_count(GATE_COUNTS["B on A"]), "A's thread ran none of B's tasks"
    workers = _check_parallel_profile(prof, {native[i]: w for i, w in widths.items()},
                                      height, tmp_path)
    assert workers, "no span ran on one of Halide's worker threads"
    [a_call] = [c for c in _calls(prof, "tr_gate") if c.thread == native[1]]
    [b_call] = [c for c in _calls(prof, "tr_gate") if c.thread == native[2]]
    around = _another_calls_span_around(prof)
    assert {(r.thread, r.call) for r in around} >= {(native[1], b_call.id)}
    # B's tasks on A's thread: inside A's production of out there, their parents B's
    [a_production] = [r for r in _spans(prof, a_call) if r.kind == "production" and r.name == "out"]
    b_on_a = [r for r in _spans(prof, b_call) if r.thread == native[1]]
    assert b_on_a and all(_inside(r, a_production) for r in b_on_a)


def _check_parallel_profile(prof, width_of, height, tmp_path):
    """Checks one profile of one tr_gate call from each of two threads; returns the worker
    threads spans ran on."""
    calls = _calls(prof, "tr_gate")
    assert len(calls) == 2 and {c.thread for c in calls} == set(width_of)
    by_id = {r.id: r for r in prof.records}
    spans = _spans(prof)
    assert {r.call for r in spans} == {c.id for c in calls}
    tiles = height // TILE
    for call in calls:
        width = width_of[call.thread]
        mine = _spans(prof, call)
        counts = collections.Counter((r.kind, r.name) for r in mine)
        assert counts == {("halide pipeline", "tr_gate"): 1, ("realization", "out"): 1,
                          ("production", "out"): 1, ("realization", "blur_x"): 1,
                          ("production", "blur_x"): 1, ("consumption", "blur_x"): 1,
                          ("realization", "blur_y"): tiles, ("production", "blur_y"): tiles,
                          ("consumption", "blur_y"): tiles, ("realization", "gate"): tiles,
                          ("production", "gate"): tiles, ("consumption", "gate"): tiles}
        assert sorted(r.box for r in mine if r.kind == "realization" and r.name == "blur_y") == \
            [((0, width), (k * TILE, TILE)) for k in range(tiles)]
        assert sorted(r.box for r in mine if r.kind == "realization" and r.name == "gate") == \
            [((k * TILE, TILE),) for k in range(tiles)]
        [realize_x] = [r for r in mine if r.kind == "realization" and r.name == "blur_x"]
        assert realize_x.box == ((0, width), (0, height + 2))
        for r in mine:
            assert call.start_ns <= r.start_ns and _end(r) <= _end(call)
            # its parent belongs to the same call (or is the call itself)
            parent = by_id[r.parent]
            assert parent.id == call.id or parent.call == call.id, (r, parent)
            if parent.id != call.id and parent.thread == r.thread:
                assert _inside(r, parent)
    workers = {r.thread for r in spans} - set(width_of)
    assert all(prof.thread_names.get(t) for t in workers)
    _check_records_nest(prof)
    trace = _check_json_nests(prof.save_trace(tmp_path / "trace.json"))
    tids = {e["tid"] for e in trace["traceEvents"] if e["ph"] == "X" and e["name"].startswith("realize ")}
    assert workers <= tids
    return workers


# --- 3. -trace_all: counts, sizes, the limit ---------------------------------------------------

def _blur_accesses(width, height, vector=1):
    """{Func: (loads, stores, values loaded, values stored)} the blur schedules make: blur_x
    (vectorized by ``vector``) reads inp 3 times per element of its W x (H+2), blur_y reads
    blur_x 3 times per element of its W x H, out reads blur_y once."""
    bx = width * (height + 2)
    return {"inp": (3 * bx // vector, 0, 3 * bx, 0),
            "blur_x": (3 * width * height, bx // vector, 3 * width * height, bx),
            "blur_y": (width * height, width * height, width * height, width * height),
            "out": (0, width * height, 0, width * height)}


def _counts(prof):
    return {f: (c.loads, c.stores, c.loaded_values, c.stored_values) for f, c in prof.accesses.items()}


def test_trace_all_counts_every_load_and_store_and_keeps_the_trace_small(load, tmp_path):
    width, height = 1024, 1024
    inp = _input(width, height)
    with shim.profile() as prof:
        _run_blur(load("tr_all"), inp)
    assert _counts(prof) == _blur_accesses(width, height, vector=8)
    assert prof.trace_dropped == 0
    path = prof.save_trace(tmp_path / "trace.json")
    size = os.path.getsize(path)
    assert size < 5_000_000, size
    trace = _check_json_nests(path)
    assert trace["otherData"]["halide loads and stores"]["inp"]["values loaded"] == 3 * width * (height + 2)
    assert len([r for r in _spans(prof) if r.name == "blur_y" and r.kind == "realization"]) == height // TILE
    assert "Loads and stores (Halide's tracing" in prof.summary()


def test_per_row_realizations_past_the_limit_keep_whole_spans_and_say_so(load, tmp_path):
    width, height = 256, 4096  # blur_y realized per row: 4096 realizations, 6 events each
    inp = _input(width, height)
    with shim.profile() as prof:
        _run_blur(load("tr_rows"), inp)
    assert _counts(prof) == _blur_accesses(width, height)
    spans = _spans(prof)
    assert prof.trace_dropped > 0
    assert 2 * len(spans) <= halide_trace.DEFAULT_LIMIT
    # the buffer filled up: what was left out is what did not fit
    assert 2 * len(spans) > halide_trace.DEFAULT_LIMIT - 2
    assert not _unfinished(prof), "a kept begin lost its end"
    realized = sorted(r.box[1][0] for r in spans if r.kind == "realization" and r.name == "blur_y")
    assert realized == list(range(len(realized)))  # the first rows, in order, whole
    _check_records_nest(prof)
    assert f"{prof.trace_dropped} begin events or samples were left out" in prof.summary()
    path = prof.save_trace(tmp_path / "trace.json")
    assert os.path.getsize(path) < 5_000_000
    trace = _check_json_nests(path)
    assert trace["otherData"]["halide trace events left out"] == prof.trace_dropped


def test_func_names_shared_by_two_pipelines_add_up(load):
    """tr_all and tr_rows both have blur_x, blur_y, out and inp (names at other addresses)."""
    width, height = 64, 16
    inp = _input(width, height)
    with shim.profile() as prof:
        _run_blur(load("tr_all"), inp)
        _run_blur(load("tr_rows"), inp)
    one, other = _blur_accesses(width, height, vector=8), _blur_accesses(width, height)
    assert _counts(prof) == {f: tuple(a + b for a, b in zip(one[f], other[f])) for f in one}


# --- 4. sampled accesses ---------------------------------------------------------------------

def _types_inputs(width, height):
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (height, width), dtype=np.uint8)
    h = (rng.random((height, width)) * 100).astype(np.float16)
    h[0, :4] = [np.inf, -np.inf, np.nan, 65504]  # 65504 * 2 overflows to inf in float16
    b = rng.random((height, width)) < 0.5
    return a, h, b


def _same(value, expected):
    if isinstance(expected, float) and math.isnan(expected):
        return isinstance(value, float) and math.isnan(value)
    return type(value) is type(expected) and value == expected


def test_sampled_loads_and_stores_carry_the_values_at_their_coordinates(load, tmp_path):
    width, height = 37, 23
    a, h, b = _types_inputs(width, height)
    every = 5
    with shim.profile(sample_accesses=every) as prof:
        res0, res1 = load("tr_types")(a, h, b, **{"res.0": np.empty((height, width), np.float32),
                                                  "res.1": np.empty((height, width), np.uint8)})
    xs = np.arange(width)[None, :]
    with np.errstate(over="ignore"):
        mid = (h * np.float16(2), b ^ (xs % 2 == 0))
    np.testing.assert_array_equal(res0, mid[0].astype(np.float32) + a.astype(np.float32))
    np.testing.assert_array_equal(res1, np.where(mid[1], a, np.uint8(7)))
    expected = {("a", 0): a, ("h", 0): h, ("b", 0): b, ("mid", 0): mid[0], ("mid", 1): mid[1],
                ("res", 0): res0, ("res", 1): res1}
    total = sum(c.loads + c.stores for c in prof.accesses.values())
    assert len(prof.samples) == -(-total // every)
    seen = collections.Counter()
    for s in prof.samples:
        x, y = s.coordinates
        assert s.lanes == 1
        want = expected[s.func, s.value_index][y, x].item()
        assert _same(s.value, want), (s, want)
        seen[s.func, s.value_index, s.kind] += 1
    assert set(seen) == {("a", 0, "load"), ("h", 0, "load"), ("b", 0, "load"), ("mid", 0, "store"),
                         ("mid", 1, "store"), ("mid", 0, "load"), ("mid", 1, "load"),
                         ("res", 0, "store"), ("res", 1, "store")}
    assert any(isinstance(s.value, float) and math.isinf(s.value) for s in prof.samples)
    trace = _check_json_nests(prof.save_trace(tmp_path / "trace.json"))  # strict JSON: no NaN
    instants = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    assert len(instants) == len(prof.samples)
    assert {e["name"] for e in instants} >= {"load a", "store res", "load h", "store mid"}


def test_sampled_vector_accesses_give_the_first_lanes_coordinates(load):
    width, height = 64, 16
    inp = _input(width, height)
    with shim.profile(sample_accesses=3) as prof:
        _run_blur(load("tr_all"), inp)
    blur_x, out = _blur(inp)
    checked = collections.Counter()
    for s in prof.samples:
        x, y = s.coordinates
        if s.func == "inp":
            assert s.lanes == 8 and s.value == inp[y, x].item()
        elif s.func == "blur_x" and s.kind == "store":
            assert s.lanes == 8 and s.value == pytest.approx(blur_x[y, x].item(), rel=1e-6)
        elif s.func == "out":
            assert s.lanes == 1 and s.value == pytest.approx(out[y, x].item(), rel=1e-5)
        checked[s.func, s.kind] += 1
    assert checked["inp", "load"] and checked["blur_x", "store"] and checked["out", "store"]


# --- 5. Halide's own printing outside a profile ------------------------------------------------

SHIM_PRINTS = """
import sys
import numpy as np
import shim
p = shim.load(sys.argv[1])
inp = np.load(sys.argv[2])
out = np.empty((inp.shape[0] - 2, inp.shape[1] - 2), np.float32)
p(inp, out=out)
with shim.profile():
    pass
with shim.profile() as prof:
    p(inp, out=out)  # recorded, not printed
assert any(r.kind == "realization" for r in prof.records)
p(inp, out=out)
"""


def _trace_lines(text):
    return [line for line in text.splitlines() if line]


def _stock_prints(libs, name, output, inp_path, shape, tmp_path):
    """What Halide's stock runtime prints (halide_print: stdout) for one call."""
    done = subprocess.run([sys.executable, "-m", "pipelines.stock", str(libs[name]), name,
                           str(tmp_path), f"inp={inp_path}", f"{output}={shape[0]}x{shape[1]}:float32"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return _trace_lines(done.stdout)


def test_outside_a_profile_halide_prints_as_its_own_runtime_does(libs, tmp_path):
    width, height = 32, 2 * TILE
    inp_path = tmp_path / "inp.npy"
    np.save(inp_path, _input(width, height))
    stock = _stock_prints(libs, "tr_blur", "out", inp_path, (height, width), tmp_path)
    assert stock[0] == "Begin pipeline tr_blur.0()" and stock[-1] == "End pipeline tr_blur.0()"
    assert len([line for line in stock if line.startswith("Begin realization blur_y")]) == height // TILE
    # the shim writes halide_print's text to stderr when the call returns (README)
    done = _child(SHIM_PRINTS, libs["tr_blur"], inp_path)
    assert _trace_lines(done.stderr) == stock * 2
    assert done.stdout == ""


SHIM_TRACE_FILE = """
import sys
import numpy as np
import shim
p = shim.load(sys.argv[1])
inp = np.load(sys.argv[2])
out = np.empty((inp.shape[0] - 2, inp.shape[1] - 2), np.float32)
p(inp, out=out)
with shim.profile():
    p(inp, out=out)  # recorded, not written
p(inp, out=out)
"""


def _without_padding(data: bytes) -> bytes:
    """Halide 21's binary trace with each packet's padding zeroed: Halide pads a packet to a
    multiple of 4 bytes without writing the padding, which holds whatever its buffer held
    (malloc's memory: zeros, or not, as glibc's heap has been used before)."""
    out, at = bytearray(data), 0
    while at < len(data):
        size = int.from_bytes(data[at:at + 4], "little")
        bits, lanes = data[at + 9], int.from_bytes(data[at + 10:at + 12], "little")
        dimensions = int.from_bytes(data[at + 24:at + 28], "little")
        name = at + 28 + 4 * dimensions + lanes * ((bits + 7) // 8)
        tag = data.index(b"\0", name) + 1
        end = data.index(b"\0", tag) + 1
        out[end:at + size] = bytes(at + size - end)
        at += size
    return bytes(out)


def test_outside_a_profile_hl_trace_file_gets_what_halide_writes(libs, tmp_path):
    width, height = 32, 2 * TILE
    inp_path = tmp_path / "inp.npy"
    np.save(inp_path, _input(width, height))
    stock_file, shim_file = tmp_path / "stock.trace", tmp_path / "shim.trace"
    done = subprocess.run([sys.executable, "-m", "pipelines.stock", str(libs["tr_blur"]), "tr_blur",
                           str(tmp_path), f"inp={inp_path}", f"out={height}x{width}:float32"],
                          capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, HL_TRACE_FILE=str(stock_file)))
    assert done.returncode == 0, done.stderr
    stock = stock_file.read_bytes()
    assert len(stock) > 0 and done.stdout == ""
    done = _child(SHIM_TRACE_FILE, libs["tr_blur"], inp_path,
                  env=dict(os.environ, HL_TRACE_FILE=str(shim_file)))
    assert done.stderr == ""
    written = shim_file.read_bytes()
    # the first call's packets byte for byte (the third's carry later ids of Halide's count)
    assert len(written) == 2 * len(stock)
    assert _without_padding(written)[:len(stock)] == _without_padding(stock)


def _balanced(lines):
    """Each Begin/Produce/Consume line of Halide's printed trace has its End line."""
    opened = collections.Counter()
    pairs = {"Begin realization": "End realization", "Produce": "End produce",
             "Consume": "End consume", "Begin pipeline": "End pipeline"}
    for line in lines:
        for begin, end in pairs.items():
            if line.startswith(begin + " "):
                opened[end + line[len(begin):]] += 1
            elif line.startswith(end + " "):
                opened[line] -= 1
    return {line: n for line, n in opened.items() if n}


def test_a_call_a_profile_starts_in_the_middle_of_prints_whole(libs, load, tmp_path, capsys):
    """Halide's printed trace of a call stays whole: a span Halide printed the begin of gets its
    end printed even when a profile has started since."""
    width, height = 1024, 1024
    inp = _input(width, height)
    inp_path = tmp_path / "inp.npy"
    np.save(inp_path, inp)
    stock = _stock_prints(libs, "tr_slow", "slow", inp_path, (height, width), tmp_path)
    pipeline = load("tr_slow")
    out = np.empty((height, width), np.float32)
    for _ in range(5):
        capsys.readouterr()
        finished = []
        t = threading.Thread(target=lambda: (pipeline(inp, slow=out), finished.append(time.perf_counter_ns())))
        t.start()
        time.sleep(0.05)
        started = time.perf_counter_ns()
        with shim.profile() as prof:
            t.join()
        if not _spans(prof) and finished[0] > started:
            break  # the call began before the profile and ended inside it
    else:
        pytest.fail("could not start a profile in the middle of a call")
    printed = _trace_lines(capsys.readouterr().err)
    assert _balanced(printed) == {}
    assert printed == stock


def test_a_profile_stopped_mid_call_prints_no_ends_of_what_it_recorded(load, capsys):
    width, height = 1024, 1024
    inp = _input(width, height)
    pipeline = load("tr_slow")
    out = np.empty((height, width), np.float32)
    for _ in range(5):
        capsys.readouterr()
        prof = shim.profile().start()
        t = threading.Thread(target=pipeline, args=(inp,), kwargs={"slow": out})
        try:
            t.start()
            while lib.shim_trace_count() < 3 and t.is_alive():
                time.sleep(0.0002)
        finally:
            prof.stop()
        alive = t.is_alive()
        t.join()
        if alive:
            break
    else:
        pytest.fail("could not stop a profile in the middle of a call")
    assert capsys.readouterr().err == ""
    unfinished = _unfinished(prof)
    assert {(r.kind, r.name) for r in unfinished} == {("halide pipeline", "tr_slow"),
                                                      ("realization", "slow"), ("production", "slow")}
    _check_records_nest(prof)


# --- 6. bad arguments --------------------------------------------------------------------------

@pytest.mark.parametrize("argument, value", [
    ("trace_limit", -1), ("trace_limit", "x"), ("trace_limit", True), ("trace_limit", 2**31),
    ("trace_limit", 1.5), ("sample_accesses", 2**40), ("sample_accesses", -1),
    ("sample_accesses", None)])
def test_bad_arguments_raise_argument_errors_naming_them(argument, value):
    assert shim.ArgumentError is shim.base.errors.ArgumentError
    with pytest.raises(shim.ArgumentError) as caught:
        shim.profile(**{argument: value})
    assert caught.value.argument == argument and argument in str(caught.value)


def test_a_trace_limit_the_memory_cannot_hold_is_refused_clearly(load, monkeypatch):
    limit = 2**31 - 1
    needed = limit * halide_trace.EVENT_BYTES  # about 270 GB
    # (a machine with less memory than the buffer needs, whatever this one has)
    monkeypatch.setattr(halide_trace, "_physical_memory", lambda: 64 * 2**30)
    with pytest.raises(shim.ShimError, match="memory") as caught:
        shim.profile(trace_limit=limit).start()
    assert "trace_limit" in str(caught.value) and "64.0 GiB" in str(caught.value)
    assert f"{needed / 2**30:.1f} GiB" in str(caught.value)
    # one just too small, one just large enough
    monkeypatch.setattr(halide_trace, "_physical_memory", lambda: 1000 * halide_trace.EVENT_BYTES - 1)
    with pytest.raises(shim.ShimError, match="trace_limit"):
        shim.profile(trace_limit=1000).start()
    monkeypatch.setattr(halide_trace, "_physical_memory", lambda: 1000 * halide_trace.EVENT_BYTES)
    shim.profile(trace_limit=1000).start().stop()
    with shim.profile(trace_limit=10) as after:  # nothing was left half-started
        _run_blur(load("tr_blur"), _input(16, TILE))
    assert after.trace_dropped > 0


# --- limits at the edges -----------------------------------------------------------------------

def test_trace_limits_of_zero_and_one(load, tmp_path):
    inp = _input(16, 2 * TILE)
    with shim.profile() as full:
        _run_blur(load("tr_blur"), inp)
    begins = len(_spans(full))
    for limit in (0, 1):
        with shim.profile(trace_limit=limit) as prof:
            _run_blur(load("tr_blur"), inp)
        assert _spans(prof) == [] and prof.trace_dropped == begins
        assert "left out" in prof.summary()
        _check_json_nests(prof.save_trace(tmp_path / f"{limit}.json"))
    with shim.profile(trace_limit=1, sample_accesses=1) as prof:
        _run_blur(load("tr_all"), inp)
    assert len(prof.samples) == 1 and _spans(prof) == []
    assert prof.samples[0].kind == "load" and prof.samples[0].func == "inp"


@pytest.mark.parametrize("every", [1, 2, 3, 1000])
def test_the_summary_says_how_many_accesses_were_kept(load, every):
    with shim.profile(sample_accesses=every) as prof:
        _run_blur(load("tr_all"), _input(16, TILE))
    title = prof.summary().split("Loads and stores (Halide's tracing, counted per Func")[1].split("\n")[0]
    assert f"1 in {every} kept" in title and "th kept" not in title


def test_ten_dimensions_and_a_very_long_name(load, tmp_path):
    a = np.arange(20, dtype=np.int16) * 3
    with shim.profile(sample_accesses=1) as prof:
        out = load("tr_dims")(a, dout=np.empty(20, np.int32))
    weights = np.arange(10)
    g = lambda x, rest: a[x].astype(np.int32) + int(np.dot(weights[1:], rest))  # noqa: E731
    np.testing.assert_array_equal(out, [g(x, [0] * 8 + [1]) + g(x, [1] * 9) + 2 * a[x] for x in range(20)])
    [g10] = [r for r in _spans(prof) if r.kind == "realization" and r.name.startswith("g10")]
    # 20 coordinates, 16 kept: the box's first 8 dimensions, as Halide realized them
    assert g10.box == ((0, 20),) + ((0, 2),) * 7
    [long_realization] = [r for r in _spans(prof) if r.kind == "realization" and r.name == LONG_NAME]
    assert long_realization.box == ((0, 20),)
    assert prof.accesses[LONG_NAME].stores == 20
    stores = [s for s in prof.samples if s.func == g10.name and s.kind == "store"]
    assert len(stores) == 20 * 2**8  # (the tenth dimension has extent 1)
    for s in stores:
        assert len(s.coordinates) == 10 and s.value == g(s.coordinates[0], s.coordinates[1:])
    assert LONG_NAME in prof.summary()
    trace = _check_json_nests(prof.save_trace(tmp_path / "trace.json"))
    assert any(e.get("name") == "realize " + LONG_NAME for e in trace["traceEvents"])


# --- stopping and starting while pipelines run --------------------------------------------------

def test_a_span_begun_in_an_earlier_profile_takes_no_room_in_the_next(load):
    """A profile stopped while a call on another thread is mid-call: its spans are drawn to the
    profile's end; their ends, arriving during the next profile, take none of its room."""
    big, small = load("tr_slow"), load("tr_blur")
    width, height = 1024, 1024
    inp, small_inp = _input(width, height), _input(16, 2 * TILE)
    with shim.profile() as reference:
        _run_blur(small, small_inp)
    spans = len(_spans(reference))
    for _ in range(5):
        first = shim.profile().start()
        t = threading.Thread(target=big, args=(inp,), kwargs={"slow": np.empty((height, width), np.float32)})
        try:
            t.start()
            while lib.shim_trace_count() < 3 and t.is_alive():
                time.sleep(0.0002)
        finally:
            first.stop()
        second = shim.profile(trace_limit=2 * spans).start()
        try:
            mid_call = t.is_alive()
            t.join()  # its ends arrive now
            _run_blur(small, small_inp)
        finally:
            second.stop()
        if mid_call:
            break
    else:
        pytest.fail("could not stop a profile in the middle of a call")
    assert len(_unfinished(first)) == 3
    _check_records_nest(first)
    [call] = _calls(second, "tr_blur")
    assert len(_spans(second, call)) == spans
    assert _unfinished(second) == [] and second.trace_dropped == 0


MID_CALL = """
import ctypes, json, sys, threading, time
import numpy as np
import shim, shim.native.threads
p, gates = shim.load(sys.argv[1]), ctypes.CDLL(sys.argv[1])
HELD, TILE = int(sys.argv[2]), int(sys.argv[3])
shim.native.threads.set_num_threads(3)
width, height = 64, 32 * TILE
inp = np.random.default_rng(0).random((height + 2, width + 2), dtype=np.float32)
out = np.empty((height, width), np.float32)
caller = []
t = threading.Thread(target=lambda: (caller.append(threading.get_native_id()), p(inp, 3, out=out)))
t.start()
while gates.tr_gate_count(HELD) < 2:  # the calling thread's task and a worker's are held
    time.sleep(0.001)
prof = shim.profile().start()  # in the middle of the parallel loop: Halide printed its begin
gates.tr_gate_release()
t.join()
prof.stop()
np.save(sys.argv[4], out)
print(json.dumps({"caller": caller[0], "records": [
    [r.kind, r.name, r.id, r.parent, r.call, r.thread, r.start_ns, r.duration_ns, r.box]
    for r in prof.records]}))
"""


def test_a_span_whose_parent_halide_began_before_the_profile_belongs_to_its_call(libs, tmp_path):
    """A profile starts while a call is in its parallel loop (tasks held in the gate, on the
    calling thread and on a worker): the spans begun since have parent ids that Halide's own
    handler gave out (the production of out; a held task's realization of gate), no ids of
    this profile's. Each such span belongs to its call (None: the call began before the
    profile), not to whichever span of the profile had the same id bits."""
    out_path = tmp_path / "out.npy"
    done = _child(MID_CALL, libs["tr_gate"], GATE_COUNTS["held"], TILE, out_path)
    result = json.loads(done.stdout)
    fields = ("kind", "name", "id", "parent", "call", "thread", "start_ns", "duration_ns", "box")
    records = [dict(zip(fields, r)) for r in result["records"]]
    by_id = {r["id"]: r for r in records}
    spans = [r for r in records if r["kind"] in SPAN_KINDS]
    # what the profile saw of the call: the tasks' spans, inside the production of out
    counts = collections.Counter((r["kind"], r["name"]) for r in spans)
    tiles = 32
    assert counts[("consumption", "gate")] == tiles and counts[("realization", "blur_y")] < tiles
    assert set(counts) <= {(kind, name) for kind in ("realization", "production", "consumption")
                           for name in ("blur_y", "gate")}
    assert all(r["call"] is None for r in records)  # (the call is not the profile's)

    def end(r):
        return r["start_ns"] + r["duration_ns"]
    for r in spans:
        if r["parent"] is not None:  # a span enclosing it on its thread
            parent = by_id[r["parent"]]
            assert parent["thread"] == r["thread"], (r, parent)
            assert parent["start_ns"] <= r["start_ns"] and end(r) <= end(parent), (r, parent)
    # tasks begun since the start: their realizations' parent is the production of out
    begun = [r for r in spans if r["kind"] == "realization" and r["name"] == "blur_y"]
    assert len(begun) >= tiles - 3 and all(r["parent"] is None for r in begun)
    # the held tasks' consumptions of gate, one on a worker at least: their parent is the
    # realization of gate begun before the start
    held = [r for r in spans if r["kind"] == "consumption" and r["name"] == "gate"
            and not any(_inside_dicts(r, s) for s in begun)]
    assert len(held) >= 2 and {r["thread"] for r in held} - {result["caller"]}
    assert all(r["parent"] is None for r in held)
    inp = np.random.default_rng(0).random((tiles * TILE + 2, 64 + 2), dtype=np.float32)
    np.testing.assert_allclose(np.load(out_path), _blur(inp)[1], rtol=1e-5)


def _inside_dicts(inner, outer):
    return inner["thread"] == outer["thread"] and outer["start_ns"] <= inner["start_ns"] and \
        inner["start_ns"] + inner["duration_ns"] <= outer["start_ns"] + outer["duration_ns"]


def test_spans_whose_end_came_after_the_stop_end_by_their_calls_end(load):
    """A call that returns after the trace stopped but before the profile took its end: its
    unfinished spans are drawn to the call's end, not past it (recording stopped by hand here,
    as Profile.stop does a moment before it takes the profile's end)."""
    pipeline = load("tr_slow")
    width, height = 1024, 1024
    inp = _input(width, height)
    for _ in range(5):
        prof = shim.profile().start()
        t = threading.Thread(target=pipeline, args=(inp,), kwargs={"slow": np.empty((height, width), np.float32)})
        try:
            t.start()
            while lib.shim_trace_count() < 3 and t.is_alive():
                time.sleep(0.0002)
            lib.shim_trace_stop()
            mid_call = t.is_alive()
            t.join()
        finally:
            prof.stop()
        if mid_call:
            break
    else:
        pytest.fail("could not stop the trace in the middle of a call")
    [call] = _calls(prof, "tr_slow")
    assert 0 < _end(call) < prof.duration_ns
    assert {(r.kind, r.name) for r in _unfinished(prof)} == {
        ("halide pipeline", "tr_slow"), ("realization", "slow"), ("production", "slow")}
    assert all(_end(r) == _end(call) for r in _unfinished(prof))
    _check_records_nest(prof)


def test_many_short_profiles_while_other_threads_call(load, tmp_path):
    """One thread calls a parallel -trace_realizations build, another a -trace_all build,
    without pause, while profiles start and stop: every stop waits for the handlers still
    writing, so what each profile kept is whole and right."""
    blur, everything = load("tr_par"), load("tr_all")
    inp = _input(256, 16 * TILE)
    small = _input(64, 16)
    stop = threading.Event()
    errors = []

    def work(pipeline, inp):
        try:
            while not stop.is_set():
                _run_blur(pipeline, inp)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(blur, inp)),
               threading.Thread(target=work, args=(everything, small))]
    for t in threads:
        t.start()
    complete = sampled = 0
    try:
        for i in range(150):
            prof = shim.profile(trace_limit=(40, 400, 20000)[i % 3], sample_accesses=i % 3 * 7)
            prof.start()
            started = time.perf_counter_ns()  # (the profile's times count from before this)
            try:
                time.sleep(0.001 * (i % 4))
            finally:
                stopping = time.perf_counter_ns()
                prof.stop()
            _check_records_nest(prof)
            unfinished = {r.id for r in _unfinished(prof)}
            for call in _calls(prof, "tr_par"):
                assert all(_end(r) <= _end(call) for r in _spans(prof, call)) or not call.duration_ns
                if call.duration_ns and started + _end(call) < stopping:
                    # a call that returned before the stop: every span of it kept has its end
                    complete += 1
                    assert not unfinished & {r.id for r in _spans(prof, call)}
            for s in prof.samples:
                if s.func == "inp":
                    sampled += 1
                    x, y = s.coordinates
                    assert s.value == small[y, x].item()
            if i % 25 == 0:
                _check_json_nests(prof.save_trace(tmp_path / "t.json"))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors
    assert complete and sampled


RACE = """
import sys, threading
import numpy as np
import shim
p = shim.load(sys.argv[1])
width, height = 64, 2048
inp = np.random.default_rng(0).random((height + 2, width + 2), dtype=np.float32)
stop = threading.Event()

def other():
    while not stop.is_set():
        try:
            with shim.profile(trace_limit=10):
                pass
        except shim.ShimError as e:
            assert "another profile is recording" in str(e), e

t = threading.Thread(target=other)
t.start()
wrong = []
for i in range(30):
    while True:
        try:
            prof = shim.profile().start()
            break
        except shim.ShimError:
            pass
    p(inp, out=np.empty((height, width), np.float32))
    prof.stop()
    n = sum(1 for r in prof.records if r.kind == "realization" and r.name == "blur_y")
    if n != height // 8:
        wrong.append(n)
stop.set()
t.join()
assert not wrong, wrong
print("ok")
"""


def test_a_profile_started_on_another_thread_as_one_stops_takes_nothing_from_it(libs):
    """Profile.stop() reads the trace after letting other threads start profiles: the next
    start must not free or reset what the stopped one still reads."""
    done = _child(RACE, libs["tr_blur"])
    assert done.stdout.strip() == "ok"


RESTART = """
import sys, threading
import numpy as np
import shim
from shim.native import lib
p = shim.load(sys.argv[1])
inp = np.random.default_rng(0).random((66, 258), dtype=np.float32)
stop = threading.Event()


def work():
    out = np.empty((64, 256), np.float32)
    while not stop.is_set():
        p(inp, out=out)


threads = [threading.Thread(target=work) for _ in range(2)]
for t in threads:
    t.start()
try:
    # every access kept: the handlers of both calls (and of Halide's workers) write into the
    # buffer all the time; each start replaces it while the recording before is still on
    for i in range(300):
        assert lib.shim_trace_start(200000, 1) == 0
finally:
    stop.set()
    for t in threads:
        t.join()
    lib.shim_trace_stop()
print("ok")
"""


def test_a_start_while_recording_stops_the_recording_before_it_frees_the_buffer(libs):
    """What an exception between halide_trace.start() and the profile becoming active leaves:
    a recording on with no profile. The next start replaces the buffer only once no handler
    writes into it any more. (Freed buffers this size are given back to the system at once
    here, so a write into one crashes.)"""
    done = _child(RESTART, libs["tr_all"], env=dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536"))
    assert done.stdout.strip() == "ok"


FORK = """
import os, sys, threading
import numpy as np
import shim
p = shim.load(sys.argv[1])
inp = np.random.default_rng(0).random((18, 18), dtype=np.float32)
with shim.profile() as prof:
    p(inp, out=np.empty((16, 16), np.float32))
assert {r.thread for r in prof.records} == {threading.get_native_id()}
pid = os.fork()
if pid == 0:
    code = 1
    try:
        with shim.profile() as prof:
            p(inp, out=np.empty((16, 16), np.float32))
        threads = {(r.kind, r.thread) for r in prof.records if r.kind in ("realization", "pipeline")}
        me = threading.get_native_id()
        print(sorted(threads), me, flush=True)
        code = 0 if threads == {("realization", me), ("pipeline", me)} else 3
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_spans_in_a_forked_child_are_on_the_childs_thread(libs):
    _child(FORK, libs["tr_blur"])


# --- whose end is it: crafted events through halide_trace ---------------------------------------

# A child process's preamble: halide_trace called through ctypes with crafted events, as a
# pipeline calls it, and the counter from which Halide's own handler hands out ids (a local
# static of halide_default_trace in shim._native, found through the library's symbol table),
# so that a test can have Halide hand out the ids it reaches after 2**30 events.
CRAFT = r'''
import ctypes, subprocess, sys, threading
import shim
from shim import _native
from shim.profiling import halide_trace

so = ctypes.CDLL(_native.__file__)


class HalideType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class Event(ctypes.Structure):  # struct halide_trace_event_t
    _fields_ = [("func", ctypes.c_char_p), ("value", ctypes.c_void_p),
                ("coordinates", ctypes.POINTER(ctypes.c_int32)), ("trace_tag", ctypes.c_char_p),
                ("type", HalideType), ("event", ctypes.c_int), ("parent_id", ctypes.c_int32),
                ("value_index", ctypes.c_int32), ("dimensions", ctypes.c_int32)]


so.halide_trace.argtypes = [ctypes.c_void_p, ctypes.POINTER(Event)]
so.halide_trace.restype = ctypes.c_int32
(LOAD, STORE, BEGIN, END, PRODUCE, END_PRODUCE, CONSUME, END_CONSUME, BEGIN_PIPELINE,
 END_PIPELINE) = range(10)

symbols = {}
for line in subprocess.run(["nm", _native.__file__], capture_output=True, text=True,
                           check=True).stdout.splitlines():
    fields = line.split()
    if len(fields) == 3:
        symbols[fields[2]] = int(fields[0], 16)
base = ctypes.cast(so.halide_default_trace, ctypes.c_void_p).value - symbols["halide_default_trace"]
halide_ids = ctypes.c_int32.from_address(base + symbols["_ZZ20halide_default_traceE3ids"])
BOX = (ctypes.c_int32 * 2)(0, 10)
VALUE = ctypes.c_float(1.5)


NAMES = {}  # (a Func is known by its name's address, a constant in a pipeline's library)


def trace(event, parent_id=0, func="f"):
    """halide_trace as a pipeline calls it; returns the id it gives back."""
    access = event in (LOAD, STORE)
    pipeline = event in (BEGIN_PIPELINE, END_PIPELINE)
    e = Event(NAMES.setdefault(func, func.encode()), ctypes.cast(ctypes.byref(VALUE), ctypes.c_void_p) if access else None,
              None if pipeline else BOX, None, HalideType(2, 32, 1) if access else HalideType(0, 0, 0),
              event, parent_id, 0, 0 if pipeline else 2)
    return so.halide_trace(None, ctypes.byref(e))


def mark(text):
    """A line of our own between what Halide prints (both go to stderr)."""
    sys.stderr.flush()
    sys.stderr.write("## " + text + "\n")
    sys.stderr.flush()
'''


def _printed(stderr):
    """{mark: [lines Halide printed after it]} from a CRAFT child's stderr."""
    parts, current = {}, None
    for line in _trace_lines(stderr):
        if line.startswith("## "):
            current = line[3:]
            parts[current] = []
        else:
            parts[current].append(line)
    return parts


HALIDES_IDS = CRAFT + r'''
def call(first_id):
    """The events of one call, all printed by Halide's handler, its ids counting from first_id."""
    halide_ids.value = first_id
    p = trace(BEGIN_PIPELINE, 0, "p")
    assert p == first_id, (hex(p), hex(first_id))
    r = trace(BEGIN, p, "r")
    q = trace(PRODUCE, r, "r")
    trace(END_PRODUCE, q, "r")
    c = trace(CONSUME, r, "r")
    trace(END_CONSUME, c, "r")
    trace(END, r, "r")
    trace(END_PIPELINE, p, "p")


for first_id in (5, 0x3FFFFFFE, 0x40000005, 0x7FFFFFF0 - 4):
    mark(hex(first_id))
    call(first_id)
'''


def test_outside_a_profile_halide_prints_the_ends_of_its_spans_whatever_its_ids(libs):
    """Halide's handler takes an id for every event, loads and stores included, so after some
    2**30 events of a -trace_all build its ids carry the bit our own ids are marked with:
    the ends of its spans are printed all the same."""
    parts = _printed(_child(HALIDES_IDS).stderr)
    reference = parts.pop("0x5")  # ids far from the bit
    assert reference == ["Begin pipeline p.0()", "Begin realization r.0(0, 10)",
                         "Produce r.0(0, 10)", "End produce r.0(0, 10)", "Consume r.0(0, 10)",
                         "End consume r.0(0, 10)", "End realization r.0(0, 10)",
                         "End pipeline p.0()"]
    assert parts == {k: reference for k in ("0x3ffffffe", "0x40000005", "0x7fffffec")}


HALIDES_END_WHILE_RECORDING = CRAFT + r'''
mark("reference")
r = trace(BEGIN, 0, "h")
trace(END, r, "h")
halide_ids.value = 0x40000005  # (past 2**30 events: the bit of the ids a profile keeps)
mark("around")
h = trace(BEGIN, 0, "h")  # Halide's
assert h == 0x40000005
halide_trace.start(12, 0)  # room for 6 spans
for k in range(5):
    i = trace(BEGIN, 0, "k%d" % k)  # kept: our ids count from 1 in a new process
    assert i & 0x40000000 and i & 0x3FFFFFFF == k + 1, hex(i)
    trace(END, i, "k%d" % k)
trace(END, h, "h")  # Halide's: printed, and takes none of the profile's room
last = trace(BEGIN, 0, "last")
trace(END, last, "last")
t = halide_trace.stop()
mark("after")
print(repr(([(s.func, s.end_ns is not None) for s in t.spans], t.dropped,
            halide_trace.lib.shim_trace_count())))
'''


def test_the_end_of_a_span_halide_began_before_a_profile_goes_to_halide_whatever_its_id(libs):
    done = _child(HALIDES_END_WHILE_RECORDING)
    parts = _printed(done.stderr)
    assert parts["reference"] == ["Begin realization h.0(0, 10)", "End realization h.0(0, 10)"]
    assert parts["around"] == parts["reference"] and parts["after"] == []
    # the profile kept its six spans whole, in the twelve slots it had
    spans, dropped, count = eval(done.stdout)
    assert spans == [("k%d" % k, True) for k in range(5)] + [("last", True)]
    assert dropped == 0 and count == 12


OWNERS = CRAFT + r'''
# 1. a profile's spans: their ends are never printed; an end from an older profile takes no room
halide_trace.start(100, 0)
old = trace(BEGIN, 0, "old")  # ends in the next profile
t = halide_trace.stop()
assert [s.end_ns for s in t.spans] == [None]
halide_trace.start(4, 0)
trace(END, old, "old")  # swallowed: neither printed nor recorded
a = trace(BEGIN, 0, "a")
b = trace(BEGIN, a, "b")
left_out = trace(BEGIN, b, "left_out")  # no room: left out, and so is its end
assert left_out == 0
trace(END, left_out, "left_out")
trace(END, b, "b")
trace(END, a, "a")
t = halide_trace.stop()
assert [(s.func, s.end_ns is not None) for s in t.spans] == [("a", True), ("b", True)], t.spans
assert t.dropped == 1 and halide_trace.lib.shim_trace_count() == 4

# 2. a call that failed midway: its begins never get their ends; the ends that come later
# close the right spans, printed by Halide
mark("failed call")
halide_ids.value = 0x40000005
outer = trace(BEGIN, 0, "outer")
trace(BEGIN, outer, "stale")  # never ends
trace(BEGIN, outer, "stale2")  # never ends
trace(END, outer, "outer")
halide_trace.start(100, 0)
outer = trace(BEGIN, 0, "outer")
trace(BEGIN, outer, "stale")  # never ends
trace(END, outer, "outer")
t = halide_trace.stop()
assert [(s.func, s.end_ns is not None) for s in t.spans] == [("outer", True), ("stale", False)]

# 3. spans nested deeper than the handler's stack holds: the ends of the outermost, which it
# lost, are routed by their ids (Halide's not yet past 2**30 events)
mark("deep")
DEEP = 300
halide_ids.value = 1000
ids = [trace(BEGIN, 0, "d%d" % k) for k in range(DEEP)]
for k in reversed(range(DEEP)):
    trace(END, ids[k], "d%d" % k)
halide_trace.start(2 * DEEP, 0)
ids = [trace(BEGIN, 0, "e%d" % k) for k in range(DEEP)]
for k in reversed(range(DEEP)):
    trace(END, ids[k], "e%d" % k)
t = halide_trace.stop()
assert len(t.spans) == DEEP and all(s.end_ns is not None for s in t.spans)
assert halide_trace.lib.shim_trace_count() == 2 * DEEP
mark("end")
'''


def test_each_end_goes_where_its_begin_went(libs):
    """A profile's ends are recorded by the profile that kept their begin, never printed;
    stale begins of a call that failed midway and nesting deeper than the handler's stack do
    not send an end to the wrong place."""
    parts = _printed(_child(OWNERS).stderr)
    assert None not in parts  # (nothing printed before the first mark)
    assert parts["failed call"] == ["Begin realization outer.0(0, 10)",
                                    "Begin realization stale.0(0, 10)",
                                    "Begin realization stale2.0(0, 10)",
                                    "End realization outer.0(0, 10)"]
    deep = parts["deep"]
    assert deep == [f"Begin realization d{k}.0(0, 10)" for k in range(300)] + \
        [f"End realization d{k}.0(0, 10)" for k in reversed(range(300))]
    assert parts["end"] == []


NO_MEMORY_FOR_NAMES = r"""
#include <stdlib.h>
#include <string.h>

/* strdup as the C library's, except that it fails for names beginning with "nomem_" */
char *strdup(const char *s) {
    if (strncmp(s, "nomem_", 6) == 0) {
        return NULL;
    }
    size_t n = strlen(s) + 1;
    char *copy = malloc(n);
    return copy == NULL ? NULL : memcpy(copy, s, n);
}
"""

NAMELESS = CRAFT + r'''
halide_trace.start(100, 0)
for _ in range(3):
    trace(LOAD, 0, "nomem_f")
trace(STORE, 0, "nomem_f")
trace(LOAD, 0, "g")
r = trace(BEGIN, 0, "nomem_r")
trace(END, r, "nomem_r")
t = halide_trace.stop()
print(repr(({f: (c.loads, c.stores) for f, c in t.accesses.items()},
            [(s.kind, s.func, s.end_ns is not None) for s in t.spans])))
'''


def test_a_func_whose_name_cannot_be_copied_is_counted_among_other_funcs(libs, tmp_path):
    """The handler copies each Func's name (it must outlive the pipeline's library); where
    there is no memory for the copy, that Func's loads and stores still count, among "(other
    Funcs)" (a strdup that fails for some names, preloaded)."""
    source, preload = tmp_path / "nomem.c", tmp_path / "nomem.so"
    source.write_text(NO_MEMORY_FOR_NAMES)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(preload), str(source)], check=True)
    done = _child(NAMELESS, env=dict(os.environ, LD_PRELOAD=str(preload)))
    accesses, spans = eval(done.stdout)
    assert accesses == {"(other Funcs)": (3, 1), "g": (1, 0)}
    assert spans == [("realization", "(other Funcs)", True)]


def test_the_trace_event_codes_declared_are_halides():
    """abi/halide_runtime.h declares halide_trace_event_code_t for cffi, which takes the
    values from Halide's real header when it compiles: the declaration says the same."""
    text = (ROOT / "abi" / "halide_runtime.h").read_text()
    body = text.split("enum halide_trace_event_code_t {")[1].split("}")[0]
    declared = {name.strip(): int(value) for name, value in
                (item.split("=") for item in body.replace("\n", " ").split(",") if "=" in item)}
    assert declared == {name: getattr(lib, name) for name in declared}
    assert list(declared.values()) == list(range(11))
    assert lib.SHIM_TRACE_COORDINATES == len(ffi.new("shim_trace_event *").coordinates)

