"""Profiles of what the runtime does while pipelines run.

    with shim.profile() as prof:
        p(x, output=y)
    print(prof.summary())
    prof.save_trace("trace.json")      # Perfetto / chrome://tracing

Every runtime call that reaches Python (all device work of the shim's own backends) becomes a
Record: function, backend, buffer, bytes moved, host time, device time where the backend can
measure it, thread, result. Kernel launches, which the native library makes without Python,
are reported by it around each launch while a profile records; the calls it decides alone (no-
ops, refusals, another runtime's interfaces) are counted per function in C, never entering
Python (native_stubs/profiling/profile.c). Pipeline calls are records that enclose the runtime calls
they make, on their thread and, through the call context, on Halide's worker threads.

Device time comes from markers enqueued before and after each launch or copy (OpenCL events
on a profiling queue, CUDA events) and is read when the profile stops, once the work is done;
the markers' device clock is related to the host's once per profile and backend. Concurrent
launches into one queue share its timeline, so their device times are those of the queue.

One profile records at a time. With none recording, the hooks below cost one global read.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import TYPE_CHECKING, NamedTuple

from shim.profiling import halide_profiler
from shim.native import interrupts
from shim.base import sections
from shim.backends.devices import backend_for_interface, kind_of_index
from shim.base.errors import ArgumentError, ShimError
from shim.native import HeldContext, ffi, lib
from shim.base.types import HalideType

if TYPE_CHECKING:  # (imported at the first profile: see _halide_trace)
    from shim.profiling import halide_trace

# Names of the functions the native library counts, by enum shim_function value.
C_FUNCTIONS = {value: name.removeprefix("SHIM_FN_").lower()
               for value, name in ffi.typeof("enum shim_function").elements.items()
               if name != "SHIM_FN_COUNT"}

_active: Profile | None = None
_start_lock = threading.Lock()
_local = threading.local()


class BufferInfo(NamedTuple):
    """A halide_buffer_t as the profile saw it first: ``id`` is the profile's own number for
    it; ``crop_of`` the id of the buffer it is a crop or slice of."""

    id: int
    shape: tuple
    dtype: str
    crop_of: int | None = None


class Record:
    """One recorded call. Times are ns since the profile started; ``device_*`` are None where
    the backend cannot time device work. ``kind`` is "pipeline", "runtime" (a runtime function),
    "launch" (a kernel) or "copy" (bytes moved inside a runtime call).

    Other fields: ``backend`` (a device kind), ``buffer`` (a BufferInfo), ``bytes`` moved,
    ``result`` (Halide's return code), ``parent`` (the id of the record it ran inside),
    ``call`` (the id of the pipeline call it belongs to), ``launch`` (a kernel's launch
    geometry; on OpenCL and Vulkan also "staged", the number of buffers staged around the
    kernel: crops it could take neither in place nor at an offset), ``device_track``, ``device_start_ns`` and
    ``device_ns`` (device timing).

    - ``stages``: a pipeline call of a build with Halide's profiler (``-profile``): that call's
      per-Func figures, a shim.profiling.halide_profiler.CallStages (None where Halide recorded
      no run of it, or where another call of it ended meanwhile and mixed in: one run outside
      the profile, or one that went ahead without its turn, shim/profiling/halide_profiler.py).
    - ``box``: a span of Halide's tracing (kinds "realization", "production", "consumption",
      "halide pipeline", and a Halide 22 library's "parallel task"): the box Halide passed,
      ((min, extent), ...) per dimension (a task's: its loop's).
    - ``stage``: a kernel launch in a call of a build with Halide's profiler: the Func (stage)
      whose kernel it is, from the kernel's name (Halide names it after the Func's loop).

    (A plain class, not a dataclass: a dataclass costs every ``import shim`` a millisecond.)"""

    __slots__ = ("id", "kind", "name", "thread", "start_ns", "duration_ns", "backend", "buffer",
                 "bytes", "result", "parent", "call", "launch", "device_track",
                 "device_start_ns", "device_ns", "markers", "stages", "box", "stage",
                 "_snapshot")
    # What repr shows: everything but the markers and the snapshot, which are the profile's.
    _SHOWN = __slots__[:16] + ("stages", "box", "stage")

    def __init__(self, id: int, kind: str, name: str, thread: int, start_ns: int,
                 duration_ns: int = 0, backend: str | None = None,
                 buffer: BufferInfo | None = None, bytes: int = 0, result: int = 0,
                 parent: int | None = None, call: int | None = None, launch: dict | None = None,
                 device_track: str | None = None, device_start_ns: int | None = None,
                 device_ns: int | None = None, markers=None,
                 stages: halide_profiler.CallStages | None = None,
                 box: tuple[tuple[int, int], ...] | None = None, stage: str | None = None,
                 _snapshot=None):
        self.id, self.kind, self.name, self.thread = id, kind, name, thread
        self.start_ns, self.duration_ns, self.backend, self.buffer = start_ns, duration_ns, backend, buffer
        self.bytes, self.result, self.parent, self.call = bytes, result, parent, call
        self.launch, self.device_track = launch, device_track
        self.device_start_ns, self.device_ns = device_start_ns, device_ns
        self.markers, self.stages, self.box, self.stage = markers, stages, box, stage
        self._snapshot = _snapshot

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._SHOWN)
        return f"Record({fields})"


def _halide_trace():
    """shim/profiling/halide_trace.py, imported at the first profile: most processes never
    make one, and every import of shim would pay for it."""
    from shim.profiling import halide_trace

    return halide_trace


def profile(*, trace_limit: int | None = None, sample_accesses: int = 0) -> Profile:
    """A new profile; it records inside ``with`` or between ``start()`` and ``stop()``.

    For pipelines built with Halide's tracing (shim/profiling/halide_trace.py): at most ``trace_limit``
    begin/end events are kept (the rest are counted in ``trace_dropped``; None: 20,000,
    halide_trace.DEFAULT_LIMIT); loads and stores are counted per Func, and one in every
    ``sample_accesses`` is kept as well where it is not 0."""
    return Profile(trace_limit=trace_limit, sample_accesses=sample_accesses)


def _event_count(argument: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        raise ArgumentError(argument, f"expected an int from 0 to 2**31 - 1, got {value!r}")
    return value


class Profile(HeldContext):
    """Records what the runtime does between ``start()`` and ``stop()``; see the module. As a
    context manager, its start and stop run with signal handlers held (HeldContext): a
    Ctrl-C raised at the first bytecode of a Python __exit__ would leave it recording."""

    def __init__(self, *, trace_limit: int | None = None, sample_accesses: int = 0):
        if trace_limit is None:
            trace_limit = _halide_trace().DEFAULT_LIMIT
        self.trace_limit = _event_count("trace_limit", trace_limit)
        self.sample_accesses = _event_count("sample_accesses", sample_accesses)
        #: What was recorded, a Record each: pipeline and runtime calls, launches, copies, and
        #: the spans of Halide's tracing.
        self.records: list[Record] = []
        #: {function: {"noop": n, "foreign": n, "refused": n, "served": n}}: calls decided in
        #: C ("served": done there, data moved: halide_buffer_copy between hosts).
        self.decided_in_c: dict[str, dict[str, int]] = {}
        #: [(ns, backend kind, live bytes, pooled bytes)]: the backends' device memory after
        #: each change: held by Buffers, and kept idle for reuse (shim/backends/pool.py).
        self.memory: list[tuple[int, str, int, int]] = []
        #: {native thread id: name} of the threads that recorded.
        self.thread_names: dict[int, str] = {}
        #: Halide's tracing: {Func: the loads and stores counted}.
        self.accesses: dict[str, halide_trace.AccessCounts] = {}
        #: Halide's tracing: the sampled loads and stores (``sample_accesses``).
        self.samples: list[halide_trace.Access] = []
        #: Halide's tracing: how many begin/end events ``trace_limit`` left out.
        self.trace_dropped = 0
        #: Nanoseconds from start() to stop().
        self.duration_ns = 0
        self._origin = 0
        self._ids = 0
        self._buffers: dict[tuple, BufferInfo] = {}
        self._calls: dict[int, int] = {}  # call context id -> pipeline record id
        self._clocks: dict = {}  # backend -> its timing origin
        self._lock = sections.Lock()
        self._recording = False

    # --- control ---------------------------------------------------------------------------

    def start(self) -> Profile:
        global _active
        try:
            # (signal handlers wait: the native trace must not be left recording with no
            # profile active)
            with interrupts.deferred(), _start_lock:
                if _active is not None:
                    raise ShimError("another profile is recording; stop it first")
                if self._recording or self.duration_ns:
                    raise ShimError("this profile has already recorded; make a new one")
                self._origin = time.perf_counter_ns()  # (before any span can begin)
                _halide_trace().start(self.trace_limit, self.sample_accesses)
                try:
                    lib.shim_profile_reset()
                    self._recording = True
                    _active = self
                    lib.shim_profile_enable(True)
                except BaseException:
                    self._deactivate()
                    raise
        except BaseException:
            # A handler's exception raised as the section ends (Ctrl-C during the start), once
            # the profile records: nobody would ever stop it (``with`` runs __exit__ only after
            # __enter__ returned), and every later call would be recorded without bound.
            with _start_lock:
                if _active is self:
                    self._deactivate()
            raise
        return self

    def stop(self) -> Profile:
        with interrupts.deferred(), _start_lock:
            if _active is not self:
                raise ShimError("this profile is not recording")
            trace = self._deactivate()
            self.duration_ns = time.perf_counter_ns() - self._origin
        self._read_trace(trace)
        self._read_c_counts()
        self._read_device_times()
        self._attribute_launches()
        return self

    def _deactivate(self):
        """Stop recording (with ``_start_lock`` held); returns Halide's trace of the recording.
        Calls still running on other threads record nothing more from here on (their hooks
        see ``_recording`` false under the profile's lock, see _begin and _mark_before), so the
        reading of the results below never races them."""
        global _active
        lib.shim_profile_enable(False)
        trace = _halide_trace().stop()  # (read before another profile's start resets it)
        _active = None
        with self._lock:
            self._recording = False
        return trace

    def _enter(self) -> Profile:
        return self.start()

    def _exit(self, *exc) -> None:
        self.stop()

    # --- results ---------------------------------------------------------------------------

    def summary(self) -> str:
        """Tables per function, kernel, pipeline and buffer."""
        from shim.profiling.report import summary

        return summary(self)

    def save_trace(self, path: str | os.PathLike[str]) -> str:
        """Write a Chrome trace (JSON) that Perfetto and chrome://tracing open; returns the
        path."""
        from shim.profiling.report import save_trace

        return save_trace(self, path)

    def calls(self, name: str) -> list[Record]:
        """The records of runtime function (or kernel, or pipeline) ``name``."""
        return [r for r in self.records if r.name == name]

    @property
    def stages(self) -> list[tuple[Record, halide_profiler.CallStages]]:
        """[(pipeline call Record, CallStages)] for the calls of pipelines built with Halide's
        profiler, in call order."""
        return [(r, r.stages) for r in self.records if r.kind == "pipeline" and r.stages is not None]

    def count(self, function: str) -> int:
        """How many calls of a runtime function reached the shim: recorded plus decided in C."""
        recorded = sum(1 for r in self.records if r.kind == "runtime" and r.name == function)
        return recorded + sum(self.decided_in_c.get(function, {}).values())

    # --- recording (the hooks below call these) ----------------------------------------------

    def _begin(self, kind: str, name: str, raw, backend, launch=None, call_id=None) -> Record:
        """A new record, on the calling thread's stack. Once the profile stopped (another
        thread stopped it while this call ran), the record is the profile's no more: id 0,
        kept nowhere, and the rest of the call's hooks do nothing with it."""
        now = time.perf_counter_ns() - self._origin
        thread = threading.get_native_id()
        with self._lock:
            if not self._recording:
                return Record(0, kind, name, thread, now, backend=backend, launch=launch)
            if thread not in self.thread_names:
                self.thread_names[thread] = threading.current_thread().name
            self._ids += 1
            record = Record(self._ids, kind, name, thread, now, backend=backend, launch=launch)
            if raw is not None:
                record.buffer = self._buffer_info(raw)
            if call_id is not None:
                self._calls[call_id] = record.id
            self.records.append(record)
        stack = _stack()
        record.parent = stack[-1].id if stack else None
        record.call = record.id if kind == "pipeline" else self._call_of_thread()
        stack.append(record)
        return record

    def _end(self, record: Record, result: int) -> None:
        if not record.id:
            return  # (begun after the profile stopped: see _begin)
        record.duration_ns = time.perf_counter_ns() - self._origin - record.start_ns
        record.result = int(result)
        stack = _stack()
        if stack and stack[-1] is record:
            stack.pop()
        if record.kind == "copy" and stack:
            stack[-1].bytes += record.bytes  # the runtime call the copy was part of

    def _call_of_thread(self) -> int | None:
        call = lib.shim_current_call()
        if call == ffi.NULL:
            return None
        return self._calls.get(lib.shim_call_id(call))

    def _buffer_info(self, raw) -> BufferInfo:
        from shim.memory import families

        address = families.address_of(raw)
        family = families.family_of(raw)
        key = (address, id(family))
        info = self._buffers.get(key)
        if info is None:
            crop_of = None
            if family is not None and family.shared:
                # (Without the family's lock: another thread may be adding or removing a
                # member, so the members are taken in one step, which the GIL keeps whole.)
                members = tuple(family.members.values())
                root = members[0].raw if members else raw
                if families.address_of(root) != address:
                    crop_of = self._buffer_info(root).id
            shape = tuple(raw.dim[i].extent for i in reversed(range(raw.dimensions)))
            htype = HalideType.from_c(raw.type)
            info = BufferInfo(len(self._buffers) + 1, shape, str(htype.dtype or htype), crop_of)
            self._buffers[key] = info
        return info

    def _timing_origin(self, backend):
        origin = self._clocks.get(backend)
        if origin is None:
            origin = self._clocks[backend] = backend.timing_origin()
        return origin

    def _read_c_counts(self) -> None:
        outcomes = {"noop": lib.SHIM_OUTCOME_NOOP, "foreign": lib.SHIM_OUTCOME_FOREIGN,
                    "refused": lib.SHIM_OUTCOME_REFUSED, "served": lib.SHIM_OUTCOME_SERVED}
        for value, name in C_FUNCTIONS.items():
            counts = {key: lib.shim_profile_count(value, outcome) for key, outcome in outcomes.items()}
            if any(counts.values()):
                self.decided_in_c[name] = counts

    def _read_trace(self, trace) -> None:
        """Halide's trace (shim/profiling/halide_trace.py) into the profile: spans become records on the
        thread each ran on, in the pipeline call it ran under."""
        self.accesses, self.trace_dropped = trace.accesses, trace.dropped
        # (times from the profile's start, like the records')
        from dataclasses import replace  # (halide_trace's records: imported with it)

        self.samples = [replace(a, time_ns=a.time_ns - self._origin) for a in trace.samples]
        calls = {r.id: r for r in self.records if r.kind == "pipeline"}
        by_halide_id: dict[int, Record] = {}
        open_spans: dict[int, list[Record]] = {}  # thread -> spans enclosing the next start
        for span in trace.spans:  # (in order of start)
            record = self._span_record(span, calls)
            record.parent = _span_parent(record, open_spans.setdefault(span.thread, []),
                                         by_halide_id.get(span.parent_id))
            by_halide_id[span.halide_id] = record
            self.records.append(record)
        for thread in {s.thread for s in trace.spans} | {a.thread for a in self.samples}:
            self.thread_names.setdefault(thread, f"thread {thread}")

    def _span_record(self, span, calls: dict) -> Record:
        """A span as a record. One whose end came after the stop ends at the profile's end,
        or at its call's where that came first."""
        self._ids += 1
        end_ns = span.end_ns if span.end_ns is not None else self._origin + self.duration_ns
        record = Record(self._ids, span.kind, span.func, span.thread,
                        span.start_ns - self._origin, end_ns - span.start_ns, box=span.box)
        record.call = self._calls.get(span.call) if span.call else None
        call = calls.get(record.call)
        if span.end_ns is None and call is not None and call.duration_ns:
            record.duration_ns = min(record.duration_ns,
                                     call.start_ns + call.duration_ns - record.start_ns)
        return record

    def _attribute_launches(self) -> None:
        """Name the stage (Func) of each kernel launched by a call of a build with Halide's
        profiler, from the kernel's name (halide_profiler.stage_of_kernel)."""
        calls = {r.id: r for r in self.records if r.kind == "pipeline" and r.stages is not None}
        for record in self.records:
            call = calls.get(record.call) if record.kind == "launch" else None
            if call is not None:
                record.stage = halide_profiler.stage_of_kernel(
                    record.name, [s.name for s in call.stages.stages])

    def _read_device_times(self) -> None:
        """Turn the markers into device times (the device finishes its work first), then lay
        each device track's slices end to end where marker jitter made them overlap."""
        timed = [r for r in self.records if r.markers is not None and r.markers.after is not None]
        for backend in {r.markers.backend for r in timed}:
            backend.sync()
        for record in timed:
            marks, record.markers = record.markers, None
            start, duration = marks.backend.timing_read(marks.origin, marks.before, marks.after)
            record.device_start_ns = start - self._origin
            record.device_ns = duration
        for record in self.records:
            record.markers = None  # (those of calls that failed before their second mark)
        for backend, origin in self._clocks.items():
            if origin is not None:
                backend.timing_close(origin)
        end_of_track: dict[str, int] = {}
        for record in sorted(timed, key=lambda r: r.device_start_ns):
            start = max(record.device_start_ns, end_of_track.get(record.device_track, 0))
            record.device_start_ns = start
            end_of_track[record.device_track] = start + record.device_ns


