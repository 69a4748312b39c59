"""What only the OpenCL backend has, on the machine's OpenCL device (PoCL's CPU device from
pip in CI): programs compiled once per source, crops launched through sub-buffers, build logs
and launch errors, Halide's cl_mem helpers, pyopencl buffers wrapped, platform selection. What
every GPU backend does alike is in test_gpu_backends.py."""

import numpy as np
import pytest

import shim
from gpu_cases import build_libraries
from support.opencl_kernels import launch
from shim.pipelines.build import RUNTIMES
from shim.backends import opencl as opencl_backend
from shim.backends.base import BackendError
from shim.native import ffi, lib


@pytest.fixture(scope="module")
def device(opencl):
    return opencl


@pytest.fixture(scope="module")
def libraries(device):
    return build_libraries(device.kind)


def test_programs_compile_once_per_source(libraries, device):
    calls = []
    original = device._compile
    device._compile = lambda source: calls.append(source) or original(source)
    try:
        # Two libraries, three calls each. Their kernel sources differ in a comment (the
        # target, which names the runtime choice), so each source compiles once.
        for runtime in RUNTIMES:
            pipeline = shim.load(libraries["crop_fill", runtime])
            for param in range(3):
                out = pipeline(param=param, f=(4, 4))
                assert out.numpy()[0, 0] == param * 10000
    finally:
        device._compile = original
    assert len(calls) == len(set(calls))  # none for a source an earlier test compiled


@pytest.mark.parametrize("offset_x", [1, 32])  # 4 bytes: misaligned; 128 bytes: aligned on PoCL
def test_a_crop_launches_through_a_sub_buffer_where_its_offset_is_aligned(device, offset_x):
    """A crop's handle is its parent's memory and the offset, and a sub-buffer to launch with
    where OpenCL can make one: at a multiple of the device's base address alignment. (Kernels
    writing through both kinds of crop: test_gpu_backends.py.)"""
    parent = shim.Buffer(np.zeros((20, 40), np.int32))
    parent.copy_to_device(device)
    crop = parent.cropped([(offset_x, 6), (3, 5)])
    handle = ffi.cast("shim_cl_handle *", crop.raw.device)
    assert handle.offset == (3 * 40 + offset_x) * 4
    aligned = handle.offset % device.alignment == 0
    assert (handle.launch_mem != ffi.NULL) == aligned


def test_build_failure_is_a_device_error_with_the_build_log(device):
    state = ffi.new("void **")
    source = b"__kernel void broken(__global int *a) { this is not OpenCL; }\0"
    with pytest.raises(shim.DeviceError) as e:
        with shim.core.bridge.runtime_call("initialize") as check:
            check(lib.halide_opencl_initialize_kernels(ffi.NULL, state, source, len(source)))
    assert "clBuildProgram failed" in str(e.value) and "build log" in str(e.value)
    assert "undeclared identifier 'this'" in str(e.value)  # the compiler's own words


def test_launch_failure_is_a_device_error(device):
    source = b"__kernel void k(__global int *a, __local int16 *s) { a[0] = 1; }"
    with pytest.raises(shim.DeviceError) as e:
        launch(source, b"k", threads=1 << 20)  # a work-group far larger than any device allows
    assert e.value.code == -29 and "clEnqueueNDRangeKernel" in str(e.value)


def test_the_handle_helpers_are_halides(device):
    buf = shim.Buffer(np.zeros((4, 4), np.float32))
    buf.device_malloc(device)
    mem = lib.halide_opencl_get_cl_mem(ffi.NULL, buf.raw)
    assert mem == device_memory_of(buf) and lib.halide_opencl_get_crop_offset(ffi.NULL, buf.raw) == 0
    crop = buf.cropped(0, 1, 2)
    assert lib.halide_opencl_get_crop_offset(ffi.NULL, crop.raw) == 4
    assert lib.halide_opencl_get_cl_mem(ffi.NULL, crop.raw) == mem
    ctx, queue = ffi.new("void **"), ffi.new("void **")
    assert lib.halide_acquire_cl_context(ffi.NULL, ctx, queue, True) == 0
    assert int(ffi.cast("uintptr_t", ctx[0])) == device.context.int_ptr


def device_memory_of(buf):
    return int(ffi.cast("uintptr_t", ffi.cast("shim_cl_handle *", buf.raw.device).mem))


def test_wrapping_a_pyopencl_buffer(device):
    import pyopencl as cl

    data = np.arange(16, dtype=np.int32)
    foreign = cl.Buffer(device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                        hostbuf=data)
    buf = shim.Buffer(np.zeros(16, np.int32))
    buf.set_host_dirty(False)
    with shim.core.bridge.runtime_call("wrap") as check:
        check(lib.halide_opencl_wrap_cl_mem(ffi.NULL, buf.raw, foreign.int_ptr))
    buf.set_device_dirty()
    np.testing.assert_array_equal(buf.numpy(), data)
    with shim.core.bridge.runtime_call("detach") as check:
        check(lib.halide_opencl_detach_cl_mem(ffi.NULL, buf.raw))
    assert not buf.has_device_allocation()


def test_selecting_a_device_that_does_not_exist(device):
    with pytest.raises(shim.DeviceUnavailable, match="no OpenCL platform matches 'no-such-platform'"):
        shim.device("opencl", platform="no-such-platform")
    assert any(kind == "opencl" for kind, _ in shim.devices())


def test_no_opencl_driver_is_a_helpful_error(monkeypatch):
    monkeypatch.setattr(opencl_backend, "_platforms", lambda: [])
    with pytest.raises(shim.DeviceUnavailable, match="pip install pocl-binary-distribution"):
        opencl_backend._select(None, None)


def test_a_program_the_driver_cannot_build_is_refused_with_its_log(device):
    """A build failure names the driver's log; where the log says the driver's compiler does not
    know this CPU (PoCL 3.0 from pip, LLVM 14, on a newer CPU), it also says what to install."""
    with pytest.raises(BackendError, match="clBuildProgram failed") as failure:
        device._build_from_source(b"__kernel void broken(__global float *a) { a[0] = ; }")
    assert "pocl-opencl-icd" not in str(failure.value)
    hint = opencl_backend.build_failure_hint("error: unknown target CPU 'generic'\n")
    assert "pocl-opencl-icd" in hint and "LLVM 14" in hint
    assert opencl_backend.build_failure_hint("error: expected expression") == ""
