"""The CUDA backend, through cuda-python (the driver API).

It uses the device's primary context (the one the CUDA runtime, PyTorch and CuPy share),
chosen by ``shim.device("cuda", device=N)``, $HALIDE_SHIM_CUDA_DEVICE or Halide's HL_GPU_DEVICE;
-1 or unset is Halide's choice: the device with the most multiprocessors. Handles are raw
CUdeviceptr values, as in Halide. Launches are in C (native_stubs/backends/cuda.c); this module loads
modules (once per PTX source and context), allocates and copies. Every driver call here runs
between shim_cuda_enter and shim_cuda_leave, which acquire the context through Halide's hooks
and push it, so the caller's current context is left alone (see cuda.c).

Streams: a pipeline call runs on the calling thread's ``shim.stream`` (0, the legacy default,
outside one). After a call, each allocation it used keeps a *fence* per stream: an event
recorded after the call's work (on the legacy stream, a note to record one when needed, since
that stream never goes away). Copies, frees, later calls on other streams and DLPack consumers
wait for an allocation's fences, so reading a result on any stream, after the stream it was
made on is gone, is ordered after the kernels that wrote it. Copies are synchronous, since
the caller reads or reuses the host memory next.
"""

from __future__ import annotations

import os
import re
import time
from contextlib import contextmanager

from shim.base import sections
from shim.native import streams
from shim.backends.base import Backend, BackendError, Memory, fork_guard
from shim.base.errors import DeviceUnavailable
from shim.native import Finalized, ffi, lib
from shim.native.regions import CopyPlan, rectangles

# Halide 21 loads modules with the register cap below (src/runtime/cuda.cpp, compile_kernel),
# and reads this variable to change it, so that a kernel's largest blocks can be resident.
MAX_REGISTERS_VARIABLE = "HL_CUDA_JIT_MAX_REGISTERS"
DEFAULT_MAX_REGISTERS = 64


def _driver():
    try:
        try:
            from cuda.bindings import driver
        except ImportError:
            from cuda import cuda as driver
    except ImportError:
        raise DeviceUnavailable("CUDA needs cuda-python: pip install 'halide-shim[cuda]'") from None
    return driver