def _span_parent(record: Record, stack: list, named: Record | None) -> int | None:
    """The parent of a span's record: the innermost span enclosing it on its thread in the
    same call (a thread waiting in a parallel loop may run another call's tasks meanwhile),
    else the span Halide names as its parent (a realization's pipeline), else its call.
    ``stack``: the spans still open on its thread, brought up to the record's start; the
    record is pushed."""
    while stack and stack[-1].start_ns + stack[-1].duration_ns <= record.start_ns:
        stack.pop()
    enclosing = next((r for r in reversed(stack) if r.call == record.call), None)
    stack.append(record)
    if enclosing is not None:
        return enclosing.id
    return named.id if named is not None else record.call


def _stack() -> list:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _after_fork_in_child() -> None:
    """The child has only the thread that forked: locks other threads held are let go."""
    global _start_lock
    _start_lock = threading.Lock()
    if _active is not None:
        _active._lock = sections.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


# --- hooks: each costs one global read while nothing records -------------------------------

def begin_call(operation, args) -> tuple | None:
    """A runtime function (a Python operation serving a C caller) starts."""
    profile = _active
    if profile is None:
        return None
    raw, backend = _subject(args)
    return profile, profile._begin("runtime", operation.__name__, raw, backend)


def begin_pipeline(name: str, call_id: int, halide_profiler_abi: int | None = None) -> tuple | None:
    """A pipeline call starts; ``halide_profiler_abi``: it was built with Halide's profiler, by
    a release of that profiler ABI (Release.profiler_abi; None: built without)."""
    profile = _active
    if profile is None:
        return None
    # A build with Halide's profiler: its calls take turns while profiled (the turn is taken
    # before the record starts, so waiting for it is not the call's time).
    snapshot = (halide_profiler.begin(name, halide_profiler_abi)
                if halide_profiler_abi is not None else None)
    try:
        record = profile._begin("pipeline", name, None, None, call_id=call_id)
    except BaseException:
        halide_profiler.end(snapshot)
        raise
    record._snapshot = snapshot
    return profile, record


