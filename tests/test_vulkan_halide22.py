"""Halide 22's Vulkan kernels, prepared: kernels shaped as Halide 22's code generator makes them
(PR 8954: an int32 element offset per buffer in the uniform buffer, after the scalars, and
every buffer bound whole), compiled from GLSL at test time (tests/support/halide22_kernels,
tests/support/halide22_vulkan.py), launched by pipelines written as Halide 22's generated code
(tests/support/halide22_vulkan_pipelines.c) that the shim serves as Halide 22's: crops at any
offset used in place, crops of crops, buffers the kernels cannot reach refused, beside Halide
21's pipelines (which stage misaligned crops) in one process. Results against numpy."""

import ctypes

import numpy as np
import pytest

import shim
from shim.native import ffi, lib
from shim.pipelines.build import Build, build
from support import halide22_vulkan
from support.halide22_vulkan import ADD, SCALE
from support.threads import run_threads
from support.vulkan import (VulkanCapsule, initialize_kernels, run_python, tensor_of,
                            validation_layer)
from test_device_layer import raw_like

RNG = np.random.default_rng(22)


@pytest.fixture(scope="module")
def device(vulkan):
    return vulkan


@pytest.fixture(scope="module")
def kernels(device, tmp_path_factory):
    """Each kernel with its SPIR-V."""
    work = tmp_path_factory.mktemp("halide22_kernels")
    return [(kernel, halide22_vulkan.spirv(kernel, work)) for kernel in (SCALE, ADD)]


@pytest.fixture(scope="module")
def library(kernels, tmp_path_factory):
    return halide22_vulkan.build_library(halide22_vulkan.module_blob(kernels),
                                         tmp_path_factory.mktemp("h22vk"))


@pytest.fixture(scope="module")
def scale(library):
    return shim.load(library, name="h22vk_scale")


@pytest.fixture(scope="module")
def add(library):
    return shim.load(library, name="h22vk_add")


@pytest.fixture(scope="module")
def crop_fill_21(device):
    """The sample pipeline crop_fill, built for Vulkan by this environment's Halide 21."""
    return build(Build("crop_fill", "vulkan", "no_runtime"))


def _offset(buf) -> int:
    """Where a Buffer's min element is in its VkBuffer, in bytes."""
    return ffi.cast("shim_vk_handle *", buf.raw.device).offset


def _misaligned(device, *buffers) -> None:
    """Each buffer sits where Vulkan binds no descriptor (lavapipe: off 16 bytes), so that a
    descriptor at its offset would break the rule; a kernel of Halide 22 takes it in place."""
    for buf in buffers:
        assert device.alignment <= 4 or _offset(buf) % device.alignment != 0


def _scaled(image, gain, bias):
    return (image * np.float32(gain) + np.float32(bias)).astype(np.float32)


def _add_inputs(n):
    return (RNG.integers(0, 256, n, dtype=np.uint8),
            RNG.integers(-30000, 30000, n, dtype=np.int16))


def test_a_halide22_vulkan_library_is_served_as_halide22s(scale, add):
    assert scale.release == add.release == "22"
    assert "vulkan" in scale.target


# --- whole buffers ------------------------------------------------------------------------------

def test_a_kernel_with_scalars_and_buffers(scale):
    """Scalars of 30 bytes (a 16-bit one last): the offsets start at 32, after two bytes of
    padding, where Halide 22's kernels read them."""
    image = RNG.integers(-1000, 1000, (37, 53)).astype(np.float32)  # (products exact in float32)
    np.testing.assert_array_equal(scale(image, 3.0, -7, output=image.shape).numpy(),
                                  _scaled(image, 3.0, -7))
    out = np.zeros_like(image)
    scale(image, 0.5, 12, out)  # numpy arrays on the fast path: served allocations
    np.testing.assert_array_equal(out, _scaled(image, 0.5, 12))


def test_a_kernel_with_buffers_only_gets_a_uniform_buffer_of_offsets(add):
    a, b = _add_inputs(300)
    expected = a.astype(np.int32) + b
    np.testing.assert_array_equal(add(a, b, out=(300,)).numpy(), expected)
    with shim.profile() as prof:  # (the profiled launch path takes the same state)
        np.testing.assert_array_equal(add(a, b, out=(300,)).numpy(), expected)
    assert [r.backend for r in prof.records if r.kind == "launch"] == ["vulkan"]


