"""A cost table of the whole runtime: every entry point a pipeline or a user can call, the
shim against Halide's stock runtime, side by side in one run.

    python benchmarks/entry_points.py [--quick] [--backends host,opencl,vulkan,cuda] [--json OUT]
                                      [--markdown OUT]

Rows: the device interface's fifteen entry points (device_malloc / free, sync, release,
copy_to_host / device, device_and_host_malloc / free, buffer_copy, device_crop / slice /
release_crop, wrap_native / detach_native, compute_capability) on each backend that runs here,
in the cases that matter (nothing to do, small, large, a crop of a plain family, a member of a
shared family, from two threads); then halide_malloc / free, halide_do_par_for, the
semaphores, halide_trace, halide_print and halide_error. Entry points that undo each other are
timed as a pair (malloc + free, crop + release_crop, wrap + detach), so that every iteration
starts from the same state.

Both sides are timed by the same C loop (benchmarks/entry_loop.c), which calls the entry points
through a table of their addresses: the stock runtime's, bundled in a sample pipeline and loaded
in a child process where the shim is not (pipelines/stock.py says why), and the shim's exported
halide_* functions in this process. Operands are halide_buffer_t structs made as a pipeline makes
them (``bare``, ``device``); for the family cases the shim's are shim.Buffer structs and their
crops (the stock runtime has no families: its operands there are the same bare structs and a
halide_device_crop of one). Halide has no ``host`` device: the shim's host device is compared
with the stock runtime's OpenCL on PoCL, a device in the same host memory.

Per row: ns per call (median and min over samples, each sample a C loop of enough iterations
to last --sample-ms), stock and shim, and shim/stock. With two threads, each thread runs the
loop on operands of its own and the figure is the wall time per iteration of one thread (the
cost of a call while another thread calls too). ``python`` names the shim's Python operations
a row's calls entered (shim/core/runtime.py, counted in an untimed run of the same loop): the
reason of a cliff.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from sidebyside import ChildProcess, serve  # noqa: E402

HARNESS_SOURCE = HERE / "entry_loop.c"

# The table of entry points the C loop calls, in entry_loop.c's F_* order.
FUNCTIONS = (
    "halide_device_malloc", "halide_device_free", "halide_device_sync", "halide_device_release",
    "halide_copy_to_host", "halide_copy_to_device", "halide_device_and_host_malloc",
    "halide_device_and_host_free", "halide_buffer_copy", "halide_device_crop",
    "halide_device_slice", "halide_device_release_crop", "halide_device_wrap_native",
    "halide_device_detach_native", "halide_malloc", "halide_free", "halide_do_par_for",
    "halide_semaphore_init", "halide_semaphore_release", "halide_semaphore_try_acquire",
    "halide_trace", "halide_set_custom_trace", "halide_print", "halide_set_custom_print",
    "halide_error", "halide_set_error_handler",
)
# What an iteration does, in entry_loop.c's OP_* order.
OPERATIONS = (
    "copy_to_host", "copy_to_device", "device_malloc_free", "device_sync", "device_release",
    "device_and_host_malloc_free", "buffer_copy", "crop_release", "slice_release", "wrap_detach",
    "compute_capability", "malloc_free", "do_par_for", "semaphore", "trace", "print", "error",
)
# The device interface's fifteen and the rest: what the table must cover.
DEVICE_ENTRY_POINTS = (
    "device_malloc", "device_free", "device_sync", "device_release", "copy_to_host",
    "copy_to_device", "device_and_host_malloc", "device_and_host_free", "buffer_copy",
    "device_crop", "device_slice", "device_release_crop", "wrap_native", "detach_native",
    "compute_capability",
)
OTHER_ENTRY_POINTS = ("halide_malloc", "halide_free", "halide_do_par_for", "halide_semaphore_init",
                      "halide_semaphore_release", "halide_semaphore_try_acquire", "halide_trace",
                      "halide_print", "halide_error")
BACKENDS = ("host", "opencl", "vulkan", "cuda")
# The stock runtime's library for each backend's rows (Halide has no host device).
STOCK_KIND = {"host": "opencl", "opencl": "opencl", "vulkan": "vulkan", "cuda": "cuda"}

SHAPES = {"small": (64, 64), "large": (1024, 1024)}  # float32: 16 KiB and 4 MiB
CROP = ((8, 32), (8, 32))  # (min, extent) in x and y of a small buffer
SLICE = (1, 5)  # dimension, position: row 5
HOST_DIRTY, DEVICE_DIRTY = 1, 2


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the table. ``a`` and ``b`` are operand recipes (Side.operand):
    ``bare``: a struct over host memory; ``device``: a bare struct allocated on the device (a
    pipeline's own buffer); ``nohost``: a bare struct with no host memory; ``buffer``: a
    shim.Buffer's struct; ``family``: one on the device; ``crop``: a halide_device_crop of a
    ``family`` struct (a crop of a plain family); ``member``: a shim.Buffer crop of a
    ``family`` Buffer (a member of a shared family); ``cropdst`` / ``slicedst``: bare structs
    shaped as a crop / slice of ``a``. Each with its size: "device small"."""

    backend: str  # a device kind, or "-" for the entry points that take no device
    entry: str  # the entry points called, in order
    case: str
    op: str
    a: str | None = None
    b: str | None = None
    a_dirty: int = -1
    b_dirty: int = -1
    dst_interface: bool = True  # buffer_copy: to the backend's interface (else to the host)
    size: int = 0  # halide_malloc's bytes, do_par_for's tasks
    threads: int = 1

    @property
    def key(self) -> str:
        return f"{self.backend} | {self.entry} | {self.case}"


