"""The device layer on the simulated ``host`` device: Buffer device methods, copies, crops,
buffer_copy, native handles, failures and leaks."""

import gc
import warnings

import numpy as np
import pytest

import shim
from shim.native import ffi, lib


@pytest.fixture
def device():
    backend = shim.device("host")
    backend.clear_faults()
    before = backend.live_allocations
    yield backend
    backend.clear_faults()
    gc.collect()
    assert backend.live_allocations == before, "device memory leaked"


def device_contents(buf, device):
    """A copy of what the device allocation of ``buf`` holds, read without touching ``buf``'s
    host memory or flags. On the host device a handle is the address of the buffer's min
    element in device memory, laid out with the buffer's own strides."""
    assert device.kind == "host"
    array = buf._array
    span = sum((n - 1) * s for n, s in zip(array.shape, array.strides)) + array.itemsize
    memory = shim.native.regions.host_memory(buf.raw.device, span)
    return np.lib.stride_tricks.as_strided(memory.view(array.dtype), array.shape,
                                           array.strides).copy()


def test_upload_then_download_round_trip(device):
    data = np.arange(48, dtype=np.int32).reshape(6, 8)
    buf = shim.Buffer(data)
    assert buf.host_dirty() and not buf.has_device_allocation()
    buf.copy_to_device(device)
    assert not buf.host_dirty() and buf.has_device_allocation() and buf.device is device
    np.testing.assert_array_equal(device_contents(buf, device), data)
    data[:] = -1  # host changes, not marked dirty: the device keeps the old data
    buf.set_device_dirty()
    buf.copy_to_host()
    np.testing.assert_array_equal(data, np.arange(48).reshape(6, 8))
    assert not buf.device_dirty()


def test_device_memory_is_separate_from_host_memory(device):
    data = np.ones((4, 4), np.float32)
    buf = shim.Buffer(data)
    buf.copy_to_device(device)
    assert buf.raw.device != int(ffi.cast("uintptr_t", buf.raw.host))
    data[:] = 7
    np.testing.assert_array_equal(device_contents(buf, device), 1)


def test_upload_happens_only_when_host_dirty(device):
    buf = shim.Buffer(np.zeros((16, 16), np.uint8))
    copied = device.transfers.total
    buf.copy_to_device(device)
    assert device.transfers.total - copied == 256
    for _ in range(5):
        buf.copy_to_device(device)  # no-ops: decided in C
    assert device.transfers.total - copied == 256


def test_reading_a_device_dirty_buffer_copies_back_first(device):
    data = np.zeros((3, 5), np.int16)
    buf = shim.Buffer(data)
    buf.copy_to_device(device)
    data[:] = 9  # what a kernel would not see...
    buf.set_device_dirty()  # ...and results that exist only on the device
    np.testing.assert_array_equal(np.asarray(buf), 0)
    assert not buf.device_dirty()


def test_device_free_keeps_device_results(device):
    data = np.zeros(10, np.float64)
    buf = shim.Buffer(data)
    buf.copy_to_device(device)
    data[:] = 3
    buf.set_device_dirty()
    buf.device_free()
    assert not buf.has_device_allocation() and not buf.device_dirty()
    np.testing.assert_array_equal(data, 0)  # the device's version won


def test_dropping_a_dirty_buffer_copies_back_and_warns(device):
    data = np.zeros(6, np.int32)
    buf = shim.Buffer(data)
    buf.copy_to_device(device)
    data[:] = 5
    buf.set_device_dirty()
    with pytest.warns(shim.DirtyBufferWarning) as caught:
        del buf
        gc.collect()
    np.testing.assert_array_equal(data, 0)
    # The warning names the line that dropped the Buffer, not the shim's own.
    assert {warning.filename for warning in caught} == {__file__}, [str(w) for w in caught]


def test_dropping_a_clean_buffer_frees_quietly(device):
    buf = shim.Buffer(np.zeros(6, np.int32))
    buf.copy_to_device(device)
    assert device.live_allocations >= 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del buf
        gc.collect()


def test_device_sync_and_malloc_are_idempotent(device):
    buf = shim.Buffer(np.zeros((2, 2), np.uint8))
    buf.device_sync()  # nothing on a device: nothing to wait for
    buf.device_malloc(device)
    handle = buf.raw.device
    buf.device_malloc(device)
    assert buf.raw.device == handle
    buf.device_sync()
    assert buf.host_dirty()  # malloc does not upload


