"""Crops, slices, releases and syncs of a pipeline's own buffers served in C
(native_stubs/devices/served.c), against the Python core (shim/core/runtime.py) and numpy.

A served allocation is a bare halide_buffer_t's (no shim.Buffer, no family in Python) whose
device memory served.c made. Random sequences of malloc / crop / slice / release_crop / sync /
copies / free run on such structs twice side by side: through the generic ``lib.halide_*``
entry points, which serve what they can in C; and through the Python core's callbacks
(``lib.shim_py_*``, which device_generic.c calls for the rest: called from Python they take the
Python path whatever the buffers are). Every struct's host view is of one numpy memory per
world, as generated code's crops share their parent's host memory. After each step the return
codes, flags, whether each struct holds a device handle and the host bytes must agree between
the worlds and with a numpy model of the device's bytes; at the end every handle is gone and
the allocation back in the pool, in both worlds.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shim
from shim.memory import families
from shim.native import ffi, lib

H, W = 6, 40  # int32 rows of 160 bytes: crops at misaligned, zero and (x 0, y 4) aligned offsets
HOST_DIRTY = lib.halide_buffer_flag_host_dirty
DEVICE_DIRTY = lib.halide_buffer_flag_device_dirty
BACKENDS = {"opencl": lib.SHIM_BACKEND_OPENCL, "vulkan": lib.SHIM_BACKEND_VULKAN}


@pytest.fixture(params=sorted(BACKENDS))
def device(request):
    """Each backend whose native side serves allocations, through its fixture (which skips,
    saying why, where this machine has none)."""
    request.getfixturevalue(request.param)
    lib.shim_serve_allocations(BACKENDS[request.param], True)
    yield request.param
    lib.shim_serve_allocations(BACKENDS[request.param], True)


def interface_of(name: str):
    return getattr(lib, f"halide_{name}_device_interface")()


def served_count(function) -> int:
    return lib.shim_profile_count(function, lib.SHIM_OUTCOME_SERVED)


class World:
    """One side: a parent struct over ``memory`` (H x W int32) and the crops made of it."""

    def __init__(self, name: str, python: bool):
        self.name, self.python, self.interface = name, python, interface_of(name)
        self.memory = np.zeros((H, W), np.int32)
        self.structs, self.keep = [], []
        self.parent = self.new_struct(2, 0, [(0, W, 1), (0, H, W)])
        self.live = [self.parent]  # structs that may hold a device handle

    def new_struct(self, dims, start, shape):
        raw = ffi.new("halide_buffer_t *")
        dim = ffi.new("halide_dimension_t[]", max(dims, 1))
        for i, (lo, extent, stride) in enumerate(shape):
            dim[i].min, dim[i].extent, dim[i].stride = lo, extent, stride
        raw.host = ffi.cast("uint8_t *", self.memory.ctypes.data + 4 * start)
        raw.type.code, raw.type.bits, raw.type.lanes = lib.halide_type_int, 32, 1
        raw.dimensions, raw.dim = dims, dim
        self.keep.append(dim)
        self.structs.append(raw)
        return raw

    def malloc(self):
        if self.python:
            return lib.shim_py_device_malloc(ffi.NULL, self.parent, self.interface)
        return lib.halide_device_malloc(ffi.NULL, self.parent, self.interface)

    def crop(self, src, box):
        """box: ((x min, x extent), (y min, y extent)) within ``src``'s."""
        (x, w), (y, h) = box
        dst = self.new_struct(2, y * W + x, [(x, w, 1), (y, h, W)])
        if self.python:
            code = lib.shim_py_device_crop(ffi.NULL, src, dst, self.interface)
        else:
            code = lib.halide_device_crop(ffi.NULL, src, dst)
        self.live.append(dst)
        return code

    def slice(self, src, row, x, w):
        dst = self.new_struct(1, row * W + x, [(x, w, 1)])
        if self.python:
            code = lib.shim_py_device_slice(ffi.NULL, src, 1, row, dst, self.interface)
        else:
            code = lib.halide_device_slice(ffi.NULL, src, 1, row, dst)
        self.live.append(dst)
        return code

    def release(self, raw):
        if self.python:
            return lib.shim_py_device_release_crop(ffi.NULL, raw, self.interface)
        return lib.halide_device_release_crop(ffi.NULL, raw)

    def sync(self, raw):
        if self.python:
            return lib.shim_py_device_sync(ffi.NULL, raw, self.interface)
        return lib.halide_device_sync(ffi.NULL, raw)

    def free(self):
        if self.python:
            return lib.shim_py_device_free(ffi.NULL, self.parent, self.interface)
        return lib.halide_device_free(ffi.NULL, self.parent)

    def handle(self, raw):
        """What a launch binds for a struct's handle: its byte offset, and for OpenCL whether
        kernels get memory of their own (a sub-buffer or the allocation) or the offset."""
        if raw.device == 0:
            return None
        if self.name == "opencl":
            handle = ffi.cast("shim_cl_handle *", raw.device)
            return int(handle.offset), handle.launch_mem == ffi.NULL
        return int(ffi.cast("shim_vk_handle *", raw.device).offset)

    def state(self):
        return ([int(raw.flags) for raw in self.structs],
                [self.handle(raw) for raw in self.structs], self.memory.tobytes())


