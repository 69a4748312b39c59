"""Halide 22's tracing, served to Halide 22 libraries beside Halide 21's
(native_stubs/profiling/tracing.c and trace_handlers.c, shim/profiling/halide_trace.py).

The Halide 22 pipeline is tests/support/halide22_instrumented.c's h22_trace: hand-written as
Halide 22's generated code traces (the 13-argument halide_trace_helper, each event's parent
the innermost scope around it, a begin/end_parallel_task pair around each task of its parallel
loop with halide_current_thread_id), so every event is known from its own numbers. Halide
21's is the sample blur3x3 built with -trace_all, whose events are those Halide 21 emits:
references for it come from a run of it alone. What is printed or written to HL_TRACE_FILE
is checked in a child process."""

from __future__ import annotations

import collections
import ctypes
import itertools
import json
import os
import re
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import shim
import shim.native.threads
from shim.native import ffi, lib
from shim.pipelines.build import RUNTIMES, Build, build
from shim.profiling import halide_trace
from support.releases import halide22_instrumented
from support.threads import run_threads

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HANG_GUARD_S = 300  # a child that hangs fails after this long (never a check of speed)
LANES = 4  # h22_trace's vector width (its loads of in22, its stores to row22)
BEGIN_TASK, END_TASK = lib.halide22_trace_begin_parallel_task, lib.halide22_trace_end_parallel_task


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    return halide22_instrumented(tmp_path_factory.mktemp("h22_trace"))


@pytest.fixture(scope="module")
def trace22(library):
    return shim.load(library, name="h22_trace")


@pytest.fixture(scope="module", params=RUNTIMES)
def blur21(request):
    """(path, Pipeline): Halide 21's blur3x3 built with -trace_all, its runtime bundled or
    not."""
    path = build(Build("blur3x3", "host", request.param, features=("trace_all",)))
    return path, shim.load(path)


@pytest.fixture
def threads3():
    """Three threads in Halide's pool (two workers), so that tasks run on two threads or more
    (h22_trace's first task waits for another to begin)."""
    previous = shim.native.threads.set_num_threads(3)
    yield
    shim.native.threads.set_num_threads(previous)


def _image(width, height, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (height, width), dtype=np.uint8)


def run22(pipeline, width, height, seed=0):
    image = _image(width, height, seed)
    out = pipeline(image, image.shape).numpy()
    np.testing.assert_array_equal(out, (2 * (image.astype(np.int64) + 1)) % 256)
    return image


def run21(pipeline, width, height):
    pipeline(np.ones((height + 2, width + 2), np.uint16), output=(height, width))