def end(token, result: int = 0) -> None:
    if token is not None:
        profile, record = token
        snapshot, record._snapshot = record._snapshot, None
        try:
            profile._end(record, result)
        finally:
            if snapshot is not None:
                record.stages = halide_profiler.end(snapshot)


class timed_copy:
    """``with timed_copy(backend, "upload", nbytes):`` around one transfer of a runtime call."""

    __slots__ = ("token", "backend", "name", "nbytes")

    def __init__(self, backend, name: str, nbytes: int):
        self.backend, self.name, self.nbytes, self.token = backend, name, nbytes, None

    def __enter__(self):
        profile = _active
        if profile is not None:
            record = profile._begin("copy", self.name, None, self.backend.kind)
            record.bytes = self.nbytes
            self.token = profile, record
            _mark_before(profile, record, self.backend, None)

    def __exit__(self, kind, value, traceback):
        if self.token is not None:
            profile, record = self.token
            _mark_after(profile, record)
            profile._end(record, 0 if kind is None else -1)


def memory_changed(backend) -> None:
    profile = _active
    if profile is not None:
        now = time.perf_counter_ns() - profile._origin
        with profile._lock:
            if profile._recording:
                profile.memory.append((now, backend.kind, backend.live_bytes, backend.pooled_bytes))


