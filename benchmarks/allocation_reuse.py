"""Call patterns that allocate device memory, with allocation reuse on and off: the shim
against Halide's stock runtime, side by side in one run.

    python benchmarks/allocation_reuse.py [--device opencl|cuda] [--repeats R]

Cases, each with Halide's switch (halide_reuse_device_allocations) on and off in both runtimes:

- ``pipeline 64x64`` and ``pipeline 1024x1024``: brighten (float32) called on fresh numpy
  arrays every time: each call allocates device memory for its input and output, uploads,
  runs, downloads and frees both.
  The shim: a plain pipeline call with the arrays (its argument handling included). The stock
  runtime: the same buffers re-pointed at the fresh arrays, the pipeline run, the output
  copied to the host and both buffers freed with halide_device_free, from Python.
- ``up+down 16K``: halide_copy_to_device then halide_copy_to_host of one allocated 64x64
  float32 buffer (host-dirty, then device-dirty, as a pipeline leaves it), through the C entry
  points in both runtimes; the shim's rows as for malloc/free below (a pipeline's own buffer is
  served in C).
  On OpenCL a second table times the same copies made through pyopencl in the shim's process
  (on its queue and on a plain one), next to the served ones: what the driver costs there.
- ``malloc/free 16K`` and ``malloc/free 16M``: halide_device_malloc + halide_device_free of
  one buffer (64x64 and 2048x2048 float32) in a loop, through the C entry points in both
  runtimes (what a pipeline calls). The stock runtime's buffer is a bare halide_buffer_t, as
  a pipeline's own intermediate is; the shim's is one too (``shim, own buffer``: served by the
  native layer, native_stubs/devices/served.c), a shim.Buffer's struct (``shim``: its family
  lives in Python, and the native layer serves it while the family is idle,
  native_stubs/fast/buffer_families.c), and a shim.Buffer through Buffer.device_malloc/
  device_free.

Halide 21 reuses allocations in its CUDA runtime only (its OpenCL runtime ignores the switch),
so on OpenCL the stock runtime's two settings time the same thing. The stock runtime runs the
pipeline built with its runtime bundled, in a child process without the shim; both use the
same device (the OpenCL platform and device the shim picks, passed to the child as Halide's
HL_OCL_PLATFORM_NAME / HL_OCL_DEVICE_TYPE; CUDA device 0).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from sidebyside import ChildProcess, interleave, serve

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

# The checkout's pipelines/ by the folder's own name, not as shim.pipelines: the stock runtime's
# child process runs this module too, and must not import the shim package.
from pipelines.build import Build, build  # noqa: E402

PIPELINE_SHAPES = {"pipeline 64x64": (64, 64), "pipeline 1024x1024": (1024, 1024)}
MALLOC_SHAPES = {"malloc/free 16K": (64, 64), "malloc/free 16M": (2048, 2048),
                 "up+down 16K": (64, 64)}
ITERATIONS = {"pipeline 64x64": 100, "pipeline 1024x1024": 20,
              "malloc/free 16K": 300, "malloc/free 16M": 100, "up+down 16K": 300}
COPY_CASES = {"up+down 16K"}


def library(kind: str, runtime: str) -> Path:
    return build(Build("brighten", kind, runtime))


def fresh_arrays(case: str, count: int):
    """(input, output) pairs of new host memory, one pair per call."""
    rng = np.random.default_rng(5)
    shape = PIPELINE_SHAPES[case]
    return [(rng.random(shape, dtype=np.float32), np.empty(shape, np.float32))
            for _ in range(count)]


def requests(cases=None) -> dict:
    cases = cases or list(ITERATIONS)
    return {(case, reuse): {"case": case, "iterations": ITERATIONS[case], "reuse": reuse}
            for case in cases for reuse in (True, False)}


def per_operation(request) -> int:
    return request["iterations"]


# --- the stock runtime (child process) ---------------------------------------------------------

class StockRunner:
    def __init__(self, kind: str):
        from pipelines.stock import StockPipeline

        self.pipeline = p = StockPipeline(str(library(kind, "bundled")), "brighten")
        self.interface = getattr(p.lib, f"halide_{kind}_device_interface")()
        self.buffers = {}
        for case, shape in MALLOC_SHAPES.items():
            array = np.zeros(shape, np.float32)
            self.buffers[case] = bare_struct(p.ffi, array)

    def _bind(self, pair) -> tuple:
        """The pipeline bound to arrays of the pair's shape: its input and output structs."""
        p = self.pipeline
        p.bind({"input": pair[0], "scale": 2.0, "offset": 1.0, "output": pair[1]})
        raws = dict(zip([a[0] for a in p.arguments], p.argv))
        return tuple(p.ffi.cast("halide_buffer_t *", raws[name]) for name in ("input", "output"))

    def _check(self, result, what):
        if result != 0:
            raise RuntimeError(f"stock {what} failed ({result}): {' '.join(self.pipeline.errors)}")

    def seconds(self, case, iterations, reuse) -> float:
        p, lib, ffi = self.pipeline, self.pipeline.lib, self.pipeline.ffi
        self._check(lib.halide_reuse_device_allocations(ffi.NULL, reuse), "reuse switch")
        if case in PIPELINE_SHAPES:
            arrays = fresh_arrays(case, iterations + 1)
            source, target = self._bind(arrays[0])

            def call(pair):
                source.host = ffi.cast("uint8_t *", pair[0].ctypes.data)
                target.host = ffi.cast("uint8_t *", pair[1].ctypes.data)
                source.flags, target.flags = 1, 0  # the input is new on the host
                p.run()
                self._check(lib.halide_copy_to_host(ffi.NULL, target), "copy_to_host")
                self._check(lib.halide_device_free(ffi.NULL, source), "device_free")
                self._check(lib.halide_device_free(ffi.NULL, target), "device_free")

            call(arrays.pop())  # untimed: the switch just changed
            start = time.perf_counter()
            for pair in arrays:
                call(pair)
            return time.perf_counter() - start
        raw = self.buffers[case][0]
        if case in COPY_CASES:
            return copy_seconds(ffi, lib, raw, self.interface, iterations, self._check)
        malloc, free, interface = lib.halide_device_malloc, lib.halide_device_free, self.interface
        self._check(malloc(ffi.NULL, raw, interface), "device_malloc")
        self._check(free(ffi.NULL, raw), "device_free")
        start = time.perf_counter()
        for _ in range(iterations):
            malloc(ffi.NULL, raw, interface)
            free(ffi.NULL, raw)
        elapsed = time.perf_counter() - start
        self._check(malloc(ffi.NULL, raw, interface) or free(ffi.NULL, raw), "device_malloc/free")
        return elapsed


