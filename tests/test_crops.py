"""Crops and slices that alias their parent on the device, and dirty bits that reach the
parent (Halide issue 8395, seeds/halide-crop-on-gpu.txt)."""

import gc
import threading

import numpy as np
import pytest

import shim
from gpu_cases import build_libraries
from shim.pipelines.build import RUNTIMES, Build, build_all
from shim.native import ffi, lib

HOST_DIRTY = lib.halide_buffer_flag_host_dirty
DEVICE_DIRTY = lib.halide_buffer_flag_device_dirty


@pytest.fixture(scope="module")
def libraries():
    specs = [Build(name, target, runtime) for name in ("crop_fill", "plane_fill", "plane_sum", "brighten")
             for target in ("host", "opencl") for runtime in RUNTIMES]
    paths = build_all(specs, progress=None)
    return {(s.name, s.target, s.runtime): path for s, path in paths.items()}


@pytest.fixture
def host_device():
    device = shim.device("host")
    device.clear_faults()
    gc.collect()
    before = device.live_allocations
    yield device
    gc.collect()
    assert device.live_allocations == before, "device memory leaked"


def fill(xs, ys, param):
    return xs * 100 + ys + param * 10000


def run_seed(crop_fill):
    """The seed's program: two realizations into crops of one buffer, with no device_malloc
    beforehand. (The buffer, its host array.)"""
    data = np.full((20, 20), -1, np.int32)
    buf = shim.Buffer(data)
    crop_fill(param=1, f=buf.cropped([(2, 8), (4, 4)]))
    crop_fill(param=2, f=buf.cropped([(0, 1), (2, 8)]))
    return buf, data


def seed_expected():
    """The seed's buffer after its two realizations: -1 outside the crops."""
    ys, xs = np.mgrid[0:20, 0:20]
    expected = np.full((20, 20), -1, np.int32)
    expected[4:8, 2:10] = fill(xs, ys, 1)[4:8, 2:10]
    expected[2:10, 0:1] = fill(xs, ys, 2)[2:10, 0:1]
    return expected


# --- crops and slices as views -------------------------------------------------------------

def test_crops_and_slices_share_memory_in_halide_coordinates():
    data = np.arange(6 * 8 * 3, dtype=np.int16).reshape(3, 6, 8)  # c, y, x
    buf = shim.Buffer(data)
    crop = buf.cropped([(2, 4), (1, 3)])  # x in [2, 6), y in [1, 4), all channels
    assert crop.shape == (3, 3, 4)
    assert [tuple(crop.dim(i))[:2] for i in range(3)] == [(2, 4), (1, 3), (0, 3)]
    assert np.shares_memory(crop.numpy(), data)
    np.testing.assert_array_equal(crop.numpy(), data[:, 1:4, 2:6])
    deeper = crop.cropped(0, 3, 2)  # a crop of a crop: x in [3, 5)
    np.testing.assert_array_equal(deeper.numpy(), data[:, 1:4, 3:5])
    plane = deeper.sliced(2, 1)  # a slice of a crop: channel 1
    assert plane.dimensions() == 2 and [tuple(plane.dim(i))[:2] for i in range(2)] == [(3, 2), (1, 3)]
    np.testing.assert_array_equal(plane.numpy(), data[1, 1:4, 3:5])
    plane.numpy()[:] = -9  # one memory: the parent sees it
    assert np.all(data[1, 1:4, 3:5] == -9)


def test_crops_outside_the_buffer_are_refused():
    buf = shim.Buffer(np.zeros((4, 4), np.uint8))
    with pytest.raises(shim.ArgumentError, match=r"\[3, 6\) is not inside \[0, 4\)"):
        buf.cropped(0, 3, 3)
    with pytest.raises(shim.ArgumentError, match="outside dimension 1"):
        buf.sliced(1, 4)
    with pytest.raises(shim.ArgumentError, match="dimension index"):
        buf.cropped(2, 0, 1)


def test_a_crop_of_a_parent_without_device_memory_carries_the_proxy(host_device):
    buf = shim.Buffer(np.zeros((8, 8), np.float32))
    crop = buf.cropped([(1, 4), (2, 4)])
    proxy = lib.shim_backend_interface(lib.SHIM_BACKEND_PROXY)
    assert crop.raw.device_interface == proxy and not crop.has_device_allocation()
    crop.copy_to_device(host_device)  # first device use: the parent is allocated, whole
    assert buf.has_device_allocation() and crop.has_device_allocation()
    assert crop.raw.device == buf.raw.device + (2 * 8 + 1) * 4
    assert host_device.live_allocations >= 1


