"""Kernels given crops at byte offsets the OpenCL device cannot make a sub-buffer at (not a
multiple of CL_DEVICE_MEM_BASE_ADDR_ALIGN): native_stubs/backends/opencl.c launches them at an
element offset where the kernel's uses of the buffer are element-aligned (test_opencl_offsets.py),
and stages them around the launch where they are not (a vector-pointer cast: the hand-written
kernels here cast, and `vector_doubling` does, as Halide does for aligned vectors). Results
against numpy, inside each crop and around it, on the device."""

import threading

import numpy as np
import pytest

import shim
from gpu_cases import blur_reference
from shim.pipelines.build import Build, build_all
from shim.memory import families
from shim.native import ffi, lib
from support.staging import (OUTPUTS, build_doubling, check_input_not_copied_back,
                             check_many_dimensions)
from support.threads import run_threads

NAMES = ["brighten", "blur3x3", "crop_fill", "mix", "plane_fill", "sum_diff"]
SENTINEL = -7


@pytest.fixture(scope="module")
def load(opencl):
    paths = build_all([Build(name, "opencl", "no_runtime") for name in NAMES], progress=None)
    pipelines = {spec.name: shim.load(path) for spec, path in paths.items()}
    return pipelines.__getitem__


def misaligned(device, dtype, x: int) -> bool:
    return x * np.dtype(dtype).itemsize % device.alignment != 0


def on_device(device, data: np.ndarray) -> shim.Buffer:
    buf = shim.Buffer(data)
    buf.copy_to_device(device)
    return buf


def device_contents(parent: shim.Buffer) -> np.ndarray:
    """The parent's bytes as the device holds them, all of them."""
    parent.set_device_dirty()
    parent.copy_to_host()
    return np.asarray(parent).copy()


def fill(ys, xs, param, cs=0):
    return xs * 100 + ys + cs * 10 + param * 10000


def assert_only(parent, expected: np.ndarray, where) -> None:
    """The device holds ``expected`` at ``where`` and SENTINEL everywhere else."""
    got = device_contents(parent)
    np.testing.assert_array_equal(got[where], expected)
    outside = np.ones(got.shape, bool)
    outside[where] = False
    assert np.all(got[outside] == SENTINEL)


# --- outputs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("x, y, width, height", [(1, 0, 6, 5), (3, 2, 17, 9), (31, 1, 33, 4),
                                                 (33, 7, 1, 1), (32, 2, 8, 8)])
def test_an_output_crop_gets_its_elements_and_nothing_else(load, opencl, x, y, width, height):
    crop_fill = load("crop_fill")
    parent = on_device(opencl, np.full((12, 80), SENTINEL, np.int32))
    crop = parent.cropped([(x, width), (y, height)])
    staged = ffi.cast("shim_cl_handle *", crop.raw.device).launch_mem == ffi.NULL
    assert staged == misaligned(opencl, np.int32, x + y * 80) == (x != 32)  # (the last: aligned)
    ys, xs = np.mgrid[y:y + height, x:x + width]
    for param in (1, 2, 3):  # the staging buffer is reused from the second call on
        crop_fill(param=param, f=crop)
        assert_only(parent, fill(ys, xs, param), np.s_[y:y + height, x:x + width])


@pytest.mark.parametrize("plane_stride", [500, 513])  # 513: not whole rows, planes copied one by one
def test_a_three_dimensional_crop(load, opencl, plane_stride):
    plane_fill = load("plane_fill")
    memory = np.full(4 * plane_stride, SENTINEL, np.int32)
    planes = np.lib.stride_tricks.as_strided(memory, (4, 10, 50), (plane_stride * 4, 200, 4))
    parent = on_device(opencl, planes)  # (c, y, x)
    plane_fill(param=4, f=parent.cropped([(5, 20), (1, 8), (1, 2)]))
    cs, ys, xs = np.mgrid[1:3, 1:9, 5:25]
    assert_only(parent, fill(ys, xs, 4, cs), np.s_[1:3, 1:9, 5:25])


