"""halide_buffer_copy between host memories, served in C (native_stubs/devices/host_copy.c),
against the Python core's copy (shim/core/runtime.py buffer_copy) and a numpy model.

Random sequences of copies between views of two memories (any number of dimensions, 0-d too;
negative, zero and interleaved strides; mins and dimension counts that differ; views of one
memory that overlap each other, the source being the destination too) run three times side by
side: through ``lib.halide_buffer_copy``, which serves what it can in C; through
``lib.shim_py_buffer_copy``, the Python core's entry point that device_generic.c calls for the
rest (calling it from Python takes the Python path whatever the buffers are); and through a
model that copies each element of the overlap box as numpy fancy indexing reads and writes
it. After each step the memories' bytes, the views' flags and the return codes must agree, and
a profile must count the copy as served in C exactly where the destination's elements are laid
out apart from each other (the layouts real buffers have); the rest must reach Python.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shim
from shim.core.bridge import runtime_call
from shim.native import ffi, lib

HOST_DIRTY = lib.halide_buffer_flag_host_dirty
DEVICE_DIRTY = lib.halide_buffer_flag_device_dirty
MEMORY_BYTES = 4096
MEMORIES = 2
TYPES = [(lib.halide_type_uint, 8), (lib.halide_type_int, 16), (lib.halide_type_int, 32),
         (lib.halide_type_float, 64)]


def served_count() -> int:
    return lib.shim_profile_count(lib.SHIM_FN_BUFFER_COPY, lib.SHIM_OUTCOME_SERVED)


# --- views: (memory, byte offset of the min element, type, ((min, extent, stride), ...)) -------

@st.composite
def views(draw, common):
    """A view; mostly of the element type ``common``, so that most copies are between equal
    element sizes."""
    code, bits = common if draw(st.integers(0, 4)) else draw(st.sampled_from(TYPES))
    elem = bits // 8
    dims = []
    elements = 1
    for _ in range(draw(st.integers(0, 8))):
        extent = draw(st.sampled_from([1, 1, 2, 2, 3, 4, 0]) if elements < 64 else st.just(1))
        elements *= max(extent, 1)
        dims.append((draw(st.integers(-3, 3)), extent, draw(st.integers(-12, 12))))
    lo = sum(min(0, (e - 1) * s) for _, e, s in dims if e > 0)
    hi = sum(max(0, (e - 1) * s) for _, e, s in dims if e > 0) + 1
    start = draw(st.integers(-lo, MEMORY_BYTES // elem - hi)) * elem
    return draw(st.integers(0, MEMORIES - 1)), start, (code, bits), tuple(dims)


class World:
    """The memories and bare halide_buffer_t structs (as generated code makes them: no family)
    of one side of the comparison."""

    def __init__(self, initial: np.ndarray, pool, flags):
        self.memories = initial.copy()
        self.structs = []
        self.keep = []
        for (memory, start, (code, bits), dims), bits_set in zip(pool, flags):
            raw = ffi.new("halide_buffer_t *")
            shape = ffi.new("halide_dimension_t[]", max(len(dims), 1))
            for i, (lo, extent, stride) in enumerate(dims):
                shape[i].min, shape[i].extent, shape[i].stride = lo, extent, stride
            raw.host = ffi.cast("uint8_t *", self.memories[memory].ctypes.data + start)
            raw.type.code, raw.type.bits, raw.type.lanes = code, bits, 1
            raw.dimensions, raw.dim, raw.flags = len(dims), shape, bits_set
            self.structs.append(raw)
            self.keep.append(shape)

    def flags(self) -> list[int]:
        return [int(raw.flags) for raw in self.structs]


def overlap(src_dims, dst_dims):
    """overlap_plan's box over the dimensions both have, or None."""
    box = []
    for (s_min, s_ext, _), (d_min, d_ext, _) in zip(src_dims, dst_dims):
        lo, hi = max(s_min, d_min), min(s_min + s_ext, d_min + d_ext)
        if hi <= lo:
            return None
        box.append((lo, hi - lo))
    return box


def offsets(box, view) -> np.ndarray:
    """The byte offsets, from the memory's start, of ``view``'s elements in ``box``, in one
    order for every view (C order over the box's dimensions)."""
    _, start, (_, bits), dims = view
    elem = bits // 8
    grids = np.indices([extent for _, extent in box], dtype=np.int64)
    at = np.full(grids.shape[1:], start, np.int64)
    for d, (lo, _) in enumerate(box):
        d_min, _, stride = dims[d]
        at += (grids[d] + lo - d_min) * stride * elem
    return at.reshape(-1)


def apart(addresses: np.ndarray, elem: int, nested_dims) -> tuple[bool, bool]:
    """(whether no two elements share a byte, whether they are laid out as real buffers are:
    by increasing stride magnitude, each step clearing what the dimensions inside reach)."""
    starts = np.sort(addresses)
    distinct = bool(np.all(np.diff(starts) >= elem))
    reach, nested = elem, True
    for extent, step in sorted(((e, abs(s) * elem) for e, s in nested_dims if e > 1),
                               key=lambda d: d[1]):
        nested &= step >= reach
        reach += (extent - 1) * step
    return distinct, nested