# --- the seed's programs -------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpu_libraries(gpu):
    return build_libraries(gpu.kind)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_seed_repro_on_a_gpu(gpu_libraries, gpu, runtime):
    """The seed's program as it was reported (on CUDA): no set_device_dirty afterwards."""
    buf, data = run_seed(shim.load(gpu_libraries["crop_fill", runtime]))
    assert buf.has_device_allocation()  # one allocation for the parent, which both crops alias
    downloaded = gpu.transfers.downloaded
    buf.copy_to_host()
    np.testing.assert_array_equal(data, seed_expected())
    # Only what the crops wrote came back: (8*4 + 1*8) int32 elements, not the 20*20.
    assert gpu.transfers.downloaded - downloaded == (8 * 4 + 1 * 8) * 4


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_seed_repro_on_the_host_device(libraries, host_device, runtime):
    buf, data = run_seed(shim.load(libraries["crop_fill", "host", runtime]))
    buf.copy_to_host()
    np.testing.assert_array_equal(data, seed_expected())
    buf.copy_to_device(host_device)  # and the device copy agrees
    np.testing.assert_array_equal(device_view(buf), seed_expected())


def device_view(buf):
    """A copy of what the host device holds for ``buf`` (its handle is the address of its min
    element in device memory, with the buffer's strides)."""
    array = buf._array
    span = sum((n - 1) * s for n, s in zip(array.shape, array.strides)) + array.itemsize
    memory = shim.native.regions.host_memory(buf.raw.device, span)
    return np.lib.stride_tricks.as_strided(memory.view(array.dtype), array.shape, array.strides).copy()


def write_on_device(buf, value):
    """What a kernel does to ``buf`` on the host device: new values in device memory only."""
    array = buf._array
    span = sum((n - 1) * s for n, s in zip(array.shape, array.strides)) + array.itemsize
    memory = shim.native.regions.host_memory(buf.raw.device, span)
    view = np.lib.stride_tricks.as_strided(memory.view(array.dtype), array.shape, array.strides)
    view[...] = value
    buf.set_device_dirty()


def test_device_writes_through_crops_reach_the_parent(host_device):
    data = np.zeros((10, 12), np.int32)
    parent = shim.Buffer(data)
    left, right = parent.cropped(0, 0, 3), parent.cropped([(8, 4), (5, 5)])
    left.copy_to_device(host_device)
    right.copy_to_device(host_device)
    write_on_device(left, 7)
    write_on_device(right, 9)
    assert parent.device_dirty()  # the crops' bits reached the parent
    downloaded = host_device.transfers.downloaded
    np.testing.assert_array_equal(parent.numpy()[:, :3], 7)  # a host read brings them back
    assert host_device.transfers.downloaded - downloaded == (3 * 10 + 4 * 5) * 4
    expected = np.zeros((10, 12), np.int32)
    expected[:, :3] = 7
    expected[5:, 8:] = 9
    np.testing.assert_array_equal(data, expected)
    assert not (parent.device_dirty() or left.device_dirty() or right.device_dirty())


def test_a_buffer_copy_into_a_crop_reaches_the_parent(host_device):
    """halide_buffer_copy into a crop outside any call (Buffer.copy_into, or a program calling
    the runtime) marks the crop's box newer on that side for the whole family: the parent's
    host read used to miss the copy, its device-dirty bit never set."""
    parent = shim.Buffer(np.zeros((6, 8), np.int32))
    parent.copy_to_device(host_device)
    crop = parent.cropped([(2, 4), (1, 3)])
    source = shim.Buffer(np.full((3, 4), 5, np.int32), mins=[2, 1])
    source.copy_to_device(host_device)
    copied = host_device.transfers.device_copied
    source.copy_into(crop, host_device, "a test's copy")
    assert host_device.transfers.device_copied - copied == 3 * 4 * 4  # device to device
    assert parent.device_dirty() and crop.device_dirty()
    expected = np.zeros((6, 8), np.int32)
    expected[1:4, 2:6] = 5
    np.testing.assert_array_equal(parent.numpy(), expected)
    # Into the host memory of a crop while the device holds the family's newest data.
    other = parent.cropped([(0, 2), (0, 6)])
    write_on_device(parent, 1)
    shim.Buffer(np.full((6, 2), 9, np.int32)).copy_into(other, None, "a test's copy")
    assert other.host_dirty() and not other.device_dirty()
    expected = np.ones((6, 8), np.int32)
    expected[:, :2] = 9
    np.testing.assert_array_equal(parent.numpy(), expected)


