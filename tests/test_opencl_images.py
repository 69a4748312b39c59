"""OpenCL image memory (Halide's MemoryType::GPUTexture, halide_opencl_image_device_interface):
pipelines that store their arguments in textures, built in the run, give numpy's results
through the shim, bundled and no_runtime, from numpy arrays and from Buffers; crops and slices
of images work as crops of buffers do (Halide's runtime refuses them); and copies of any box of
an image move exactly its pixels (a Hypothesis property against a numpy model)."""

import subprocess

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import shim
from shim.backends.devices import device as device_of_kind
from shim.native import ffi, lib
from shim.native.regions import Layout, box_plan, mirror_plan
from support.threads import run_threads

hl = pytest.importorskip("halide", reason="building texture pipelines needs halide")

# name -> (dimensions, Halide type, numpy dtype)
VARIANTS = {
    "tex2_i32": (2, "Int(32)", np.int32),
    "tex1_i32": (1, "Int(32)", np.int32),
    "tex3_i32": (3, "Int(32)", np.int32),
    "tex2_f32": (2, "Float(32)", np.float32),
    "tex2_u8": (2, "UInt(8)", np.uint8),
}


@pytest.fixture(scope="module")
def images(opencl):
    backend = shim.device("opencl_image")
    if not opencl.images_supported:
        pytest.skip(f"{opencl.name} has no image memory")
    return backend


def _build(directory, name, dims, type_name, target):
    x, y, z = hl.Var("x"), hl.Var("y"), hl.Var("z")
    coords = [x, y, z][:dims]
    source = hl.ImageParam(eval(f"hl.{type_name}"), dims, "input")
    output = hl.Func("output")
    output[coords] = source[coords] * 2 + 1
    source.store_in(hl.MemoryType.GPUTexture)
    output.store_in(hl.MemoryType.GPUTexture)
    xo, yo, xi, yi = hl.Var(), hl.Var(), hl.Var(), hl.Var()
    if dims == 1:
        output.gpu_tile(x, xo, xi, 8)
    else:
        output.gpu_tile(x, y, xo, yo, xi, yi, 8, 8)
    obj, library = directory / f"{name}.o", directory / f"{name}.so"
    output.compile_to({hl.OutputFileType.object: str(obj)}, [source], name, hl.Target(target))
    subprocess.run(["cc", "-shared", "-o", library, obj, "-lpthread", "-ldl"], check=True)
    return str(library)


@pytest.fixture(scope="module")
def texture_pipelines(images, tmp_path_factory):
    """{(name, runtime): path}: each variant no_runtime; the 2-D int32 one bundled too."""
    directory = tmp_path_factory.mktemp("textures")
    built = {}
    for name, (dims, type_name, _) in VARIANTS.items():
        built[name, "no_runtime"] = _build(directory, name, dims, type_name,
                                           "host-opencl-no_runtime")
    built["tex2_i32", "bundled"] = _build(directory, "tex2_i32_bundled", 2, "Int(32)",
                                          "host-opencl")
    return built


def _expected(array):
    return (array * 2 + 1).astype(array.dtype)


def _array(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, 100, shape).astype(dtype)


SHAPES = {1: (40,), 2: (24, 40), 3: (3, 16, 24)}


@pytest.mark.parametrize("key", [(name, "no_runtime") for name in VARIANTS]
                         + [("tex2_i32", "bundled")], ids="-".join)
def test_numpy_arrays_through_a_texture_pipeline(texture_pipelines, key):
    name, _ = key
    dims, _, dtype = VARIANTS[name]
    pipeline = shim.load(texture_pipelines[key])
    source = _array(SHAPES[dims], dtype)
    np.testing.assert_array_equal(np.asarray(pipeline(source)), _expected(source))
    out = np.zeros_like(source)
    pipeline(source, out)
    np.testing.assert_array_equal(out, _expected(source))