def _check(result, what):
    """cuda-python returns (CUresult, values...): the values, or BackendError."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if int(status) != 0:
        name = _driver().cuGetErrorName(status)
        raise BackendError(f"{what} failed: {name[1].decode() if name[0] == 0 else int(status)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _init():
    """The driver module, initialized; DeviceUnavailable where there is no CUDA driver."""
    cu = _driver()
    try:
        _check(cu.cuInit(0), "cuInit")
    except BackendError as e:
        raise DeviceUnavailable(f"no CUDA device: {e}") from None
    except Exception as e:  # noqa: BLE001 - cuda-python raises its own when the driver is missing
        raise DeviceUnavailable(f"no CUDA driver on this machine: {e}") from None
    return cu


def unavailable_reason() -> str | None:
    """Why this machine has no usable CUDA device, or None if it has one."""
    try:
        return None if _device_names() else "the CUDA driver reports no device"
    except (DeviceUnavailable, BackendError) as e:
        return str(e)


def _device_names() -> list[str]:
    cu = _init()
    names = []
    for i in range(_check(cu.cuDeviceGetCount(), "cuDeviceGetCount")):
        device = _check(cu.cuDeviceGet(i), "cuDeviceGet")
        names.append(_check(cu.cuDeviceGetName(256, device), "cuDeviceGetName")
                     .split(b"\0")[0].decode())
    return names


def _requested_device(device) -> int:
    """The ordinal asked for: the argument, else $HALIDE_SHIM_CUDA_DEVICE, else Halide's
    HL_GPU_DEVICE, else -1 (Halide's "choose for me")."""
    for value, source in ((device, "device"),
                          (os.environ.get("HALIDE_SHIM_CUDA_DEVICE"), "$HALIDE_SHIM_CUDA_DEVICE"),
                          (os.environ.get("HL_GPU_DEVICE"), "$HL_GPU_DEVICE")):
        if value is None or value == "":
            continue
        try:
            return int(value)
        except (TypeError, ValueError):
            raise DeviceUnavailable(f"{source} must be a CUDA device number or -1, got "
                                    f"{value!r}") from None
    return -1


def _choose_device(cu, requested: int) -> int:
    """Halide's rule (cuda.cpp, create_cuda_context): -1 is the only device if there is one,
    else the one with the most multiprocessors (the last of equals)."""
    count = _check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
    if count == 0:
        raise DeviceUnavailable("the CUDA driver reports no device")
    if requested == -1:
        if count == 1:
            return 0
        cores = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        best, best_cores = 0, -1
        for ordinal in range(count):
            handle = _check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
            n = _check(cu.cuDeviceGetAttribute(cores, handle), "cuDeviceGetAttribute")
            if n >= best_cores:
                best, best_cores = ordinal, n
        return best
    if not 0 <= requested < count:
        raise DeviceUnavailable(f"no CUDA device {requested}: this machine has {count} "
                                f"(0 to {count - 1}, or -1 for the one with the most cores)")
    return requested


def _driver_library_path() -> str:
    with open("/proc/self/maps") as maps:
        found = re.findall(r"(/\S*libcuda\.so\S*)", maps.read())
    return found[0] if found else "libcuda.so.1"


class _Fence(Finalized):
    """Work enqueued on ``stream`` up to some point: ``event`` was recorded there, or, on the
    legacy default stream (``event`` None), one is recorded when someone must wait.

    The event goes back to ``spares`` for the next record only when no one holds the fence any
    more: a thread about to wait on it never finds it recorded again for other work."""

    __slots__ = ("stream", "event", "spares")

    def __init__(self, stream: int, event=None, spares: list | None = None):
        self.stream, self.event, self.spares = stream, event, spares

    def _finalize(self):  # (Finalized's finalizer: Ctrl-C cannot lose the event)
        if self.event is not None and self.spares is not None:
            self.spares.append(self.event)  # (atomic: safe from any thread, at any time)


class CUDAMemory(Memory):
    def __init__(self, pointer: int, nbytes: int, owned: bool = True):
        super().__init__(nbytes, owned)
        self.pointer = pointer
        # stream -> _Fence: the pipeline work on each stream that used this memory last.
        self.fences: dict[int, _Fence] = {}


class CUDABackend(Backend):
    kind = "cuda"
    index = lib.SHIM_BACKEND_CUDA
    dlpack_device_type = 2  # kDLCUDA
    # First: a CUDA device is always a GPU (an OpenCL one may be a CPU).
    default_rank = 0

    @classmethod
    def available(cls) -> list[str]:
        """The names of the CUDA devices on this machine ([] without a driver)."""
        try:
            return _device_names()
        except (DeviceUnavailable, BackendError):
            return []

    def __init__(self, device=None):
        super().__init__()
        self._usable = fork_guard("CUDA")
        cu = self._api = _init()
        self.ordinal = _choose_device(cu, _requested_device(device))
        self._device = _check(cu.cuDeviceGet(self.ordinal), "cuDeviceGet")
        self.context = _check(cu.cuDevicePrimaryCtxRetain(self._device), "cuDevicePrimaryCtxRetain")
        self._modules: dict[tuple, tuple] = {}
        self._module_lock = sections.Lock()
        self._fence_lock = sections.Lock()  # every CUDAMemory.fences
        # Events no fence holds: recorded again for new fences instead of created (as many as
        # fences were ever alive at once).
        self._spare_events: list = []
        status = lib.shim_cuda_bind(_driver_library_path().encode(),
                                    ffi.cast("void *", int(self.context)))
        if status != 0:
            raise DeviceUnavailable(f"cannot bind kernel launches to the CUDA driver (status {status})")
        attribute = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_PITCH
        self._max_pitch = _check(cu.cuDeviceGetAttribute(attribute, self._device),
                                 "cuDeviceGetAttribute(MAX_PITCH)")

    @property
    def _cu(self):
        # Every driver call goes through here: a forked child is refused before it reaches the
        # driver (kernel launches, in C, refuse on their own).
        self._usable()
        return self._api

    @contextmanager
    def _entered(self):
        """The context (Halide's hooks: the backend's, or the application's) pushed on this
        thread for the block; yields it."""
        self._usable()
        context = ffi.new("void **")
        status = lib.shim_cuda_enter(ffi.NULL, context)
        if status != 0:
            raise BackendError(f"acquiring the CUDA context failed (Halide error {status})")
        try:
            yield int(ffi.cast("uintptr_t", context[0]))
        finally:
            lib.shim_cuda_leave(ffi.NULL)

    def _stream(self, context: int) -> int:
        """Where the runtime call being served runs (Halide's get_stream hook: by default
        the call's shim.stream, else the legacy default stream)."""
        stream = ffi.new("void **")
        status = lib.halide_cuda_get_stream(ffi.NULL, ffi.cast("void *", context), stream)
        if status != 0:
            raise BackendError(f"halide_cuda_get_stream failed (Halide error {status})")
        return int(ffi.cast("uintptr_t", stream[0]))

    @property
    def name(self) -> str:
        raw = _check(self._cu.cuDeviceGetName(256, self._device), "cuDeviceGetName")
        return raw.split(b"\0")[0].decode()

    def matches(self, device=None) -> bool:
        return device is None or _choose_device(self._api, _requested_device(device)) == self.ordinal

    def compute_capability(self) -> tuple[int, int]:
        attribute = self._cu.CUdevice_attribute
        major = _check(self._cu.cuDeviceGetAttribute(
            attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self._device), "cuDeviceGetAttribute")
        minor = _check(self._cu.cuDeviceGetAttribute(
            attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self._device), "cuDeviceGetAttribute")
        return major, minor

    # --- fences: the order of work across streams ---------------------------------------

    orders_streams = True

    def ran_on(self, memory: CUDAMemory, stream: int) -> None:
        if not isinstance(memory, CUDAMemory):
            return
        fence = _Fence(stream)
        if stream != streams.LEGACY_DEFAULT:
            try:
                with self._entered():
                    fence = _Fence(stream, self._record(stream), self._spare_events)
            except BackendError:
                # Without its fence, later users of ``memory`` (a free, a reuse from the pool)
                # would not wait for the call's kernels: wait for them now, then report.
                self.sync()
                raise
        with self._fence_lock:
            memory.fences[stream] = fence  # a stream's newer fence covers its older one

    def order_before(self, memory: CUDAMemory, stream: int) -> None:
        if isinstance(memory, CUDAMemory) and memory.fences:
            with self._entered():
                self._wait_for(memory, stream)

    def settle(self, memory: CUDAMemory) -> None:
        """Block until every fence of ``memory`` is reached (before it is freed or reused)."""
        if not isinstance(memory, CUDAMemory) or not memory.fences:
            return
        with self._entered():
            with self._fence_lock:
                fences = list(memory.fences.values())
            for fence in fences:
                if fence.event is None:
                    _check(self._cu.cuStreamSynchronize(streams.LEGACY_DEFAULT), "cuStreamSynchronize")
                else:
                    _check(self._cu.cuEventSynchronize(fence.event), "cuEventSynchronize")
            self._reached(memory, fences)

    def _wait_for(self, memory: CUDAMemory, stream: int) -> list:
        """Enqueue on ``stream`` a wait for each of ``memory``'s fences from other streams
        (inside _entered); the fences waited for."""
        with self._fence_lock:
            fences = list(memory.fences.values())
        for fence in fences:
            if fence.event is not None:
                _check(self._cu.cuStreamWaitEvent(stream, fence.event, 0), "cuStreamWaitEvent")
            elif fence.stream != stream:
                # The legacy stream's work so far, recorded now (it never goes away).
                now = _Fence(streams.LEGACY_DEFAULT, self._record(streams.LEGACY_DEFAULT),
                             self._spare_events)
                _check(self._cu.cuStreamWaitEvent(stream, now.event, 0), "cuStreamWaitEvent")
        return fences

    def _reached(self, memory: CUDAMemory, fences) -> None:
        """``fences`` have been reached: forget them (unless a newer one replaced them)."""
        with self._fence_lock:
            for fence in fences:
                if memory.fences.get(fence.stream) is fence:
                    del memory.fences[fence.stream]

    def _record(self, stream: int):
        """A spare (or new) event, recorded on ``stream`` now."""
        try:
            event = self._spare_events.pop()
        except IndexError:
            flags = self._cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
            event = _check(self._cu.cuEventCreate(flags), "cuEventCreate")
        try:
            _check(self._cu.cuEventRecord(event, stream), "cuEventRecord")
        except BaseException:
            self._spare_events.append(event)
            raise
        return event

    def _forget(self, memory: CUDAMemory) -> None:
        with self._fence_lock:
            memory.fences.clear()

    # --- DLPack ----------------------------------------------------------------------------

    def dlpack_device_id(self) -> int:
        return self.ordinal

    def dlpack_stream(self):
        # The stream this thread's pipelines run on, in DLPack's numbering (1: legacy default).
        return streams.current() or 1

    def dlpack_data(self, handle: int) -> tuple[int, int]:
        return handle, 0  # a CUdeviceptr, already at the buffer's min element

    def dlpack_consumer_stream(self, stream):
        """The consumer's stream for make_visible, checked against DLPack's CUDA numbering."""
        if stream is not None and (stream == 0 or stream < -1):
            raise ValueError(f"stream {stream} is not a valid CUDA stream for DLPack (0 is "
                             "ambiguous: pass 1 for the legacy default stream, 2 for the "
                             "per-thread one)")
        return stream

    def check_dlpack_memory(self, data: int, byte_offset: int, nbytes: int) -> None:
        """Nothing checked: the driver validates device pointers itself (a bad one fails the
        copy or launch with a CUDA error, not the process), and a tensor's allocation may be
        several virtual-memory mappings (PyTorch's expandable segments), whose extent no single
        driver query gives."""

    def make_visible(self, stream, memory: CUDAMemory) -> None:
        """The consumer's stream waits for ``memory``'s fences (event waits: no device-wide
        synchronization). ``stream`` follows DLPack's CUDA numbering: None or 1 the legacy
        default stream, 2 the calling thread's per-thread default, -1 no synchronization."""
        if stream == -1 or not isinstance(memory, CUDAMemory):
            return
        consumer = streams.LEGACY_DEFAULT if stream in (None, 1) else stream
        with self._entered():
            self._wait_for(memory, consumer)

    # --- device timing, for profiles: CUDA events on the stream of the launch or copy ------

    def timing_origin(self):
        with self._entered():
            event = _check(self._cu.cuEventCreate(0), "cuEventCreate")
            _check(self._cu.cuEventRecord(event, 0), "cuEventRecord")
            _check(self._cu.cuEventSynchronize(event), "cuEventSynchronize")
        return time.perf_counter_ns(), event

    def timing_track(self, stream) -> str:
        if stream is None:
            with self._entered() as context:
                stream = self._stream(context)
        return "CUDA default stream" if stream == 0 else f"CUDA stream {stream:#x}"

    def timing_marker(self, stream):
        with self._entered() as context:
            event = _check(self._cu.cuEventCreate(0), "cuEventCreate")
            _check(self._cu.cuEventRecord(event, self._stream(context) if stream is None else stream),
                   "cuEventRecord")
        return event

    def timing_read(self, origin, before, after) -> tuple[int, int]:
        host, reference = origin
        since = _check(self._cu.cuEventElapsedTime(reference, before), "cuEventElapsedTime")
        took = _check(self._cu.cuEventElapsedTime(before, after), "cuEventElapsedTime")
        for event in (before, after):
            _check(self._cu.cuEventDestroy(event), "cuEventDestroy")
        return host + int(since * 1e6), max(int(took * 1e6), 0)

    def timing_close(self, origin) -> None:
        _check(self._cu.cuEventDestroy(origin[1]), "cuEventDestroy")

    # --- memory --------------------------------------------------------------------------

    # Allocation and free; reuse (the pool) and settling before either are the generic
    # layer's: Backend.allocate and Backend.free.

    def memory_size(self) -> int:
        return int(_check(self._cu.cuDeviceTotalMem(self._device), "cuDeviceTotalMem"))

    def _allocate_new(self, nbytes: int) -> CUDAMemory:
        with self._entered():
            pointer = _check(self._cu.cuMemAlloc(max(nbytes, 1)), f"cuMemAlloc({nbytes})")
        return CUDAMemory(int(pointer), nbytes)

    def _free_now(self, memory: CUDAMemory) -> None:
        with self._entered():
            _check(self._cu.cuMemFree(memory.pointer), "cuMemFree")

    def detached(self, memory: CUDAMemory) -> None:
        self._forget(memory)
        super().detached(memory)

    def handle(self, memory: CUDAMemory, offset: int, nbytes: int) -> int:
        return memory.pointer + offset

    def wrap(self, native: int) -> CUDAMemory:
        if native == 0:
            raise BackendError("cannot wrap a null device pointer")
        return CUDAMemory(native, 0, owned=False)

    def native(self, memory: CUDAMemory) -> int:
        return memory.pointer

    # --- copies: 2-D and 3-D driver copies, on the stream of the call that asked -----------

    def write(self, memory: CUDAMemory, plan: CopyPlan, host_address: int) -> None:
        self._copies(plan, [memory], ("host", host_address), ("device", memory.pointer))

    def read(self, memory: CUDAMemory, plan: CopyPlan, host_address: int) -> None:
        self._copies(plan, [memory], ("device", memory.pointer), ("host", host_address))

    def copy(self, src: CUDAMemory, dst: CUDAMemory, plan: CopyPlan) -> None:
        self._copies(plan, [src, dst], ("device", src.pointer), ("device", dst.pointer))

    def _copies(self, plan: CopyPlan, memories, src, dst) -> None:
        """Enqueue ``plan`` between ``src`` and ``dst`` ((kind, base address)) after the work
        pending on ``memories``, and wait for it."""
        cu = self._cu
        with self._entered() as context:
            stream = self._stream(context)
            reached = [(m, self._wait_for(m, stream)) for m in memories if m.fences]
            try:
                for rect in rectangles(plan, whole_rows=True, max_pitch=self._max_pitch):
                    self._enqueue(cu, rect, src, dst, stream)
            finally:
                # Even after a failed enqueue: the copies enqueued before it must not still
                # be moving bytes in host memory once the caller has it back.
                _check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
        for memory, fences in reached:
            self._reached(memory, fences)

    @staticmethod
    def _enqueue(cu, rect, src, dst, stream) -> None:
        (src_kind, src_base), (dst_kind, dst_base) = src, dst
        width, height, depth = rect.region
        src_address, dst_address = src_base + rect.src_offset, dst_base + rect.dst_offset
        if height == depth == 1:
            if src_kind == "host":
                _check(cu.cuMemcpyHtoDAsync(dst_address, src_address, width, stream), "cuMemcpyHtoDAsync")
            elif dst_kind == "host":
                _check(cu.cuMemcpyDtoHAsync(dst_address, src_address, width, stream), "cuMemcpyDtoHAsync")
            else:
                _check(cu.cuMemcpyDtoDAsync(dst_address, src_address, width, stream), "cuMemcpyDtoDAsync")
            return
        copy = cu.CUDA_MEMCPY3D()
        for side, kind, address, (pitch, slice_pitch) in (
                ("src", src_kind, src_address, rect.src_pitches),
                ("dst", dst_kind, dst_address, rect.dst_pitches)):
            memory_type = cu.CUmemorytype.CU_MEMORYTYPE_HOST if kind == "host" \
                else cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
            setattr(copy, f"{side}MemoryType", memory_type)
            setattr(copy, f"{side}Host" if kind == "host" else f"{side}Device", address)
            setattr(copy, f"{side}Pitch", pitch)
            setattr(copy, f"{side}Height", slice_pitch // pitch)
        copy.WidthInBytes, copy.Height, copy.Depth = width, height, depth
        _check(cu.cuMemcpy3DAsync(copy, stream), "cuMemcpy3DAsync")

    def sync(self) -> None:
        with self._entered():
            _check(self._cu.cuCtxSynchronize(), "cuCtxSynchronize")

    # --- kernels -------------------------------------------------------------------------

    def module(self, ptx: bytes):
        """The loaded module for ``ptx`` in the current context (a shim_cuda_module*), loading
        it once, with Halide 21's register cap."""
        import hashlib  # (here: 4 ms of every import shim otherwise)

        with self._entered() as context:
            key = (context, hashlib.sha256(ptx).digest())
            entry = self._modules.get(key)
            if entry is None:
                with self._module_lock:
                    entry = self._modules.get(key)
                    if entry is None:
                        entry = self._modules[key] = self._load(ptx, context)
        return entry[1]

    def _load(self, ptx: bytes, context: int):
        cu = self._cu
        registers = os.environ.get(MAX_REGISTERS_VARIABLE)
        try:
            registers = int(registers) if registers else DEFAULT_MAX_REGISTERS
        except ValueError:
            raise BackendError(f"${MAX_REGISTERS_VARIABLE} must be a number, got {registers!r}") from None
        module = _check(cu.cuModuleLoadDataEx(ptx + b"\0", 1, [cu.CUjit_option.CU_JIT_MAX_REGISTERS],
                                              [registers]), "cuModuleLoadDataEx")
        return module, lib.shim_cuda_module_new(ffi.cast("void *", int(module)),
                                                ffi.cast("void *", context))
