"""The CUDA backend, through cuda-python (the driver API).

It uses the device's primary context (the one the CUDA runtime, PyTorch and CuPy share),
chosen by ``shim.device("cuda", device=N)``, $HALIDE_SHIM_CUDA_DEVICE or Halide's HL_GPU_DEVICE
(default 0). Handles are raw CUdeviceptr values, as in Halide. Launches are in C
(native_stubs/cuda.c), on the stream of the calling pipeline (``shim.stream``) or the default
stream; this module loads modules (once per PTX source), allocates and copies.

Copies are synchronous, as in Halide's runtime when no stream is set.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time

from shim import streams
from shim.backends.base import Backend, BackendError, Memory
from shim.devices import fork_guard
from shim.errors import DeviceUnavailable
from shim.native import ffi, lib
from shim.regions import CopyPlan


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


def available() -> list[str]:
    """The names of the CUDA devices on this machine ([] without a driver)."""
    try:
        return _device_names()
    except (DeviceUnavailable, BackendError):
        return []


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


def _driver_library_path() -> str:
    with open("/proc/self/maps") as maps:
        found = re.findall(r"(/\S*libcuda\.so\S*)", maps.read())
    return found[0] if found else "libcuda.so.1"


class CUDAMemory(Memory):
    def __init__(self, pointer: int, nbytes: int, owned: bool = True):
        super().__init__(nbytes, owned)
        self.pointer = pointer


class CUDABackend(Backend):
    kind = "cuda"
    index = lib.SHIM_BACKEND_CUDA

    def __init__(self, device=None):
        super().__init__()
        self._usable = fork_guard("CUDA")
        cu = self._api = _init()
        if device is None:
            device = os.environ.get("HALIDE_SHIM_CUDA_DEVICE") or os.environ.get("HL_GPU_DEVICE") or 0
        count = _check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
        self.ordinal = int(device)
        if not 0 <= self.ordinal < count:
            raise DeviceUnavailable(f"no CUDA device {self.ordinal}: this machine has {count}")
        self._device = _check(cu.cuDeviceGet(self.ordinal), "cuDeviceGet")
        self.context = _check(cu.cuDevicePrimaryCtxRetain(self._device), "cuDevicePrimaryCtxRetain")
        self._current()
        self._modules: dict[bytes, tuple] = {}
        self._module_lock = threading.Lock()
        status = lib.shim_cuda_bind(_driver_library_path().encode(),
                                    ffi.cast("void *", int(self.context)), ffi.NULL)
        if status != 0:
            raise DeviceUnavailable(f"cannot bind kernel launches to the CUDA driver (status {status})")

    @property
    def _cu(self):
        # Every driver call goes through here: a forked child is refused before it reaches the
        # driver (kernel launches, in C, refuse on their own).
        self._usable()
        return self._api

    def _current(self):
        # The driver API wants the context current on whichever thread calls it.
        _check(self._cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    @property
    def name(self) -> str:
        raw = _check(self._cu.cuDeviceGetName(256, self._device), "cuDeviceGetName")
        return raw.split(b"\0")[0].decode()

    dlpack_device_type = 2  # kDLCUDA

    def dlpack_device_id(self) -> int:
        return self.ordinal

    def dlpack_stream(self):
        # The stream this thread's pipelines run on; 1 is DLPack's legacy default stream.
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

    def make_visible(self, stream, producer: int) -> None:
        """Event record on the stream the shim's work ran on, then the consumer's stream waits
        for it: no device-wide synchronization. ``stream`` follows DLPack's CUDA numbering:
        None or 1 the legacy default stream, 2 the per-thread default, -1 no synchronization."""
        if stream == -1:
            return
        consumer = 1 if stream is None else stream  # CU_STREAM_LEGACY = 1, CU_STREAM_PER_THREAD = 2
        if consumer == producer or (producer == 0 and consumer == 1):
            return  # the same stream: its own order suffices
        self._current()
        flags = self._cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
        event = _check(self._cu.cuEventCreate(flags), "cuEventCreate")
        try:
            _check(self._cu.cuEventRecord(event, producer), "cuEventRecord")
            _check(self._cu.cuStreamWaitEvent(consumer, event, 0), "cuStreamWaitEvent")
        finally:
            _check(self._cu.cuEventDestroy(event), "cuEventDestroy")

    # Device timing: CUDA events on the stream of the launch or copy.

    def timing_origin(self):
        self._current()
        event = _check(self._cu.cuEventCreate(0), "cuEventCreate")
        _check(self._cu.cuEventRecord(event, 0), "cuEventRecord")
        _check(self._cu.cuEventSynchronize(event), "cuEventSynchronize")
        return time.perf_counter_ns(), event

    def timing_track(self, stream) -> str:
        stream = _call_stream() if stream is None else stream
        return "CUDA default stream" if stream == 0 else f"CUDA stream {stream:#x}"

    def timing_marker(self, stream):
        self._current()
        event = _check(self._cu.cuEventCreate(0), "cuEventCreate")
        _check(self._cu.cuEventRecord(event, _call_stream() if stream is None else stream),
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

    def matches(self, device=None) -> bool:
        return device is None or int(device) == self.ordinal

    def compute_capability(self) -> tuple[int, int]:
        attribute = self._cu.CUdevice_attribute
        major = _check(self._cu.cuDeviceGetAttribute(
            attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self._device), "cuDeviceGetAttribute")
        minor = _check(self._cu.cuDeviceGetAttribute(
            attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self._device), "cuDeviceGetAttribute")
        return major, minor

    # --- memory --------------------------------------------------------------------------

    def allocate(self, nbytes: int) -> CUDAMemory:
        self._current()
        pointer = _check(self._cu.cuMemAlloc(max(nbytes, 1)), f"cuMemAlloc({nbytes})")
        return self._allocated(CUDAMemory(int(pointer), nbytes))

    def free(self, memory: CUDAMemory) -> None:
        self._released(memory)
        self._current()
        _check(self._cu.cuMemFree(memory.pointer), "cuMemFree")

    def handle(self, memory: CUDAMemory, offset: int, nbytes: int) -> int:
        return memory.pointer + offset

    def wrap(self, native: int) -> CUDAMemory:
        if native == 0:
            raise BackendError("cannot wrap a null device pointer")
        return CUDAMemory(native, 0, owned=False)

    def native(self, memory: CUDAMemory) -> int:
        return memory.pointer

    # --- copies --------------------------------------------------------------------------
    #
    # On the stream of the call that asked for them, so that they are ordered with that call's
    # kernels even on a non-blocking stream; synchronized before returning, since the caller
    # reads or reuses the host memory next (Halide's runtime leaves async copies unsynced).

    def write(self, memory: CUDAMemory, plan: CopyPlan, host_address: int) -> None:
        self._on_stream(lambda stream: [
            _check(self._cu.cuMemcpyHtoDAsync(memory.pointer + dst, host_address + src,
                                              plan.chunk, stream), "cuMemcpyHtoDAsync")
            for src, dst in plan.chunks()])

    def read(self, memory: CUDAMemory, plan: CopyPlan, host_address: int) -> None:
        self._on_stream(lambda stream: [
            _check(self._cu.cuMemcpyDtoHAsync(host_address + dst, memory.pointer + src,
                                              plan.chunk, stream), "cuMemcpyDtoHAsync")
            for src, dst in plan.chunks()])

    def copy(self, src: CUDAMemory, dst: CUDAMemory, plan: CopyPlan) -> None:
        self._on_stream(lambda stream: [
            _check(self._cu.cuMemcpyDtoDAsync(dst.pointer + d, src.pointer + s, plan.chunk,
                                              stream), "cuMemcpyDtoDAsync")
            for s, d in plan.chunks()])

    def _on_stream(self, enqueue) -> None:
        self._current()
        stream = _call_stream()
        enqueue(stream)
        _check(self._cu.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def sync(self) -> None:
        self._current()
        _check(self._cu.cuCtxSynchronize(), "cuCtxSynchronize")

    # --- kernels -------------------------------------------------------------------------

    def module(self, ptx: bytes):
        """The loaded module for ``ptx`` (a shim_cuda_module*), loading it once."""
        key = hashlib.sha256(ptx).digest()
        entry = self._modules.get(key)
        if entry is None:
            with self._module_lock:
                entry = self._modules.get(key)
                if entry is None:
                    self._current()
                    module = _check(self._cu.cuModuleLoadData(ptx + b"\0"), "cuModuleLoadData")
                    handle = lib.shim_cuda_module_new(ffi.cast("void *", int(module)))
                    entry = self._modules[key] = (module, handle)
        return entry[1]


def _call_stream() -> int:
    """The stream of the runtime call being served (its context carries it), else the
    calling thread's choice (shim.stream), else the default stream (0)."""
    call = lib.shim_current_call()
    if call != ffi.NULL:
        stream = lib.shim_call_stream(call)
        if stream != ffi.NULL:
            return int(ffi.cast("uintptr_t", stream))
    return streams.current()


# --- the callbacks ------------------------------------------------------------------------

def _backend() -> CUDABackend:
    from shim.devices import device

    return device("cuda")


def initialize_kernels(uc, state_ptr, src, size):
    ptx = bytes(ffi.buffer(src, max(size - 1, 0)))
    state_ptr[0] = ffi.cast("void *", _backend().module(ptx))


def start(uc):
    _backend()


def _register():
    from shim.runtime import E, guarded

    @ffi.def_extern(error=E.halide_error_code_generic_error)
    def shim_py_cuda_initialize(uc, state_ptr, src, size):
        return guarded(initialize_kernels, E.halide_error_code_generic_error, uc, state_ptr, src, size)

    @ffi.def_extern(error=E.halide_error_code_generic_error)
    def shim_py_cuda_start(uc):
        return guarded(start, E.halide_error_code_generic_error, uc)


_register()