boxes = st.tuples(st.integers(0, W - 1), st.integers(0, H - 1)).flatmap(
    lambda xy: st.tuples(st.tuples(st.just(xy[0]), st.integers(1, W - xy[0])),
                         st.tuples(st.just(xy[1]), st.integers(1, H - xy[1]))))
steps = st.lists(st.one_of(
    st.tuples(st.just("crop"), st.integers(0, 7), boxes),
    st.tuples(st.just("slice"), st.integers(0, 7), st.integers(0, H - 1),
              st.integers(0, W - 1), st.integers(1, W)),
    st.tuples(st.just("release"), st.integers(0, 7)),
    st.tuples(st.just("sync"), st.integers(0, 7)),
    st.tuples(st.just("write"), st.integers(0, 7), st.integers(1, 1 << 20)),
    st.tuples(st.just("read"), st.integers(0, 7)),
    st.tuples(st.just("free")),
), max_size=14)


def views(world, raw):
    """The numpy view of ``world.memory`` a struct has (its own elements)."""
    x0, w = raw.dim[0].min, raw.dim[0].extent
    offset = (int(ffi.cast("uintptr_t", raw.host)) - world.memory.ctypes.data) // 4
    row, col = divmod(offset, W)
    h = raw.dim[1].extent if raw.dimensions == 2 else 1
    return (slice(row, row + h), slice(col, col + w))


def run_step(world, step, device_model):
    """One step on ``world``; (the code, the model's expected code or None)."""
    kind = step[0]
    live = [raw for raw in world.live if raw.device != 0]
    if kind == "free":
        return world.free()
    if not live:
        return None
    raw = live[step[1] % len(live)]
    if kind == "crop":
        (x, w), (y, h) = step[2]
        if raw.dimensions != 2:
            return None
        rows, cols = views(world, raw)
        x = min(max(x, cols.start), cols.stop - 1)
        y = min(max(y, rows.start), rows.stop - 1)
        w, h = min(w, cols.stop - x), min(h, rows.stop - y)
        return world.crop(raw, ((x, w), (y, h)))
    if kind == "slice":
        _, _, row, x, w = step
        if raw.dimensions != 2:
            return None
        rows, cols = views(world, raw)
        row = min(max(row, rows.start), rows.stop - 1)
        x = min(max(x, cols.start), cols.stop - 1)
        return world.slice(raw, row, x, min(w, cols.stop - x))
    if kind == "release":
        if raw is world.parent:
            return None
        return world.release(raw)
    if kind == "sync":
        return world.sync(raw)
    if kind == "write":  # new host values, uploaded
        world.memory[views(world, raw)] = step[2]
        raw.flags = HOST_DIRTY
        code = lib.halide_copy_to_device(ffi.NULL, raw, world.interface)
        if device_model is not None and code == 0:
            device_model[views(world, raw)] = step[2]
        return code
    if kind == "read":  # host values lost, downloaded again
        world.memory[views(world, raw)] = -1
        raw.flags = DEVICE_DIRTY
        code = lib.halide_copy_to_host(ffi.NULL, raw)
        if device_model is not None and code == 0:
            assert (world.memory[views(world, raw)] == device_model[views(world, raw)]).all()
        return code
    raise AssertionError(kind)


def finish(world):
    """Release every crop, free the parent: all codes."""
    codes = [world.release(raw) for raw in world.live[1:] if raw.device != 0]
    if world.parent.device != 0:
        codes.append(world.free())
    return codes


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=steps)
def test_crops_of_served_allocations_behave_as_the_python_cores(device, steps):
    """The model: both worlds agree on every code, flag, handle and byte, and their device
    bytes are numpy's."""
    before = families.live_counts()
    in_c, in_python = World(device, False), World(device, True)
    model = np.zeros((H, W), np.int32)
    assert in_c.malloc() == in_python.malloc() == 0
    for world in (in_c, in_python):  # the device's bytes known: zeros
        world.parent.flags = HOST_DIRTY
        assert lib.halide_copy_to_device(ffi.NULL, world.parent, world.interface) == 0
    for step in steps:
        got = run_step(in_c, step, model)
        expected = run_step(in_python, step, None)
        assert got == expected, step
        assert in_c.state() == in_python.state(), step
    assert finish(in_c) == finish(in_python)
    assert in_c.state() == in_python.state()
    assert families.live_counts() == before