def test_a_family_nobody_can_see_keeps_its_device_data_on_the_device(opencl):
    """A Buffer over a pyopencl Array's memory (its host memory the shim's own staging),
    cropped, and dropped with the crop: the data stays in the Array. The last member's drop
    used to download the whole family into staging nobody can read."""
    cla = pytest.importorskip("pyopencl.array")
    array = cla.to_device(opencl.queue, np.arange(48, dtype=np.int32).reshape(6, 8))
    parent = shim.from_pyopencl(array)
    crop = parent.cropped([(2, 4), (1, 3)])
    assert crop.device_dirty()
    downloaded = opencl.transfers.downloaded
    del parent, crop
    gc.collect()
    assert opencl.transfers.downloaded == downloaded
    np.testing.assert_array_equal(array.get(), np.arange(48).reshape(6, 8))


def test_a_family_whose_host_memory_was_seen_brings_device_data_home(opencl):
    """The same family, where a crop's host memory was read (and is still held): device
    results written after it reach that memory when the last member goes."""
    cla = pytest.importorskip("pyopencl.array")
    parent = shim.from_pyopencl(cla.zeros(opencl.queue, (6, 8), np.int32))
    crop = parent.cropped([(2, 4), (1, 3)])
    seen = crop.numpy()  # (downloads the crop's zeros; this memory is now the caller's)
    source = shim.Buffer(np.full((3, 4), 7, np.int32), mins=[2, 1])
    source.copy_to_device(opencl)
    source.copy_into(crop, opencl, "a test's copy")
    del parent, crop
    gc.collect()
    np.testing.assert_array_equal(seen, 7)


def test_many_crops_written_in_turn(libraries, host_device):
    """A member remembers what calls do to its family's regions, state by state (Member in
    shim/memory/families.py); writing 80 crops in turn takes the family through more states than a
    member keeps, so it forgets them and works them out again, and the results stay right."""
    crop_fill = shim.load(libraries["crop_fill", "host", "no_runtime"])
    data = np.full((4, 80), -1, np.int32)
    parent = shim.Buffer(data)
    parent.copy_to_device(host_device)
    columns = [parent.cropped(0, x, 1) for x in range(80)]
    ys, xs = np.mgrid[0:4, 0:80]
    for param in (1, 2):
        for column in columns:
            crop_fill(param=param, f=column)
            assert column.host_dirty() and parent.host_dirty() and not parent.device_dirty()
        assert all(column.host_dirty() for column in columns)
        parent.copy_to_device()  # every column's results go up, and every bit clears
        assert not parent.host_dirty() and not any(column.host_dirty() for column in columns)
        np.testing.assert_array_equal(device_view(parent), fill(xs, ys, param))
    members = parent.family.members.values()
    assert max(len(member._known) for member in members) <= shim.memory.families._REMEMBERED_STATES


def test_a_host_dirty_parent_is_uploaded_before_a_crop_is_used(libraries, opencl):
    brighten = shim.load(libraries["brighten", "opencl", "no_runtime"])
    data = np.ones((8, 8), np.float32)
    parent = shim.Buffer(data)
    crop = parent.cropped([(2, 4), (2, 4)])
    # The output covers the same coordinates as the crop (Halide coordinates, min 2).
    out = shim.Buffer(shape=(8, 8), dtype=np.float32).cropped([(2, 4), (2, 4)])
    brighten(crop, scale=1.0, offset=0.0, output=out)  # puts the family on the device
    data[:] = 5  # the host changes, and says so on the parent, not the crop
    parent.set_host_dirty()
    assert crop.host_dirty()
    brighten(crop, scale=2.0, offset=0.0, output=out)
    np.testing.assert_array_equal(out.numpy(), 10)  # computed on the new data