def test_two_output_crops_of_one_parent_in_one_call(load, opencl):
    sum_diff = load("sum_diff")
    rng = np.random.default_rng(1)
    a = rng.integers(-1000, 1000, (9, 70), dtype=np.int32)
    b = rng.integers(-1000, 1000, (9, 70), dtype=np.int32)
    parent = on_device(opencl, np.full((9, 70), SENTINEL, np.int32))
    total, diff = parent.cropped([(1, 30), (0, 9)]), parent.cropped([(33, 30), (0, 9)])
    sum_diff(a=on_device(opencl, a), b=on_device(opencl, b), sum=total, diff=diff)
    expected = np.full((9, 70), SENTINEL, np.int32)
    expected[:, 1:31], expected[:, 33:63] = (a + b)[:, 1:31], (a - b)[:, 33:63]
    np.testing.assert_array_equal(device_contents(parent), expected)


# --- inputs (a crop keeps its mins: the output is then a crop at the same place) ----------------

@pytest.mark.parametrize("x", [1, 5, 33])
def test_an_input_crop_is_read_and_left_as_it_was(load, opencl, x):
    brighten = load("brighten")
    data = np.random.default_rng(x).random((10, 80), dtype=np.float32)
    parent = on_device(opencl, data.copy())
    outputs = on_device(opencl, np.full((10, 80), SENTINEL, np.float32))
    box = np.s_[2:9, x:x + 40]
    crop, out = (b.cropped([(x, 40), (2, 7)]) for b in (parent, outputs))
    for scale in (2.0, 0.5):
        brighten(crop, scale=scale, offset=1.0, output=out)
        assert_only(outputs, data[box] * np.float32(scale) + 1, box)
    np.testing.assert_array_equal(device_contents(parent), data)


@pytest.mark.parametrize("x", [1, 2, 3, 129])  # uint8: every byte offset but multiples of 128
def test_byte_sized_inputs_at_any_offset(load, opencl, x):
    mix = load("mix")
    rng = np.random.default_rng(x)
    a = rng.integers(0, 256, (6, 160), dtype=np.uint8)
    b = rng.random((6, 160), dtype=np.float32)
    parents = [on_device(opencl, array.copy()) for array in (a, b)]
    outputs = on_device(opencl, np.full((6, 160), SENTINEL, np.float32))
    crop_a, crop_b, out = (p.cropped([(x, 31), (0, 6)]) for p in (*parents, outputs))
    mix(a=crop_a, b=crop_b, alpha=0.25, offset=2, output=out)
    box = np.s_[:, x:x + 31]
    expected = a[box].astype(np.float32) * np.float32(0.25) + b[box] * np.float32(0.75) + 2
    np.testing.assert_allclose(device_contents(outputs)[box], expected, rtol=1e-6)
    for parent, array in zip(parents, (a, b)):
        np.testing.assert_array_equal(device_contents(parent), array)


def test_an_input_crop_read_by_two_kernels(load, opencl):
    """blur3x3 has two stages: its input crop goes to the first kernel, its output crop
    comes from the second."""
    blur = load("blur3x3")
    data = np.random.default_rng(3).integers(0, 1 << 16, (20, 90), dtype=np.uint16)
    parent = on_device(opencl, data.copy())
    outputs = on_device(opencl, np.full((20, 90), 7, np.uint16))
    blur(parent.cropped([(1, 40), (0, 20)]), output=outputs.cropped([(1, 38), (0, 18)]))
    expected = np.full((20, 90), 7, np.uint16)
    expected[:18, 1:39] = blur_reference(data[:, 1:41])
    np.testing.assert_array_equal(device_contents(outputs), expected)
    np.testing.assert_array_equal(device_contents(parent), data)


def test_one_crop_as_input_and_output(load, opencl):
    brighten = load("brighten")
    data = np.arange(8 * 40, dtype=np.float32).reshape(8, 40)
    parent = on_device(opencl, data.copy())
    crop = parent.cropped([(1, 16), (0, 8)])
    brighten(crop, scale=2.0, offset=1.0, output=crop)
    expected = data.copy()
    expected[:, 1:17] = data[:, 1:17] * 2 + 1
    np.testing.assert_array_equal(device_contents(parent), expected)