def test_negative_strides_cannot_go_to_a_device(device):
    buf = shim.Buffer(np.zeros((4, 4), np.float32)[::-1])
    with pytest.raises(shim.DeviceError) as e:
        buf.device_malloc(device)
    assert e.value.code == -16 and "negative strides" in str(e.value)


def test_allocation_failure_is_a_device_error_with_code_and_cause(device):
    buf = shim.Buffer(np.zeros(4, np.int8))
    device.set_faults(fail_allocation=1)
    with pytest.raises(shim.DeviceError) as e:
        buf.copy_to_device(device)
    assert e.value.code == -16 and "injected allocation failure" in str(e.value)
    assert e.value.__cause__ is not None
    assert not buf.has_device_allocation() and buf.host_dirty()
    buf.copy_to_device(device)  # the next one works
    assert not buf.host_dirty()


def test_copy_failure_leaves_the_dirty_bit_set(device):
    data = np.arange(8, dtype=np.int32)
    buf = shim.Buffer(data)
    device.set_faults(fail_copy=1)
    with pytest.raises(shim.DeviceError) as e:
        buf.copy_to_device(device)
    assert e.value.code == -15
    assert buf.host_dirty()  # the upload never happened, so the host is still the truth
    buf.copy_to_device(device)
    np.testing.assert_array_equal(device_contents(buf, device), data)


def test_python_exception_inside_a_callback_is_a_device_error(device, monkeypatch):
    def broken(*args):
        raise ZeroDivisionError("backend bug")

    monkeypatch.setattr(device, "read", broken)
    buf = shim.Buffer(np.zeros(4, np.float32))
    buf.copy_to_device(device)
    buf.set_device_dirty()
    with pytest.raises(shim.DeviceError) as e:
        buf.copy_to_host()
    assert e.value.code == -14
    assert isinstance(e.value.__cause__, ZeroDivisionError)
    assert buf.device_dirty()
    monkeypatch.undo()
    buf.copy_to_host()


def test_crop_and_slice_alias_the_parent_allocation(device):
    data = np.arange(60, dtype=np.int32).reshape(6, 10)
    parent = shim.Buffer(data)
    parent.copy_to_device(device)
    # A crop x in [2, 7), y in [1, 4), built as native code would, then device_crop. A crop
    # has its parent's strides; its host memory here is a separate array, so what it reads
    # can only have come from the device.
    crop_host = np.zeros_like(data)[1:4, 2:7]
    crop = raw_like(crop_host, mins=(2, 1))
    assert lib.halide_device_crop(ffi.NULL, parent.raw, crop.raw) == 0
    assert crop.raw.device_interface == parent.raw.device_interface
    # The crop reads the parent's device memory at its offset.
    crop.raw.flags = lib.halide_buffer_flag_device_dirty
    assert lib.halide_copy_to_host(ffi.NULL, crop.raw) == 0
    np.testing.assert_array_equal(crop_host, data[1:4, 2:7])
    # Writing through the crop lands in the parent's allocation.
    crop_host[:] = -5
    crop.raw.flags = lib.halide_buffer_flag_host_dirty
    assert lib.halide_copy_to_device(ffi.NULL, crop.raw, ffi.NULL) == 0
    expected = data.copy()
    expected[1:4, 2:7] = -5
    np.testing.assert_array_equal(device_contents(parent, device), expected)
    # A slice: row y=4 of the parent.
    row_host = np.zeros_like(data)[4]
    row = raw_like(row_host, mins=(0,))
    assert lib.halide_device_slice(ffi.NULL, parent.raw, 1, 4, row.raw) == 0
    row.raw.flags = lib.halide_buffer_flag_device_dirty
    assert lib.halide_copy_to_host(ffi.NULL, row.raw) == 0
    np.testing.assert_array_equal(row_host, data[4])
    # The parent's memory outlives its own handle while crops still point into it.
    allocations = device.live_allocations
    parent.device_free()
    assert device.live_allocations == allocations
    for view in (crop, row):
        assert lib.halide_device_release_crop(ffi.NULL, view.raw) == 0
        assert view.raw.device == 0 and view.raw.device_interface == ffi.NULL
    assert device.live_allocations == allocations - 1