def device_rows(backend: str) -> list[Row]:
    """The device interface's rows for one backend, device_release last (it restarts the
    device; entry_points.py runs all of them after every other row)."""
    rows = []
    for op, dirty in (("copy_to_host", DEVICE_DIRTY), ("copy_to_device", HOST_DIRTY)):
        rows += [
            Row(backend, op, "nothing to do", op, "device small", a_dirty=0),
            Row(backend, op, "nothing to do, 2 threads", op, "device small", a_dirty=0, threads=2),
            Row(backend, op, "small", op, "device small", a_dirty=dirty),
            Row(backend, op, "large", op, "device large", a_dirty=dirty),
            Row(backend, op, "a shim.Buffer, small", op, "family small", a_dirty=dirty),
            Row(backend, op, "crop of a plain family", op, "crop small", a_dirty=dirty),
            Row(backend, op, "member of a shared family", op, "member small", a_dirty=dirty),
        ]
    pair = "device_malloc + device_free"
    rows += [
        Row(backend, pair, "small", "device_malloc_free", "bare small"),
        Row(backend, pair, "large", "device_malloc_free", "bare large"),
        Row(backend, pair, "small, 2 threads", "device_malloc_free", "bare small", threads=2),
        Row(backend, pair, "a shim.Buffer, small", "device_malloc_free", "buffer small"),
        Row(backend, "device_sync", "nothing to do", "device_sync", "device small"),
        Row(backend, "device_sync", "member of a shared family", "device_sync", "member small"),
    ]
    pair = "device_and_host_malloc + device_and_host_free"
    rows += [Row(backend, pair, size, "device_and_host_malloc_free", f"nohost {size}")
             for size in SHAPES]
    rows += [
        Row(backend, "buffer_copy", "host to host, small", "buffer_copy", "bare small", "bare small",
            dst_interface=False),
        Row(backend, "buffer_copy", "host to host, large", "buffer_copy", "bare large", "bare large",
            dst_interface=False),
        Row(backend, "buffer_copy", "host to device, small", "buffer_copy", "bare small",
            "device small", b_dirty=0),
        Row(backend, "buffer_copy", "device to host, small", "buffer_copy", "device small",
            "bare small", a_dirty=DEVICE_DIRTY, dst_interface=False),
        Row(backend, "buffer_copy", "device to host, large", "buffer_copy", "device large",
            "bare large", a_dirty=DEVICE_DIRTY, dst_interface=False),
        Row(backend, "buffer_copy", "device to device, small", "buffer_copy", "device small",
            "device small", a_dirty=DEVICE_DIRTY, b_dirty=0),
        Row(backend, "buffer_copy", "crop of a plain family to host", "buffer_copy", "crop small",
            "cropdst small", a_dirty=DEVICE_DIRTY, dst_interface=False),
        Row(backend, "buffer_copy", "member of a shared family to host", "buffer_copy",
            "member small", "cropdst small", a_dirty=DEVICE_DIRTY, dst_interface=False),
    ]
    pair = "device_crop + device_release_crop"
    rows += [
        Row(backend, pair, "small", "crop_release", "device small", "cropdst small"),
        Row(backend, pair, "small, 2 threads", "crop_release", "device small", "cropdst small",
            threads=2),
        Row(backend, pair, "of a plain family", "crop_release", "family small", "cropdst small"),
        Row(backend, pair, "of a member of a shared family", "crop_release", "member small",
            "cropdst small"),
        Row(backend, "device_slice + device_release_crop", "small", "slice_release", "device small",
            "slicedst small"),
        Row(backend, "device_slice + device_release_crop", "of a plain family", "slice_release",
            "family small", "slicedst small"),
        Row(backend, "wrap_native + detach_native", "small", "wrap_detach", None, "bare small"),
        Row(backend, "compute_capability", "nothing to do", "compute_capability"),
        Row(backend, "device_release + device_malloc + device_free", "restart the device",
            "device_release", "bare small"),
    ]
    return rows