@pytest.fixture(scope="module")
def doubling(opencl, tmp_path_factory):
    """The doubling pipeline (support/staging.py) of a number of dimensions, built once each."""
    work, built = tmp_path_factory.mktemp("doubling"), {}

    def of(dims: int):
        if dims not in built:
            built[dims] = shim.load(build_doubling(work, dims, "opencl"))
        return built[dims]

    return of


@pytest.fixture(scope="module")
def vector_doubling(tmp_path_factory):
    """The 2-D doubling pipeline whose kernel reads and writes int4s through cast pointers: its
    misaligned crops are staged."""
    return shim.load(build_doubling(tmp_path_factory.mktemp("vector"), 2, "opencl",
                                    vector_casts=True))


@pytest.mark.parametrize("output", OUTPUTS)
def test_a_staged_input_is_never_copied_back_over_what_the_kernel_wrote(vector_doubling, opencl,
                                                                         output):
    check_input_not_copied_back(vector_doubling, opencl, output, width=48)


@pytest.mark.parametrize("permuted", [False, True], ids=["in order", "permuted"])
@pytest.mark.parametrize("dims", [6, 8, 24])
def test_misaligned_crops_of_many_dimensions(doubling, opencl, dims, permuted):
    """Halide's buffers have any number of dimensions (a shim.Buffer, numpy's 64): staging
    walks a crop with one counter per dimension, however many (24: past the 16 it refused)."""
    check_many_dimensions(doubling(dims), opencl, dims, permuted)


# --- threads -----------------------------------------------------------------------------------

def test_threads_writing_crops_whose_rows_interleave(load, opencl):
    crop_fill = load("crop_fill")
    parent = on_device(opencl, np.full((16, 70), SENTINEL, np.int32))
    boxes = [(1, 30), (31, 30), (61, 9)]  # (x, width): one row of each between the next's
    crops = [parent.cropped([(x, width), (0, 16)]) for x, width in boxes]

    def writer(i):
        for k in range(25):
            crop_fill(param=i * 100 + k, f=crops[i])

    run_threads(len(crops), writer)
    expected = np.full((16, 70), SENTINEL, np.int32)
    for i, (x, width) in enumerate(boxes):
        ys, xs = np.mgrid[0:16, x:x + width]
        expected[:, x:x + width] = fill(ys, xs, i * 100 + 24)
    np.testing.assert_array_equal(device_contents(parent), expected)


def test_a_reader_never_puts_old_values_back_over_a_writer(load, opencl):
    """A kernel that only reads a staged crop leaves it alone afterwards: copying it back
    would put old values over what another thread's kernel wrote there meanwhile."""
    crop_fill, sum_diff = load("crop_fill"), load("sum_diff")
    parent = on_device(opencl, np.full((16, 40), SENTINEL, np.int32))
    written, read = parent.cropped([(1, 32), (0, 16)]), parent.cropped([(1, 32), (0, 16)])
    results = [on_device(opencl, np.zeros((16, 40), np.int32)) for _ in range(2)]
    total, diff = (r.cropped([(1, 32), (0, 16)]) for r in results)
    ys, xs = np.mgrid[0:16, 1:33]
    writing = threading.Event()
    writing.set()

    def reader():
        while writing.is_set():
            sum_diff(a=read, b=read, sum=total, diff=diff)

    def writer():
        try:
            for param in range(1, 100):
                crop_fill(param=param, f=written)
                np.testing.assert_array_equal(device_contents(parent)[:, 1:33], fill(ys, xs, param))
        finally:
            writing.clear()

    run_threads(2, lambda i: (reader, writer)[i]())


# --- the launch itself -------------------------------------------------------------------------