def test_crop_of_a_buffer_without_device_memory_is_a_no_op(device):
    parent = shim.Buffer(np.zeros((4, 4), np.uint8))
    crop = raw_like(np.zeros((2, 2), np.uint8), mins=(1, 1))
    assert lib.halide_device_crop(ffi.NULL, parent.raw, crop.raw) == 0
    assert crop.raw.device == 0


class raw_like:
    """A bare halide_buffer_t over a numpy array, with Halide mins: what native code makes."""

    def __init__(self, array, mins):
        self.array = array
        self.dims = ffi.new("halide_dimension_t[]", array.ndim)
        for i in range(array.ndim):
            axis = array.ndim - 1 - i
            self.dims[i].min = mins[i]
            self.dims[i].extent = array.shape[axis]
            self.dims[i].stride = array.strides[axis] // array.itemsize
        self.raw = ffi.new("halide_buffer_t *")
        self.raw.host = ffi.cast("uint8_t *", array.ctypes.data)
        htype = shim.HalideType.from_dtype(array.dtype)
        htype.to_c(self.raw.type)
        self.raw.dimensions = array.ndim
        self.raw.dim = self.dims


def test_buffer_copy_between_host_and_device_over_the_overlap(device):
    src_data = np.arange(64, dtype=np.uint16).reshape(8, 8)
    src = shim.Buffer(src_data)
    src.copy_to_device(device)
    # A destination covering x in [4, 12), y in [2, 6): overlap x [4, 8), y [2, 6).
    dst_host = np.zeros((4, 8), np.uint16)
    dst = raw_like(dst_host, mins=(4, 2))
    # Device -> host (dst has no device): the source's device data is valid.
    with shim.core.bridge.runtime_call("buffer_copy") as check:
        check(lib.halide_buffer_copy(ffi.NULL, src.raw, ffi.NULL, dst.raw))
    np.testing.assert_array_equal(dst_host[:, :4], src_data[2:6, 4:8])
    np.testing.assert_array_equal(dst_host[:, 4:], 0)
    assert dst.raw.flags == lib.halide_buffer_flag_host_dirty
    # Host -> device into a fresh destination allocation.
    interface = lib.shim_backend_interface(device.index)
    dst2_host = np.full((8, 8), 1, np.uint16)
    dst2 = raw_like(dst2_host, mins=(0, 0))
    with shim.core.bridge.runtime_call("buffer_copy") as check:
        check(lib.halide_buffer_copy(ffi.NULL, src.raw, interface, dst2.raw))
    assert dst2.raw.flags == lib.halide_buffer_flag_device_dirty
    dst2.raw.flags = lib.halide_buffer_flag_device_dirty
    assert lib.halide_copy_to_host(ffi.NULL, dst2.raw) == 0
    np.testing.assert_array_equal(dst2_host, src_data)
    assert lib.halide_device_free(ffi.NULL, dst2.raw) == 0


def test_buffer_copy_device_to_device(device):
    src_data = np.arange(20, dtype=np.float32).reshape(4, 5)
    src = shim.Buffer(src_data)
    src.copy_to_device(device)
    dst = shim.Buffer(np.zeros((4, 5), np.float32))
    dst.device_malloc(device)
    copied = device.transfers.total
    with shim.core.bridge.runtime_call("buffer_copy") as check:
        check(lib.halide_buffer_copy(ffi.NULL, src.raw, lib.shim_backend_interface(device.index),
                                     dst.raw))
    assert device.transfers.total - copied == src_data.nbytes  # one copy, device to device
    assert dst.device_dirty() and not dst.host_dirty()
    np.testing.assert_array_equal(dst.numpy(), src_data)


def test_wrap_and_detach_native_memory(device):
    backing = np.arange(12, dtype=np.int32)
    buf = shim.Buffer(np.zeros(12, np.int32))
    interface = lib.shim_backend_interface(device.index)
    with shim.core.bridge.runtime_call("wrap") as check:
        check(lib.halide_device_wrap_native(ffi.NULL, buf.raw, backing.ctypes.data, interface))
    assert buf.raw.device == backing.ctypes.data
    buf.set_host_dirty(False)
    buf.set_device_dirty()
    np.testing.assert_array_equal(buf.numpy(), backing)
    with shim.core.bridge.runtime_call("detach") as check:
        check(lib.halide_device_detach_native(ffi.NULL, buf.raw))
    assert not buf.has_device_allocation()
    np.testing.assert_array_equal(backing, np.arange(12))  # wrapped memory is never freed


