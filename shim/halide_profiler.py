"""Halide's own profiler, read per pipeline call while ``shim.profile()`` records.

A pipeline built with the ``profile`` or ``profile_by_timer`` target feature keeps per-Func
figures in Halide's profiler state (HalideRuntime.h: ``halide_profiler_state`` ->
``halide_profiler_pipeline_stats`` -> ``halide_profiler_func_stats``; the runtime is Halide's
own, linked into ``shim._native``). Halide only accumulates them over the process and prints
them at exit. Inside a profile, each call of such a pipeline snapshots its entry before the call
and reads it again as the call returns; the difference is that call's figures (``CallStages``,
on the pipeline call's ``Record.stages``). Halide keeps peaks (memory, stack) as maxima, which
no difference recovers: they are zeroed before the call and, after it is read, set back to the
larger of the old and the new value, so Halide's own report stays as it would have been.

Concurrency: the counters are shared by every call of a pipeline of that name, so inside a
profile the calls of one such pipeline run one at a time (a lock per pipeline name, held from
before the snapshot to after the read); each call's figures are then its own. Calls of it that
run outside the profile (begun before it started) would still be counted into the call in
flight. Outside a profile nothing here runs: Halide's behaviour is untouched.

At exit Halide prints its report through halide_print (a destructor in its runtime); the
stock runtime prints to stdout, the shim to stderr (where shim/running.py writes what a call
prints, and native_stubs/call_context.c what is printed outside any call).
``HALIDE_SHIM_PROFILER_REPORT=off`` drops it, ``=PATH`` writes it to PATH instead (appending);
``set_exit_report()`` does the same from Python.
"""

from __future__ import annotations

import atexit
import os
import threading
from dataclasses import dataclass

from shim.native import CallContext, ffi, lib

# Target features that build Halide's profiler into a pipeline.
PROFILE_FEATURES = frozenset({"profile", "profile_by_timer"})
# Halide's first four Func ids are its own: overhead (asserts...), waiting for parallel tasks,
# halide_malloc, halide_free. Reported when they are non-zero.
_RUNTIME_SLOTS = 4

ENV_VAR = "HALIDE_SHIM_PROFILER_REPORT"

_profiled_names: set[str] = set()
_locks: dict[str, threading.RLock] = {}
_locks_lock = threading.Lock()


def builds_profile(target: str) -> bool:
    return bool(PROFILE_FEATURES & set(target.split("-")))


def register(name: str, target: str) -> None:
    """A pipeline called ``name`` built for ``target`` was loaded (shim/pipeline.py)."""
    if builds_profile(target):
        _profiled_names.add(name)


def is_profiled(name: str) -> bool:
    return name in _profiled_names


@dataclass(frozen=True, slots=True)
class StageStats:
    """One Func's figures for one call, as Halide's profiler keeps them. ``time_ns`` is
    sampled (Halide scales the samples to the call's measured duration); ``threads`` is the
    average number of threads active while it ran (None: never sampled)."""

    name: str
    index: int
    time_ns: int
    memory_peak: int
    memory_total: int
    num_allocs: int
    stack_peak: int
    threads: float | None
    samples: int