def other_rows() -> list[Row]:
    pair = "halide_malloc + halide_free"
    return [
        Row("-", pair, "64 B", "malloc_free", size=64),
        Row("-", pair, "1 MiB", "malloc_free", size=1 << 20),
        Row("-", pair, "64 B, 2 threads", "malloc_free", size=64, threads=2),
        Row("-", "halide_do_par_for", "1 task", "do_par_for", size=1),
        Row("-", "halide_do_par_for", "16 empty tasks", "do_par_for", size=16),
        Row("-", "halide_do_par_for", "16 empty tasks, 2 threads", "do_par_for", size=16, threads=2),
        Row("-", "halide_semaphore_init + _release + _try_acquire", "uncontended", "semaphore"),
        Row("-", "halide_trace", "a load event, to a custom trace handler", "trace"),
        Row("-", "halide_print", "to a custom print handler", "print"),
        Row("-", "halide_error", "to a custom error handler", "error"),
    ]


def entry_points_of(row: Row) -> set[str]:
    """The entry points a row calls, in the names of DEVICE_ENTRY_POINTS / OTHER_ENTRY_POINTS."""
    if row.backend == "-":
        names = set()
        for part in row.entry.split(" + "):
            part = part.strip()
            names.add(part if part.startswith("halide_") else f"halide_semaphore{part}")
        return names
    return {part.strip() for part in row.entry.split(" + ")}


# --- the C loop --------------------------------------------------------------------------------

class Dimension(ctypes.Structure):
    _fields_ = [("min", ctypes.c_int32), ("extent", ctypes.c_int32), ("stride", ctypes.c_int32),
                ("flags", ctypes.c_uint32)]


class HalideType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class HalideBuffer(ctypes.Structure):
    """halide_buffer_t, as generated code lays it out."""
    _fields_ = [("device", ctypes.c_uint64), ("device_interface", ctypes.c_void_p),
                ("host", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("type", HalideType),
                ("dimensions", ctypes.c_int32), ("dim", ctypes.POINTER(Dimension)),
                ("padding", ctypes.c_void_p)]


class Operands(ctypes.Structure):
    """entry_loop.c's operands: one thread's."""
    _fields_ = [("a", ctypes.c_void_p), ("b", ctypes.c_void_p), ("interface", ctypes.c_void_p),
                ("native", ctypes.c_uint64), ("size", ctypes.c_int64), ("slice_dim", ctypes.c_int),
                ("slice_pos", ctypes.c_int), ("a_dirty", ctypes.c_int), ("b_dirty", ctypes.c_int)]


def harness_path() -> Path:
    out_dir = Path(os.environ.get("HALIDE_SHIM_BENCHMARK_BUILD") or ROOT / "build" / "benchmarks")
    return out_dir / f"entry_loop-{hashlib.sha256(HARNESS_SOURCE.read_bytes()).hexdigest()[:12]}.so"


def build_harness() -> Path:
    """Compile the C loop unless it is there for the current source (against the installed
    halide's HalideRuntime.h, so the parent process builds it before the child needs it)."""
    library = harness_path()
    if not library.exists():
        import halide

        library.parent.mkdir(parents=True, exist_ok=True)
        staged = library.with_suffix(f".{os.getpid()}.so")
        compiler = os.environ.get("CC", "cc")
        subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-pthread",
                        "-I", str(Path(halide.install_dir()) / "include"),
                        "-o", str(staged), str(HARNESS_SOURCE)], check=True)
        os.replace(staged, library)
    return library


