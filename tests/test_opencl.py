"""The OpenCL backend on the machine's OpenCL device (PoCL's CPU device from pip in CI):
Halide-generated kernels run through the shim, against Halide's stock runtime and numpy."""

import threading

import numpy as np
import pytest

import shim
from gpu_cases import cases, check_against_stock
from shim.pipelines.build import RUNTIMES, Build, build_all
from shim.backends import opencl as opencl_backend
from shim.native import ffi, lib

CASES = cases()


@pytest.fixture(scope="module")
def device(opencl):
    return opencl  # (the name the CUDA suite's tests share)


@pytest.fixture(scope="module")
def libraries(device):
    specs = [Build(name, "opencl", runtime) for name in CASES for runtime in RUNTIMES]
    paths = build_all(specs, progress=None)
    return {(s.name, s.runtime): path for s, path in paths.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_pipeline_matches_the_stock_runtime_and_numpy(libraries, name, tmp_path):
    check_against_stock(libraries, name, tmp_path, RUNTIMES)


def test_device_buffers_pass_between_libraries_without_host_round_trips(libraries, device):
    bundled = shim.load(libraries["brighten", "bundled"])
    no_runtime = shim.load(libraries["brighten", "no_runtime"])
    image = np.random.default_rng(0).random((32, 40), dtype=np.float32)
    first = bundled(image, scale=2.0, offset=0.0, output=image.shape)
    before = (device.transfers.uploaded, device.transfers.downloaded)
    second = no_runtime(first, scale=0.5, offset=0.0, output=image.shape)  # no -42 here
    third = bundled(second, scale=4.0, offset=0.0, output=image.shape)
    assert (device.transfers.uploaded, device.transfers.downloaded) == before
    np.testing.assert_array_equal(third.numpy(), image * 4)  # powers of two: exact


def test_programs_compile_once_per_source(libraries, device):
    calls = []
    original = device._compile
    device._compile = lambda source: calls.append(source) or original(source)
    try:
        for runtime in RUNTIMES:  # two libraries, identical kernel source
            pipeline = shim.load(libraries["crop_fill", runtime])
            for param in range(3):
                out = pipeline(param=param, f=(4, 4))
                assert out.numpy()[0, 0] == param * 10000
    finally:
        device._compile = original
    assert len(calls) <= 1  # 0 if an earlier test compiled it already


@pytest.mark.parametrize("offset_x", [1, 32])  # 4 bytes: misaligned; 128 bytes: aligned on PoCL
def test_crops_at_any_offset(libraries, device, offset_x):
    crop_fill = shim.load(libraries["crop_fill", "no_runtime"])
    data = np.full((20, 40), -7, np.int32)
    parent = shim.Buffer(data)
    parent.copy_to_device(device)
    crop = parent.cropped([(offset_x, 6), (3, 5)])
    handle = ffi.cast("shim_cl_handle *", crop._raw.device)
    assert handle.offset == (3 * 40 + offset_x) * 4
    aligned = handle.offset % device.alignment == 0
    assert (handle.launch_mem != ffi.NULL) == aligned
    crop_fill(param=1, f=crop)
    crop.copy_to_host()
    ys, xs = np.mgrid[3:8, offset_x:offset_x + 6]
    np.testing.assert_array_equal(data[3:8, offset_x:offset_x + 6], xs * 100 + ys + 10000)
    # Nothing around the crop changed on the device.
    parent.set_device_dirty()
    parent.copy_to_host()
    outside = np.ones(data.shape, bool)
    outside[3:8, offset_x:offset_x + 6] = False
    assert np.all(data[outside] == -7)


def test_copies_of_a_crop_whose_planes_are_not_whole_rows_apart(device):
    """A crop of a 3D buffer with a plane stride of 513 elements and rows of 50: OpenCL's
    rectangle copies take only slice pitches that are whole rows, so planes go one by one."""
    memory = np.zeros(4 * 513, np.int32)
    planes = np.lib.stride_tricks.as_strided(memory, (4, 10, 50), (513 * 4, 200, 4))
    parent = shim.Buffer(planes)
    parent.copy_to_device(device)
    crop = parent.cropped([(5, 20), (1, 8), (1, 2)])
    planes[1:3, 1:9, 5:25] = np.arange(2 * 8 * 20).reshape(2, 8, 20)
    crop.set_host_dirty()
    crop.copy_to_device(device)  # upload
    expected = planes.copy()
    planes[1:3, 1:9, 5:25] = -1
    crop.set_device_dirty()
    crop.copy_to_host()  # download
    np.testing.assert_array_equal(planes, expected)


def test_many_threads_launch_the_same_kernels(libraries, device):
    brighten = shim.load(libraries["brighten", "no_runtime"])
    images = [np.full((16, 16), i, np.float32) for i in range(6)]
    failures = []

    def work(image):
        out = shim.Buffer(shape=image.shape, dtype=np.float32)
        source = shim.Buffer(image)
        for _ in range(40):
            brighten(source, scale=3.0, offset=0.0, output=out)
            if not np.array_equal(out.numpy(), image * 3):
                failures.append(image[0, 0])

    threads = [threading.Thread(target=work, args=(image,)) for image in images]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_build_failure_is_a_device_error_with_the_build_log(device):
    state = ffi.new("void **")
    source = b"__kernel void broken(__global int *a) { this is not OpenCL; }\0"
    with pytest.raises(shim.DeviceError) as e:
        with shim.bridge.runtime_call("initialize") as check:
            check(lib.halide_opencl_initialize_kernels(ffi.NULL, state, source, len(source)))
    assert "clBuildProgram failed" in str(e.value) and "build log" in str(e.value)
    assert "undeclared identifier 'this'" in str(e.value)  # the compiler's own words


def test_launch_failure_is_a_device_error(device):
    state = ffi.new("void **")
    source = b"__kernel void k(__global int *a, __local int16 *s) { a[0] = 1; }\0"
    with shim.bridge.runtime_call("initialize") as check:
        check(lib.halide_opencl_initialize_kernels(ffi.NULL, state, source, len(source)))
    buf = shim.Buffer(np.zeros(4, np.int32))
    buf.copy_to_device(device)
    sizes = ffi.new("size_t[]", [8, 0])
    args = ffi.new("void *[]", [buf._raw, ffi.NULL])
    is_buffer = ffi.new("int8_t[]", [1, 0])
    with pytest.raises(shim.DeviceError) as e:
        with shim.bridge.runtime_call("run") as check:
            # A work-group far larger than any device allows.
            check(lib.halide_opencl_run(ffi.NULL, state[0], b"k", 1, 1, 1, 1 << 20, 1, 1, 0,
                                        sizes, args, is_buffer))
    assert e.value.code == -29 and "clEnqueueNDRangeKernel" in str(e.value)


def test_the_interface_and_handle_helpers_are_halides(device):
    assert lib.halide_opencl_device_interface() == lib.shim_backend_interface(lib.SHIM_BACKEND_OPENCL)
    buf = shim.Buffer(np.zeros((4, 4), np.float32))
    buf.device_malloc(device)
    mem = lib.halide_opencl_get_cl_mem(ffi.NULL, buf._raw)
    assert mem == device_memory_of(buf) and lib.halide_opencl_get_crop_offset(ffi.NULL, buf._raw) == 0
    crop = buf.cropped(0, 1, 2)
    assert lib.halide_opencl_get_crop_offset(ffi.NULL, crop._raw) == 4
    assert lib.halide_opencl_get_cl_mem(ffi.NULL, crop._raw) == mem
    ctx, queue = ffi.new("void **"), ffi.new("void **")
    assert lib.halide_acquire_cl_context(ffi.NULL, ctx, queue, True) == 0
    assert int(ffi.cast("uintptr_t", ctx[0])) == device.context.int_ptr


def device_memory_of(buf):
    return int(ffi.cast("uintptr_t", ffi.cast("shim_cl_handle *", buf._raw.device).mem))


def test_wrapping_a_pyopencl_buffer(device):
    import pyopencl as cl

    data = np.arange(16, dtype=np.int32)
    foreign = cl.Buffer(device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                        hostbuf=data)
    buf = shim.Buffer(np.zeros(16, np.int32))
    buf.set_host_dirty(False)
    with shim.bridge.runtime_call("wrap") as check:
        check(lib.halide_opencl_wrap_cl_mem(ffi.NULL, buf._raw, foreign.int_ptr))
    buf.set_device_dirty()
    np.testing.assert_array_equal(buf.numpy(), data)
    with shim.bridge.runtime_call("detach") as check:
        check(lib.halide_opencl_detach_cl_mem(ffi.NULL, buf._raw))
    assert not buf.has_device_allocation


def test_selecting_a_device_that_does_not_exist(device):
    with pytest.raises(shim.DeviceUnavailable, match="no OpenCL platform matches 'no-such-platform'"):
        shim.device("opencl", platform="no-such-platform")
    assert any(kind == "opencl" for kind, _ in shim.devices())


def test_no_opencl_driver_is_a_helpful_error(monkeypatch):
    monkeypatch.setattr(opencl_backend, "_platforms", lambda: [])
    with pytest.raises(shim.DeviceUnavailable, match="pip install pocl-binary-distribution"):
        opencl_backend._select(None, None)
