"""No-op halide_copy_to_device / halide_copy_to_host, called from C in a loop: the shim's
runtime against Halide's stock runtime, side by side in one run.

    python benchmarks/noop_copies.py [--iterations N] [--repeats R]

prints ns per call for 1 and 2 threads (each thread on its own buffer) and the ratios. The
stock runtime is the one bundled in a sample pipeline, loaded in a child process where the
shim is not; the shim is measured in this process. Both are timed by the same C loop
(benchmarks/noop_loop.c), which calls the entry point through a function pointer.

In both runtimes the call has nothing to do: the buffer has a device allocation and is not
dirty. The stock runtime decides that after taking its process-wide mutex; the shim decides it
from atomic loads. For the stock child the buffers carry a placeholder device handle: a no-op
call returns before looking at it.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import subprocess
import sys
from pathlib import Path

from sidebyside import ChildProcess, interleave, serve

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
HARNESS_SOURCE = HERE / "noop_loop.c"
OPERATIONS = ("copy_to_device", "copy_to_host")


def harness_path(out_dir=None) -> Path:
    """Where the compiled loop for the current source lives: ``out_dir``, else
    $HALIDE_SHIM_BENCHMARK_BUILD (a GPU check kit brings it prebuilt there), else build/benchmarks."""
    out_dir = Path(out_dir or os.environ.get("HALIDE_SHIM_BENCHMARK_BUILD") or ROOT / "build" / "benchmarks")
    return out_dir / f"noop_loop-{hashlib.sha256(HARNESS_SOURCE.read_bytes()).hexdigest()[:12]}.so"


def build_harness(out_dir=None) -> Path:
    """Compile the C loop unless it is there for the current source."""
    library = harness_path(out_dir)
    if not library.exists():
        library.parent.mkdir(parents=True, exist_ok=True)
        staged = library.with_suffix(f".{os.getpid()}.so")
        compiler = os.environ.get("CC", "cc")
        try:
            subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-pthread",
                            "-o", str(staged), str(HARNESS_SOURCE)], check=True)
        except FileNotFoundError:
            raise RuntimeError(f"{library} is not built and there is no C compiler ({compiler}) "
                               "to build it") from None
        os.replace(staged, library)
    return library


def harness():
    """The compiled C loop (ctypes), rebuilt when its source changes."""
    library = build_harness()
    lib = ctypes.CDLL(str(library))
    lib.noop_loop.restype = ctypes.c_double
    lib.noop_loop.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                              ctypes.c_void_p, ctypes.c_int, ctypes.c_long]
    return lib


class Loop:
    """Times one runtime's two entry points on a set of buffers, one per thread."""

    def __init__(self, to_device_address, to_host_address, buffers, interface):
        self._harness = harness()
        self._functions = {"copy_to_device": to_device_address, "copy_to_host": to_host_address}
        self._buffers = (ctypes.c_void_p * len(buffers))(*buffers)
        self._interface = interface

    def seconds(self, operation: str, threads: int, iterations: int) -> float:
        elapsed = self._harness.noop_loop(self._functions[operation], operation == "copy_to_device",
                                          self._buffers, self._interface, threads, iterations)
        if elapsed < 0:
            raise RuntimeError(f"{operation} failed inside the timing loop")
        return elapsed


def requests(iterations: int) -> dict:
    """The cases: each operation with 1 and 2 threads."""
    return {(op, threads): {"operation": op, "threads": threads, "iterations": iterations}
            for op in OPERATIONS for threads in (1, 2)}


def calls(request) -> int:
    return request["threads"] * request["iterations"]


# --- the stock runtime, in a process without the shim ---------------------------------------

def stock_loop(library: str) -> Loop:
    """Halide's own runtime, as bundled in ``library``. Must not run where shim is imported."""
    assert "shim" not in sys.modules, "the stock runtime must be measured without the shim"
    stock = ctypes.CDLL(library, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    address = lambda name: ctypes.cast(getattr(stock, name), ctypes.c_void_p).value  # noqa: E731
    # halide_buffer_t: device at +0, device_interface at +8, flags at +24 (all zero but the
    # device handle and interface). 64-byte aligned, one cache line per buffer.
    global _keep
    _keep = [(ctypes.c_uint64 * 8)() for _ in range(2)]
    placeholder_interface = ctypes.c_void_p(0x1000)
    for raw in _keep:
        raw[0], raw[1] = 1, placeholder_interface.value
    buffers = [ctypes.addressof(raw) for raw in _keep]
    return Loop(address("halide_copy_to_device"), address("halide_copy_to_host"), buffers,
                placeholder_interface.value)


def stock_process() -> ChildProcess:
    return ChildProcess([sys.executable, str(Path(__file__)), "--serve", stock_library()])


# --- the shim ---------------------------------------------------------------------------------

def shim_loop():
    """The shim's runtime, on two real allocations on the simulated host device."""
    import numpy as np

    import shim
    from shim.native import ffi, lib

    device = shim.device("host")
    global _keep
    _keep = [shim.Buffer(np.zeros(16, np.float32)) for _ in range(2)]
    for buf in _keep:
        buf.copy_to_device(device)
    address = lambda name: int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))  # noqa: E731
    return Loop(address("halide_copy_to_device"), address("halide_copy_to_host"),
                [buf.raw_buffer() for buf in _keep],
                int(ffi.cast("uintptr_t", lib.shim_backend_interface(device.index))))


class ProfiledLoop:
    """The shim's loop with a shim.profile recording: the fast path counts each no-op."""

    def __init__(self, loop: Loop):
        self._loop = loop

    def seconds(self, **request) -> float:
        import shim

        with shim.profile():  # started and stopped outside the timed C loop
            return self._loop.seconds(**request)


def stock_library() -> str:
    sys.path.insert(0, str(ROOT))
    from shim.pipelines.build import Build, build

    return str(build(Build("brighten", "host", "bundled")))


def report(stock: dict, ours: dict, profiled: dict) -> str:
    lines = [f"{'operation':<16}{'threads':>8}{'stock ns/call':>16}{'shim ns/call':>15}"
             f"{'shim/stock':>12}{'profiling ns/call':>19}{'profiling/shim':>16}",
             "  (min over samples; for 2 threads, aggregate: wall time / all calls; profiling:"
             " the shim while a shim.profile records, counting each no-op)"]
    for op in OPERATIONS:
        for threads in (1, 2):
            s, o = 1e9 * stock[op, threads]["min"], 1e9 * ours[op, threads]["min"]
            p = 1e9 * profiled[op, threads]["min"]
            lines.append(f"{op:<16}{threads:>8}{s:>16.2f}{o:>15.2f}{o / s:>12.2f}{p:>19.2f}"
                         f"{p / o:>16.2f}")
    lines.append("")
    lines.append("2-thread aggregate throughput / 1-thread throughput (higher scales better):")
    for op in OPERATIONS:
        for name, results in (("stock", stock), ("shim", ours)):
            speedup = results[op, 1]["min"] / results[op, 2]["min"]
            lines.append(f"  {op:<16} {name:<6} {speedup:.2f}x")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=2_000_000, help="calls per thread per sample")
    parser.add_argument("--repeats", type=int, default=31, help="samples per runtime, operation and thread count")
    parser.add_argument("--serve", metavar="LIBRARY", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(stock_loop(args.serve).seconds)
        return 0
    child = stock_process()
    try:
        loop = shim_loop()
        results = interleave({"stock": child, "shim": loop, "profiling": ProfiledLoop(loop)},
                             requests(args.iterations), args.repeats, per_sample=calls)
    finally:
        child.close()
    print(report(results["stock"], results["shim"], results["profiling"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