def harness():
    lib = ctypes.CDLL(str(harness_path()))
    lib.entry_loop.restype = ctypes.c_double
    lib.entry_loop.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                               ctypes.c_long]
    return lib


def struct_of(shape, host: bool = True) -> tuple:
    """A bare 2-D float32 halide_buffer_t over fresh host memory (``host``) or none: the
    struct, and what keeps it alive."""
    width, height = shape
    memory = (ctypes.c_float * (width * height))() if host else None
    dims = (Dimension * 2)(Dimension(0, width, 1, 0), Dimension(0, height, width, 0))
    raw = HalideBuffer(0, None, ctypes.addressof(memory) if host else None, 0,
                       HalideType(2, 32, 1), 2, dims, None)
    return raw, (raw, dims, memory)


def window_of(parent: HalideBuffer, dims_spec, keep: list) -> HalideBuffer:
    """A bare struct shaped as a window on ``parent``: (min, extent) per kept dimension, with
    the parent's strides; None for a dimension sliced away at SLICE's position."""
    dims = []
    offset = 0
    for d, spec in enumerate(dims_spec):
        stride, low = parent.dim[d].stride, parent.dim[d].min
        if spec is None:
            offset += (SLICE[1] - low) * stride
            continue
        dims.append(Dimension(spec[0], spec[1], stride, 0))
        offset += (spec[0] - low) * stride
    array = (Dimension * len(dims))(*dims)
    raw = HalideBuffer(0, None, parent.host + 4 * offset, 0, HalideType(2, 32, 1), len(dims),
                       array, None)
    keep += [raw, array]
    return raw


class Side:
    """One runtime's entry points, timed by the C loop: ``symbol(name)`` gives an exported
    function's address; ``interface(kind)`` the device interface's address."""

    def __init__(self, symbol, interface):
        self._loop = harness()
        self._table = (ctypes.c_void_p * len(FUNCTIONS))(*(symbol(n) for n in FUNCTIONS))
        self._symbol = symbol
        self._interface = interface
        self._prepared = {}
        self._keep = []
        call = lambda name, *types: ctypes.CFUNCTYPE(ctypes.c_int, *types)(symbol(name))  # noqa: E731
        p = ctypes.c_void_p
        self.device_malloc = call("halide_device_malloc", p, p, p)
        self.device_crop = call("halide_device_crop", p, p, p)
        self.device_free = call("halide_device_free", p, p)

    def check(self, result: int, what: str) -> None:
        if result != 0:
            raise RuntimeError(f"{what} failed ({result})")

    def operand(self, recipe: str, kind: str) -> HalideBuffer:
        what, size = recipe.split()
        shape = SHAPES[size]
        if what in ("bare", "nohost"):
            raw, keep = struct_of(shape, host=what == "bare")
            self._keep.append(keep)
            return raw
        if what == "device":
            raw = self.operand(f"bare {size}", kind)
            self.check(self.device_malloc(None, ctypes.addressof(raw), self._interface(kind)),
                       "device_malloc")
            return raw
        if what == "crop":
            parent = self.operand(f"family {size}", kind)
            dst = window_of(parent, CROP, self._keep)
            self.check(self.device_crop(None, ctypes.addressof(parent), ctypes.addressof(dst)),
                       "device_crop")
            return dst
        raise KeyError(recipe)

    def prepare(self, row: Row) -> ctypes.Array:
        """The row's operands, one per thread (made once, kept for the run)."""
        if row.key not in self._prepared:
            operands = (Operands * row.threads)()
            for o in operands:
                a = self.operand(row.a, row.backend) if row.a else None
                if row.b in ("cropdst small", "slicedst small"):
                    parent = a if a is not None else self.operand("bare small", row.backend)
                    b = window_of(parent, CROP if row.b.startswith("crop") else
                                  [(parent.dim[0].min, parent.dim[0].extent), None], self._keep)
                else:
                    b = self.operand(row.b, row.backend) if row.b else None
                o.a = ctypes.addressof(a) if a is not None else None
                o.b = ctypes.addressof(b) if b is not None else None
                if row.backend != "-" and (row.op != "buffer_copy" or row.dst_interface):
                    o.interface = self._interface(row.backend)
                if row.op == "wrap_detach":
                    o.native = self.native_handle(row.backend)
                o.size, o.slice_dim, o.slice_pos = row.size, *SLICE
                o.a_dirty, o.b_dirty = row.a_dirty, row.b_dirty
            self._prepared[row.key] = operands
        return self._prepared[row.key]

    def seconds(self, row: dict, iterations: int) -> float:
        row = Row(**row)
        operands = self.prepare(row)
        elapsed = self._loop.entry_loop(self._table, OPERATIONS.index(row.op), operands,
                                        row.threads, iterations)
        return elapsed

    def native_handle(self, kind: str) -> int:
        """A native allocation of the device (what wrap_native takes), from an allocation
        made through the runtime."""
        raw = self.operand("device small", kind)
        getter = {"opencl": "halide_opencl_get_cl_mem", "vulkan": "halide_vulkan_get_vk_buffer",
                  "cuda": "halide_cuda_get_device_ptr"}[STOCK_KIND[kind]]
        get = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p)(self._symbol(getter))
        return get(None, ctypes.addressof(raw))


