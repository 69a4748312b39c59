"""What the tests of the served paths (native_stubs/devices/served.c) observe: the native
layer's live served allocations, the driver's accounting, and the Python that ran meanwhile."""

import sys
import threading

from shim.native import ffi, lib

OPENCL = lib.SHIM_BACKEND_OPENCL


def served_live() -> int:
    return lib.shim_served_live(OPENCL, ffi.new("int64_t *"))


def accounting(opencl) -> int:
    """What the driver allocated and did not free, less what is live or pooled: constant."""
    counts = opencl.allocation_counts()
    return counts["new"] - counts["freed"] - opencl.live_allocations - opencl.pooled_allocations


def python_calls_during(work, module_prefix: str) -> set[str]:
    """"module.function" of each Python function whose module's name starts with
    ``module_prefix`` that ran, on any thread, while ``work()`` ran."""
    seen = set()

    def profiler(frame, event, arg):
        module = frame.f_globals.get("__name__", "")
        if event == "call" and module.startswith(module_prefix):
            seen.add(f"{module}.{frame.f_code.co_name}")

    sys.setprofile(profiler)
    threading.setprofile(profiler)
    try:
        work()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return seen


def in_both_worlds(worlds, operation, errors=()):
    """operation(world) on each of ``worlds`` (each with ``on``: whether the native layer
    serves OpenCL's allocations there), with serving switched accordingly and then back on;
    an exception of ``errors`` counts as its type's name. The results must agree: the one."""
    results = []
    for world in worlds:
        lib.shim_serve_allocations(OPENCL, world.on)
        try:
            results.append(operation(world))
        except errors as e:
            results.append(type(e).__name__)
    lib.shim_serve_allocations(OPENCL, True)
    assert results[0] == results[1], results
    return results[0]
