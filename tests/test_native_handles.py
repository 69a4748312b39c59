"""Halide's per-API handle helpers (halide_cuda_get_device_ptr, halide_opencl_get_cl_mem, their
detach functions) on buffers that are not theirs: a crop that is not on a device yet carries a
placeholder handle (the address of a host struct) that must never come out as device memory,
and another API's buffer is refused (Halide aborts there) instead of being detached."""

import numpy as np
import pytest

import shim
from shim.native import ffi, lib
from shim.core.bridge import runtime_call


def proxy_crop():
    parent = shim.Buffer(np.zeros((8, 8), np.float32))
    crop = parent.cropped([(2, 4), (2, 4)])
    assert crop.raw.device != 0  # the placeholder the shim gives crops of host-only parents
    return parent, crop


def test_a_crop_not_yet_on_a_device_has_no_native_handle():
    parent, crop = proxy_crop()
    assert lib.halide_cuda_get_device_ptr(ffi.NULL, crop.raw) == 0
    assert lib.halide_opencl_get_cl_mem(ffi.NULL, crop.raw) == 0
    assert lib.halide_opencl_get_crop_offset(ffi.NULL, crop.raw) == 0
    with runtime_call("detach") as check:  # nothing attached: nothing to detach
        check(lib.halide_cuda_detach_device_ptr(ffi.NULL, crop.raw))
        check(lib.halide_opencl_detach_cl_mem(ffi.NULL, crop.raw))
    assert crop.raw.device != 0  # the placeholder stays: it is the shim's, not the caller's


def test_a_buffer_of_another_api_is_refused_not_detached(opencl):
    data = np.arange(16, dtype=np.float32)
    buf = shim.Buffer(data)
    buf.copy_to_device(opencl)
    handle = buf.raw.device
    assert lib.halide_cuda_get_device_ptr(ffi.NULL, buf.raw) == 0
    with pytest.raises(shim.DeviceError, match="another device interface") as error:
        with runtime_call("detach") as check:
            check(lib.halide_cuda_detach_device_ptr(ffi.NULL, buf.raw))
    assert error.value.code == lib.halide_error_code_incompatible_device_interface
    assert buf.raw.device == handle and buf.device is opencl
    assert lib.halide_opencl_get_cl_mem(ffi.NULL, buf.raw) != 0
    buf.set_device_dirty()
    np.testing.assert_array_equal(buf.numpy(), data)  # still on OpenCL, whole


def test_null_buffers_are_reported():
    assert lib.halide_cuda_get_device_ptr(ffi.NULL, ffi.NULL) == 0
    assert lib.halide_opencl_get_cl_mem(ffi.NULL, ffi.NULL) == 0
    with pytest.raises(shim.DeviceError):
        with runtime_call("detach") as check:
            check(lib.halide_cuda_detach_device_ptr(ffi.NULL, ffi.NULL))