# --- the stock runtime (child process) ---------------------------------------------------------

class StockSide(Side):
    """Halide's own runtime, from the bundled libraries of one kind. Its operands for the
    family recipes are bare structs: the stock runtime has no families."""

    def __init__(self, kind: str):
        from pipelines.build import Build, build
        from pipelines.stock import StockRuntime

        library = str(build(Build("brighten", kind, "bundled")))
        self.runtime = StockRuntime(library)  # (the OpenCL loader, an error handler)
        dll = ctypes.CDLL(library, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        address = lambda name: ctypes.cast(getattr(dll, name), ctypes.c_void_p).value  # noqa: E731
        interface = ctypes.CFUNCTYPE(ctypes.c_void_p)(address(f"halide_{kind}_device_interface"))()
        super().__init__(address, lambda _kind: interface)

    def operand(self, recipe: str, kind: str) -> HalideBuffer:
        what, size = recipe.split()
        renamed = {"buffer": "bare", "family": "device", "member": "crop"}.get(what)
        if renamed is not None:
            return self.operand(f"{renamed} {size}", kind)
        if what == "crop":
            parent = self.operand(f"device {size}", kind)
            dst = window_of(parent, CROP, self._keep)
            self.check(self.device_crop(None, ctypes.addressof(parent), ctypes.addressof(dst)),
                       "device_crop")
            return dst
        return super().operand(recipe, kind)

    def seconds(self, row: dict, iterations: int) -> float:
        try:
            return super().seconds(row, iterations)
        except Exception as e:  # (answered as a failure, the message on stderr)
            print(f"stock: {e} {' '.join(self.runtime.errors)}", file=sys.stderr, flush=True)
            return -1.0


def stock_process(kind: str) -> ChildProcess:
    return ChildProcess([sys.executable, str(Path(__file__)), "--serve", kind])


# --- the shim ----------------------------------------------------------------------------------

class ShimSide(Side):
    """The shim's exported halide_* functions, in this process."""

    def __init__(self):
        import numpy as np

        import shim
        from shim.backends.base import interface_of

        self.shim, self.np = shim, np
        dll = ctypes.CDLL(sys.modules["shim._native"].__file__)
        address = lambda name: ctypes.cast(getattr(dll, name), ctypes.c_void_p).value  # noqa: E731
        self.devices = {}

        def interface(kind):
            return int(shim.native.ffi.cast("uintptr_t", interface_of(self.device(kind))))

        super().__init__(address, interface)

    def device(self, kind: str):
        if kind not in self.devices:
            self.devices[kind] = self.shim.device(kind)
        return self.devices[kind]

    def operand(self, recipe: str, kind: str) -> HalideBuffer:
        what, size = recipe.split()
        if what in ("buffer", "family", "member"):
            buf = self.shim.Buffer(self.np.zeros(SHAPES[size][::-1], self.np.float32))
            if what != "buffer":
                buf.copy_to_device(self.device(kind))
            if what == "member":
                (x, w), (y, h) = CROP
                buf = buf.cropped(rect=[(x, w), (y, h)])
            self._keep.append(buf)
            return HalideBuffer.from_address(buf.raw_buffer())
        return super().operand(recipe, kind)

    def native_handle(self, kind: str) -> int:
        if kind == "host":  # the host device's native memory: any host address
            return self.operand("bare small", kind).host
        return super().native_handle(kind)

    def entered(self, row: Row) -> list[str]:
        """The Python operations (shim/core/runtime.py) an untimed run of the row's loop entered."""
        with python_entries() as seen:
            if self.seconds(dataclasses.asdict(row), 3) < 0:
                raise RuntimeError(f"{row.key}: a call failed")
        return sorted(seen)


@contextlib.contextmanager
def python_entries():
    """Counts the native library's calls into the Python core by operation name: every
    callback runs its operation through shim.core.callbacks' ``guarded``, looked up at each
    call, so wrapping that name sees them all."""
    from shim.core import callbacks

    seen = Counter()
    original = callbacks.guarded

    def counting(operation, *args):
        seen[operation.__name__] += 1
        return original(operation, *args)

    callbacks.guarded = counting
    try:
        yield seen
    finally:
        callbacks.guarded = original


# --- the run -----------------------------------------------------------------------------------

def calibrate(side, row: Row, target: float) -> int:
    """Iterations for one sample of ``side`` to last about ``target`` seconds (after an
    untimed run: the operands made, the device started, pages faulted in)."""
    if side.seconds(row=dataclasses.asdict(row), iterations=2) < 0:
        raise RuntimeError("a call failed")
    iterations = 1
    while True:
        elapsed = side.seconds(row=dataclasses.asdict(row), iterations=iterations)
        if elapsed < 0:
            raise RuntimeError("a call failed")
        if elapsed >= target / 4 or iterations >= 1 << 26:
            return max(1, math.ceil(iterations * target / max(elapsed, 1e-9)))
        iterations *= 8 if elapsed < target / 64 else 2


def measure(row: Row, sides: dict, samples: int, target: float) -> dict:
    """{"stock": {...}, "shim": {...}, "ratio", "python"} for one row; a side that failed has
    {"error": text}."""
    result = {"backend": row.backend, "entry": row.entry, "case": row.case, "threads": row.threads}
    counts = {}
    for name, side in sides.items():
        try:
            counts[name] = calibrate(side, row, target)
        except Exception as e:  # noqa: BLE001 (reported in the row)
            result[name] = {"error": str(e)}
    times = {name: [] for name in counts}
    for _ in range(samples):  # the sides take turns, so a noisy moment hits both alike
        for name in counts:
            if name in result:
                continue
            try:
                elapsed = sides[name].seconds(row=dataclasses.asdict(row), iterations=counts[name])
            except Exception as e:  # noqa: BLE001 (a child that died: reported in the row)
                elapsed, result[name] = None, {"error": f"{type(e).__name__}: {e}"}
            if elapsed is not None and elapsed < 0:
                result[name] = {"error": "a call failed"}
            elif elapsed is not None:
                times[name].append(1e9 * elapsed / counts[name])
    for name, values in times.items():
        if name not in result and values:
            result[name] = {"median_ns": statistics.median(values), "min_ns": min(values),
                            "iterations": counts[name]}
    if "median_ns" in result.get("stock", {}) and "median_ns" in result.get("shim", {}):
        result["ratio"] = result["shim"]["median_ns"] / result["stock"]["median_ns"]
    try:
        result["python"] = sides["shim"].entered(row)
    except Exception as e:  # noqa: BLE001
        result["python"] = [f"failed: {e}"]
    return result


def reason(result: dict) -> str:
    if result["python"]:
        return "enters Python: shim/core/runtime.py " + ", ".join(result["python"])
    return "in C"


HEADER = (f"{'backend':<8}{'entry points':<46}{'case':<36}{'stock ns':>11}{'(min)':>11}"
          f"{'shim ns':>11}{'(min)':>11}{'shim/stock':>11}  why")


def line(result: dict) -> str:
    def figures(side):
        s = result.get(side, {})
        if "median_ns" not in s:
            return f"{'failed':>11}{'':>11}"
        return f"{s['median_ns']:>11.0f}{s['min_ns']:>11.0f}"

    ratio = result.get("ratio")
    ratio_text = f"{ratio:>10.2f}x" if ratio is not None else f"{'-':>11}"
    why = reason(result) if ratio is None or ratio > 1.2 or result["python"] else ""
    errors = "; ".join(f"{side}: {result[side]['error']}" for side in ("stock", "shim")
                       if "error" in result.get(side, {}))
    return (f"{result['backend']:<8}{result['entry']:<46}{result['case']:<36}{figures('stock')}"
            f"{figures('shim')}{ratio_text}  {why}{'  ' + errors if errors else ''}")


def markdown(table: dict) -> str:
    """The rows as a Markdown table (docs/benchmarks.md)."""
    lines = ["| backend | entry points | case | stock ns (min) | shim ns (min) | shim/stock | why |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in table["rows"]:
        cells = []
        for side in ("stock", "shim"):
            s = r.get(side, {})
            cells.append(f"{s['median_ns']:.0f} ({s['min_ns']:.0f})" if "median_ns" in s
                         else f"failed: {s.get('error', '')}")
        ratio = r.get("ratio")
        why = reason(r) if ratio is None or ratio > 1.2 or r["python"] else ""
        lines.append(f"| {r['backend']} | {r['entry']} | {r['case']} | {cells[0]} | {cells[1]} | "
                     f"{f'{ratio:.2f}x' if ratio is not None else '-'} | {why} |")
    return "\n".join(lines)


def available(kinds) -> tuple[list[str], dict]:
    """The kinds whose device the shim opens here, and why each other one is left out."""
    import shim

    usable, skipped = [], {}
    for kind in kinds:
        try:
            shim.device(kind)
            usable.append(kind)
        except shim.DeviceUnavailable as e:
            skipped[kind] = str(e)
    return usable, skipped


def run(backends, samples: int, target: float, progress=print) -> dict:
    build_harness()
    shim_side = ShimSide()
    kinds, skipped = available(backends)
    for kind, why in skipped.items():
        progress(f"skipped {kind}: no device ({why})")
    children = {}
    results = []
    try:
        for kind in {STOCK_KIND[k] for k in kinds}:
            children[kind] = stock_process(kind)
        rows = [row for kind in kinds for row in device_rows(kind)]
        # device_release restarts the device: after every other row.
        rows = ([r for r in rows if r.op != "device_release"] + other_rows()
                + [r for r in rows if r.op == "device_release"])
        progress(HEADER)
        for row in rows:
            if row.backend == "-" and not children:
                children["opencl"] = stock_process("opencl")
            stock = children[STOCK_KIND[row.backend]] if row.backend != "-" else \
                next(iter(children.values()))
            if row.op == "device_release":
                # In a fresh process, where nothing else holds device memory: Halide 21's
                # Vulkan runtime's process died when this row came after the others (their
                # buffers still allocated on the device it released).
                stock = children[f"{row.backend} release"] = stock_process(STOCK_KIND[row.backend])
            result = measure(row, {"stock": stock, "shim": shim_side}, samples, target)
            results.append(result)
            progress(line(result))
    finally:
        for child in children.values():
            child.close()
    return {"rows": results, "skipped": skipped, "backends": kinds,
            "samples": samples, "sample_ms": 1e3 * target}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="3 samples of 2 ms each (a smoke run; the figures are rough)")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated device kinds (default: all; those without a "
                             "device here are skipped with the reason)")
    parser.add_argument("--samples", type=int, default=11, help="samples per side and row")
    parser.add_argument("--sample-ms", type=float, default=20.0, help="length of one sample")
    parser.add_argument("--json", metavar="OUT", help="write the rows to this file as JSON")
    parser.add_argument("--markdown", metavar="OUT", help="write the table to this file as Markdown")
    parser.add_argument("--serve", metavar="KIND", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        side = StockSide(args.serve)
        serve(side.seconds)
        return 0
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        parser.error(f"--backends: unknown {', '.join(sorted(unknown))}; known: {', '.join(BACKENDS)}")
    samples, target = (3, 2e-3) if args.quick else (args.samples, args.sample_ms / 1e3)
    start = time.perf_counter()
    table = run(backends, samples, target)
    print(f"{len(table['rows'])} rows in {time.perf_counter() - start:.0f} s; ns per call "
          f"(per iteration of one thread), median and min of {samples} samples of "
          f"{1e3 * target:g} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(markdown(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
