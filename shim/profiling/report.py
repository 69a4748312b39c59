"""What a shim.Profile shows: tables for the terminal and a Chrome trace for Perfetto.

The trace follows the Trace Event Format that Perfetto and chrome://tracing read: complete
("X") slices, one track per host thread (the records of a thread nest, since they are made
and finished in stack order) and one per device queue or stream (device slices laid end to
end), flows from each launch and copy on the host to its execution on the device, and a
counter of device memory per backend (held by Buffers, and pooled for reuse).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

from shim.base.errors import error_name

HOST_PID, DEVICE_PID = 1, 2
MAX_BUFFER_ROWS = 20


# --- tables ----------------------------------------------------------------------------------

def summary(profile) -> str:
    sections = [
        f"Profile of {profile.duration_ns / 1e6:.1f} ms: {_plural(len(profile.records), 'record')}"
        f" on {_plural(len(profile.thread_names), 'thread')}",
        _function_table(profile),
        _kernel_table(profile),
        _pipeline_table(profile),
        *_stage_tables(profile),
        *_span_tables(profile),
        _access_table(profile),
        _trace_dropped(profile),
        _buffer_table(profile),
    ]
    return "\n\n".join(s for s in sections if s)


def _function_table(profile) -> str:
    by_function = defaultdict(list)
    for record in profile.records:
        if record.kind == "runtime":
            by_function[record.name].append(record)
    rows = []
    for name in sorted(set(by_function) | set(profile.decided_in_c)):
        records = by_function.get(name, [])
        decided = profile.decided_in_c.get(name, {})
        errors = sum(1 for r in records if r.result != 0) + decided.get("refused", 0)
        rows.append([name, len(records) + sum(decided.values()), decided.get("noop", 0),
                     decided.get("foreign", 0), decided.get("served", 0),
                     *_time_columns([r.duration_ns for r in records]),
                     _bytes(sum(r.bytes for r in records)), errors])
    return _table("Runtime calls (no-ops, foreign calls and copies served in C: untimed)",
                  ["function", "calls", "no-ops", "foreign", "served", "total ms", "mean us",
                   "p50 us", "p99 us", "bytes", "errors"], rows)


def _kernel_table(profile) -> str:
    by_kernel = defaultdict(list)
    for record in profile.records:
        if record.kind == "launch":
            by_kernel[record.backend, record.name].append(record)
    rows = []
    for (backend, name), records in sorted(by_kernel.items()):
        device = [r.device_ns for r in records if r.device_ns is not None]
        first = records[0].launch
        rows.append([name, backend, len(records),
                     f"{sum(r.duration_ns for r in records) / 1e6:.3f}",
                     f"{sum(device) / 1e6:.3f}" if device else "-",
                     "x".join(map(str, first["blocks"])), "x".join(map(str, first["threads"])),
                     sum(1 for r in records if r.result != 0)])
    return _table("Kernel launches", ["kernel", "backend", "launches", "host ms", "device ms",
                                      "blocks", "threads", "errors"], rows)


# The runtime call in which a GPU pipeline's kernels are compiled (shim/core/runtime.py's
# operation, named as Halide's halide_<api>_initialize_kernels): shown as compilation, not as
# part of whichever call of the pipeline happened to trigger it.
KERNEL_COMPILE = "initialize_kernels"


def _pipeline_table(profile) -> str:
    by_name = defaultdict(list)
    compiling = defaultdict(int)  # pipeline call id -> ns its GPU code took to compile
    for record in profile.records:
        if record.kind == "pipeline":
            by_name[record.name].append(record)
        elif record.kind == "runtime" and record.name == KERNEL_COMPILE:
            compiling[record.call] += record.duration_ns
    rows = [[name, len(records), *_time_columns([r.duration_ns for r in records]),
             f"{sum(compiling[r.id] for r in records) / 1e6:.3f}",
             sum(1 for r in records if r.result != 0)]
            for name, records in sorted(by_name.items())]
    # (A GPU pipeline's first call compiles its kernels, whichever call that is: often its
    # bounds query. "compiling ms" is that part of the call's time.)
    return _table("Pipeline calls", ["pipeline", "calls", "total ms", "mean us", "p50 us",
                                     "p99 us", "compiling ms", "errors"], rows)


def _stage_tables(profile) -> list[str]:
    """Per pipeline built with Halide's profiler: its Funcs over the profile's calls, as
    Halide's profiler saw them (shim/profiling/halide_profiler.py), and the kernels each launched."""
    by_name = defaultdict(list)
    for record, stages in profile.stages:
        by_name[record.name].append(stages)
    calls = {r.id: r.name for r, _ in profile.stages}
    launches = defaultdict(list)  # (pipeline, stage) -> its kernel launches
    for record in profile.records:
        if record.kind == "launch" and record.stage is not None:
            launches[calls[record.call], record.stage].append(record)
    tables = []
    for name, calls_stages in sorted(by_name.items()):
        total = sum(c.time_ns for c in calls_stages)
        funcs: dict[int, list] = {}
        for call in calls_stages:
            for stage in call.funcs():
                funcs.setdefault(stage.index, []).append(stage)
        on_device = any(pipeline == name for pipeline, _ in launches)
        rows = []
        for index in sorted(funcs):
            stages = funcs[index]
            time_ns = sum(s.time_ns for s in stages)
            samples = sum(s.samples for s in stages)
            threads = (sum(s.threads * s.samples for s in stages if s.threads is not None)
                       / samples if samples else None)
            allocs = sum(s.num_allocs for s in stages)
            memory = sum(s.memory_total for s in stages)
            row = [stages[0].name, f"{time_ns / 1e6:.3f}",
                   f"{time_ns / len(calls_stages) / 1e3:.1f}",
                   f"{100 * time_ns / total:.1f}%" if total else "-",
                   f"{threads:.2f}" if threads is not None else "-",
                   _bytes(max(s.memory_peak for s in stages)), _bytes(memory), allocs,
                   _bytes(memory // allocs) if allocs else "-",
                   _bytes(max(s.stack_peak for s in stages))]
            if on_device:
                kernels = launches.get((name, stages[0].name), [])
                device = [r.device_ns for r in kernels if r.device_ns is not None]
                row += [len(kernels), f"{sum(device) / 1e6:.3f}" if device else "-"]
            rows.append(row)
        samples = sum(c.samples for c in calls_stages)
        tables.append(_table(
            f"Stages of {name} (Halide's profiler: {_plural(len(calls_stages), 'call')}, "
            f"{total / 1e6:.3f} ms, {_plural(samples, 'sample')}, peak heap "
            f"{_bytes(max(c.memory_peak for c in calls_stages))})",
            ["func", "total ms", "mean us", "share", "threads", "peak mem", "total mem",
             "allocs", "avg alloc", "stack peak"]
            + (["launches", "device ms"] if on_device else []), rows))
    return tables


# How a span of Halide's tracing is labelled in the trace: "realize blur_x", "produce blur_x".
_SPAN_LABELS = {"realization": "realize", "production": "produce", "consumption": "consume",
                "halide pipeline": "pipeline", "parallel task": "task"}


def _span_tables(profile) -> list[str]:
    """Per pipeline built with Halide's tracing: its Funcs' realizations and productions
    (shim/profiling/halide_trace.py)."""
    calls = {r.id: r.name for r in profile.records if r.kind == "pipeline"}
    by_pipeline = defaultdict(lambda: defaultdict(list))
    for record in profile.records:
        if record.kind in ("realization", "production"):
            by_pipeline[calls.get(record.call, "(calls begun before the profile)")][record.name].append(record)
    tables = []
    for pipeline, funcs in sorted(by_pipeline.items()):
        rows = []
        for func, records in funcs.items():
            realized = [r for r in records if r.kind == "realization"]
            produced = [r.duration_ns for r in records if r.kind == "production"]
            largest = max(records, key=lambda r: _elements(r.box))
            rows.append([func, len(realized), len(produced),
                         f"{sum(produced) / 1e6:.3f}" if produced else "-",
                         f"{sum(produced) / len(produced) / 1e3:.1f}" if produced else "-",
                         _box_text(largest.box)])
        rows.sort(key=lambda row: min(r.start_ns for r in funcs[row[0]]))
        tables.append(_table(f"Realizations of {pipeline} (Halide's tracing)",
                             ["func", "realizations", "productions", "produce ms",
                              "mean us", "largest box"], rows))
    return tables


def _access_table(profile) -> str:
    rows = [[func, c.loads, c.stores, c.loaded_values, c.stored_values]
            for func, c in sorted(profile.accesses.items())]
    sampled = f", 1 in {profile.sample_accesses} kept" if profile.sample_accesses else ""
    return _table(f"Loads and stores (Halide's tracing, counted per Func{sampled})",
                  ["func", "loads", "stores", "values loaded", "values stored"], rows)


def _trace_dropped(profile) -> str:
    if not profile.trace_dropped:
        return ""
    return (f"Halide's tracing: {profile.trace_dropped} begin events or samples were left out "
            f"of the trace (trace_limit={profile.trace_limit} events; pass a larger one to "
            f"shim.profile)")


def _elements(box) -> int:
    n = 1
    for _, extent in box or ():
        n *= extent
    return n


def _box_text(box) -> str:
    return " x ".join(f"[{lo}, {lo + extent})" for lo, extent in box) if box else "-"


def _buffer_table(profile) -> str:
    copies = defaultdict(list)  # runtime record id -> its copies
    for record in profile.records:
        if record.kind == "copy" and record.parent is not None:
            copies[record.parent].append(record)
    usage = {}
    for record in profile.records:
        if record.buffer is None:
            continue
        entry = usage.setdefault(record.buffer.id, [record.buffer, 0, 0, 0])
        entry[1] += 1
        for copy in copies.get(record.id, ()):
            if copy.name in ("upload", "download"):
                entry[2 if copy.name == "upload" else 3] += copy.bytes
    busiest = sorted(usage.values(), key=lambda e: (-(e[2] + e[3]), -e[1], e[0].id))
    rows = [[info.id, "x".join(map(str, info.shape)) or "scalar", info.dtype,
             info.crop_of if info.crop_of is not None else "", calls, _bytes(up), _bytes(down)]
            for info, calls, up, down in busiest[:MAX_BUFFER_ROWS]]
    title = "Buffers" if len(busiest) <= MAX_BUFFER_ROWS else \
        f"Buffers (the {MAX_BUFFER_ROWS} that moved the most data, of {len(busiest)})"
    return _table(title, ["buffer", "shape", "dtype", "crop of", "calls", "uploaded",
                          "downloaded"], rows)


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _time_columns(durations: list[int]) -> list[str]:
    if not durations:
        return ["-"] * 4
    ordered = sorted(durations)
    def at(q):
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    return [f"{sum(ordered) / 1e6:.3f}", f"{sum(ordered) / len(ordered) / 1e3:.1f}",
            f"{at(0.5) / 1e3:.1f}", f"{at(0.99) / 1e3:.1f}"]


def _bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024 or unit == "GiB":
            return f"{size:.1f} {unit}"


def _table(title: str, header: list[str], rows: list[list]) -> str:
    if not rows:
        return ""
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    def line(row):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
    return "\n".join([title, line(header), line(["-" * w for w in widths])]
                     + [line(row) for row in cells[1:]])


# --- Chrome trace ----------------------------------------------------------------------------

def save_trace(profile, path) -> str:
    path = os.fspath(path)
    with open(path, "w") as f:
        json.dump(chrome_trace(profile), f)
    return path


def chrome_trace(profile) -> dict:
    events = [_meta("process_name", HOST_PID, 0, "halide-shim: host threads"),
              _meta("process_name", DEVICE_PID, 0, "halide-shim: device queues and streams")]
    for thread, name in profile.thread_names.items():
        events.append(_meta("thread_name", HOST_PID, thread, name))
    tracks: dict[str, int] = {}
    for record in profile.records:
        events.append(_slice(record, HOST_PID, record.thread, record.start_ns, record.duration_ns))
        if record.device_ns is None:
            continue
        track = tracks.get(record.device_track)
        if track is None:
            track = tracks[record.device_track] = len(tracks) + 1
            events.append(_meta("thread_name", DEVICE_PID, track, record.device_track))
        events.append(_slice(record, DEVICE_PID, track, record.device_start_ns, record.device_ns))
        # A flow from the host call that enqueued the work to its execution on the device.
        events.append({"ph": "s", "id": record.id, "name": "enqueue", "cat": "flow",
                       "pid": HOST_PID, "tid": record.thread, "ts": _us(record.start_ns)})
        events.append({"ph": "f", "bp": "e", "id": record.id, "name": "enqueue", "cat": "flow",
                       "pid": DEVICE_PID, "tid": track, "ts": _us(record.device_start_ns)})
    for sample in profile.samples:
        value = sample.value  # (inf and nan as text: JSON has no such numbers)
        if isinstance(value, float) and not abs(value) < float("inf"):
            value = str(value)
        args = {"coordinates": list(sample.coordinates), "value": value}
        if sample.lanes > 1:
            args["lanes"] = sample.lanes
        if sample.value_index:
            args["value index"] = sample.value_index
        events.append({"ph": "i", "s": "t", "name": f"{sample.kind} {sample.func}",
                       "cat": "halide access", "pid": HOST_PID, "tid": sample.thread,
                       "ts": _us(sample.time_ns), "args": args})
    for ns, backend, live, pooled in profile.memory:
        events.append({"ph": "C", "name": f"live device memory ({backend})", "pid": DEVICE_PID,
                       "tid": 0, "ts": _us(ns), "args": {"bytes": live, "pooled bytes": pooled}})
    other = {"producer": "halide-shim", "records": len(profile.records)}
    if profile.accesses:
        other["halide loads and stores"] = {
            func: {"loads": c.loads, "stores": c.stores, "values loaded": c.loaded_values,
                   "values stored": c.stored_values} for func, c in profile.accesses.items()}
    if profile.trace_dropped:
        other["halide trace events left out"] = profile.trace_dropped
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}