def model_copy(memories: np.ndarray, pool, src_i, dst_i, flags) -> tuple[int, bool, bool]:
    """The copy done on ``memories`` and ``flags`` as the model sees it: (the expected result,
    whether C serves it, whether the model knows the bytes: not where the destination's
    elements overlap each other, whose last write is the implementation's order of writing)."""
    src, dst = pool[src_i], pool[dst_i]
    if src[2][1] != dst[2][1]:
        return lib.halide_error_code_device_buffer_copy_failed, False, True
    elem = src[2][1] // 8
    box = overlap(src[3], dst[3])
    served = modelled = True
    if src_i != dst_i:
        flags[dst_i] = (flags[dst_i] | HOST_DIRTY) & ~DEVICE_DIRTY
    if box is not None:
        s_at, d_at = offsets(box, src), offsets(box, dst)
        distinct, nested = apart(d_at, elem, [(e, dst[3][d][2]) for d, (_, e) in enumerate(box)])
        served = modelled = distinct and nested
        if distinct:
            flat = memories.reshape(-1)
            s_bytes = (src[0] * MEMORY_BYTES + s_at)[:, None] + np.arange(elem)
            d_bytes = (dst[0] * MEMORY_BYTES + d_at)[:, None] + np.arange(elem)
            flat[d_bytes] = flat[s_bytes].copy()  # read whole, then written: as copyto
            modelled = True
    return 0, served, modelled


@st.composite
def scenarios(draw):
    common = draw(st.sampled_from(TYPES))
    pool = draw(st.lists(views(common), min_size=1, max_size=5))
    flags = draw(st.lists(st.sampled_from([0, HOST_DIRTY, DEVICE_DIRTY, HOST_DIRTY | DEVICE_DIRTY]),
                          min_size=len(pool), max_size=len(pool)))
    steps = draw(st.lists(st.tuples(st.integers(0, len(pool) - 1), st.integers(0, len(pool) - 1)),
                          min_size=1, max_size=8))
    return pool, flags, steps, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_copies_in_c_match_the_python_core_and_numpy(scenario):
    pool, flags, steps, seed = scenario
    rng = np.random.default_rng(seed)
    initial = rng.integers(0, 256, (MEMORIES, MEMORY_BYTES), dtype=np.uint8)
    in_c, in_python = World(initial, pool, flags), World(initial, pool, flags)
    model, model_flags = initial.copy(), list(flags)
    # (in a call context: a failure's message is kept there, as in a pipeline call's)
    with shim.profile(), runtime_call("buffer_copy"):
        for src, dst in steps:
            before = served_count()
            got_c = lib.halide_buffer_copy(ffi.NULL, in_c.structs[src], ffi.NULL, in_c.structs[dst])
            served = served_count() - before
            got_python = lib.shim_py_buffer_copy(ffi.NULL, in_python.structs[src], ffi.NULL,
                                                 in_python.structs[dst])
            expected, in_c_expected, modelled = model_copy(model, pool, src, dst, model_flags)
            assert got_c == got_python == expected
            assert served == int(in_c_expected), (pool[src], pool[dst])
            np.testing.assert_array_equal(in_c.memories, in_python.memories)
            if modelled:
                np.testing.assert_array_equal(in_c.memories, model)
            else:  # (the destination's elements overlap: what the Python core wrote)
                model[:] = in_python.memories
            assert in_c.flags() == in_python.flags() == model_flags


def bare(array: np.ndarray, mins=None):
    """A bare halide_buffer_t over ``array`` (numpy's last axis is Halide's x)."""
    raw = ffi.new("halide_buffer_t *")
    dims = ffi.new("halide_dimension_t[]", max(array.ndim, 1))
    for i in range(array.ndim):
        axis = array.ndim - 1 - i
        dims[i].min = 0 if mins is None else mins[i]
        dims[i].extent = array.shape[axis]
        dims[i].stride = array.strides[axis] // array.itemsize
    raw.host = ffi.cast("uint8_t *", array.ctypes.data)
    shim.HalideType.from_dtype(array.dtype).to_c(raw.type)
    raw.dimensions, raw.dim = array.ndim, dims
    return raw, dims


def test_a_host_copy_between_a_pipelines_own_buffers_stays_in_c():
    """A profile counts the copy as served in C and records no Python call for it."""
    src_array = np.arange(64, dtype=np.int32).reshape(8, 8)
    dst_array = np.zeros((4, 8), np.int32)
    (src, _s), (dst, _d) = bare(src_array), bare(dst_array, mins=(0, 2))
    with shim.profile() as prof:
        assert lib.halide_buffer_copy(ffi.NULL, src, ffi.NULL, dst) == 0
    assert prof.decided_in_c["buffer_copy"]["served"] == 1
    assert prof.calls("buffer_copy") == [] and prof.count("buffer_copy") == 1
    np.testing.assert_array_equal(dst_array, src_array[2:6])
    assert dst.flags == HOST_DIRTY
    row = next(line.split() for line in prof.summary().splitlines()
               if line.startswith("buffer_copy "))
    assert row[1:5] == ["1", "0", "0", "1"]  # calls, no-ops, foreign, served


@pytest.mark.parametrize("which", ["src", "dst"])
def test_a_shim_buffer_is_copied_by_the_python_core(which):
    """A shim.Buffer belongs to a family the Python core locks (shared with its crops, possibly
    abandoned at a fork): its copies are not served in C."""
    buf = shim.Buffer(np.arange(16, dtype=np.int32).reshape(4, 4))
    other_array = np.zeros((4, 4), np.int32)
    other, _dims = bare(other_array)
    src, dst = (buf.raw, other) if which == "src" else (other, buf.raw)
    with shim.profile() as prof:
        assert lib.halide_buffer_copy(ffi.NULL, src, ffi.NULL, dst) == 0
    assert "buffer_copy" not in prof.decided_in_c and len(prof.calls("buffer_copy")) == 1
