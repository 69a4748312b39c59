"""One OpenCL C kernel built and launched straight through the shim's runtime entry points
(halide_opencl_initialize_kernels, halide_opencl_run), as generated code calls them, on a
four-element int32 Buffer on the OpenCL device: for the tests of what the backend does with a
kernel Halide would never emit."""

import numpy as np

import shim
from shim.native import ffi, lib


def launch(source: bytes, name: bytes, threads: int = 1) -> None:
    """Builds ``source`` and launches its kernel ``name`` over one block of ``threads``
    threads, its one argument the Buffer; a failing step raises its shim.DeviceError."""
    device = shim.device("opencl")
    state = ffi.new("void **")
    source += b"\0"
    with shim.core.bridge.runtime_call("initialize") as check:
        check(lib.halide_opencl_initialize_kernels(ffi.NULL, state, source, len(source)))
    buf = shim.Buffer(np.zeros(4, np.int32))
    buf.copy_to_device(device)
    sizes = ffi.new("size_t[]", [8, 0])
    args = ffi.new("void *[]", [buf.raw, ffi.NULL])
    is_buffer = ffi.new("int8_t[]", [1, 0])
    with shim.core.bridge.runtime_call("run") as check:
        check(lib.halide_opencl_run(ffi.NULL, state[0], name, 1, 1, 1, threads, 1, 1, 0,
                                    sizes, args, is_buffer))