def accesses22(width, height, calls=1) -> dict:
    """h22_trace's loads and stores per Func: (loads, stores, values loaded, values stored)."""
    points = width * height * calls
    return {"in22": halide_trace.AccessCounts(points // LANES, 0, points, 0),
            "row22": halide_trace.AccessCounts(points, points // LANES, points, points),
            "out22": halide_trace.AccessCounts(0, points, 0, points)}


# --- while a profile records -------------------------------------------------------------------

def test_a_halide22_call_keeps_its_parallel_tasks_as_spans_with_their_threads(trace22, threads3):
    width, height = 16, 6
    halide_trace.start(10_000, 0)
    try:
        run22(trace22, width, height)
    finally:
        trace = halide_trace.stop()
    assert trace.dropped == 0
    kinds = collections.Counter((s.kind, s.func) for s in trace.spans)
    assert kinds == {("halide pipeline", "h22_trace"): 1, ("realization", "out22"): 1,
                     ("production", "out22"): 1, ("parallel task", "out22.s0.y"): height,
                     ("realization", "row22"): height, ("production", "row22"): height,
                     ("consumption", "row22"): height}
    by_id = {s.halide_id: s for s in trace.spans}
    [pipeline] = [s for s in trace.spans if s.kind == "halide pipeline"]
    [realization] = [s for s in trace.spans if s.kind == "realization" and s.func == "out22"]
    [production] = [s for s in trace.spans if s.kind == "production" and s.func == "out22"]
    assert (realization.parent_id, production.parent_id) == \
        (pipeline.halide_id, realization.halide_id)
    assert realization.box == production.box == ((0, width), (0, height))
    tasks = [s for s in trace.spans if s.kind == "parallel task"]
    for task in tasks:
        # each task names its thread as the OS does, on the thread the handler saw it on
        assert task.halide_thread_id == task.thread > 0
        assert task.parent_id == production.halide_id and task.box == ((0, height),)
        assert task.start_ns <= task.end_ns
    assert len({t.thread for t in tasks}) >= 2  # (the pool's workers took some)
    for span in trace.spans:
        if span.func == "row22":
            # the parent chain of what a task computes leads to its task, on its thread
            up = span
            while up.kind != "parallel task":
                up = by_id[up.parent_id]
            assert up.thread == span.thread and span.halide_thread_id == 0
            assert up.start_ns <= span.start_ns <= span.end_ns <= up.end_ns
            assert span.box == ((0, width),)
    # every task's realization of row22, one each
    assert sorted(by_id[s.parent_id].halide_id for s in trace.spans
                  if s.kind == "realization" and s.func == "row22") == \
        sorted(t.halide_id for t in tasks)
    assert trace.accesses == accesses22(width, height)


def test_a_profiles_records_nest_tasks_under_their_production(trace22, threads3, tmp_path):
    width, height = 8, 5
    with shim.profile() as prof:
        run22(trace22, width, height)
    records = {r.id: r for r in prof.records}
    [production] = [r for r in prof.records if r.kind == "production" and r.name == "out22"]
    tasks = [r for r in prof.records if r.kind == "parallel task"]
    assert len(tasks) == height and all(t.parent == production.id for t in tasks)
    assert all(t.box == ((0, height),) for t in tasks)
    for r in prof.records:
        if r.kind == "realization" and r.name == "row22":
            assert records[r.parent].kind == "parallel task"
            assert records[r.parent].thread == r.thread
    assert prof.accesses == accesses22(width, height)
    assert "Realizations of h22_trace" in prof.summary()
    slices = [e["name"] for e in json.loads(open(prof.save_trace(tmp_path / "t.json")).read())
              ["traceEvents"] if e.get("ph") == "X"]
    assert slices.count("task out22.s0.y") == height


def test_sampled_vector_accesses_of_a_halide22_call(trace22):
    width, height = 12, 3
    with shim.profile(sample_accesses=1) as prof:
        image = run22(trace22, width, height, seed=5)
    samples = collections.defaultdict(list)
    for a in prof.samples:
        samples[a.func, a.kind].append(a)
    loads = samples["in22", "load"]
    assert len(loads) == width * height // LANES
    for a in loads:  # a vector access: its first lane's coordinates and value, and its lanes
        x, y = a.coordinates
        assert (a.lanes, a.value) == (LANES, image[y, x]) and x % LANES == 0
    for a in samples["row22", "store"]:
        assert a.lanes == LANES and len(a.coordinates) == 1
    for a in samples["out22", "store"]:
        x, y = a.coordinates
        assert (a.lanes, a.value) == (1, (2 * (int(image[y, x]) + 1)) % 256)


def test_halide21_and_22_traced_at_once_from_threads(trace22, blur21, threads3):
    _, blur = blur21
    with shim.profile() as alone:
        run21(blur, 40, 24)
    reference = alone.accesses
    realized = sorted((r.name, r.box) for r in alone.records if r.kind == "realization")

    def work(index):
        for _ in range(4):
            if index % 2:
                run22(trace22, 16, 6)
            else:
                run21(blur, 40, 24)

    with shim.profile(trace_limit=200_000) as prof:
        run_threads(4, work)
    assert prof.trace_dropped == 0
    for func, counts in accesses22(16, 6, calls=8).items():
        assert prof.accesses[func] == counts
    for func, counts in reference.items():
        assert prof.accesses[func] == halide_trace.AccessCounts(*(8 * n for n in (
            counts.loads, counts.stores, counts.loaded_values, counts.stored_values)))
    calls = [r for r in prof.records if r.kind == "pipeline"]
    for call in calls:
        spans = [r for r in prof.records if r.call == call.id and r.kind != "pipeline"]
        if call.name == "blur3x3":
            assert sorted((r.name, r.box) for r in spans if r.kind == "realization") == realized
            assert not any(r.kind == "parallel task" for r in spans)
        else:
            assert sum(r.kind == "parallel task" for r in spans) == 6
    assert collections.Counter(c.name for c in calls) == {"blur3x3": 8, "h22_trace": 8}


# --- handlers ------------------------------------------------------------------------------------

def test_a_handler_the_application_installs_gets_halide21s_layout_from_every_library(
        trace22, blur21, threads3):
    _, blur = blur21
    seen, ids = [], itertools.count(1)

    @ffi.callback("int32_t(void *, const struct halide_trace_event_t *)")
    def handler(user_context, e):
        my_id = next(ids)
        coords = tuple(e.coordinates[i] for i in range(e.dimensions)) if e.coordinates else ()
        seen.append((my_id, e.event, e.parent_id, ffi.string(e.func).decode(), e.type.code,
                     e.type.bits, e.type.lanes, coords))
        return my_id

    previous = lib.halide_set_custom_trace(handler)
    try:
        # (Halide's default until then: the symbol's address, which cffi's wrapper is not)
        native = ctypes.CDLL(shim.native._native.__file__)
        assert int(ffi.cast("uintptr_t", previous)) == \
            ctypes.cast(native.halide_default_trace, ctypes.c_void_p).value
        run22(trace22, 8, 3)
        run21(blur, 16, 4)
        before = len(seen)
        with shim.profile() as prof:  # a profile records what it sees; the handler gets none
            run22(trace22, 8, 3)
        assert len(seen) == before and prof.accesses == accesses22(8, 3)
    finally:
        assert lib.halide_set_custom_trace(previous) == handler
    events = {e[0]: e for e in seen}
    assert all(0 <= e[1] <= lib.halide_trace_tag for e in seen)  # no event 11 or 12
    assert {e[3] for e in seen} >= {"h22_trace", "out22", "row22", "in22", "blur3x3", "blur_x",
                                    "output"}
    loads = [e for e in seen if e[3] == "in22"]
    assert len(loads) == 8 * 3 // LANES
    assert all(e[4:7] == (lib.halide_type_uint, 8, LANES) and len(e[7]) == 2 * LANES for e in loads)
    # a task is transparent: what it emits names the production around it
    [produce] = [e for e in seen if e[3] == "out22" and e[1] == lib.halide_trace_produce]
    rows = [e for e in seen if e[3] == "row22" and e[1] == lib.halide_trace_begin_realization]
    assert len(rows) == 3 and all(e[2] == produce[0] for e in rows)
    ends = [e for e in seen if e[1] == lib.halide_trace_end_realization]
    assert all(events[e[2]][1] == lib.halide_trace_begin_realization for e in ends)
    stores = [e for e in seen if e[3] == "blur_x" and e[1] == lib.halide_trace_store]
    assert stores and all(e[4:7] == (lib.halide_type_uint, 16, 8) for e in stores)


class Seen(ctypes.Structure):
    """What the library's own handler keeps of an event (halide22_instrumented.c)."""
    _fields_ = [("id", ctypes.c_int32), ("event", ctypes.c_int32), ("parent_id", ctypes.c_int32),
                ("thread_id", ctypes.c_int32), ("lanes", ctypes.c_int32),
                ("dimensions", ctypes.c_int32), ("value_index", ctypes.c_int32),
                ("type_word", ctypes.c_uint32), ("coordinates", ctypes.c_int32 * 2),
                ("func", ctypes.c_char * 32)]


def _type_word(code, bits):
    return code | bits << 8  # Halide 22's: the third field 0


def test_a_handler_a_halide22_library_installs_gets_halide22s_layout(library, trace22, blur21,
                                                                      threads3):
    _, blur = blur21
    own = ctypes.CDLL(str(library))
    own.h22_seen.restype = ctypes.POINTER(Seen)
    own.h22_install_trace_handler(0)
    try:
        run22(trace22, 8, 3)
        run21(blur, 16, 4)
    finally:
        own.h22_uninstall_trace_handler()
    seen = own.h22_seen()[:own.h22_seen_count()]
    events = {e.id: e for e in seen}
    tasks = [e for e in seen if e.event == BEGIN_TASK]
    assert len(tasks) == 3 and sum(e.event == END_TASK for e in seen) == 3
    [produce] = [e for e in seen if e.func == b"out22" and e.event == lib.halide_trace_produce]
    for task in tasks:
        assert task.thread_id > 0 and task.parent_id == produce.id and task.func == b"out22.s0.y"
        assert (task.dimensions, tuple(task.coordinates)) == (2, (0, 3))
    rows = [e for e in seen if e.func == b"row22" and e.event == lib.halide_trace_begin_realization]
    assert sorted(e.parent_id for e in rows) == sorted(t.id for t in tasks)
    assert all(events[e.parent_id].event == BEGIN_TASK for e in seen if e.event == END_TASK)
    assert all(e.thread_id == 0 for e in seen if e.event != BEGIN_TASK)
    loads = [e for e in seen if e.func == b"in22"]
    assert all((e.lanes, e.type_word, e.dimensions) ==
               (LANES, _type_word(lib.halide_type_uint, 8), 2 * LANES) for e in loads)
    # Halide 21's events, in Halide 22's layout: the vector width in `lanes`, none in the type
    stores = [e for e in seen if e.func == b"blur_x" and e.event == lib.halide_trace_store]
    assert stores and all(e.type_word == _type_word(lib.halide_type_uint, 16) for e in stores)
    assert all(e.lanes == 8 and e.dimensions == 2 * 8 for e in stores)  # (vectorized by 8)


# --- outside a profile: what Halide's default prints and writes ----------------------------------

CHILD = """
import ctypes, sys
import numpy as np
import shim, shim.native.threads
shim.native.threads.set_num_threads(3)
p22 = shim.load(sys.argv[1], name="h22_trace")
p21 = shim.load(sys.argv[2])
image = np.arange(8 * 3, dtype=np.uint8).reshape(3, 8)
p22(image, image.shape)
p21(np.ones((6, 18), np.uint16), output=(4, 16))
"""


def _child(library, blur_path, script=CHILD, env=None):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), str(library),
                           str(blur_path)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT, **(env or {})),
                          timeout=HANG_GUARD_S)