def test_cpu_pipeline_reads_an_input_whose_data_is_on_a_device(load, device):
    brighten = load("brighten")
    data = np.full((4, 4), 3, np.float32)
    inp = shim.Buffer(data)
    inp.copy_to_device(device)
    data[:] = 100
    inp.set_device_dirty()  # the device's 3s are the truth
    out = brighten(inp, offset=0, output=(4, 4))
    np.testing.assert_array_equal(out.numpy(), 6)


def test_cpu_pipeline_output_with_a_device_copy_becomes_host_dirty(load, device):
    brighten = load("brighten")
    out = shim.Buffer(shape=(4, 4), dtype=np.float32)
    out.copy_to_device(device)
    brighten(np.ones((4, 4), np.float32), offset=0, output=out)
    assert out.host_dirty()  # so the next device user uploads the new results
    out.copy_to_device()
    np.testing.assert_array_equal(device_contents(out, device), 2)


def test_failed_download_inside_a_pipeline_is_a_device_error(load, device):
    brighten = load("brighten")
    inp = shim.Buffer(np.ones((4, 4), np.float32))
    inp.copy_to_device(device)
    inp.set_device_dirty()
    device.set_faults(fail_copy=1)
    with pytest.raises(shim.DeviceError) as e:
        brighten(inp, output=(4, 4))
    assert e.value.code == -14
    assert inp.device_dirty()
    np.testing.assert_array_equal(inp.numpy(), 1)  # the data is still there to be read


def test_unknown_device_kind_is_an_argument_error():
    with pytest.raises(shim.ArgumentError, match="unknown device kind 'tpu'"):
        shim.device("tpu")


@pytest.mark.parametrize("kind", ["host", "opencl", "vulkan", "cuda"])
@pytest.mark.parametrize("flip", [(slice(None, None, -1), slice(None, None, -1)),
                                  (slice(None), slice(None, None, -1))], ids=["both", "x"])
def test_buffer_copy_between_a_device_and_host_memory_of_negative_strides(kind, flip, request):
    """A host side whose strides are negative reaches below its base: OpenCL's copies, which
    count offsets from a host array, took offsets from the base and failed (std::bad_cast
    from pyopencl, the first row written)."""
    device = shim.device("host") if kind == "host" else request.getfixturevalue(kind)
    data = np.arange(35, dtype=np.int32).reshape(5, 7)
    interface = lib.shim_backend_interface(device.index)
    # Device -> a reversed host view.
    src = shim.Buffer(data.copy())
    src.copy_to_device(device)
    src.raw.flags = lib.halide_buffer_flag_device_dirty  # the device's bytes are the data
    base = np.full((5, 7), -1, np.int32)
    dst = shim.Buffer(base[flip])
    with shim.core.bridge.runtime_call("buffer_copy") as check:
        check(lib.halide_buffer_copy(ffi.NULL, src.raw, ffi.NULL, dst.raw))
    np.testing.assert_array_equal(base[flip], data)
    # A reversed host view -> a device allocation.
    reversed_data = np.ascontiguousarray(data[flip])
    src2 = shim.Buffer(reversed_data[flip])
    dst2 = shim.Buffer(np.zeros((5, 7), np.int32))
    dst2.device_malloc(device)
    with shim.core.bridge.runtime_call("buffer_copy") as check:
        check(lib.halide_buffer_copy(ffi.NULL, src2.raw, interface, dst2.raw))
    assert dst2.device_dirty()
    np.testing.assert_array_equal(dst2.numpy(), data)


def test_compute_capability_is_asked_of_python_once(device):
    """The interface's compute_capability gives the backend's answer; once it has one, later
    calls are answered in C (the Python core is not entered) with the same answer, except
    while profiling, when each call reaches the Python core for the profile to see."""
    from support.served import python_calls_during

    interface = lib.shim_backend_interface(device.index)
    major, minor = ffi.new("int *"), ffi.new("int *")

    def ask():
        major[0] = minor[0] = -1
        assert interface.compute_capability(ffi.NULL, major, minor) == 0
        return major[0], minor[0]

    assert ask() == device.compute_capability()
    ran = python_calls_during(ask, "shim.core.runtime")
    assert "shim.core.runtime.compute_capability" not in ran
    assert ask() == device.compute_capability()
    with shim.profile():
        ran = python_calls_during(ask, "shim.core.runtime")
    assert "shim.core.runtime.compute_capability" in ran