def stock_server(kind: str) -> None:
    runner = StockRunner(kind)
    serve(runner.seconds)


# --- the shim --------------------------------------------------------------------------------

class ShimRunner:
    """The shim in this process. ``buffer_methods``: the malloc/free cases through
    Buffer.device_malloc / device_free instead of the C entry points."""

    def __init__(self, kind: str, buffer_methods: bool = False, bare: bool = False):
        import shim
        from shim.backends.base import interface_of
        from shim.native import ffi, lib

        self.shim, self.ffi, self.lib = shim, ffi, lib
        self.device = shim.device(kind)
        self.interface = interface_of(self.device)
        self.pipeline = shim.load(library(kind, "no_runtime"))
        self.buffer_methods = buffer_methods
        self.bare = bare
        self.buffers = {case: shim.Buffer(np.zeros(shape, np.float32))
                        for case, shape in MALLOC_SHAPES.items()}
        # Bare structs over the same memory: what a pipeline's own buffers are.
        self.structs = {case: bare_struct(ffi, buf.numpy()) for case, buf in self.buffers.items()}

    def seconds(self, case, iterations, reuse) -> float:
        self.shim.reuse_device_allocations(reuse)
        if case in PIPELINE_SHAPES:
            arrays = fresh_arrays(case, iterations + 1)
            call = self.pipeline
            source, target = arrays.pop()
            call(source, scale=2.0, offset=1.0, output=target)  # untimed: the switch changed
            start = time.perf_counter()
            for source, target in arrays:
                call(source, scale=2.0, offset=1.0, output=target)
            return time.perf_counter() - start
        buf = self.buffers[case]
        if case in COPY_CASES:
            return self._copy_seconds(case, iterations)
        if self.buffer_methods:
            malloc, free = (lambda: buf.device_malloc(self.device)), buf.device_free
        else:
            raw = self.structs[case][0] if self.bare else buf.raw
            ffi, lib, interface = self.ffi, self.lib, self.interface
            malloc = lambda: lib.halide_device_malloc(ffi.NULL, raw, interface)  # noqa: E731
            free = lambda: lib.halide_device_free(ffi.NULL, raw)  # noqa: E731
        malloc(), free()
        start = time.perf_counter()
        for _ in range(iterations):
            malloc()
            free()
        elapsed = time.perf_counter() - start
        if buf.has_device_allocation() or self.structs[case][0].device:
            raise RuntimeError("device_malloc/free failed inside the timing loop")
        return elapsed

    def _copy_seconds(self, case, iterations) -> float:
        buf = self.buffers[case]
        if not self.buffer_methods:
            raw = self.structs[case][0] if self.bare else buf.raw
            return copy_seconds(self.ffi, self.lib, raw, self.interface, iterations, _check)
        buf.copy_to_device(self.device)
        start = time.perf_counter()
        for _ in range(iterations):
            buf.set_host_dirty()
            buf.copy_to_device(self.device)
            buf.set_device_dirty()
            buf.copy_to_host()
        elapsed = time.perf_counter() - start
        buf.device_free()
        return elapsed

    def close(self) -> None:
        self.shim.reuse_device_allocations(True)
        self.shim.release_unused_device_allocations(self.device)


