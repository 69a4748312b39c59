"""Halide's own profiler, read per pipeline call while ``shim.profile()`` records.

A pipeline built with the ``profile`` or ``profile_by_timer`` target feature keeps per-Func
figures in Halide's profiler state (HalideRuntime.h: ``halide_profiler_state`` ->
``halide_profiler_pipeline_stats`` -> ``halide_profiler_func_stats``). Halide only accumulates
them over the process and prints them at exit. There is one state per profiler ABI (a fact of
the release that built the library, shim/base/releases.py: ``Release.profiler_abi``;
native_stubs/profiling/halide_profiler.c): Halide 21's runtime's, linked into ``shim._native``,
serving Halide 19 and 21 libraries; and the shim's own serving Halide 22 libraries with Halide
22's semantics, whose entries are ``halide22_profiler_func_stats``, with the counters Halide 22's
generated code adds (parallel loops and tasks, points computed, loads and stores), read into
``StageStats.counters``. Everything below reads either through ``_LAYOUTS``.

Inside a profile, each call of such a pipeline snapshots its entry before the call and reads
it again as the call returns; the difference is that call's figures (``CallStages``,
on the pipeline call's ``Record.stages``). Halide keeps peaks (memory, stack) as maxima, which
no difference recovers: they are zeroed before the call and, after it is read, set back to the
larger of the old and the new value, so Halide's own report stays as it would have been.

Concurrency: the counters are shared by every call of a pipeline of that name, and Halide adds
a call's figures to them as the call ends. So inside a profile the calls of one such pipeline
run one at a time (a lock per pipeline name, held from before the snapshot to after the read),
and a profiled call first waits for the calls of it still running from before the profile
(Halide lists the calls in flight); each call's figures are then its own. A call run outside
the profile that ends during a profiled one (begun after the profile stopped, while the
profiled call was still running) would add its figures too: the profiled call then gets none
(``None``: more than one run was added). A call made from inside a pipeline call (an extern
stage calling back into Python, on the calling thread or on one of Halide's worker threads)
takes no turn and waits for nothing: the call it serves cannot end before it; the count of runs
decides. No wait may hang a call that would end without a profile (the call ahead may itself
wait for the waiting thread): a call waits only while calls of its pipeline keep ending, and
goes ahead without its turn once none has for ``PATIENCE_S`` (its figures are then None where
runs mix). Waits for a turn give way to signal handlers (Ctrl-C, a timeout: shim/native/interrupts.py). Outside a profile nothing
here runs: Halide's behaviour is untouched.

At exit Halide prints its report through halide_print (a destructor in its runtime); the
stock runtime prints to stdout, the shim to stderr (where shim/calls/running.py writes what a call
prints, and native_stubs/calls/call_context.c what is printed outside any call). The state
serving Halide 22 libraries has no destructor: its report (a subset of Halide 22's,
native_stubs/profiling/profiler22_report.c) is written here at exit, where Halide 21's goes.
``HALIDE_SHIM_PROFILER_REPORT=off`` drops it, ``=PATH`` writes it to PATH instead (appending;
a relative PATH is taken from the working directory the shim was imported in, or, for a value
the program sets later, the one at exit); ``set_exit_report()`` does the same from Python (a
relative path from the working directory as it is called). Halide's destructor waits for every
profiled call still running; calls the shim stopped waiting for at exit (shim/core/shutdown.py)
would keep the process from ending, so then the report is written here and Halide's shutdown
skipped.

Fork: a child has none of its parent's other threads, so it starts with the per-name locks
new, and (native_stubs/forks/fork.c, for forks from C too) each state's lock free, no sampling
thread (its first profiled call starts one), and in its list of calls in flight only the
forking thread's own (it may be inside calls, in an extern stage that forked: each unlinks
itself as it ends).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Iterable
from typing import NamedTuple

from shim.native import interrupts
from shim.native import CallContext, ffi, lib

# Target features that build Halide's profiler into a pipeline.
PROFILE_FEATURES = frozenset({"profile", "profile_by_timer"})
# Halide's first four Func ids are its own: overhead (asserts...), waiting for parallel tasks,
# halide_malloc, halide_free. Reported when they are non-zero.
_RUNTIME_SLOTS = 4

ENV_VAR = "HALIDE_SHIM_PROFILER_REPORT"

# Each pipeline's turn, by (profiler ABI, name): its state tells its calls apart by name.
_locks: dict[tuple, threading.RLock] = {}
_locks_lock = threading.Lock()
# How many times each pipeline's turn was given back (a waiting call sees the turn move).
_handovers: dict[tuple, int] = {}
# How often a profiled call waiting for its turn looks again (and for a Ctrl-C).
_TURN_POLL_S = 0.05
_IN_FLIGHT_POLL_S = 0.001
# How long a profiled call waits for the calls of its pipeline ahead of it (the one holding the
# turn, those in flight from before the profile) while none of them ends. They may be waiting
# for this very thread (an extern stage waiting for it, for a lock it holds...): without a
# profile both would end. Once no call of the pipeline has ended for this long it goes ahead
# without its turn, and the runs counted in end() tell whether its figures are its own.
PATIENCE_S = 10.0


def builds_profile(target: str) -> bool:
    return bool(PROFILE_FEATURES & set(target.split("-")))


class Counters(NamedTuple):
    """What Halide 22's generated code counts for one Func (one entry of its profile) in one
    call (update_counters; Halide 21's counts none of these): parallel loops launched and
    their tasks, points of the Func required at the root of the pipeline (on the Func's first
    entry only) and points computed, loads (scalar, dense vector, gathers) and bytes loaded,
    stores (scalar, dense vector, scatters) and bytes stored while computing it.
    ``approximated``: the counters Halide could only bound from above (e.g. hoisted out of a
    GPU kernel), by name."""

    parallel_loops: int
    parallel_tasks: int
    points_required_at_root: int
    points_computed: int
    scalar_loads: int
    vector_loads: int
    gathers: int
    bytes_loaded: int
    scalar_stores: int
    vector_stores: int
    scatters: int
    bytes_stored: int
    approximated: frozenset = frozenset()


# halide_profiler_update_counters' arguments in order, each a bit of counters_approximated
# (Halide 22's src/runtime/profiler_common.cpp).
_APPROXIMABLE = ("memory_total", "num_allocs", "parallel_loops", "parallel_tasks",
                 "points_required_at_root", "points_computed", "scalar_loads", "vector_loads",
                 "gathers", "bytes_loaded", "scalar_stores", "vector_stores", "scatters",
                 "bytes_stored")
_COUNTERS = Counters._fields[:-1]


class StageStats(NamedTuple):
    """One Func's figures for one call, as Halide's profiler keeps them. ``time_ns`` is
    sampled (Halide scales the samples to the call's measured duration); ``threads`` is the
    average number of threads active while it ran (None: never sampled). Halide 22's profile
    has entries rather than Funcs (a Func computed in two places has two) and says more of each:
    ``parent``, the index of the entry it is computed inside (-1: at the root), ``kind``
    ("func", "overhead", "thread idle", "malloc", "free", "copy to host", "copy to device",
    "allocation") and ``counters``; None for a pipeline built by Halide 19 or 21."""

    name: str
    index: int
    time_ns: int
    memory_peak: int
    memory_total: int
    num_allocs: int
    stack_peak: int
    threads: float | None
    samples: int
    parent: int | None = None
    kind: str | None = None
    counters: Counters | None = None


class CallStages(NamedTuple):
    """Halide's profiler figures for one pipeline call. ``time_ns``: the call's duration as
    Halide measured it (Halide 22 counts it only for a call it took a sample of, else 0);
    ``share(stage)``: the stage's part of it; ``stages``: every Func in Halide's order, its own
    four slots first (overhead, waiting for parallel tasks (Halide 22: thread idle),
    halide_malloc, halide_free); ``funcs()``: the pipeline's Funcs plus Halide's slots where
    non-zero, as Halide's report lists them."""

    pipeline: str
    time_ns: int
    samples: int
    memory_peak: int
    memory_total: int
    num_allocs: int
    threads: float | None
    stages: tuple[StageStats, ...]

    def share(self, stage: StageStats) -> float:
        return stage.time_ns / self.time_ns if self.time_ns else 0.0

    def funcs(self) -> list[StageStats]:
        return [s for s in self.stages
                if s.index >= _RUNTIME_SLOTS or s.time_ns or s.num_allocs or s.memory_total]

    def stage(self, name: str) -> StageStats:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)


# --- the states, by profiler ABI ---------------------------------------------------------------

class _Layout(NamedTuple):
    """How a state of one profiler ABI is laid out: the C type of its pipelines' stats, the
    figures a call adds to its pipeline's and to each of its Funcs', and whether its entries
    carry Halide 22's identity fields and counters."""

    pipelines: str
    pipeline_fields: tuple
    func_fields: tuple
    entries: bool


_PIPELINE_FIELDS = ("time", "memory_total", "active_threads_numerator",
                    "active_threads_denominator", "runs", "samples", "num_allocs")
_FUNC_FIELDS = ("time", "memory_total", "active_threads_numerator",
                "active_threads_denominator", "num_allocs")
# By Release.profiler_abi: 0, Halide 21's runtime's state; 1, the shim's Halide 22 state.
_LAYOUTS = {
    0: _Layout("struct halide_profiler_pipeline_stats *", _PIPELINE_FIELDS, _FUNC_FIELDS, False),
    1: _Layout("struct halide22_profiler_pipeline_stats *", _PIPELINE_FIELDS + ("billed_runs",),
               _FUNC_FIELDS + _COUNTERS, True),
}
_KINDS = {lib.halide22_profiler_func_kind_func: "func",
          lib.halide22_profiler_func_kind_overhead: "overhead",
          lib.halide22_profiler_func_kind_thread_idle: "thread idle",
          lib.halide22_profiler_func_kind_malloc: "malloc",
          lib.halide22_profiler_func_kind_free: "free",
          lib.halide22_profiler_func_kind_copy_to_host: "copy to host",
          lib.halide22_profiler_func_kind_copy_to_device: "copy to device",
          lib.halide22_profiler_func_kind_allocation: "allocation"}


class _Locked:
    """``with _Locked(abi) as state:`` the state of profiler ABI ``abi``, its lock held."""

    __slots__ = ("abi",)

    def __init__(self, abi: int):
        self.abi = abi

    def __enter__(self):
        lib.shim_profiler_lock(self.abi)
        return lib.shim_profiler_state(self.abi)

    def __exit__(self, *exc) -> None:
        lib.shim_profiler_unlock(self.abi)


# --- one call ---------------------------------------------------------------------------------

def _entries(state, layout: _Layout, name: bytes):
    """The stats entries of pipelines called ``name`` (caller holds the state's lock). Halide
    tells pipelines apart by the address of their name string; two libraries may hold a
    pipeline of one name."""
    p = ffi.cast(layout.pipelines, state.pipelines)
    while p != ffi.NULL:
        if ffi.string(p.name) == name:
            yield p
        p = ffi.cast(layout.pipelines, p.next)


def _key(p) -> int:
    return int(ffi.cast("uintptr_t", p))


class _Snapshot:
    __slots__ = ("name", "abi", "lock", "before")

    def __init__(self, name: str, abi: int, lock):
        # lock: the pipeline's turn, held until end(); None: the call runs without it
        self.name, self.abi, self.lock, self.before = name, abi, lock, {}


def begin(name: str, abi: int = 0) -> _Snapshot | None:
    """Before a call of pipeline ``name``, built with Halide's profiler by a release of
    profiler ABI ``abi``, inside a profile. Takes the pipeline's turn (released by ``end``):
    its lock, then waits for the calls of it still running from outside the profile. A call
    made inside a pipeline call (an extern stage calling back into Python, on the calling
    thread or on one of Halide's worker threads, which run in the call's context) neither
    takes the turn nor waits: the call it serves may hold the turn or be in flight, and cannot
    end first."""
    call = lib.shim_current_call()
    if call != ffi.NULL and lib.shim_call_in_pipeline(call):
        return _snapshot(name, abi, None, wait=False)
    with _locks_lock:
        lock = _locks.setdefault((abi, name), threading.RLock())
    held = _wait_for_turn((abi, name), lock)
    try:
        return _snapshot(name, abi, lock if held else None, wait=True)
    except BaseException:
        if held:
            lock.release()
        raise


def _wait_for_turn(key: tuple, lock) -> bool:
    """Take the pipeline's turn: True once held; False where it stayed with one call for
    PATIENCE_S (that call may wait for this thread): then the call goes ahead without it."""
    patience = _Patience()
    while not lock.acquire(timeout=_TURN_POLL_S):
        interrupts.run_pending()  # (a safe point: a handler's exception ends the wait)
        if patience.exhausted(_handovers.get(key, 0)):
            return False
    return True


def _snapshot(name: str, abi: int, lock, wait: bool) -> _Snapshot:
    """The figures before the call, once the calls of the pipeline in flight have ended
    (``wait``; while they keep ending, see PATIENCE_S)."""
    snapshot = _Snapshot(name, abi, lock)
    encoded = name.encode()
    layout = _LAYOUTS[abi]
    patience = _Patience()
    while True:
        with _Locked(abi) as state:
            if wait:
                calls = _in_flight(state, layout, encoded)
                wait = bool(calls) and not patience.exhausted(
                    (calls, _runs(state, layout, encoded)))
            if not wait:
                _take(snapshot, state, layout, encoded)
                return snapshot
        _pause(_IN_FLIGHT_POLL_S)


class _Patience:
    """Tells a wait to give up once what it watches has not changed for PATIENCE_S."""

    __slots__ = ("seen", "since")

    def __init__(self):
        self.seen, self.since = None, time.monotonic()

    def exhausted(self, seen) -> bool:
        now = time.monotonic()
        if seen != self.seen:
            self.seen, self.since = seen, now
            return False
        return now - self.since >= PATIENCE_S


def _pause(seconds: float) -> None:
    interrupts.run_pending()  # (a safe point: a handler's exception ends the wait)
    time.sleep(seconds)


def _in_flight(state, layout: _Layout, name: bytes) -> frozenset:
    """The calls of pipelines called ``name`` running now, by the address of Halide's record
    of each (caller holds the state's lock): Halide lists each call from its start to its
    end, when it adds its figures."""
    calls = []
    instance = state.instances
    while instance != ffi.NULL:
        p = ffi.cast(layout.pipelines, instance.pipeline_stats)
        if p != ffi.NULL and ffi.string(p.name) == name:
            calls.append(_key(instance))
        instance = instance.next
    return frozenset(calls)


def _runs(state, layout: _Layout, name: bytes) -> int:
    """How many calls of pipelines called ``name`` Halide counted (caller holds the lock)."""
    return sum(p.runs for p in _entries(state, layout, name))


def _take(snapshot: _Snapshot, state, layout: _Layout, name: bytes) -> None:
    """Note the entries' figures and zero their peaks (caller holds the state's lock)."""
    for p in _entries(state, layout, name):
        funcs = []
        for i in range(p.num_funcs):
            f = p.funcs[i]
            funcs.append(({k: getattr(f, k) for k in layout.func_fields}, f.memory_peak,
                          f.stack_peak))
            f.memory_peak = f.stack_peak = 0
        snapshot.before[_key(p)] = ({k: getattr(p, k) for k in layout.pipeline_fields},
                                    p.memory_peak, funcs)
        p.memory_peak = 0


def end(snapshot: _Snapshot | None) -> CallStages | None:
    """After the call: its figures (None where Halide recorded no run of it, e.g. a bounds
    query, or where the difference holds more than one run: another call of the pipeline,
    run outside the profile, ended meanwhile), and the pipeline's turn given back."""
    if snapshot is None:
        return None
    try:
        layout = _LAYOUTS[snapshot.abi]
        with _Locked(snapshot.abi) as state:
            entries = []
            for p in _entries(state, layout, snapshot.name.encode()):
                before = snapshot.before.get(_key(p))
                if before is None:  # created during the call: Halide started it at zero
                    before = (dict.fromkeys(layout.pipeline_fields, 0), 0,
                              [(dict.fromkeys(layout.func_fields, 0), 0, 0)] * p.num_funcs)
                entries.append((p, before))
            ran = [(p, before) for p, before in entries if p.runs != before[0]["runs"]]
            result = None
            if len(ran) == 1 and ran[0][0].runs - ran[0][1][0]["runs"] == 1:
                p, (pfields, _, funcs) = ran[0]
                result = _difference(p, layout, pfields, funcs)
            for p, (_, ppeak, funcs) in entries:  # Halide's peaks, as without the shim
                p.memory_peak = max(p.memory_peak, ppeak)
                for i, (_, mpeak, speak) in enumerate(funcs):
                    f = p.funcs[i]
                    f.memory_peak = max(f.memory_peak, mpeak)
                    f.stack_peak = max(f.stack_peak, speak)
            return result
    finally:
        if snapshot.lock is not None:
            key = (snapshot.abi, snapshot.name)
            with _locks_lock:
                _handovers[key] = _handovers.get(key, 0) + 1
            snapshot.lock.release()


def _threads(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def _identity(f, difference: dict) -> dict:
    """A Halide 22 entry's identity fields and the call's counters of it, as StageStats takes
    them."""
    approximated = frozenset(name for bit, name in enumerate(_APPROXIMABLE)
                             if f.counters_approximated >> bit & 1)
    return {"parent": f.parent, "kind": _KINDS.get(f.kind, str(f.kind)),
            "counters": Counters(*(difference[k] for k in _COUNTERS), approximated)}


def _difference(p, layout: _Layout, pfields: dict, funcs: list) -> CallStages:
    d = {k: getattr(p, k) - pfields[k] for k in layout.pipeline_fields}
    stages = []
    for i, (ffields, _, _) in enumerate(funcs):
        f = p.funcs[i]
        fd = {k: getattr(f, k) - ffields[k] for k in layout.func_fields}
        stages.append(StageStats(
            ffi.string(f.name).decode("utf-8", "replace"), i, fd["time"], f.memory_peak,
            fd["memory_total"], fd["num_allocs"], f.stack_peak,
            _threads(fd["active_threads_numerator"], fd["active_threads_denominator"]),
            fd["active_threads_denominator"], **(_identity(f, fd) if layout.entries else {})))
    return CallStages(ffi.string(p.name).decode("utf-8", "replace"), d["time"], d["samples"],
                      p.memory_peak, d["memory_total"], d["num_allocs"],
                      _threads(d["active_threads_numerator"], d["active_threads_denominator"]),
                      tuple(stages))


# --- the Func a GPU kernel computes ------------------------------------------------------------

def _c_name(name: str) -> str:
    """A name as Halide writes it into C identifiers (its c_print_name, byte by byte on the
    UTF-8 text): "." -> "_", "$" -> "__", any other byte but ASCII letters, digits and "_" ->
    "___"."""
    out = []
    for byte in name.encode("utf-8", "surrogatepass"):
        if byte == 0x2E:
            out.append("_")
        elif byte == 0x24:
            out.append("__")
        elif byte == 0x5F or (byte < 0x80 and chr(byte).isalnum()):
            out.append(chr(byte))
        else:
            out.append("___")
    return "".join(out)


def stage_of_kernel(kernel_name: str, stage_names: Iterable[str]) -> str | None:
    """The Func (one of ``stage_names``, as Halide's profiler names them) that GPU kernel
    ``kernel_name`` computes, or None. Halide names a kernel after the loop it offloads,
    "kernel_" + "FUNC.sSTAGE.VAR...", written as a C identifier: "_kernel_" + FUNC + "_s" +
    STAGE + "_" ..., where "." becomes "_", "$" "__" and any other byte but ASCII letters,
    digits and "_" "___" (a second kernel of the same loop, e.g. a specialization, first has
    each "$" of the name made "_", and ends in "__N"). Where several Funcs fit (blur and blur_s1),
    the longest wins."""
    best, best_length = None, -1
    for name in stage_names:
        for written in {_c_name(name), _c_name(name.replace("$", "_"))}:
            prefix = "_kernel_" + written + "_s"
            if len(prefix) <= best_length or not kernel_name.startswith(prefix):
                continue
            rest = kernel_name[len(prefix):]
            digits = len(rest) - len(rest.lstrip("0123456789"))
            if digits and (len(rest) == digits or rest[digits] == "_"):
                best, best_length = name, len(prefix)
    return best


# --- Halide's report at exit --------------------------------------------------------------------

_exit_report: str | None = None  # None: Halide's own (printed); "off"; or a path


def _resolved(where: str) -> str:
    """A destination as given: "off", "" (Halide's own), or a path, made absolute (a relative
    one is taken from the working directory now)."""
    where = where.strip()
    return where if not where or where.lower() == "off" else os.path.abspath(where)


# The variable as the shim was imported: a relative path names a file in that directory, even
# if the program changes directory before it exits.
_env_given = os.environ.get(ENV_VAR, "")
_env_resolved = _resolved(_env_given)


def set_exit_report(where: str | os.PathLike | None) -> None:
    """Where Halide's profiler report goes at exit: None (printed, as Halide does), "off", or
    a file path (appended to; a relative one from the working directory now). Overrides
    HALIDE_SHIM_PROFILER_REPORT."""
    global _exit_report
    _exit_report = None if where is None else _resolved(os.fsdecode(where))


def silence_exit_report_unless_chosen() -> None:
    """Drop Halide's report at exit unless the program chose where it goes (set_exit_report(),
    or HALIDE_SHIM_PROFILER_REPORT set and not blank). For commands that show Halide's figures
    themselves (``python -m shim profile``, ``demo``), where the report would repeat them."""
    if _exit_report is None and not os.environ.get(ENV_VAR, "").strip():
        set_exit_report("off")


def _destination() -> str:
    if _exit_report is not None:
        return _exit_report
    given = os.environ.get(ENV_VAR, "")
    return _env_resolved if given == _env_given else _resolved(given)


def report_text(abi: int = 0) -> str:
    """The report of Halide's profiler state of ABI ``abi`` (0: Halide 21's, serving Halide 19
    and 21 libraries; 1: the one serving Halide 22 libraries) of everything since the start
    (or its last reset), as text."""
    context = CallContext()
    previous = lib.shim_call_enter(context.pointer)
    try:
        lib.shim_profiler_report(abi, ffi.NULL)
    finally:
        lib.shim_call_leave(previous)
    return context.prints()


def _status(abi: int) -> tuple[bool, bool]:
    """(calls running, pipelines recorded) in the state of ABI ``abi``."""
    with _Locked(abi) as state:
        return state.instances != ffi.NULL, state.pipelines != ffi.NULL


def _forget_all(let_go: bool = False) -> None:
    """Unlink Halide 21's stats so that its exit report has nothing to print. The entries are
    left allocated: a call still running keeps a pointer to its own. ``let_go``: calls are
    still running, and Halide's shutdown (its runtime's destructor) would wait for them: forget
    the sampling thread too, which makes it return at once (the thread ends with the
    process)."""
    with _Locked(0) as state:
        state.pipelines = ffi.NULL
        if let_go:
            state.sampling_thread = ffi.NULL


def _print(text: str) -> None:
    if sys.stderr is not None:
        sys.stderr.write(text)
        sys.stderr.flush()


@atexit.register
def _at_exit() -> None:
    """(Registered before shim/core/shutdown.py's, so it runs after: by then new calls are refused
    and the calls still running waited for.) Halide 21's runtime prints its state's report as
    the process ends, waiting for the calls still running: it is left to do so where none is
    and the report goes to the terminal; else written here, and Halide's shutdown skipped. The
    state serving Halide 22 libraries has no destructor: its report is always written here."""
    where = _destination()
    off = where.lower() == "off"
    running, recorded = _status(0)
    ours = running or bool(where and recorded)
    text21 = report_text(0) if ours and recorded and not off else ""
    text22 = report_text(1) if _status(1)[1] and not off else ""
    if not where:
        _print(text21 + text22)
    elif text21 or text22:
        try:
            with open(where, "a") as f:
                f.write(text21 + text22)
        except OSError as e:
            _print(f"halide-shim: cannot write Halide's profiler report to {where}: {e}\n")
            if not running:  # Halide prints its own, as without a destination
                ours, text21 = False, ""
            _print(text21 + text22)
    if ours:
        _forget_all(let_go=running)


def _after_fork_in_child() -> None:
    """The child has only the thread that forked: the turns other threads held are let go.
    (Halide's own state, its lock and list of calls in flight, is reset in C before this runs:
    native_stubs/forks/fork.c.)"""
    global _locks, _locks_lock, _handovers
    _locks, _locks_lock, _handovers = {}, threading.Lock(), {}


os.register_at_fork(after_in_child=_after_fork_in_child)