def expected_lines22(width=8, height=3) -> collections.Counter:
    """What Halide 22's default handler prints of h22_trace on np.arange's image, each task's
    thread id as T."""
    image = np.arange(width * height, dtype=np.int64).reshape(height, width)
    box, row = f"0, {width}, 0, {height}", f"0, {width}"
    lines = ["Begin pipeline h22_trace.0()",
             'Tag out22.0() tag = "func_type_and_dim: 1 1 8 1 2 0 16 0 16"',
             f"Begin realization out22.0({box})", f"Produce out22.0({box})",
             f"End produce out22.0({box})", f"End realization out22.0({box})",
             "End pipeline h22_trace.0()"]
    for y in range(height):
        lines += [f"Begin parallel task out22.s0.y.0(0, {height}) thread_id = T",
                  f"Begin realization row22.0({row})", f"Produce row22.0({row})",
                  f"End produce row22.0({row})", f"Consume row22.0({row})",
                  f"End consume row22.0({row})", f"End realization row22.0({row})",
                  f"End parallel task out22.s0.y.0(0, {height})"]
        for x in range(0, width, LANES):
            xs = ", ".join(str(x + i) for i in range(LANES))
            ys = ", ".join([str(y)] * LANES)
            values = image[y, x:x + LANES] % 256
            lines += [f"Load in22.0(<{xs}>, <{ys}>) = <{', '.join(map(str, values))}>",
                      f"Store row22.0(<{xs}>) = <{', '.join(str((v + 1) % 256) for v in values)}>"]
        for x in range(width):
            v = (image[y, x] + 1) % 256
            lines += [f"Load row22.0({x}) = {v}", f"Store out22.0({x}, {y}) = {(2 * v) % 256}"]
    return collections.Counter(lines)


