"""atheris target: a pipeline's metadata (halide_filter_metadata_t), as shim.load reads it.

A real library (fz.so, compiled at start: ``fz_argv`` and ``fz_metadata``, which returns what
``fz_current`` points to) hands the shim metadata made of the input: its version, name and
target, and its arguments' names, kinds, dimensions, types, scalar defaults, bounds and
estimates, and buffer estimates. Pointers the metadata holds point to memory of that shape
(a library's metadata is its own memory, which the shim cannot check beyond its values: a
buffer's estimates are as many as its dimensions say), but any may be NULL, and every value is
the input's. Then shim.load (both conventions), what ``python -m shim info`` shows of the
pipeline, and a call with every argument left out (fz_argv does nothing).

Checked: every refusal is one of the shim's errors.
"""

import atexit
import contextlib
import ctypes
import os
import shutil
import subprocess
import tempfile

import numpy as np

from common import Reader, Writer, check_error, fuzz, quiet

import shim
from shim.native import ffi

_FZ_SOURCE = b"""
const void *fz_current;
int fz_argv(void **args) { (void)args; return 0; }
const void *fz_metadata(void) { return fz_current; }
"""
# Which of an argument's pointers are set (the input's bits).
_SCALARS = ("scalar_def", "scalar_min", "scalar_max", "scalar_estimate")
_HAS_ESTIMATES = 1 << 4
_NULL_NAME = 1 << 5
_MAX_ESTIMATED_DIMENSIONS = 64  # (the harness allocates 2 * dimensions pointers)


def fz_library() -> str:
    """fz.so, compiled into a private folder."""
    folder = tempfile.mkdtemp(prefix="halide-shim-fuzz-")
    atexit.register(shutil.rmtree, folder, True)
    source, path = os.path.join(folder, "fz.c"), os.path.join(folder, "fz.so")
    with open(source, "wb") as f:
        f.write(_FZ_SOURCE)
    subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O1", "-o", path, source],
                   check=True)
    return path


def _string(r: Reader, keep: list, null: bool):
    text = r.blob()
    if null:
        return ffi.NULL
    keep.append(ffi.new("char[]", text))
    return keep[-1]


def metadata_of(data: bytes):
    """The halide_filter_metadata_t the input describes, and what keeps its memory alive."""
    r = Reader(data)
    keep = []
    meta = ffi.new("struct halide_filter_metadata_t *")
    keep.append(meta)
    meta.version = r.i32()
    nulls = r.u8()
    meta.name = _string(r, keep, bool(nulls & 1))
    meta.target = _string(r, keep, bool(nulls & 2))
    count = r.i8()
    meta.num_arguments = count
    arguments = ffi.new("struct halide_filter_argument_t[]", max(count, 0) or 1)
    keep.append(arguments)
    meta.arguments = ffi.NULL if nulls & 4 else arguments
    for i in range(max(count, 0)):
        arg = arguments[i]
        present = r.u8()
        arg.name = _string(r, keep, bool(present & _NULL_NAME))
        arg.kind = r.i32()
        arg.dimensions = r.i32()
        arg.type.code, arg.type.bits, arg.type.lanes = r.u8(), r.u8(), r.u16()
        for bit, field in enumerate(_SCALARS):
            if present & (1 << bit):
                value = ffi.new("struct halide_scalar_value_t *")
                value.u.u64 = r.u64()
                keep.append(value)
                setattr(arg, field, value)
        if present & _HAS_ESTIMATES and 0 <= arg.dimensions <= _MAX_ESTIMATED_DIMENSIONS:
            pointers = ffi.new("int64_t *[]", 2 * arg.dimensions or 1)
            keep.append(pointers)
            for j in range(2 * arg.dimensions):
                if r.bool():
                    keep.append(ffi.new("int64_t *", r.i64()))
                    pointers[j] = keep[-1]
            arg.buffer_estimates = pointers
    return meta, keep


def encode(meta, name: str = "fz") -> bytes:
    """The input that describes the metadata ``meta`` (a real pipeline's, for seeds), named
    ``name``."""
    w = Writer().i32(meta.version).u8(0).text(name).blob(ffi.string(meta.target))
    w.i8(meta.num_arguments)
    for i in range(meta.num_arguments):
        arg = meta.arguments[i]
        present = sum(1 << bit for bit, field in enumerate(_SCALARS)
                      if getattr(arg, field) != ffi.NULL)
        if arg.buffer_estimates != ffi.NULL:
            present |= _HAS_ESTIMATES
        w.u8(present).blob(ffi.string(arg.name)).i32(arg.kind).i32(arg.dimensions)
        w.u8(arg.type.code).u8(arg.type.bits).u16(arg.type.lanes)
        for field in _SCALARS:
            if getattr(arg, field) != ffi.NULL:
                w.u64(getattr(arg, field).u.u64)
        if arg.buffer_estimates != ffi.NULL:
            for j in range(2 * arg.dimensions):
                pointer = arg.buffer_estimates[j]
                w.bool(pointer != ffi.NULL)
                if pointer != ffi.NULL:
                    w.i64(pointer[0])
    return w.bytes()


def library_metadata(path: str, name: str):
    """The metadata of the pipeline ``name`` in the library at ``path`` (loaded, not run)."""
    handle = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    function = ctypes.cast(getattr(handle, f"{name}_metadata"), ctypes.c_void_p).value
    return ffi.cast("const struct halide_filter_metadata_t *(*)(void)", function)()


def _use(pipeline) -> None:
    """What the command line's info shows, a call with everything left out, and one with
    every input buffer given (zeros of 2 elements a dimension, of its type) and every output
    as a shape (fz_argv's bounds query leaves it as it is)."""
    pipeline.release_description()
    pipeline.subtarget_status()
    repr(pipeline)
    for argument in pipeline.arguments:
        argument.describe()
    with contextlib.suppress(shim.ArgumentError):
        pipeline()
    given = {}
    for argument in pipeline.arguments:
        if argument.is_buffer and 0 <= argument.dimensions <= 8:
            shape = (2,) * argument.dimensions
            given[argument.name] = shape if argument.is_output else np.zeros(
                shape, argument.type.dtype or np.uint8)
    pipeline(**given)


def main():
    path = fz_library()
    current = ctypes.c_void_p.in_dll(ctypes.CDLL(path), "fz_current")

    def test_one_input(data: bytes) -> None:
        meta, _keep = metadata_of(data)
        current.value = int(ffi.cast("uintptr_t", meta))
        for convention in ("numpy", "extension"):
            try:
                with quiet():
                    pipeline = shim.load(path, convention=convention)
            except Exception as e:  # noqa: BLE001 - the property
                check_error(e, f"shim.load(convention={convention!r})")
                continue
            if convention == "numpy":
                try:
                    with quiet():
                        _use(pipeline)
                except Exception as e:  # noqa: BLE001 - the property
                    check_error(e, "using the pipeline")
        current.value = None

    fuzz(test_one_input)


if __name__ == "__main__":
    main()
