"""A CUDA driver for machines without a GPU, to check the shim's CUDA backend where no GPU is.

It stands in for cuda-python's ``cuda.bindings.driver`` (the calls shim/backends/cuda.py makes,
with the same argument order and ``(CUresult, value)`` returns) and, through a small C library
(fake_cuda.c), for the driver library the shim's launches bind to. Memory is host memory and
copies really move bytes, so data can be checked against numpy; kernels run nothing. Every
operation is logged on one sequence with its stream, so that a test can ask whether one
operation is *ordered before* another the way the driver promises: on the same stream, through
an event recorded on one stream and waited for on another, or through a host synchronization.
Streams the tests create are non-blocking (no implicit order with the legacy stream).

    driver = install(monkeypatch_like, sms=(80, 132))   # before the backend is created

Each test runs in its own process (the backend and the C binding are process-wide).
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

SUCCESS, INVALID_VALUE, INVALID_CONTEXT, INVALID_HANDLE = 0, 1, 201, 400
ERROR_NAMES = {SUCCESS: b"CUDA_SUCCESS", INVALID_VALUE: b"CUDA_ERROR_INVALID_VALUE",
               INVALID_CONTEXT: b"CUDA_ERROR_INVALID_CONTEXT",
               INVALID_HANDLE: b"CUDA_ERROR_INVALID_HANDLE"}
MAX_PITCH = 1 << 21  # small, so that tests can exceed it
PRIMARY_CONTEXT = 0xC0DE


def library() -> Path:
    """fake_cuda.c, compiled (once per source version) into build/."""
    source = HERE / "fake_cuda.c"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    out = ROOT / "build" / "tests" / f"fake_cuda-{digest}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{threading.get_ident()}.tmp")
        subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(tmp), str(source), "-lpthread"],
                       check=True)
        tmp.replace(out)
    return out


class _LaunchRecord(ctypes.Structure):
    _fields_ = [("seq", ctypes.c_long), ("stream", ctypes.c_size_t), ("context", ctypes.c_size_t),
                ("function", ctypes.c_size_t), ("blocks", ctypes.c_uint * 3),
                ("threads", ctypes.c_uint * 3)]


@dataclass
class Op:
    seq: int
    kind: str            # launch, copy, record, wait, sync, free, ...
    stream: int | None   # None: the host (synchronizations, frees)
    detail: dict = field(default_factory=dict)


class FakeDriver:
    """The driver module: enums, structs and cu* functions, plus the log and the checks."""

    CUdevice_attribute = SimpleNamespace(
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT="multiprocessors",
        CU_DEVICE_ATTRIBUTE_MAX_PITCH="max_pitch",
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR="major",
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR="minor")
    CUevent_flags = SimpleNamespace(CU_EVENT_DISABLE_TIMING=2)
    CUmemorytype = SimpleNamespace(CU_MEMORYTYPE_HOST=1, CU_MEMORYTYPE_DEVICE=2)
    CUjit_option = SimpleNamespace(CU_JIT_MAX_REGISTERS=0)

    class CUDA_MEMCPY3D:  # noqa: N801 - the driver's name
        def __init__(self):
            for side in ("src", "dst"):
                for name in ("XInBytes", "Y", "Z", "LOD", "MemoryType", "Host", "Device",
                             "Array", "Pitch", "Height"):
                    setattr(self, side + name, 0)
            self.WidthInBytes = self.Height = self.Depth = 0

    def __init__(self, sms=(132,)):
        self.c = ctypes.CDLL(str(library()))
        self.c.fake_current_context.restype = ctypes.c_size_t
        self.c.fake_tick.restype = ctypes.c_long
        self.c.fake_launch.restype = ctypes.POINTER(_LaunchRecord)
        self.sms = list(sms)
        self.lock = threading.Lock()
        self.ops: list[Op] = []
        self.allocations: dict[int, ctypes.Array] = {}
        self.events: dict[int, tuple[int, int] | None] = {}  # event -> (stream, seq) recorded
        self.destroyed_streams: set[int] = set()
        self.modules: list[dict] = []
        self._ids = itertools.count(0x1000)
        self.calls_without_context: list[str] = []

    # --- failures ------------------------------------------------------------------------------

    def fail_next(self, name: str, times: int = 1, after: int = 0,
                  status: int = INVALID_VALUE) -> None:
        """Make ``times`` calls of the driver function ``name``, after the next ``after``
        ones, fail with ``status``, doing nothing, as a failing driver call does."""
        real = getattr(type(self), name).__get__(self)
        calls = itertools.count()

        def failing(*args):
            with self.lock:
                fails = after <= next(calls) < after + times
            return (status,) if fails else real(*args)

        setattr(self, name, failing)

    # --- the log -----------------------------------------------------------------------------

    def _log(self, kind, stream, **detail) -> Op:
        op = Op(int(self.c.fake_tick()), kind, None if stream is None else int(stream), detail)
        with self.lock:
            self.ops.append(op)
        return op

    def _needs_context(self, name) -> None:
        if self.c.fake_current_context() == 0:
            self.calls_without_context.append(name)

    def launches(self) -> list[Op]:
        records = [self.c.fake_launch(i).contents for i in range(self.c.fake_launch_count())]
        return [Op(r.seq, "launch", r.stream, {"context": r.context}) for r in records]

    def log(self) -> list[Op]:
        with self.lock:
            ops = list(self.ops)
        return sorted(ops + self.launches(), key=lambda op: op.seq)

    def ordered(self, first: Op, then: Op) -> bool:
        """Whether the driver guarantees ``first`` finished before ``then`` starts."""
        ops = self.log()
        position = {op.seq: i for i, op in enumerate(ops)}
        reach = {first.seq}
        for op in ops[position[first.seq] + 1:position[then.seq] + 1]:
            if self._follows(op, reach, ops[:position[op.seq]]):
                reach.add(op.seq)
        return then.seq in reach

    @staticmethod
    def _follows(op, reach, earlier) -> bool:
        """Whether ``op`` waits for something in ``reach`` (the ops known to follow first)."""
        for prior in reversed(earlier):
            if prior.seq not in reach:
                continue
            if op.stream is not None and prior.stream == op.stream and prior.kind != "sync":
                return True  # stream order
            if prior.kind == "sync" and op.kind != "sync":
                return True  # enqueued after the host waited
            if op.kind == "wait" and prior.kind == "record" and \
                    prior.detail["event"] == op.detail["event"] and \
                    op.detail["recorded"] == prior.seq:
                return True
            if op.kind == "sync" and prior.stream is not None and (
                    op.detail.get("all") or prior.stream == op.detail.get("on")
                    or prior.seq == op.detail.get("recorded")):
                return True
        return False

    # --- devices and contexts ------------------------------------------------------------------

    def cuInit(self, flags):
        return (SUCCESS,)

    def cuGetErrorName(self, status):
        return (SUCCESS, ERROR_NAMES.get(int(status), b"CUDA_ERROR_UNKNOWN"))

    def cuDeviceGetCount(self):
        return (SUCCESS, len(self.sms))

    def cuDeviceGet(self, ordinal):
        return (SUCCESS, ordinal) if 0 <= ordinal < len(self.sms) else (INVALID_VALUE, None)

    def cuDeviceGetName(self, size, device):
        return (SUCCESS, f"Fake GPU {device} ({self.sms[device]} SMs)".encode().ljust(size, b"\0"))

    def cuDeviceGetAttribute(self, attribute, device):
        values = {"multiprocessors": self.sms[device], "max_pitch": MAX_PITCH, "major": 9, "minor": 0}
        return (SUCCESS, values[attribute])

    def cuDeviceTotalMem(self, device):
        return (SUCCESS, 1 << 30)

    def cuDevicePrimaryCtxRetain(self, device):
        return (SUCCESS, PRIMARY_CONTEXT + device)

    def cuCtxSynchronize(self):
        self._needs_context("cuCtxSynchronize")
        self._log("sync", None, all=True)
        return (SUCCESS,)

    # --- streams and events --------------------------------------------------------------------

    def cuStreamCreate(self, flags):
        return (SUCCESS, next(self._ids))

    def cuStreamDestroy(self, stream):
        self.destroyed_streams.add(int(stream))
        return (SUCCESS,)

    def _stream_ok(self, stream) -> bool:
        return int(stream) not in self.destroyed_streams

    def cuStreamSynchronize(self, stream):
        self._needs_context("cuStreamSynchronize")
        if not self._stream_ok(stream):
            return (INVALID_HANDLE,)
        self._log("sync", None, on=int(stream))
        return (SUCCESS,)

    def cuEventCreate(self, flags):
        event = next(self._ids)
        self.events[event] = None
        return (SUCCESS, event)

    def cuEventRecord(self, event, stream):
        self._needs_context("cuEventRecord")
        if event not in self.events or not self._stream_ok(stream):
            return (INVALID_HANDLE,)
        op = self._log("record", stream, event=event)
        self.events[event] = (int(stream), op.seq)
        return (SUCCESS,)

    def cuStreamWaitEvent(self, stream, event, flags):
        self._needs_context("cuStreamWaitEvent")
        if event not in self.events or not self._stream_ok(stream):
            return (INVALID_HANDLE,)
        recorded = self.events[event]
        self._log("wait", stream, event=event, recorded=None if recorded is None else recorded[1])
        return (SUCCESS,)

    def cuEventSynchronize(self, event):
        recorded = self.events.get(event)
        self._log("sync", None, recorded=None if recorded is None else recorded[1])
        return (SUCCESS,)

    def cuEventElapsedTime(self, start, end):
        return (SUCCESS, 0.0)

    def cuEventDestroy(self, event):
        self.events.pop(event, None)
        return (SUCCESS,)

    # --- memory --------------------------------------------------------------------------------

    def cuMemAlloc(self, nbytes):
        self._needs_context("cuMemAlloc")
        memory = (ctypes.c_char * nbytes)()
        address = ctypes.addressof(memory)
        self.allocations[address] = memory
        self._log("alloc", None, address=address, nbytes=nbytes)
        return (SUCCESS, address)

    def cuMemFree(self, address):
        self._needs_context("cuMemFree")
        if int(address) not in self.allocations:
            return (INVALID_VALUE,)
        self._log("free", None, address=int(address))
        del self.allocations[int(address)]
        return (SUCCESS,)

    def allocation_of(self, address: int) -> int | None:
        for base, memory in self.allocations.items():
            if base <= address < base + len(memory):
                return base
        return None

    def _copy(self, name, dst, src, nbytes, stream, rows=1):
        self._needs_context(name)
        if not self._stream_ok(stream):
            return (INVALID_HANDLE,)
        self._log("copy", stream, call=name, dst=self.allocation_of(int(dst)),
                  src=self.allocation_of(int(src)), nbytes=nbytes, rows=rows)
        return (SUCCESS,)

    def cuMemcpyHtoDAsync(self, dst, src, nbytes, stream):
        ctypes.memmove(int(dst), int(src), nbytes)
        return self._copy("cuMemcpyHtoDAsync", dst, src, nbytes, stream)

    def cuMemcpyDtoHAsync(self, dst, src, nbytes, stream):
        ctypes.memmove(int(dst), int(src), nbytes)
        return self._copy("cuMemcpyDtoHAsync", dst, src, nbytes, stream)

    def cuMemcpyDtoDAsync(self, dst, src, nbytes, stream):
        ctypes.memmove(int(dst), int(src), nbytes)
        return self._copy("cuMemcpyDtoDAsync", dst, src, nbytes, stream)

    def cuMemcpy3DAsync(self, copy, stream):
        """As the driver documents CUDA_MEMCPY3D: Depth slices of Height rows of WidthInBytes,
        rows Pitch apart and slices Pitch * Height apart on each side."""
        width, height, depth = copy.WidthInBytes, copy.Height, copy.Depth
        bases = {}
        for side in ("src", "dst"):
            pitch, rows = getattr(copy, side + "Pitch"), getattr(copy, side + "Height")
            host = getattr(copy, side + "MemoryType") == self.CUmemorytype.CU_MEMORYTYPE_HOST
            base = int(getattr(copy, side + ("Host" if host else "Device")))
            if width > pitch or pitch > MAX_PITCH or (depth > 1 and rows < height) or \
                    getattr(copy, side + "XInBytes") or getattr(copy, side + "Y") or \
                    getattr(copy, side + "Z") or (not host and self.allocation_of(base) is None):
                return (INVALID_VALUE,)
            bases[side] = (base, pitch, pitch * rows)
        (src, src_pitch, src_slice), (dst, dst_pitch, dst_slice) = bases["src"], bases["dst"]
        for z in range(depth):
            for y in range(height):
                ctypes.memmove(dst + z * dst_slice + y * dst_pitch,
                               src + z * src_slice + y * src_pitch, width)
        return self._copy("cuMemcpy3DAsync", dst, src, width * height * depth, stream,
                          rows=height * depth)

    # --- modules -------------------------------------------------------------------------------

    def cuModuleLoadDataEx(self, image, count, options, values):
        self._needs_context("cuModuleLoadDataEx")
        if not isinstance(image, bytes) or not image.endswith(b"\0") or count != len(options):
            return (INVALID_VALUE,)
        self.modules.append({"ptx": image, "options": dict(zip(options, values)),
                             "context": self.c.fake_current_context()})
        return (SUCCESS, next(self._ids))


def install(patch, sms=(132,)) -> FakeDriver:
    """Make the shim's CUDA backend use a fake driver. ``patch(module, name, value)`` sets an
    attribute (pytest's monkeypatch.setattr, or setattr in a child process)."""
    from shim.backends import cuda

    driver = FakeDriver(sms)
    patch(cuda, "_driver", lambda: driver)
    patch(cuda, "_driver_library_path", lambda: str(library()))
    return driver