class DriverCopies:
    """The ``up+down 16K`` case made straight through pyopencl in this process: an upload and a
    download of a 16 KiB cl.Buffer, each enqueued without blocking then finished, on the
    shim's own queue or (``plain_queue``) on a new queue without profiling: what the driver
    costs here, next to the shim's served copies of the same size."""

    def __init__(self, device, plain_queue: bool):
        import pyopencl as cl

        self.cl = cl
        self.queue = cl.CommandQueue(device.context) if plain_queue else device.queue
        self.host = np.zeros(MALLOC_SHAPES["up+down 16K"], np.float32)
        self.memory = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, self.host.nbytes)

    def seconds(self, case, iterations, reuse) -> float:
        cl, queue, host, memory = self.cl, self.queue, self.host, self.memory
        start = time.perf_counter()
        for _ in range(iterations):
            cl.enqueue_copy(queue, memory, host, is_blocking=False)
            queue.finish()
            cl.enqueue_copy(queue, host, memory, is_blocking=False)
            queue.finish()
        return time.perf_counter() - start


def driver_report(device) -> str:
    """The served copies against the driver's own calls in this process (DriverCopies)."""
    runners = {"shim, own buffer": ShimRunner("opencl", bare=True),
               "pyopencl, shim's queue": DriverCopies(device, plain_queue=False),
               "pyopencl, plain queue": DriverCopies(device, plain_queue=True)}
    case = "up+down 16K"
    request = {"case": case, "iterations": ITERATIONS[case], "reuse": True}
    results = interleave(runners, {case: request}, 7, per_sample=per_operation)
    lines = [f"{case} in this process, the shim's served copies and the same driver calls "
             f"through pyopencl (us per upload + download, min / median of 7 samples):"]
    for name, cases in results.items():
        lines.append(f"  {name:<24}{1e6 * cases[case]['min']:>8.1f}{1e6 * cases[case]['median']:>8.1f}")
    runners["shim, own buffer"].close()
    return "\n".join(lines)


def copy_seconds(ffi, lib, raw, interface, iterations: int, check) -> float:
    """``iterations`` uploads and downloads of ``raw`` (allocated first, freed after) through
    the C entry points, as a pipeline's copies are made: the same code on both sides."""
    check(lib.halide_device_malloc(ffi.NULL, raw, interface), "device_malloc")
    to_device, to_host = lib.halide_copy_to_device, lib.halide_copy_to_host
    host_dirty, device_dirty = lib.halide_buffer_flag_host_dirty, lib.halide_buffer_flag_device_dirty
    # The dirty bits changed, the others kept, as generated code changes them (the shim keeps
    # bits of its own there).
    others = raw.flags & ~(host_dirty | device_dirty)
    start = time.perf_counter()
    for _ in range(iterations):
        raw.flags = others | host_dirty
        to_device(ffi.NULL, raw, interface)
        raw.flags = others | device_dirty
        to_host(ffi.NULL, raw)
    elapsed = time.perf_counter() - start
    check(raw.flags & (host_dirty | device_dirty), "the copies (dirty bits left)")
    check(lib.halide_device_free(ffi.NULL, raw), "device_free")
    return elapsed