# --- crops at any offset -------------------------------------------------------------------------

@pytest.mark.parametrize("offset_x", [1, 2, 3, 4, 5])
def test_crops_at_any_offset_as_input_and_output(scale, device, offset_x):
    """A crop of one parent read, a crop of another written, at each residue of the binding
    alignment: the values where they belong, nothing around them changed."""
    source = RNG.integers(-500, 500, (30, 50)).astype(np.float32)
    target = np.full((30, 50), -1, np.float32)
    src, dst = shim.Buffer(source), shim.Buffer(target)
    src.copy_to_device(device)
    dst.copy_to_device(device)
    inp = src.cropped([(offset_x, 20), (2, 9)])
    out = dst.cropped([(offset_x + 6, 20), (11, 9)])
    assert _offset(inp) == (2 * 50 + offset_x) * 4
    if offset_x % 4:
        _misaligned(device, inp, out)
    for crop in (inp, out):
        crop.set_min([0, 0])  # (one coordinate space for the call: each crop's own from 0)
    scale(inp, 2.0, 5, out)
    dst.copy_to_host()
    expected = np.full_like(target, -1)
    expected[11:20, offset_x + 6:offset_x + 26] = _scaled(source[2:11, offset_x:offset_x + 20],
                                                         2.0, 5)
    np.testing.assert_array_equal(target, expected)


def test_crops_of_three_element_sizes_in_one_buffer_only_launch(add, device):
    """uint8, int16 and int32 crops, each at an offset no descriptor may take: each offset
    counted in elements of its own buffer's type."""
    a, b = _add_inputs(64)
    out_data = np.full(64, -1, np.int32)
    parents = [shim.Buffer(x) for x in (a, b, out_data)]
    for parent in parents:
        parent.copy_to_device(device)
    crops = [parents[0].cropped(0, 5, 40), parents[1].cropped(0, 3, 40),
             parents[2].cropped(0, 7, 40)]
    assert [_offset(c) for c in crops] == [5, 6, 28]
    _misaligned(device, *crops)
    for crop in crops:
        crop.set_min([0])
    add(*crops)
    parents[2].copy_to_host()
    expected = np.full(64, -1, np.int32)
    expected[7:47] = a[5:45].astype(np.int32) + b[3:43]
    np.testing.assert_array_equal(out_data, expected)


def test_crops_of_crops_and_a_slice_of_a_crop(scale, add, device):
    """Halide 22's own runtime counts a crop of a crop from its allocation's owner, losing the
    middle crop's offset; the shim passes where the buffer's elements actually are."""
    source = RNG.integers(-500, 500, (40, 60)).astype(np.float32)
    target = np.full((40, 60), -1, np.float32)
    src, dst = shim.Buffer(source), shim.Buffer(target)
    src.copy_to_device(device)
    dst.copy_to_device(device)
    inp = src.cropped([(3, 50), (2, 30)]).cropped([(6, 20), (5, 9)])
    out = dst.cropped([(1, 55), (4, 30)]).cropped([(9, 30), (6, 20)]).cropped([(13, 20),
                                                                              (7, 9)])
    assert (_offset(inp), _offset(out)) == ((5 * 60 + 6) * 4, (7 * 60 + 13) * 4)
    _misaligned(device, inp, out)
    inp.set_min([0, 0])
    out.set_min([0, 0])
    scale(inp, 4.0, -3, out)
    dst.copy_to_host()
    expected = np.full_like(target, -1)
    expected[7:16, 13:33] = _scaled(source[5:14, 6:26], 4.0, -3)
    np.testing.assert_array_equal(target, expected)
    # A row of a crop, written by a kernel that takes buffers only.
    grid = np.full((8, 32), -1, np.int32)
    rows = shim.Buffer(grid)
    rows.copy_to_device(device)
    row = rows.cropped([(3, 20), (2, 5)]).sliced(1, 4)
    assert _offset(row) == (4 * 32 + 3) * 4
    row.set_min([0])
    a, b = _add_inputs(20)
    add(a, b, row)
    rows.copy_to_host()
    expected = np.full_like(grid, -1)
    expected[4, 3:23] = a.astype(np.int32) + b
    np.testing.assert_array_equal(grid, expected)


def _raw22(array, mins):
    """A bare halide_buffer_t over ``array`` as Halide 22's code makes one (its type's third
    field 0)."""
    raw = raw_like(array, mins)
    raw.raw.type.lanes = 0
    return raw