def test_overlapping_sibling_crops_keep_the_last_write(libraries, opencl):
    crop_fill = shim.load(libraries["crop_fill", "opencl", "no_runtime"])
    data = np.full((4, 16), -1, np.int32)
    parent = shim.Buffer(data)
    crop_fill(param=1, f=parent.cropped(0, 0, 10))
    crop_fill(param=2, f=parent.cropped(0, 6, 10))
    parent.copy_to_host()
    ys, xs = np.mgrid[0:4, 0:16]
    np.testing.assert_array_equal(data[:, :6], fill(xs, ys, 1)[:, :6])
    np.testing.assert_array_equal(data[:, 6:], fill(xs, ys, 2)[:, 6:])


def test_a_dirty_crop_that_holds_the_last_handle_brings_its_data_home(libraries, opencl):
    crop_fill = shim.load(libraries["crop_fill", "opencl", "no_runtime"])
    data = np.full((6, 6), -1, np.int32)
    parent = shim.Buffer(data)
    crop = parent.cropped([(1, 3), (1, 3)])
    crop_fill(param=4, f=crop)
    parent.device_free()  # the crop still holds the allocation
    assert not parent.has_device_allocation() and crop.has_device_allocation()
    live = opencl.live_allocations
    del crop  # the last handle: what only the device held comes home first
    gc.collect()
    assert opencl.live_allocations == live - 1
    ys, xs = np.mgrid[0:6, 0:6]
    np.testing.assert_array_equal(data[1:4, 1:4], fill(xs, ys, 4)[1:4, 1:4])
    assert np.all(data[0] == -1)


def test_device_release_crop_of_a_dirty_crop_keeps_its_data(host_device):
    data = np.zeros((6, 6), np.int16)
    parent = shim.Buffer(data)
    crop = parent.cropped([(0, 2), (0, 2)])
    crop.copy_to_device(host_device)
    write_on_device(crop, 3)
    lib.shim_flags_assign(crop.raw, DEVICE_DIRTY, True)  # as generated code would leave it
    with shim.core.bridge.runtime_call("release crop") as check:
        check(lib.halide_device_release_crop(ffi.NULL, crop.raw))
    parent.copy_to_host()
    np.testing.assert_array_equal(data[:2, :2], 3)


def test_crops_made_by_native_code_for_an_extern_stage(host_device):
    """What a pipeline's extern stage does: _halide_buffer_crop copies the parent's struct and
    calls device_crop, the stage writes the crop on the device, and
    _halide_buffer_retire_crop_after_extern_stage marks the parent and releases the crop."""
    data = np.zeros((4, 8), np.int32)
    parent = shim.Buffer(data)
    parent.copy_to_device(host_device)
    crop = ffi.new("halide_buffer_t *")
    crop[0] = parent.raw[0]  # *dst = *src, flags and all
    dims = ffi.new("halide_dimension_t[2]", [(4, 4, 1, 0), (1, 2, 8, 0)])
    crop.dim, crop.device, crop.device_interface = dims, 0, ffi.NULL
    crop.host = ffi.cast("uint8_t *", data[1:, 4:].ctypes.data)
    interface = parent.raw.device_interface
    assert interface.device_crop(ffi.NULL, parent.raw, crop) == 0
    device = np.frombuffer(ffi.buffer(ffi.cast("int32_t *", crop.device), 12 * 4), np.int32)
    device[0:4], device[8:12] = 5, 6  # the stage writes rows y = 1 and 2 of the crop
    lib.shim_flags_assign(crop, DEVICE_DIRTY, True)
    lib.shim_flags_assign(parent.raw, DEVICE_DIRTY, True)  # the retire helper's inline write
    assert interface.device_release_crop(ffi.NULL, crop) == 0
    parent.copy_to_host()
    np.testing.assert_array_equal(data[1, 4:], 5)
    np.testing.assert_array_equal(data[2, 4:], 6)
    assert np.all(data[0] == 0) and np.all(data[3] == 0)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_planar_ycocg_use_case(libraries, opencl, runtime):
    plane_fill = shim.load(libraries["plane_fill", "opencl", runtime])
    plane_sum = shim.load(libraries["plane_sum", "opencl", runtime])
    denoised = shim.Buffer(shape=(3, 12, 16), dtype=np.int32)  # planar: c, y, x
    plane_fill(param=1, f=denoised.cropped(2, 0, 1))  # Y
    plane_fill(param=2, f=denoised.cropped(2, 1, 2))  # Co, Cg
    ys, xs = np.mgrid[0:12, 0:16]
    expected = np.stack([fill(xs, ys, 1), fill(xs, ys, 2) + 10, fill(xs, ys, 2) + 20])
    np.testing.assert_array_equal(denoised.numpy(), expected)  # the whole buffer, on the host
    total = plane_sum(denoised, output=(12, 16))  # and as the input of another pipeline
    np.testing.assert_array_equal(total.numpy(), expected.sum(axis=0))