def initialized(source: bytes):
    state = ffi.new("void **")
    source += b"\0"
    with shim.core.bridge.runtime_call("initialize") as check:
        check(lib.halide_opencl_initialize_kernels(ffi.NULL, state, source, len(source)))
    return state[0]


def run_kernel(module, name: bytes, buffers, threads: int, rows: int = 1) -> None:
    """Launch kernel ``name`` of ``module`` on one block of threads x rows."""
    sizes = ffi.new("size_t[]", [8] * len(buffers) + [0])
    args = ffi.new("void *[]", [b.raw if isinstance(b, shim.Buffer) else b for b in buffers]
                   + [ffi.NULL])
    is_buffer = ffi.new("int8_t[]", [1] * len(buffers) + [0])
    with shim.core.bridge.runtime_call("run") as check:
        check(lib.halide_opencl_run(ffi.NULL, module, name, 1, 1, 1, threads, rows, 1, 0, sizes,
                                    args, is_buffer))


def test_only_a_crops_elements_are_copied_back(opencl):
    """Two crops whose rows interleave, written by one kernel: each one's copy back must leave
    the other's elements, in between its rows, alone."""
    module = initialized(b"__kernel void two(__global int *a, __global int *b, __local int16 *s) "
                         b"{ int i = get_global_id(1) * 16 + get_global_id(0); a[i] = 1; b[i] = 2; "
                         b"if (i < 0) { ((__global int2 *)a)[0] = 0; ((__global int2 *)b)[0] = 0; } }")
    parent = on_device(opencl, np.full((4, 16), SENTINEL, np.int32))
    run_kernel(module, b"two", [parent.cropped([(1, 2), (0, 4)]), parent.cropped([(3, 2), (0, 4)])],
               2, 4)
    expected = np.full((4, 16), SENTINEL, np.int32)
    expected[:, 1:3], expected[:, 3:5] = 1, 2
    np.testing.assert_array_equal(device_contents(parent), expected)


def test_a_const_parameter_is_not_copied_back(opencl):
    """Two crops of the same elements, given to a kernel that writes the first and reads the
    second: had the second been copied back after the first, the old values would be back."""
    module = initialized(b"__kernel void plus_one(__global int *restrict b, "
                         b"__global const int *restrict a, __local int16 *s) "
                         b"{ int i = get_global_id(0); b[i] = a[i] + 1; "
                         b"if (i < 0) b[0] = ((__global const int2 *)a)[0].x; }")
    data = np.arange(64, dtype=np.int32)
    parent = on_device(opencl, data.copy())
    out, source = parent.cropped(0, 1, 8), parent.cropped(0, 1, 8)
    run_kernel(module, b"plus_one", [out, source], 8)
    expected = data.copy()
    expected[1:9] += 1
    np.testing.assert_array_equal(device_contents(parent), expected)


def crop_struct(crop: shim.Buffer, dims):
    """A halide_buffer_t for ``crop``'s device handle that claims ``dims``, (extent, stride)s."""
    dim = ffi.new("halide_dimension_t[]", len(dims))
    for i, (extent, stride) in enumerate(dims):
        dim[i].extent, dim[i].stride = extent, stride
    raw = ffi.new("halide_buffer_t *")
    raw.device, raw.device_interface = crop.raw.device, crop.raw.device_interface
    raw.type, raw.dimensions, raw.dim = crop.raw.type, len(dims), dim
    return raw, dim


HUGE = (1 << 31) - 1


@pytest.mark.parametrize("dims, call", [([(HUGE, 1), (HUGE, HUGE)], "clCreateBuffer"),
                                        ([(1000, 1)], "clEnqueueCopyBuffer")])