def test_buffers_end_up_in_image_memory_as_halide_puts_them(texture_pipelines):
    # What Halide's gpu_texture test checks of its own runtime: the pipeline moved its input to
    # the image interface. (Its output, a plain buffer here, is the OpenCL backend's.)
    pipeline = shim.load(texture_pipelines["tex2_i32", "no_runtime"])
    source = _array((32, 32), np.int32)
    inp, out = shim.Buffer(source), shim.Buffer(np.zeros_like(source))
    inp.set_host_dirty()
    pipeline(inp, out)
    assert inp.raw.device_interface == lib.halide_opencl_image_device_interface()
    assert inp.device.kind == "opencl_image"
    out.copy_to_host()
    np.testing.assert_array_equal(out.numpy(), _expected(source))


def test_a_buffer_in_buffer_memory_moves_to_images_with_its_data(texture_pipelines, opencl):
    # Halide refuses to switch interfaces; between OpenCL's two kinds of memory the shim moves
    # the buffer, its device-only data first.
    pipeline = shim.load(texture_pipelines["tex2_i32", "no_runtime"])
    source = _array((16, 24), np.int32)
    inp = shim.Buffer(np.zeros_like(source))
    inp.copy_to_device(opencl)
    on_device = shim.Buffer(source)
    on_device.copy_to_device(opencl)
    inp.copy_from(on_device)  # the data only the device holds now
    del on_device
    out = np.zeros_like(source)
    pipeline(inp, out)
    np.testing.assert_array_equal(out, _expected(source))
    assert inp.device.kind == "opencl_image"


def test_crops_of_images(texture_pipelines, images, opencl):
    # Halide's runtime refuses any crop of an image but the whole image: here a crop aliases
    # its image (staged into an image of its own around the launch).
    pipeline = shim.load(texture_pipelines["tex3_i32", "no_runtime"])
    source = _array((4, 20, 30), np.int32, seed=1)
    whole_in = shim.Buffer(source)
    whole_in.copy_to_device(images)
    whole_out = shim.Buffer(np.full_like(source, -7))
    whole_out.copy_to_device(opencl)  # (the pipeline writes a plain buffer)
    box = [(5, 11), (3, 9), (1, 2)]  # x, y, z: (min, extent)
    crop_in, crop_out = whole_in.cropped(rect=box), whole_out.cropped(rect=box)
    pipeline(crop_in, crop_out)
    del crop_in, crop_out
    whole_out.copy_to_host()
    expected = np.full_like(source, -7)
    region = np.s_[1:3, 3:12, 5:16]
    expected[region] = _expected(source[region])
    np.testing.assert_array_equal(whole_out.numpy(), expected)
    # A slice of z of a 3-D image is a 2-D crop in the image's own axes.
    pipeline2 = shim.load(texture_pipelines["tex2_i32", "no_runtime"])
    plane = whole_in.sliced(2, 3)
    np.testing.assert_array_equal(np.asarray(pipeline2(plane)), _expected(source[3]))


def test_a_slice_across_an_images_rows_fails_clearly(texture_pipelines, images):
    pipeline = shim.load(texture_pipelines["tex2_i32", "no_runtime"])
    whole = shim.Buffer(_array((8, 20, 32), np.int32))
    whole.copy_to_device(images)
    across = whole.sliced(1, 5)  # x and z: not the image's x and y
    with pytest.raises(shim.ShimError, match="not the image's x, y, z in order"):
        pipeline(across, np.zeros((8, 32), np.int32))


@pytest.mark.parametrize("on_device", [True, False], ids=["image", "host"])
def test_a_transposed_view_of_a_3d_image_is_never_launched_as_the_image(texture_pipelines,
                                                                        images, on_device):
    # It starts where the image does, with its dimensions, but its y and z are the image's z
    # and y: a kernel given the image itself would read the wrong pixels (found by an
    # adversarial pass). It is staged, which refuses it, as Halide's runtime refuses a buffer
    # that is not dense from x up.
    pipeline = shim.load(texture_pipelines["tex3_i32", "no_runtime"])
    source = _array((16, 8, 24), np.int32, seed=3)
    whole = shim.Buffer(source)
    if on_device:
        whole.copy_to_device(images)
    view = whole.transposed(1, 2)
    expected = _expected(np.ascontiguousarray(np.swapaxes(source, 0, 1)))
    try:
        result = np.asarray(pipeline(view))
    except shim.ShimError as e:
        assert "not the image's x, y, z in order" in str(e) or "dense from its first" in str(e)
    else:
        np.testing.assert_array_equal(result, expected)


