"""What every GPU backend does alike, each test once per backend (the ``gpu`` fixture): on
the machine's OpenCL device (PoCL's CPU device from pip in CI), on its CUDA device (an
NVIDIA GPU: benchmarks/gpu_kit.py runs the CUDA half there) and on its Vulkan device (Mesa's
lavapipe, a CPU device, in CI). Halide-generated kernels run
through the shim, against Halide's stock runtime and numpy. A backend's half skips, saying
why, where this machine has no such device. What only one backend has is in test_opencl.py,
test_cuda.py and test_vulkan.py."""


import numpy as np
import pytest

import shim
from gpu_cases import build_libraries, cases, check_against_stock
from shim.native import lib
from shim.pipelines.build import RUNTIMES
from support.threads import run_threads


@pytest.fixture(scope="module")
def libraries(gpu):
    return build_libraries(gpu.kind)


@pytest.mark.parametrize("name", sorted(cases()))
def test_pipeline_matches_the_stock_runtime_and_numpy(libraries, gpu, name, tmp_path):
    check_against_stock(libraries, name, tmp_path, RUNTIMES, gpu.kind)


def test_device_buffers_pass_between_libraries_without_host_round_trips(libraries, gpu):
    bundled = shim.load(libraries["brighten", "bundled"])
    no_runtime = shim.load(libraries["brighten", "no_runtime"])
    image = np.random.default_rng(0).random((32, 40), dtype=np.float32)
    first = bundled(image, scale=2.0, offset=0.0, output=image.shape)
    before = (gpu.transfers.uploaded, gpu.transfers.downloaded)
    second = no_runtime(first, scale=0.5, offset=0.0, output=image.shape)  # no -42 here
    third = bundled(second, scale=4.0, offset=0.0, output=image.shape)
    assert (gpu.transfers.uploaded, gpu.transfers.downloaded) == before
    np.testing.assert_array_equal(third.numpy(), image * 4)  # powers of two: exact


# The crops' x offsets, in int32 elements; 1 (4 bytes) is misaligned for both. OpenCL launches
# a crop through a sub-buffer only where its offset is a multiple of the device's base address
# alignment (128 bytes on PoCL: 32 elements) and through the parent and an offset elsewhere, so
# its offsets take both paths; a CUDA crop is pointer arithmetic at any offset. Vulkan binds a
# crop in place at a multiple of minStorageBufferOffsetAlignment (16 bytes on lavapipe: 4
# elements) and stages it elsewhere. (How each
# backend's handle holds the offset: test_opencl.py and test_cuda.py.)
CROP_OFFSETS = {"opencl": [1, 32], "cuda": [1, 5], "vulkan": [1, 4]}


# (scope: the gpu fixture feeds the module's libraries, so its parameters cannot be narrower.)
@pytest.mark.parametrize("gpu, offset_x", [(kind, x) for kind, xs in CROP_OFFSETS.items() for x in xs],
                         indirect=["gpu"], scope="module")
def test_crops_at_any_offset(libraries, gpu, offset_x):
    crop_fill = shim.load(libraries["crop_fill", "no_runtime"])
    data = np.full((20, 40), -7, np.int32)
    parent = shim.Buffer(data)
    parent.copy_to_device(gpu)
    crop = parent.cropped([(offset_x, 6), (3, 5)])
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


def test_copies_of_a_crop_whose_planes_are_not_whole_rows_apart(gpu):
    """A crop of a 3D buffer with a plane stride of 513 elements and rows of 50: both drivers'
    rectangle copies take only slice pitches that are whole rows (OpenCL refuses others, CUDA
    gives the pitch as a row count), so planes go one by one."""
    memory = np.zeros(4 * 513, np.int32)
    planes = np.lib.stride_tricks.as_strided(memory, (4, 10, 50), (513 * 4, 200, 4))
    parent = shim.Buffer(planes)
    parent.copy_to_device(gpu)
    crop = parent.cropped([(5, 20), (1, 8), (1, 2)])
    planes[1:3, 1:9, 5:25] = np.arange(2 * 8 * 20).reshape(2, 8, 20)
    crop.set_host_dirty()
    crop.copy_to_device(gpu)  # upload
    expected = planes.copy()
    planes[1:3, 1:9, 5:25] = -1
    crop.set_device_dirty()
    crop.copy_to_host()  # download
    np.testing.assert_array_equal(planes, expected)


def test_many_threads_launch_the_same_kernels(libraries, gpu):
    brighten = shim.load(libraries["brighten", "no_runtime"])
    images = [np.full((16, 16), i, np.float32) for i in range(6)]
    failures = []

    def work(index):
        image = images[index]
        out = shim.Buffer(shape=image.shape, dtype=np.float32)
        source = shim.Buffer(image)
        for _ in range(40):
            brighten(source, scale=3.0, offset=0.0, output=out)
            if not np.array_equal(out.numpy(), image * 3):
                failures.append(image[0, 0])

    run_threads(len(images), work)
    assert not failures


def test_the_device_interface_is_halides(gpu):
    halides = getattr(lib, f"halide_{gpu.kind}_device_interface")  # Halide's name for it
    assert halides() == lib.shim_backend_interface(gpu.index)