def _call(library, name, *structs):
    """The library's pipeline ``name`` called with bare halide_buffer_t structs, as native code
    calls it."""
    function = getattr(ctypes.CDLL(str(library)), name)
    function.argtypes = [ctypes.c_void_p] * len(structs)
    with shim.core.bridge.runtime_call(name) as check:
        check(function(*(int(ffi.cast("uintptr_t", struct)) for struct in structs)))


def test_a_crop_of_a_crop_made_by_native_code(add, library, device):
    """halide_device_crop of a halide_device_crop, on bare structs: the inner crop's elements
    start 13 int32s into the allocation (8 into the middle crop), and that is where the
    kernel writes."""
    interface = lib.halide_vulkan_device_interface()
    out_host = np.full(64, -1, np.int32)
    parent = _raw22(out_host, (0,))
    assert lib.halide_device_malloc(ffi.NULL, parent.raw, interface) == 0
    middle = _raw22(out_host[5:45], (5,))
    inner = _raw22(out_host[13:30], (13,))
    assert lib.halide_device_crop(ffi.NULL, parent.raw, middle.raw) == 0
    assert lib.halide_device_crop(ffi.NULL, middle.raw, inner.raw) == 0
    _misaligned(device, inner)
    a_host, b_host = _add_inputs(17)
    a, b = _raw22(a_host, (13,)), _raw22(b_host, (13,))
    for raw in (a, b):
        raw.raw.flags = lib.halide_buffer_flag_host_dirty
    try:
        _call(library, "h22vk_add", a.raw, b.raw, inner.raw)
        assert lib.halide_copy_to_host(ffi.NULL, inner.raw) == 0
    finally:
        for raw in (a, b):
            assert lib.halide_device_free(ffi.NULL, raw.raw) == 0
        for crop in (inner, middle):
            assert lib.halide_device_release_crop(ffi.NULL, crop.raw) == 0
        assert lib.halide_device_free(ffi.NULL, parent.raw) == 0
    expected = np.full(64, -1, np.int32)
    expected[13:30] = a_host.astype(np.int32) + b_host
    np.testing.assert_array_equal(out_host, expected)


# --- what Halide 22's kernels cannot reach -----------------------------------------------------

def test_a_buffer_past_int32_element_offsets_is_refused(add, library, device):
    """A row 2^31 bytes into a uint8 buffer (the claim of a struct wrapping a small VkBuffer,
    whose size the shim does not know): its element offset does not fit the kernel's int32,
    and the launch is refused with Halide's error code before anything runs."""
    owner = shim.Buffer(np.zeros(64, np.uint8))
    owner.copy_to_device(device)
    vk_buffer = lib.halide_vulkan_get_vk_buffer(ffi.NULL, owner.raw)
    dims = ffi.new("halide_dimension_t[2]", [(0, 1 << 16, 1, 0), (0, 1 << 16, 1 << 16, 0)])
    huge = ffi.new("halide_buffer_t *", {"dimensions": 2, "dim": dims})
    huge.type.code, huge.type.bits = lib.halide_type_uint, 8
    row_dims = ffi.new("halide_dimension_t[1]", [(0, 16, 1, 0)])
    row = ffi.new("halide_buffer_t *", {"dimensions": 1, "dim": row_dims})
    row.type = huge.type
    assert lib.halide_vulkan_wrap_vk_buffer(ffi.NULL, huge, vk_buffer) == 0
    assert lib.halide_device_slice(ffi.NULL, huge, 1, 1 << 15, row) == 0
    assert ffi.cast("shim_vk_handle *", row.device).offset == 1 << 31
    b, out = _raw22(np.zeros(16, np.int16), (0,)), _raw22(np.zeros(16, np.int32), (0,))
    try:
        with pytest.raises(shim.DeviceError) as e:
            _call(library, "h22vk_add", row, b.raw, out.raw)
    finally:
        assert lib.halide_device_release_crop(ffi.NULL, row) == 0
        assert lib.halide_vulkan_detach_vk_buffer(ffi.NULL, huge) == 0
        for raw in (b, out):
            assert lib.halide_device_free(ffi.NULL, raw.raw) == 0
    assert e.value.code == lib.halide_error_code_gpu_device_error
    assert "buffer argument 0" in str(e.value) and "int32 element indices" in str(e.value)