def test_two_threads_realize_into_disjoint_crops_of_one_parent(libraries, opencl):
    crop_fill = shim.load(libraries["crop_fill", "opencl", "no_runtime"])
    ys, xs = np.mgrid[0:8, 0:16]
    expected = np.where(xs < 8, fill(xs, ys, 1), fill(xs, ys, 2))
    failures = []
    for _ in range(100):
        data = np.full((8, 16), -1, np.int32)
        parent = shim.Buffer(data)
        halves = [parent.cropped(0, 0, 8), parent.cropped(0, 8, 8)]
        start = threading.Barrier(2)

        def realize(half, param):
            start.wait()
            crop_fill(param=param, f=half)

        threads = [threading.Thread(target=realize, args=(half, i + 1)) for i, half in enumerate(halves)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        parent.copy_to_host()
        if not np.array_equal(data, expected):
            failures.append(data.copy())
    assert not failures, f"{len(failures)} of 100 rounds lost a crop's results"


def test_writing_the_host_over_device_changes_is_refused(host_device):
    parent = shim.Buffer(np.zeros((4, 4), np.int32))
    crop = parent.cropped(0, 0, 2)
    crop.copy_to_device(host_device)
    write_on_device(crop, 1)
    with pytest.raises(shim.DeviceError) as e:
        parent.set_host_dirty()  # the device holds changes to the parent never copied back
    assert e.value.code == -37 and "copy_to_host" in str(e.value)
    parent.copy_to_host()
    parent.set_host_dirty()  # fine once they are home
    assert crop.host_dirty()


@pytest.mark.parametrize("kind", ["host", "opencl", "vulkan"])
def test_crops_native_code_makes_of_a_shared_familys_member(kind, request):
    """An extern stage's crop of a Buffer's crop (a member of a shared family) is no member
    itself: its release drops its handle and clears it, as Halide's does. (It raised KeyError
    inside device_release_crop, -41, and the struct kept its handle: every later crop into it
    failed.) On the host device the stage's write reaches the parent."""
    device = shim.device("host") if kind == "host" else request.getfixturevalue(kind)
    data = np.arange(48, dtype=np.int32).reshape(6, 8)
    expected = data.copy()
    parent = shim.Buffer(data)
    member = parent.cropped([(2, 6), (1, 4)])  # x in [2, 8), y in [1, 5)
    member.copy_to_device(device)
    interface = member.raw.device_interface
    crop = ffi.new("halide_buffer_t *")
    crop[0] = member.raw[0]  # *dst = *src, flags and all
    dims = ffi.new("halide_dimension_t[2]", [(4, 4, 1, 0), (2, 2, 8, 0)])  # x [4, 8), y [2, 4)
    crop.dim, crop.device, crop.device_interface = dims, 0, ffi.NULL
    crop.host = ffi.cast("uint8_t *", data[2:, 4:].ctypes.data)
    for _ in range(2):
        assert interface.device_crop(ffi.NULL, member.raw, crop) == 0 and crop.device
        assert interface.device_release_crop(ffi.NULL, crop) == 0
        assert crop.device == 0 and crop.device_interface == ffi.NULL
    if kind == "host":
        assert interface.device_crop(ffi.NULL, member.raw, crop) == 0
        rows = np.frombuffer(ffi.buffer(ffi.cast("int32_t *", crop.device), 12 * 4), np.int32)
        rows[0:4], rows[8:12] = -5, -6  # the stage writes the crop's two rows
        lib.shim_flags_assign(member.raw, DEVICE_DIRTY, True)  # the retire helper's write
        assert interface.device_release_crop(ffi.NULL, crop) == 0
        expected[2, 4:], expected[3, 4:] = -5, -6
    member.copy_to_host()
    np.testing.assert_array_equal(parent.numpy(), expected)
