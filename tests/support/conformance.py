"""The device-layer conformance table: each generic halide_* function applied to a buffer in
each state, observed as (return code, flags after, device allocation after).

Runs against any runtime that exports Halide's functions: the shim (in the test process) or
Halide's stock runtime, in a process where the shim is not loaded:

    python tests/support/conformance.py BUNDLED_OPENCL_PIPELINE.so   # prints the table as JSON
    python tests/support/conformance.py BUNDLED_VULKAN_PIPELINE.so vulkan

Nothing here imports shim, so the stock run sees only Halide's own code.
"""

import json
import os
import sys

STATES = {
    # name: (allocate on the interface first?, flags)
    "null": None,
    "no device": (False, 0),
    "no device, host-dirty": (False, 1),
    "device clean": (True, 0),
    "host-dirty": (True, 1),
    "device-dirty": (True, 2),
    "both dirty": (True, 3),
}

# name: function(lib, buffer, interface, other_interface) -> return code
FUNCTIONS = {
    "copy_to_host": lambda lib, b, i, o: lib.halide_copy_to_host(NULL, b),
    "copy_to_device": lambda lib, b, i, o: lib.halide_copy_to_device(NULL, b, i),
    "copy_to_device(NULL)": lambda lib, b, i, o: lib.halide_copy_to_device(NULL, b, NULL),
    "copy_to_device(other interface)": lambda lib, b, i, o: lib.halide_copy_to_device(NULL, b, o),
    "device_malloc": lambda lib, b, i, o: lib.halide_device_malloc(NULL, b, i),
    "device_malloc(other interface)": lambda lib, b, i, o: lib.halide_device_malloc(NULL, b, o),
    "device_free": lambda lib, b, i, o: lib.halide_device_free(NULL, b),
    "device_sync": lambda lib, b, i, o: lib.halide_device_sync(NULL, b),
    "device_detach_native": lambda lib, b, i, o: lib.halide_device_detach_native(NULL, b),
    "device_and_host_free": lambda lib, b, i, o: lib.halide_device_and_host_free(NULL, b),
    "device_release_crop": lambda lib, b, i, o: lib.halide_device_release_crop(NULL, b),
}

# Where Halide's own runtime dereferences a NULL buffer instead of reporting it, and crashes.
STOCK_CRASHES = {("device_release_crop", "null")}
# Where Halide 21's Vulkan runtime also crashes ("double free or corruption"): releasing as a
# crop a buffer that owns its allocation frees the allocation's region twice (the rows that
# survive only corrupt the heap quietly, so every row with an allocation is left out).
STOCK_CRASHES_BY_API = {
    "opencl": STOCK_CRASHES,
    "vulkan": STOCK_CRASHES | {("device_release_crop", state) for state in
                               ("device clean", "host-dirty", "device-dirty", "both dirty")},
}

NULL = None  # set by run_table to the ffi's NULL


def run_table(ffi, lib, interface, other_interface, host_allocator=None, skip=()):
    """{function: {state: [code, flags, has_device]}} (flags and has_device None for "null").
    The "other interface" rows apply to buffers that already live on ``interface``."""
    global NULL
    NULL = ffi.NULL
    table = {}
    for fname, function in FUNCTIONS.items():
        row = table[fname] = {}
        for state, setup in STATES.items():
            if "other interface" in fname and setup is not None and not setup[0]:
                continue  # the other interface would allocate: not a conformance question
            if (fname, state) in skip:
                row[state] = "crash"
                continue
            if setup is None:
                row[state] = [function(lib, ffi.NULL, interface, other_interface), None, None]
                continue
            allocate, flags = setup
            dims = ffi.new("halide_dimension_t[2]", [(0, 8, 1, 0), (0, 8, 8, 0)])
            host = host_allocator(256) if host_allocator else ffi.new("int32_t[64]")
            buf = ffi.new("halide_buffer_t *")
            buf.host = ffi.cast("uint8_t *", host)
            buf.type.code, buf.type.bits, buf.type.lanes = 0, 32, 1
            buf.dimensions, buf.dim = 2, dims
            if allocate:
                assert lib.halide_device_malloc(ffi.NULL, buf, interface) == 0
            buf.flags = flags
            code = function(lib, buf, interface, other_interface)
            row[state] = [code, int(buf.flags), buf.device != 0]
            # Leave nothing allocated behind (device_and_host_free took the host pointer).
            buf.flags = 0
            if buf.device:
                assert lib.halide_device_free(ffi.NULL, buf) == 0
    return table


def _stock_table(library, api="opencl"):
    """The table for Halide's stock runtime bundled in ``library`` (built for host-``api``)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    from pipelines.stock import StockRuntime

    stock = StockRuntime(library, f"const struct halide_device_interface_t "
                                  f"*halide_{api}_device_interface(void);" if api == "vulkan" else "")
    # Another interface for the "other interface" rows: those calls must fail with -42
    # before they look inside it, so an empty struct stands in.
    other = stock.ffi.new("struct halide_device_interface_t *")
    # device_and_host_free hands the host pointer to halide_free: give it one from halide_malloc.
    interface = getattr(stock.lib, f"halide_{api}_device_interface")()
    return run_table(stock.ffi, stock.lib, interface, other,
                     host_allocator=lambda n: stock.lib.halide_malloc(stock.ffi.NULL, n),
                     skip=STOCK_CRASHES_BY_API[api])


if __name__ == "__main__":
    json.dump(_stock_table(*sys.argv[1:3]), sys.stdout)