def _check(result, what) -> None:
    if result != 0:
        raise RuntimeError(f"{what} failed ({result})")


def bare_struct(ffi, array: np.ndarray) -> tuple:
    """A halide_buffer_t over a 2-D float32 array, made as native code makes one (the struct
    and its dims, to keep alive together)."""
    dim = ffi.new("halide_dimension_t[2]")
    dim[0].extent, dim[0].stride = array.shape[1], 1
    dim[1].extent, dim[1].stride = array.shape[0], array.shape[1]
    raw = ffi.new("halide_buffer_t *")
    raw.host = ffi.cast("uint8_t *", array.ctypes.data)
    raw.type.code, raw.type.bits, raw.type.lanes = 2, 32, 1
    raw.dimensions, raw.dim = 2, dim
    return raw, dim, array


def stock_environment(kind: str, device) -> dict:
    """The child's environment: Halide's own device choice pointed at the shim's device."""
    environment = dict(os.environ)
    if kind == "opencl":
        environment["HL_OCL_PLATFORM_NAME"] = device._platform.name.strip()
        import pyopencl as cl

        environment["HL_OCL_DEVICE_TYPE"] = "gpu" if device._device.type & cl.device_type.GPU else "cpu"
    else:
        environment["HL_GPU_DEVICE"] = str(device.ordinal)
    return environment


def report(results: dict, device_name: str) -> str:
    names = [name for name in results if name != "stock"]
    lines = [f"device: {device_name}",
             f"{'case':<20}{'reuse':<7}{'stock us/op':>13}"
             + "".join(f"{n + ' us/op (/stock)':>34}" for n in names)
             + f"{'shim on/off':>13}{'stock on/off':>14}",
             "  (min over samples; op = one pipeline call, or one malloc + free; Halide 21 reuses "
             "allocations on CUDA only, so on OpenCL its on and off time the same code; the "
             "pipeline case runs the same call in every shim row)"]
    for case in ITERATIONS:
        for reuse in (True, False):
            stock = 1e6 * results["stock"][case, reuse]["min"]
            ours = {n: 1e6 * results[n][case, reuse]["min"] for n in names}
            shim_on_off = results["shim"][case, True]["min"] / results["shim"][case, False]["min"]
            stock_on_off = results["stock"][case, True]["min"] / results["stock"][case, False]["min"]
            lines.append(f"{case:<20}{'on' if reuse else 'off':<7}{stock:>13.1f}"
                         + "".join(f"{f'{ours[n]:.1f} ({ours[n] / stock:.2f}x)':>34}" for n in names)
                         + (f"{shim_on_off:>13.2f}{stock_on_off:>14.2f}" if reuse else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="opencl", choices=["opencl", "cuda"])
    parser.add_argument("--repeats", type=int, default=9, help="samples per runtime and case")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        stock_server(args.device)
        return 0
    runners = {"shim, own buffer": ShimRunner(args.device, bare=True),
               "shim": ShimRunner(args.device),
               "shim, Buffer methods": ShimRunner(args.device, buffer_methods=True)}
    device = runners["shim"].device
    child = ChildProcess([sys.executable, str(Path(__file__)), "--serve", "--device", args.device],
                         env=stock_environment(args.device, device))
    try:
        runners["stock"] = child
        results = interleave(runners, requests(), args.repeats, per_sample=per_operation)
    finally:
        child.close()
        for name in ("shim, own buffer", "shim", "shim, Buffer methods"):
            runners[name].close()
    print(report(results, device.name))
    counts = device.allocation_counts()
    print(f"shim allocations over the run: {counts['new']} new, {counts['reused']} reused, "
          f"{counts['freed']} freed")
    if args.device == "opencl":
        print(driver_report(device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
