"""Halide's tracing, read while ``shim.profile()`` records.

A pipeline built with ``-trace_realizations``, ``-trace_pipeline``, ``-trace_loads``,
``-trace_stores`` or ``-trace_all`` (or with ``Func.trace_*`` in its schedule) reports events
through ``halide_trace``. The native library's handler (native_stubs/profiling/tracing.c) hands them to
Halide's own handler while nothing records, so Halide's printing (or ``HL_TRACE_FILE``) is
untouched. While a profile records it keeps, without entering Python:

- begin and end events of realizations, productions, consumptions and pipelines, and (from
  Halide 22 libraries) of the tasks of parallel loops, with the thread, the pipeline call and
  the box, in a buffer of at most ``limit`` events (a begin is kept only with room for its
  end, so what is kept nests);
- per Func, the number of loads and stores (and values, counting vector lanes); every
  ``sample_every``th access is kept as an event too where that is asked for.

``stop()`` pairs the kept events into ``Span``s and returns them with the counts.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np

from shim.base.errors import ShimError
from shim.native import ffi, lib
from shim.base.types import HalideType

# halide_trace_event_code_t: begin event -> (its end event, what a span of it is called)
SPAN_KINDS = {lib.halide_trace_begin_realization: (lib.halide_trace_end_realization, "realization"),
              lib.halide_trace_produce: (lib.halide_trace_end_produce, "production"),
              lib.halide_trace_consume: (lib.halide_trace_end_consume, "consumption"),
              lib.halide_trace_begin_pipeline: (lib.halide_trace_end_pipeline, "halide pipeline"),
              lib.halide22_trace_begin_parallel_task: (lib.halide22_trace_end_parallel_task,
                                                       "parallel task")}
ACCESS_KINDS = {lib.halide_trace_load: "load", lib.halide_trace_store: "store"}
_ENDS = {end for end, _ in SPAN_KINDS.values()}

DEFAULT_LIMIT = 20_000  # events kept per profile: at most 10,000 spans, a trace of a few MB
EVENT_BYTES = ffi.sizeof("shim_trace_event")  # the buffer holds trace_limit of these


@dataclass(frozen=True, slots=True)
class Span:
    """One realization, production, consumption, traced pipeline run or (Halide 22) task of a
    parallel loop: from its begin event to its end (``end_ns`` None: the end came after the
    profile stopped). ``box`` is ((min, extent), ...) per dimension as Halide passed it (a
    task's: its loop's, all of it); ``call`` the native call id it ran under (0: none);
    ``halide_id``/``parent_id`` Halide's trace ids (Halide 21: the parent of a realization is
    its pipeline's id, of a production its realization's; Halide 22: the innermost scope
    around it, a task included), as counted by the profile: ``parent_id`` is None where the
    parent's begin is not among the spans it kept (Halide's own handler saw it, before the
    profile started, or the limit left it out). ``halide_thread_id``: the thread id a Halide
    22 task gives for itself (halide_current_thread_id, which is ``thread``), else 0."""

    kind: str
    func: str
    thread: int
    start_ns: int
    end_ns: int | None
    call: int
    box: tuple
    value_index: int
    halide_id: int
    parent_id: int | None
    halide_thread_id: int = 0


@dataclass(frozen=True, slots=True)
class Access:
    """A sampled load or store: the element's coordinates, one per dimension (of a vector
    access: its first lane's; at most 16), its value (the first lane's), how many ``lanes``
    the access had, and for a Tuple-valued Func which element (``value_index``)."""

    kind: str
    func: str
    thread: int
    time_ns: int
    call: int
    coordinates: tuple
    value: object
    lanes: int = 1
    value_index: int = 0


@dataclass(frozen=True, slots=True)
class AccessCounts:
    loads: int
    stores: int
    loaded_values: int
    stored_values: int


@dataclass(frozen=True, slots=True)
class Trace:
    spans: list
    samples: list
    accesses: dict  # Func name -> AccessCounts (Funcs with at least one load or store)
    dropped: int    # begin events and samples left out: the limit was reached


def start(limit: int, sample_every: int) -> None:
    needed = limit * EVENT_BYTES
    memory = _physical_memory()
    if memory is not None and needed > memory:
        raise ShimError(f"a trace of {limit} events needs {needed / 2**30:.1f} GiB, more memory "
                        f"than this machine has ({memory / 2**30:.1f} GiB); pass a smaller "
                        f"trace_limit")
    if lib.shim_trace_start(limit, sample_every) != 0:
        raise ShimError(f"no memory for a trace of {limit} events ({needed / 2**30:.1f} GiB); "
                        f"pass a smaller trace_limit")


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def stop() -> Trace:
    """Stop recording (once no handler is still writing) and read what was recorded. The
    caller keeps the next ``start`` out until this returns (shim/profiling/profiler.py: under its start
    lock), since a start resets the buffers."""
    lib.shim_trace_stop()
    return _read()


def _read() -> Trace:
    names = _func_names()
    begins: dict[int, tuple] = {}
    spans, samples = [], []
    events = lib.shim_trace_events()
    count = lib.shim_trace_count()
    # the ids of the begins this recording kept: a begin's parent id that is not one of them
    # was given out by Halide's own handler, in whose count its bits mean something else
    kept = {events[i].id for i in range(count) if events[i].event in SPAN_KINDS}
    for i in range(count):
        e = events[i]
        if e.event in SPAN_KINDS:
            begins[e.id] = (i, e)
        elif e.event in _ENDS:
            begin = begins.pop(e.parent_id, None)
            if begin is not None:
                spans.append((begin[0], _span(begin[1], e.time_ns, names, kept)))
        elif e.event in ACCESS_KINDS:
            samples.append(_access(e, names))
    spans.extend((i, _span(b, None, names, kept)) for i, b in begins.values())
    # by start; on one thread a begin's place in the buffer breaks a tie in the clock
    spans.sort(key=lambda item: (item[1].start_ns, item[0]))
    table = lib.shim_trace_func_table()
    accesses = {}
    for slot, name in names.items():
        f = table[slot]
        if f.loads or f.stores:
            # (one name may hold several slots: the same Func name in two pipelines)
            before = accesses.get(name, AccessCounts(0, 0, 0, 0))
            accesses[name] = AccessCounts(before.loads + f.loads, before.stores + f.stores,
                                          before.loaded_values + f.loaded_values,
                                          before.stored_values + f.stored_values)
    return Trace([span for _, span in spans], samples, accesses, lib.shim_trace_dropped())


def _func_names() -> dict[int, str]:
    table = lib.shim_trace_func_table()
    return {slot: ffi.string(table[slot].name).decode("utf-8", "replace")
            for slot in range(lib.SHIM_TRACE_FUNCS) if table[slot].name != ffi.NULL}


def _coordinates(e, lanes: int = 1) -> tuple:
    return tuple(e.coordinates[0:min(e.dimensions // lanes, lib.SHIM_TRACE_COORDINATES)])


def _span(begin, end_ns, names, kept) -> Span:
    c = _coordinates(begin)
    box = tuple((c[i], c[i + 1]) for i in range(0, len(c) - 1, 2))
    parent = begin.parent_id
    ours = parent & lib.SHIM_TRACE_RECORDED and parent in kept
    return Span(SPAN_KINDS[begin.event][1], names.get(begin.func, "?"), begin.thread,
                begin.time_ns, end_ns, begin.call, box, begin.value_index,
                begin.id & lib.SHIM_TRACE_ID_MASK,
                parent & lib.SHIM_TRACE_ID_MASK if ours else None, begin.thread_id)


@functools.lru_cache(maxsize=None)
def _lane_dtype(code: int, bits: int) -> np.dtype | None:
    return HalideType(code, bits).dtype


def _access(e, names) -> Access:
    dtype = _lane_dtype(e.type_code, e.type_bits)
    value = None if dtype is None else \
        np.frombuffer(bytes(ffi.buffer(e.value, 8)), dtype, count=1)[0].item()
    lanes = max(e.type_lanes, 1)
    return Access(ACCESS_KINDS[e.event], names.get(e.func, "?"), e.thread, e.time_ns, e.call,
                  _coordinates(e, lanes), value, lanes, e.value_index)