def _printed22(stderr: str) -> tuple[collections.Counter, set]:
    """The lines h22_trace printed (thread ids as T), and the thread ids."""
    lines = [line for line in stderr.splitlines()
             if re.search(r"\b(h22_trace|out22|row22|in22)\.", line)]
    threads = {int(t) for line in lines for t in re.findall(r" thread_id = (\d+)$", line)}
    return collections.Counter(re.sub(r" thread_id = \d+$", " thread_id = T", line)
                               for line in lines), threads


def test_outside_a_profile_halide22s_events_print_in_its_words(library, blur21):
    blur_path, _ = blur21
    done = _child(library, blur_path)
    assert done.returncode == 0, done.stderr
    printed, threads = _printed22(done.stderr)
    assert printed == expected_lines22()
    assert threads and all(t > 0 for t in threads)
    # and Halide 21's, as its own runtime prints them
    assert "Begin realization blur_x.0(0, 16, 0, 6)" in done.stderr
    assert "End pipeline blur3x3.0()" in done.stderr


def _packets(data: bytes) -> list[tuple]:
    """Halide 21's binary trace: (id, event, parent_id, lanes, func, coordinates) a packet."""
    packets, at = [], 0
    while at < len(data):
        size, pid, code, bits, lanes, event, parent, value_index, dims = \
            struct.unpack_from("<IiBBHiiii", data, at)
        coords = struct.unpack_from(f"<{dims}i", data, at + 28)
        value_bytes = lanes * ((bits + 7) // 8)
        name_at = at + 28 + 4 * dims + value_bytes
        func = data[name_at:data.index(b"\0", name_at)].decode()
        packets.append((pid, event, parent, lanes, func, coords))
        assert size % 4 == 0 and size >= 28
        at += size
    return packets


def test_hl_trace_file_gets_halide22s_events_in_halide21s_format(library, blur21, tmp_path):
    blur_path, _ = blur21
    trace_file = tmp_path / "trace.bin"
    done = _child(library, blur_path, env={"HL_TRACE_FILE": str(trace_file)})
    assert done.returncode == 0, done.stderr
    assert not _printed22(done.stderr)[0]
    packets = _packets(trace_file.read_bytes())
    ours = [p for p in packets if p[4] in ("h22_trace", "out22", "out22.s0.y", "row22", "in22")]
    assert ours and all(0 <= p[1] <= lib.halide_trace_tag for p in ours)  # no tasks: none in 21's
    assert all(p[4] != "out22.s0.y" for p in ours)
    count = collections.Counter((p[4], p[1]) for p in ours)
    assert count[("in22", lib.halide_trace_load)] == 8 * 3 // LANES
    assert count[("out22", lib.halide_trace_store)] == 8 * 3
    assert all(p[3] == LANES for p in ours if p[4] == "in22")
    [produce] = [p for p in ours if p[4] == "out22" and p[1] == lib.halide_trace_produce]
    rows = [p for p in ours if p[4] == "row22" and p[1] == lib.halide_trace_begin_realization]
    assert len(rows) == 3 and all(p[2] == produce[0] for p in rows)  # (tasks transparent)
    assert any(p[4] == "blur_x" for p in packets)  # Halide 21's, in the same file


CHAINED = CHILD.replace("p22(image, image.shape)", """own = ctypes.CDLL(sys.argv[1])
own.h22_install_trace_handler(1)
p22(image, image.shape)""")


def test_halide_default_trace_from_a_halide22_handler_takes_halide22s_layout(library, blur21):
    """A handler installed by a Halide 22 library that passes each event on to
    halide_default_trace prints what Halide 22's default prints: its own events in its words,
    Halide 21's (handed to it in 22's layout) as Halide 21 prints them."""
    blur_path, _ = blur21
    done = _child(library, blur_path, CHAINED)
    assert done.returncode == 0, done.stderr
    assert _printed22(done.stderr)[0] == expected_lines22()
    alone = _child(library, blur_path)

    def blur_lines(stderr):
        return collections.Counter(line for line in stderr.splitlines()
                                   if re.search(r"\b(blur3x3|blur_x|output|input)\.", line))
    assert blur_lines(alone.stderr) and blur_lines(done.stderr) == blur_lines(alone.stderr)
