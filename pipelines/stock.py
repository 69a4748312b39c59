"""Run a pipeline library with Halide's own runtime: the reference the shim is compared with.

The library must carry its runtime (built "bundled"), and this module must run in a process
where shim is not imported, so that nothing interposes Halide's functions: tests and
benchmarks start it as a child process, and import it from the checkout by the folder's own
name, pipelines.stock (as shim.pipelines.stock it would come after the shim package). From
the checkout's root:

    python -m pipelines.stock LIB NAME OUT_DIR input=a.npy scale=2.0 output=480x640:float32

runs the pipeline once on .npy inputs and writes each output to OUT_DIR/NAME.npy.
``--serve`` instead reads JSON requests on stdin (see serve()) for timing loops.

OpenCL: Halide's runtime finds clGetPlatformIDs & co. among the process's global symbols
before trying libOpenCL.so.1, so the ICD loader pyopencl ships (which finds PoCL) is loaded
globally first. Halide's default error handler aborts; RunGen's practice of installing a
handler that records the message is followed.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import sys
import time
from pathlib import Path

import cffi
import numpy as np

ABI = Path(__file__).resolve().parent.parent / "abi" / "halide_runtime.h"
_TYPES = {(0, 8): np.int8, (0, 16): np.int16, (0, 32): np.int32, (0, 64): np.int64,
          (1, 1): np.bool_, (1, 8): np.uint8, (1, 16): np.uint16, (1, 32): np.uint32,
          (1, 64): np.uint64, (2, 16): np.float16, (2, 32): np.float32, (2, 64): np.float64}


def _load_opencl_loader():
    try:
        import pyopencl
    except ImportError:
        return
    for loader in glob.glob(os.path.join(os.path.dirname(pyopencl.__file__), ".libs", "libOpenCL*")):
        ctypes.CDLL(loader, mode=os.RTLD_GLOBAL | os.RTLD_NOW)


class StockRuntime:
    """Halide's runtime as bundled in ``library``, through cffi: ``ffi``, ``lib`` (Halide's
    declarations from abi/halide_runtime.h plus ``declarations``) and the error messages it
    reported."""

    def __init__(self, library: str, declarations: str = ""):
        assert "shim" not in sys.modules, "Halide's stock runtime must run without the shim"
        _load_opencl_loader()
        self.ffi = ffi = cffi.FFI()
        ffi.cdef(ABI.read_text())
        ffi.cdef("typedef void (*halide_error_handler_t)(void *, const char *);"
                 "halide_error_handler_t halide_set_error_handler(halide_error_handler_t);"
                 "void *halide_malloc(void *, size_t);"
                 "const struct halide_device_interface_t *halide_opencl_device_interface(void);"
                 "const struct halide_device_interface_t *halide_cuda_device_interface(void);"
                 + declarations)
        # Never unloaded (RTLD_NODELETE): unloading runs the runtime's destructors
        # (halide_opencl_device_release: clFinish) under the dynamic loader's lock, and PoCL's
        # worker threads, still running other work, wait for that lock to dlopen a kernel: a
        # deadlock whenever the garbage collector dropped a library mid-run.
        self.lib = ffi.dlopen(library, os.RTLD_NOW | os.RTLD_LOCAL | os.RTLD_NODELETE)
        self.errors = []
        self._handler = ffi.callback("void(void *, const char *)",
                                     lambda uc, msg: self.errors.append(ffi.string(msg).decode()))
        self.lib.halide_set_error_handler(self._handler)


class StockPipeline(StockRuntime):
    """One pipeline from a bundled-runtime library, called through Halide's own runtime."""

    def __init__(self, library: str, name: str):
        super().__init__(library, f"int {name}_argv(void **);"
                                  f"const struct halide_filter_metadata_t *{name}_metadata(void);")
        ffi = self.ffi
        self._argv_fn = getattr(self.lib, f"{name}_argv")
        md = getattr(self.lib, f"{name}_metadata")()
        self.arguments = [(ffi.string(a.name).decode(), a.kind, a.dimensions, (a.type.code, a.type.bits))
                          for a in (md.arguments[i] for i in range(md.num_arguments))]
        self._keep = []
        self.outputs = {}
        self.argv = None

    def bind(self, values: dict) -> None:
        """Build argv from {name: numpy array (buffers) or number (scalars)}; arrays are used
        in place, outputs too."""
        ffi = self.ffi
        self._keep = []
        self.outputs = {}
        self.argv = ffi.new("void *[]", len(self.arguments))
        for i, (name, kind, dims, htype) in enumerate(self.arguments):
            if kind == 0:
                if name == "__user_context":
                    slot = ffi.new("void **")
                else:
                    slot = ffi.new("struct halide_scalar_value_t *")
                    field = {2: "f", 0: "i", 1: "u"}[htype[0]] + str(htype[1])
                    setattr(slot.u, "b" if htype == (1, 1) else field, values[name])
                self.argv[i] = slot
                self._keep.append(slot)
                continue
            array = values[name]
            assert array.dtype == _TYPES[htype] and array.ndim == dims, name
            dim = ffi.new("halide_dimension_t[]", max(dims, 1))
            for d in range(dims):
                axis = dims - 1 - d
                dim[d].extent, dim[d].stride = array.shape[axis], array.strides[axis] // array.itemsize
            raw = ffi.new("halide_buffer_t *")
            raw.host = ffi.cast("uint8_t *", array.ctypes.data)
            raw.type.code, raw.type.bits, raw.type.lanes = htype[0], htype[1], 1
            raw.dimensions, raw.dim = dims, dim
            raw.flags = 1 if kind == 1 else 0  # inputs host-dirty, as RunGen does
            self.argv[i] = raw
            self._keep += [array, dim, raw]
            if kind == 2:
                self.outputs[name] = (array, raw)

    def run(self) -> None:
        result = self._argv_fn(self.argv)
        if result != 0:
            raise RuntimeError(f"stock pipeline failed ({result}): {' '.join(self.errors)}")

    def sync(self) -> None:
        for _, raw in self.outputs.values():
            self.lib.halide_device_sync(self.ffi.NULL, raw)

    def fetch(self) -> dict:
        """The outputs, copied back to host memory."""
        for name, (array, raw) in self.outputs.items():
            if self.lib.halide_copy_to_host(self.ffi.NULL, raw) != 0:
                raise RuntimeError(f"copy_to_host of {name} failed: {' '.join(self.errors)}")
        return {name: array for name, (array, _) in self.outputs.items()}

    def seconds(self, iterations: int, sync_each: bool) -> float:
        """Time ``iterations`` runs on resident data, the device synchronized after each run or
        once at the end."""
        start = time.perf_counter()
        for _ in range(iterations):
            self.run()
            if sync_each:
                self.sync()
        self.sync()
        return time.perf_counter() - start


def parse_value(spec: str):
    """``a.npy`` -> array; ``480x640:float32`` -> zeros of that shape (numpy order); number."""
    if spec.endswith(".npy"):
        return np.load(spec)
    if ":" in spec:
        shape, dtype = spec.split(":")
        return np.zeros(tuple(int(n) for n in shape.split("x")), dtype)
    return float(spec) if any(c in spec for c in ".e") else int(spec)


def serve(pipelines: dict) -> None:
    """Requests, one JSON line each: {"case": NAME, "iterations": N, "sync_each": bool};
    answers the seconds taken. ``pipelines`` maps case names to bound StockPipelines."""
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        print(pipelines[request["case"]].seconds(request["iterations"], request["sync_each"]),
              flush=True)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    library, name, out_dir, *assignments = argv
    pipeline = StockPipeline(library, name)
    pipeline.bind({key: parse_value(value) for key, value in (a.split("=", 1) for a in assignments)})
    pipeline.run()
    for output, array in pipeline.fetch().items():
        np.save(Path(out_dir) / f"{output}.npy", array)
    return 0


if __name__ == "__main__":
    sys.exit(main())
