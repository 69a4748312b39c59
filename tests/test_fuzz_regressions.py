"""The defects the fuzz targets (fuzz/, docs/security.md's "Fuzzing") found, each as a plain
test: the input that found it stays in the target's corpus (fuzz/corpus/TARGET/regression-*),
which every fuzz run replays, and this file says the same without the fuzzer."""

import numpy as np
import pytest

import shim
from shim.buffers.buffer_arguments import zeroed
from shim.calls.metadata import read_metadata
from shim.native import ffi


def _metadata(name=b"p", target=b"x86-64-linux", arguments=()):
    """A halide_filter_metadata_t of ``arguments`` ((name, kind, dimensions, code, bits) each),
    and what keeps its memory alive."""
    keep = [ffi.new("char[]", name) if name is not None else ffi.NULL,
            ffi.new("char[]", target) if target is not None else ffi.NULL]
    meta = ffi.new("struct halide_filter_metadata_t *")
    meta.version, meta.name, meta.target = 1, keep[0], keep[1]
    array = ffi.new("struct halide_filter_argument_t[]", max(len(arguments), 1))
    for arg, (arg_name, kind, dimensions, code, bits) in zip(array, arguments):
        keep.append(ffi.new("char[]", arg_name) if arg_name is not None else ffi.NULL)
        arg.name, arg.kind, arg.dimensions = keep[-1], kind, dimensions
        arg.type.code, arg.type.bits, arg.type.lanes = code, bits, 1
    meta.num_arguments, meta.arguments = len(arguments), array
    return meta, keep, array


@pytest.mark.parametrize("where", ["name", "target", "argument name", "arguments"])
def test_metadata_with_a_null_string_or_array_is_refused(where):
    """fuzz/corpus/metadata/regression-null-string: a NULL string in a library's metadata was
    a raw RuntimeError of cffi's (``string()`` of NULL) out of shim.load."""
    meta, _keep, _array = _metadata(
        name=None if where == "name" else b"p", target=None if where == "target" else b"x",
        arguments=[(None if where == "argument name" else b"out", 2, 2, 2, 32)])
    if where == "arguments":
        meta.arguments = ffi.NULL
    with pytest.raises(ValueError, match="NULL"):
        read_metadata(meta)


@pytest.mark.parametrize("code, bits", [(0, 0), (1, 7), (2, 8), (3, 32), (4, 32), (9, 32)])
def test_metadata_with_a_type_halide_has_not_is_refused(code, bits):
    """fuzz/corpus/metadata/regression-type-with-no-bits: a scalar argument of type code 0 with
    0 bits was a raw AttributeError (no field ``i0`` in halide_scalar_value_t) out of
    shim.load."""
    meta, _keep, _array = _metadata(arguments=[(b"k", 0, 0, code, bits)])
    meta.arguments[0].scalar_def = _value = ffi.new("struct halide_scalar_value_t *")
    with pytest.raises(ValueError, match=f"type code {code} with {bits} bits"):
        read_metadata(meta)


def test_every_type_halide_makes_is_read():
    types = [(0, 8), (0, 16), (0, 32), (0, 64), (1, 1), (1, 8), (1, 16), (1, 32), (1, 64),
             (2, 16), (2, 32), (2, 64), (3, 64), (4, 16)]
    meta, _keep, _array = _metadata(arguments=[(f"a{i}".encode(), 0, 0, code, bits)
                                               for i, (code, bits) in enumerate(types)])
    assert [(a.type.code, a.type.bits) for a in read_metadata(meta).arguments] == types


def test_a_shape_with_a_negative_extent_is_an_argument_error():
    """fuzz/corpus/metadata/regression-negative-estimated-extent: an output left out, sized
    from estimates whose extent is negative, was numpy's raw ValueError ("negative dimensions
    are not allowed") out of the call."""
    with pytest.raises(shim.ArgumentError, match="output: shape \\(2, -1\\) has a negative extent"):
        zeroed((2, -1), np.dtype(np.float32), "output")
    assert zeroed((2, 0), np.dtype(np.float32), "output").shape == (2, 0)