def _slice(record, pid: int, tid: int, start_ns: int, duration_ns: int) -> dict:
    args = {"record": record.id, "kind": record.kind}
    for key in ("backend", "parent", "call"):
        value = getattr(record, key)
        if value is not None:
            args[key] = value
    if record.buffer is not None:
        args["buffer"] = record.buffer.id
        args["shape"] = list(record.buffer.shape)
        args["dtype"] = record.buffer.dtype
        if record.buffer.crop_of is not None:
            args["crop of"] = record.buffer.crop_of
    if record.bytes:
        args["bytes"] = record.bytes
    if record.launch is not None:
        args.update({key: list(v) if isinstance(v, tuple) else v for key, v in record.launch.items()})
    if record.device_ns is not None:
        args["device ns"] = record.device_ns
    if record.result != 0:
        args["result"] = f"{record.result} ({error_name(record.result)})"
    if record.box is not None:
        args["box"] = [list(d) for d in record.box]
    if record.stage is not None:
        args["stage"] = record.stage
    if record.stages is not None:
        calls = record.stages
        args["halide profiler"] = {
            "time ns": calls.time_ns, "samples": calls.samples, "peak heap": calls.memory_peak,
            "stages": {s.name: {"time ns": s.time_ns, "share": round(calls.share(s), 4),
                                "threads": s.threads, "memory peak": s.memory_peak,
                                "memory total": s.memory_total, "allocs": s.num_allocs,
                                "stack peak": s.stack_peak} for s in calls.funcs()}}
    name = f"{_SPAN_LABELS[record.kind]} {record.name}" if record.kind in _SPAN_LABELS \
        else record.name
    if record.kind == "runtime" and record.name == KERNEL_COMPILE:
        name = f"compiling GPU code ({KERNEL_COMPILE})"
    return {"ph": "X", "name": name, "cat": record.kind, "pid": pid, "tid": tid,
            "ts": _us(start_ns), "dur": _us(duration_ns), "args": args}


def _meta(kind: str, pid: int, tid: int, name: str) -> dict:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}


def _us(ns: int) -> float:
    return ns / 1000.0