def test_a_buffer_past_the_range_one_descriptor_spans_is_refused(add, device):
    """Halide 22's kernels see every buffer from the start of its VkBuffer, through one
    descriptor of at most maxStorageBufferRange bytes: a crop within it is written, one past it
    refused, and nothing written there."""
    limit = device.max_storage_buffer_range
    if limit > 1 << 30:
        pytest.skip(f"{device.name} binds {limit} bytes in one descriptor: a buffer past that is "
                    "more memory than this test takes")
    data = np.full(limit // 4 + 64, -1, np.int32)
    big = shim.Buffer(data)
    big.device_malloc(device)
    a, b = _add_inputs(16)
    near = big.cropped(0, limit // 4 - 20, 16)
    near.set_min([0])
    add(a, b, near)
    past = big.cropped(0, limit // 4 + 8, 16)
    past.set_min([0])
    with pytest.raises(shim.DeviceError) as e:
        add(a, b, past)
    assert e.value.code == lib.halide_error_code_gpu_device_error
    assert "maxStorageBufferRange" in str(e.value)
    big.copy_to_host()
    np.testing.assert_array_equal(data[limit // 4 - 20:limit // 4 - 4], a.astype(np.int32) + b)
    assert np.all(data[limit // 4 + 8:limit // 4 + 24] == -1)


def test_memory_taken_between_two_elements_is_refused(add, device):
    """A DLPack producer's VkBuffer at a byte offset inside an int32 element: a kernel of Halide
    22 cannot be given its offset in elements."""
    base = shim.Buffer(np.zeros(32, np.int32))
    base.copy_to_device(device)
    capsule = base.__dlpack__(dl_device=(7, 0))
    tensor = tensor_of(capsule).dl_tensor
    tensor.byte_offset += 2
    tensor.shape[0] = 16
    between = shim.from_dlpack(VulkanCapsule(capsule))
    a, b = _add_inputs(16)
    with pytest.raises(shim.DeviceError) as e:
        add(a, b, between)
    assert e.value.code == lib.halide_error_code_gpu_device_error
    assert "does not start a whole number of elements of its type in" in str(e.value)


def test_a_halide22_kernel_without_its_uniform_buffer_is_refused(kernels, tmp_path):
    """A module whose header gives a Halide 22 kernel with arguments no uniform buffer (which
    Halide 22 never writes): the launch is refused, nothing runs, the process goes on."""
    damaged = [(kernel._replace(uniform_buffers=0), code) for kernel, code in kernels]
    add = shim.load(halide22_vulkan.build_library(halide22_vulkan.module_blob(damaged),
                                                  tmp_path, "damaged"), name="h22vk_add")
    a, b = _add_inputs(8)
    with pytest.raises(shim.DeviceError) as e:
        add(a, b, out=(8,))
    assert "declares no uniform buffer" in str(e.value)


# --- beside Halide 21 ---------------------------------------------------------------------------

def test_libraries_of_two_releases_share_a_module_each_by_its_own_convention(kernels, device,
                                                                            tmp_path):
    """One module source made first for code of Halide 21 (the test's own call, from no
    registered library), then called by a Halide 22 library: the module is made once, and each
    launches its kernels as its own release's code expects."""
    blob = halide22_vulkan.module_blob(kernels[::-1])  # (a source no other test made)
    initialize_kernels(blob)
    made = dict(device._modules)
    add = shim.load(halide22_vulkan.build_library(blob, tmp_path, "shared"), name="h22vk_add")
    parent = shim.Buffer(np.full(40, -1, np.int32))
    parent.copy_to_device(device)
    crop = parent.cropped(0, 9, 20)
    _misaligned(device, crop)
    crop.set_min([0])
    a, b = _add_inputs(20)
    add(a, b, crop)
    assert device._modules == made
    np.testing.assert_array_equal(parent.numpy()[9:29], a.astype(np.int32) + b)


def test_halide21_and_22_pipelines_in_one_process_from_threads(scale, crop_fill_21, device):
    """Halide 21's crop_fill into misaligned crops (staged around its launches) before, beside
    (six threads) and after Halide 22's scale into misaligned crops (in place)."""
    crop_fill = shim.load(crop_fill_21)
    assert crop_fill.release == "21"

    def fill_21(x0, param):
        data = np.full((10, 24), -1, np.int32)
        parent = shim.Buffer(data)
        parent.copy_to_device(device)
        crop = parent.cropped([(x0, 9), (1, 7)])
        _misaligned(device, crop)
        crop_fill(param=param, f=crop)
        parent.copy_to_host()
        ys, xs = np.mgrid[1:8, x0:x0 + 9]
        return np.array_equal(data[1:8, x0:x0 + 9], xs * 100 + ys + param * 10000) and \
            data[0, 0] == data[9, 23] == -1

    def scale_22(x0, gain):
        image = np.random.default_rng(x0).integers(-100, 100, (12, 30)).astype(np.float32)
        target = np.full((12, 30), -1, np.float32)
        src, dst = shim.Buffer(image), shim.Buffer(target)
        src.copy_to_device(device)
        dst.copy_to_device(device)
        inp, out = src.cropped([(x0, 11), (2, 6)]), dst.cropped([(x0 + 2, 11), (3, 6)])
        _misaligned(device, inp, out)
        inp.set_min([0, 0])
        out.set_min([0, 0])
        scale(inp, gain, 1, out)
        dst.copy_to_host()
        expected = np.full_like(target, -1)
        expected[3:9, x0 + 2:x0 + 13] = _scaled(image[2:8, x0:x0 + 11], gain, 1)
        return np.array_equal(target, expected)

    assert fill_21(1, 1)
    failures = []

    def work(index):
        x0 = 1 + index % 3
        for step in range(10):
            if not fill_21(x0, index + step):
                failures.append(("21", index, step))
            if not scale_22(x0, float(index + step)):
                failures.append(("22", index, step))

    run_threads(6, work)
    assert not failures
    assert fill_21(2, 7) and scale_22(3, 2.0)


# --- under Khronos's validation layer -----------------------------------------------------------

VALIDATED = """
import sys
import numpy as np
import shim

device = shim.device("vulkan")
scale = shim.load(sys.argv[1], name="h22vk_scale")
add = shim.load(sys.argv[1], name="h22vk_add")
crop_fill = shim.load(sys.argv[2])
rng = np.random.default_rng(0)
image = rng.integers(-100, 100, (33, 47)).astype(np.float32)
assert np.array_equal(scale(image, 2.0, 3, output=image.shape).numpy(), image * 2 + 3)
a = rng.integers(0, 256, 40, dtype=np.uint8)
b = rng.integers(-1000, 1000, 40, dtype=np.int16)
assert np.array_equal(add(a, b, out=(40,)).numpy(), a.astype(np.int32) + b)
src, dst = shim.Buffer(image), shim.Buffer(np.zeros((33, 47), np.float32))
src.copy_to_device(device)
dst.copy_to_device(device)
inp = src.cropped([(1, 20), (2, 9)]).cropped([(2, 10), (3, 5)])
out = dst.cropped([(3, 20), (5, 9)]).cropped([(5, 10), (6, 5)])
inp.set_min([0, 0])
out.set_min([0, 0])
scale(inp, 2.0, 3, out)
dst.copy_to_host()
assert np.array_equal(dst.numpy()[6:11, 5:15], image[3:8, 2:12] * 2 + 3)
rows = shim.Buffer(np.zeros(64, np.int32))
rows.copy_to_device(device)
row = rows.cropped(0, 7, 40)
row.set_min([0])
add(a, b, row)
assert np.array_equal(rows.numpy()[7:47], a.astype(np.int32) + b)
parent = shim.Buffer(np.full((20, 40), -7, np.int32))
parent.copy_to_device(device)
crop_fill(param=1, f=parent.cropped([(1, 6), (2, 5)]))  # Halide 21's: staged
assert parent.numpy()[2, 1] == 10102
print("done")
"""


def test_the_khronos_validation_layer_finds_nothing_in_halide22_launches(library, crop_fill_21):
    """Halide 22's kernels with scalars and with buffers only, on whole buffers and on crops
    of crops at offsets no descriptor may take, and a Halide 21 pipeline's staged crop in the
    same process, under Khronos's validation layer: not one message."""
    done = run_python(VALIDATED, str(library), str(crop_fill_21), env=validation_layer())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # (the layer writes what it finds to stdout)
    assert done.stdout.strip() == "done", done.stdout[-3000:]
    assert "VUID" not in done.stderr and "Validation" not in done.stderr, done.stderr[-3000:]