def test_crops_and_syncs_stay_in_c(device):
    """While profiling (an allocation served before), a crop, a slice of it, their releases
    and a sync are counted as served in C; freeing the parent with none left is served too."""
    world = World(device, False)
    assert world.malloc() == 0
    before = families.live_counts()
    with shim.profile():  # (which starts the counts afresh)
        start = {f: served_count(f) for f in (lib.SHIM_FN_DEVICE_CROP, lib.SHIM_FN_DEVICE_SLICE,
                                               lib.SHIM_FN_DEVICE_RELEASE_CROP,
                                               lib.SHIM_FN_DEVICE_SYNC)}
        assert world.crop(world.parent, ((3, 17), (1, 4))) == 0
        assert world.slice(world.live[1], 2, 5, 7) == 0
        assert lib.halide_device_sync(ffi.NULL, world.live[2]) == 0
        assert world.release(world.live[2]) == 0
        assert world.release(world.live[1]) == 0
        counts = {f: served_count(f) - n for f, n in start.items()}
    assert counts == {lib.SHIM_FN_DEVICE_CROP: 1, lib.SHIM_FN_DEVICE_SLICE: 1,
                      lib.SHIM_FN_DEVICE_RELEASE_CROP: 2, lib.SHIM_FN_DEVICE_SYNC: 1}
    assert families.live_counts() == before  # no family was made
    assert lib.shim_served_live(BACKENDS[device], ffi.new("int64_t *")) >= 1
    assert world.free() == 0


def test_freeing_the_parent_while_crops_live_keeps_their_memory(device):
    """The parent freed before its crops are released: as the Python core does it (it takes
    the allocation over), the crops' handles and bytes stay valid until released, and then
    the memory goes; the same in both worlds."""
    results = []
    for python in (False, True):
        world = World(device, python)
        world.memory[:] = np.arange(H * W, dtype=np.int32).reshape(H, W)
        world.parent.flags = HOST_DIRTY
        assert world.malloc() == 0
        assert lib.halide_copy_to_device(ffi.NULL, world.parent, world.interface) == 0
        assert world.crop(world.parent, ((5, 9), (2, 3))) == 0
        crop = world.live[1]
        assert world.free() == 0
        assert world.parent.device == 0 and crop.device != 0
        world.memory[:] = 0
        crop.flags = DEVICE_DIRTY
        assert lib.halide_copy_to_host(ffi.NULL, crop) == 0
        assert world.release(crop) == 0
        results.append(world.state())
    assert results[0] == results[1]
    expected = np.zeros((H, W), np.int32)
    expected[2:5, 5:14] = np.arange(H * W, dtype=np.int32).reshape(H, W)[2:5, 5:14]
    np.testing.assert_array_equal(np.frombuffer(results[0][2], np.int32).reshape(H, W), expected)


def test_an_aligned_crop_gets_a_sub_buffer_of_its_span_in_c(opencl):
    """On OpenCL a crop at a nonzero offset aligned to the device's base address alignment is
    made in C with a sub-buffer (what kernels get) starting at the crop and covering its span,
    whose bytes are the parent's there; releasing it releases the sub-buffer, and the parent
    then goes back to the pool in C."""
    import pyopencl as cl

    device = opencl
    row = next(y for y in range(1, H) if (y * W * 4) % device.alignment == 0)
    world = World("opencl", False)
    world.memory[:] = np.arange(H * W, dtype=np.int32).reshape(H, W)
    world.parent.flags = HOST_DIRTY
    assert world.malloc() == 0
    assert lib.halide_copy_to_device(ffi.NULL, world.parent, world.interface) == 0
    with shim.profile():
        crops = served_count(lib.SHIM_FN_DEVICE_CROP)
        assert world.crop(world.parent, ((0, 8), (row, H - row))) == 0
        assert served_count(lib.SHIM_FN_DEVICE_CROP) == crops + 1
    crop = world.live[1]
    handle = ffi.cast("shim_cl_handle *", crop.device)
    assert handle.offset == row * W * 4 and handle.launch_mem != ffi.NULL
    assert handle.launch_mem != handle.mem
    sub = cl.MemoryObject.from_int_ptr(int(ffi.cast("uintptr_t", handle.launch_mem)), retain=True)
    assert sub.offset == row * W * 4
    span = ((H - row - 1) * W + 8) * 4
    assert sub.size == span
    got = np.empty(span // 4, np.int32)
    cl.enqueue_copy(device.queue, got, sub)
    np.testing.assert_array_equal(got, world.memory.ravel()[row * W:row * W + span // 4])
    sub.release()
    assert world.release(crop) == 0
    assert world.free() == 0 and world.parent.device == 0