def test_a_failing_staging_step_is_a_device_error(opencl, dims, call):
    module = initialized(b"__kernel void set(__global int *a, __local int16 *s) "
                         b"{ if (get_global_id(0) == 0) ((__global int8 *)a)[0] = (int8)(5); }")
    parent = on_device(opencl, np.zeros(64, np.int32))
    crop = parent.cropped(0, 1, 8)
    raw, _dim = crop_struct(crop, dims)  # more than any buffer can hold, or than the parent has
    with pytest.raises(shim.DeviceError) as e:
        run_kernel(module, b"set", [raw], 8)
    assert e.value.code == -29 and call in str(e.value)  # halide_error_code_gpu_device_error
    run_kernel(module, b"set", [crop], 8)  # the crop's own launches still work
    expected = np.zeros(64, np.int32)
    expected[1:9] = 5
    np.testing.assert_array_equal(device_contents(parent), expected)


def test_a_crop_keeps_its_staging_buffer_until_it_goes(vector_doubling, opencl):
    parent = on_device(opencl, np.full((4, 40), SENTINEL, np.int32))
    source = on_device(opencl, np.zeros((4, 16), np.int32))
    crop = parent.cropped([(1, 16), (0, 4)])
    crop.set_min([0, 0])
    handle = int(ffi.cast("uintptr_t", crop.raw.device))
    struct = families.family_of(parent.raw).memory.handles[handle][0]  # (kept alive here)
    vector_doubling(source, crop)
    staging = struct.staging
    assert staging != ffi.NULL
    vector_doubling(source, crop)
    assert struct.staging == staging  # reused, not made again
    crop.copy_to_host()
    del crop
    assert struct.staging == ffi.NULL  # released with the crop's handle


def test_a_profiled_call_stages_too_and_says_so(vector_doubling, opencl):
    parent = on_device(opencl, np.full((6, 40), SENTINEL, np.int32))
    data = np.arange(64, dtype=np.int32).reshape(4, 16)
    crop = parent.cropped([(3, 16), (1, 4)])
    crop.set_min([0, 0])
    with shim.profile() as profile:
        vector_doubling(on_device(opencl, data), crop)
    launches = [r for r in profile.records if r.kind == "launch" and r.result == 0]
    assert launches and all(r.launch["staged"] == 1 for r in launches)
    assert_only(parent, data * 2 + 1, np.s_[1:5, 3:19])


@pytest.mark.parametrize("x", [1, 3, 5])
def test_a_family_is_placed_for_the_crop_that_goes_to_the_device_first(load, opencl, x):
    """A crop at a misaligned offset whose family has no allocation yet: the allocation is
    placed so that the crop starts at an aligned offset (a sub-buffer, no staging), and the
    parent and a sibling, at whatever offsets that leaves them, still read and write right."""
    crop_fill = load("crop_fill")
    assert misaligned(opencl, np.int32, x)
    parent = shim.Buffer(np.full((4, 48), SENTINEL, np.int32))
    crop = parent.cropped([(x, 8), (0, 4)])
    crop_fill(param=1, f=crop)  # its family's first device use
    handle = int(ffi.cast("uintptr_t", crop.raw.device))
    family = families.family_of(parent.raw)
    struct = family.memory.handles[handle][0]
    assert struct.offset % opencl.alignment == 0 and struct.launch_mem != ffi.NULL
    crop_fill(param=2, f=crop)
    assert struct.staging == ffi.NULL  # launched directly: never staged
    sibling = parent.cropped([(x + 16, 8), (0, 4)])  # misaligned in the placed allocation
    crop_fill(param=3, f=sibling)
    ys, xs = np.mgrid[0:4, 0:8]
    expected = np.full((4, 48), SENTINEL, np.int32)
    expected[:, x:x + 8] = fill(ys, xs + x, 2)
    expected[:, x + 16:x + 24] = fill(ys, xs + x + 16, 3)
    np.testing.assert_array_equal(np.asarray(parent), expected)
    assert device_contents(parent).tolist() == expected.tolist()
    # The parent itself as a kernel's output: its handle sits at the placed offset (staged).
    crop_fill(param=4, f=parent)
    ys, xs = np.mgrid[0:4, 0:48]
    np.testing.assert_array_equal(np.asarray(parent), fill(ys, xs, 4))
    np.testing.assert_array_equal(np.asarray(crop), fill(ys, xs, 4)[:, x:x + 8])