def test_images_refuse_what_opencl_cannot_hold(images):
    with pytest.raises(shim.ShimError, match="OpenCL images hold"):
        shim.Buffer(np.zeros((4, 4), np.float64)).copy_to_device(images)
    with pytest.raises(shim.ShimError, match="1 to 3 dimensions"):
        shim.Buffer(np.zeros((2, 2, 2, 2), np.int32)).copy_to_device(images)
    padded = np.zeros((8, 10), np.int32)[:, :6]  # rows 10 elements apart, 6 wide
    with pytest.raises(shim.ShimError, match="dense from its first dimension"):
        shim.Buffer(padded).copy_to_device(images)


def test_threads_calling_a_texture_pipeline_at_once(texture_pipelines):
    pipeline = shim.load(texture_pipelines["tex2_i32", "no_runtime"])

    def work(seed):
        for i in range(10):
            source = _array((17 + seed, 23 + i), np.int32, seed=seed * 100 + i)
            np.testing.assert_array_equal(np.asarray(pipeline(source)), _expected(source))

    run_threads(4, work)


# --- copies of boxes, against a numpy model ----------------------------------------------------

@st.composite
def image_and_box(draw):
    dims = draw(st.integers(1, 3))
    extents = [draw(st.integers(1, 9)) for _ in range(dims)]
    box = []
    for extent in extents:
        lo = draw(st.integers(0, extent - 1))
        box.append((lo, draw(st.integers(1, extent - lo))))
    dtype = draw(st.sampled_from([np.uint8, np.int16, np.int32, np.float32]))
    return extents, box, dtype


@settings(max_examples=60, deadline=None)
@given(image_and_box(), st.integers(0, 2**32 - 1))
def test_box_copies_move_exactly_the_boxes_pixels(images, case, seed):
    extents, box, dtype = case
    itemsize = np.dtype(dtype).itemsize
    strides, stride = [], itemsize
    for extent in extents:
        strides.append(stride)
        stride *= extent
    layout = Layout(itemsize, (0,) * len(extents), tuple(extents), tuple(strides))
    code = {"u": 1, "i": 0, "f": 2}[np.dtype(dtype).kind]
    memory = images.allocate_for(layout, code, layout.nbytes_span)
    try:
        rng = np.random.default_rng(seed)
        shape = tuple(reversed(extents))  # numpy's order: x last
        before = rng.integers(0, 255, layout.nbytes_span, dtype=np.uint8)
        images.write(memory, mirror_plan(layout, 0, to_device=True), _address(before))
        update = rng.integers(0, 255, layout.nbytes_span, dtype=np.uint8)
        images.write(memory, box_plan(layout, box, 0, to_device=True), _address(update))
        after = np.zeros(layout.nbytes_span, np.uint8)
        images.read(memory, mirror_plan(layout, 0, to_device=False), _address(after))
        model = before.view(dtype).reshape(shape).copy()
        region = tuple(slice(lo, lo + n) for lo, n in reversed(box))
        model[region] = update.view(dtype).reshape(shape)[region]
        np.testing.assert_array_equal(after.view(dtype).reshape(shape), model)
        # And a read of the box alone brings exactly its pixels.
        partial = np.zeros(layout.nbytes_span, np.uint8)
        images.read(memory, box_plan(layout, box, 0, to_device=False), _address(partial))
        expected = np.zeros(shape, dtype)
        expected[region] = model[region]
        np.testing.assert_array_equal(partial.view(dtype).reshape(shape), expected)
    finally:
        images.free(memory)


def _address(array) -> int:
    return int(ffi.cast("uintptr_t", ffi.from_buffer(array)))


def test_the_image_kind_is_the_opencl_devices(images, opencl):
    assert device_of_kind("opencl_image") is images
    assert images.buffers is opencl
    assert shim.devices()  # (lists it without creating anything more)
    assert ("opencl_image", opencl.name) in shim.devices()