class _Markers:
    """The device-side marks around one launch or copy, until the profile reads them."""

    __slots__ = ("backend", "origin", "stream", "before", "after")

    def __init__(self, backend, origin, stream):
        self.backend, self.origin, self.stream = backend, origin, stream
        self.before = backend.timing_marker(stream)
        self.after = None


def _mark_before(profile: Profile, record: Record, backend, stream) -> None:
    """Enqueue the marker before a launch or copy on ``stream`` (None: where the backend's
    copies for the current call go). Markers are made and read under the profile's lock, and
    only while it records: a stop on another thread reads them and closes their clocks."""
    with profile._lock:
        if not profile._recording:
            return
        origin = profile._timing_origin(backend)
        if origin is None:
            return  # this backend cannot time device work
        record.device_track = backend.timing_track(stream)
        record.markers = _Markers(backend, origin, stream)


def _mark_after(profile: Profile, record: Record) -> None:
    with profile._lock:
        markers = record.markers
        if profile._recording and markers is not None:
            markers.after = markers.backend.timing_marker(markers.stream)


def _subject(args):
    """The buffer a runtime operation works on and the name of its backend."""
    raw = interface = None
    for arg in args:
        if isinstance(arg, ffi.CData) and arg != ffi.NULL:  # (device_sync_global: no buffer)
            cname = ffi.typeof(arg).cname
            if raw is None and "halide_buffer_t *" in cname:
                raw = arg
            elif "halide_device_interface_t *" in cname:
                interface = arg
    if interface is None and raw is not None:
        interface = raw.device_interface
    backend = None
    if interface is not None and interface != ffi.NULL:
        index = lib.shim_backend_of(interface)
        backend = "proxy" if index == lib.SHIM_BACKEND_PROXY else kind_of_index(index) or "foreign"
    return raw, backend


# --- kernel launches, reported by the native library -----------------------------------------

_launches: dict[int, tuple] = {}
_launch_ids = itertools.count(1)


@ffi.def_extern(error=0)
def shim_py_profile_launch_begin(user_context, launch):
    profile = _active
    if profile is None:
        return 0
    backend = backend_for_interface(lib.shim_backend_interface(launch.backend))
    info = {"blocks": tuple(launch.blocks), "threads": tuple(launch.threads),
            "shared_mem_bytes": launch.shared_mem_bytes}
    record = profile._begin("launch", ffi.string(launch.kernel).decode(), None, backend.kind,
                            launch=info)
    _mark_before(profile, record, backend, int(ffi.cast("uintptr_t", launch.stream)))
    token = next(_launch_ids) & 0x7FFFFFFF or 1  # a C int, unique among launches in flight
    _launches[token] = (profile, record)
    return token


@ffi.def_extern()
def shim_py_profile_launch_end(token, result, staged):
    entry = _launches.pop(token, None)
    if entry is None:
        return
    profile, record = entry
    if staged >= 0:  # (a backend that reports it: OpenCL, Vulkan)
        record.launch["staged"] = staged
    _mark_after(profile, record)
    profile._end(record, result)