@dataclass(frozen=True, slots=True)
class CallStages:
    """Halide's profiler figures for one pipeline call. ``time_ns``: the call's duration as
    Halide measured it; ``share(stage)``: the stage's part of it; ``stages``: every Func in
    Halide's order, its own four slots first (overhead, waiting for parallel tasks,
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


# --- one call ---------------------------------------------------------------------------------

_PIPELINE_FIELDS = ("time", "memory_total", "active_threads_numerator",
                    "active_threads_denominator", "runs", "samples", "num_allocs")
_FUNC_FIELDS = ("time", "memory_total", "active_threads_numerator",
                "active_threads_denominator", "num_allocs")


def _entries(name: bytes):
    """Halide's stats entries of pipelines called ``name`` (caller holds the profiler lock).
    Halide tells pipelines apart by the address of their name string; two libraries may hold a
    pipeline of one name."""
    state = lib.halide_profiler_get_state()
    p = state.pipelines
    while p != ffi.NULL:
        if ffi.string(p.name) == name:
            yield p
        p = ffi.cast("struct halide_profiler_pipeline_stats *", p.next)


def _key(p) -> int:
    return int(ffi.cast("uintptr_t", p))


class _Snapshot:
    __slots__ = ("name", "lock", "before")

    def __init__(self, name: str, lock):
        self.name, self.lock, self.before = name, lock, {}


def begin(name: str) -> _Snapshot | None:
    """Before a call of pipeline ``name`` inside a profile: None unless it was built with
    Halide's profiler. Takes the pipeline's lock (released by ``end``)."""
    if name not in _profiled_names:
        return None
    with _locks_lock:
        lock = _locks.setdefault(name, threading.RLock())
    lock.acquire()
    snapshot = _Snapshot(name, lock)
    try:
        state = lib.halide_profiler_get_state()
        lib.halide_profiler_lock(state)
        try:
            for p in _entries(name.encode()):
                funcs = []
                for i in range(p.num_funcs):
                    f = p.funcs[i]
                    funcs.append(({k: getattr(f, k) for k in _FUNC_FIELDS},
                                  f.memory_peak, f.stack_peak))
                    f.memory_peak = f.stack_peak = 0
                snapshot.before[_key(p)] = ({k: getattr(p, k) for k in _PIPELINE_FIELDS},
                                            p.memory_peak, funcs)
                p.memory_peak = 0
        finally:
            lib.halide_profiler_unlock(state)
    except BaseException:
        lock.release()
        raise
    return snapshot


def end(snapshot: _Snapshot | None) -> CallStages | None:
    """After the call: its figures (None where Halide recorded no run of it, e.g. a failed or
    bounds-query call), and the pipeline's lock released."""
    if snapshot is None:
        return None
    try:
        state = lib.halide_profiler_get_state()
        lib.halide_profiler_lock(state)
        try:
            result = None
            for p in _entries(snapshot.name.encode()):
                before = snapshot.before.get(_key(p))
                if before is None:  # created by this call: Halide started it at zero
                    pfields, ppeak = dict.fromkeys(_PIPELINE_FIELDS, 0), 0
                    funcs = [(dict.fromkeys(_FUNC_FIELDS, 0), 0, 0)] * p.num_funcs
                else:
                    pfields, ppeak, funcs = before
                if p.runs != pfields["runs"] and result is None:
                    result = _difference(p, pfields, funcs)
                p.memory_peak = max(p.memory_peak, ppeak)
                for i, (_, mpeak, speak) in enumerate(funcs):
                    f = p.funcs[i]
                    f.memory_peak = max(f.memory_peak, mpeak)
                    f.stack_peak = max(f.stack_peak, speak)
            return result
        finally:
            lib.halide_profiler_unlock(state)
    finally:
        snapshot.lock.release()


def _threads(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def _difference(p, pfields: dict, funcs: list) -> CallStages:
    d = {k: getattr(p, k) - pfields[k] for k in _PIPELINE_FIELDS}
    stages = []
    for i, (ffields, _, _) in enumerate(funcs):
        f = p.funcs[i]
        fd = {k: getattr(f, k) - ffields[k] for k in _FUNC_FIELDS}
        stages.append(StageStats(
            ffi.string(f.name).decode("utf-8", "replace"), i, fd["time"], f.memory_peak,
            fd["memory_total"], fd["num_allocs"], f.stack_peak,
            _threads(fd["active_threads_numerator"], fd["active_threads_denominator"]),
            fd["active_threads_denominator"]))
    return CallStages(ffi.string(p.name).decode("utf-8", "replace"), d["time"], d["samples"],
                      p.memory_peak, d["memory_total"], d["num_allocs"],
                      _threads(d["active_threads_numerator"], d["active_threads_denominator"]),
                      tuple(stages))


# --- Halide's report at exit --------------------------------------------------------------------

_exit_report: str | None = None  # None: Halide's own (printed); "off"; or a path


def set_exit_report(where: str | os.PathLike | None) -> None:
    """Where Halide's profiler report goes at exit: None (printed, as Halide does), "off", or
    a file path (appended to). Overrides HALIDE_SHIM_PROFILER_REPORT."""
    global _exit_report
    _exit_report = None if where is None else os.fspath(where)


def report_text() -> str:
    """Halide's profiler report of everything since the start (or its last reset), as text."""
    context = CallContext()
    previous = lib.shim_call_enter(context.pointer)
    try:
        lib.halide_profiler_report(ffi.NULL)
    finally:
        lib.shim_call_leave(previous)
    return context.prints()


def _forget_all() -> None:
    """Unlink Halide's stats so that its exit report has nothing to print. The entries are left
    allocated: a call still running keeps a pointer to its own."""
    state = lib.halide_profiler_get_state()
    lib.halide_profiler_lock(state)
    try:
        state.pipelines = ffi.NULL
    finally:
        lib.halide_profiler_unlock(state)


@atexit.register
def _at_exit() -> None:
    where = _exit_report if _exit_report is not None else os.environ.get(ENV_VAR, "").strip()
    if not where or lib.halide_profiler_get_state().pipelines == ffi.NULL:
        return
    if where.lower() != "off":
        text = report_text()
        try:
            with open(where, "a") as f:
                f.write(text)
        except OSError as e:
            import sys

            print(f"halide-shim: cannot write Halide's profiler report to {where}: {e}",
                  file=sys.stderr)
            return
    _forget_all()
