"""Crops at offsets Vulkan cannot bind, staged around each launch by Halide 19's and 21's kernels
(native_stubs/backends/vulkan_kernels.c): what comes back after the kernel (only the crops its
SPIR-V may write: native_stubs/backends/vulkan_spirv.c), crops of any number of dimensions, and
the memory staging takes (bounded by a crop's dimensions, not its elements). Results against
numpy, in each crop and around it, on the device. The other staging tests, through the sample
pipelines, are in test_vulkan.py."""

import subprocess

import numpy as np
import pytest

import shim
from shim.native import ffi, lib
from shim.pipelines.build import Build, build
from support.halide22_vulkan import Kernel, glslang, module_blob
from support.staging import (OUTPUTS, SENTINEL, build_doubling, check_input_not_copied_back,
                             check_many_dimensions, device_contents)
from support.vulkan import initialize_kernels, run_python


@pytest.fixture(scope="module")
def device(vulkan):
    return vulkan


@pytest.fixture(scope="module")
def doubling(device, tmp_path_factory):
    """The doubling pipeline (support/staging.py) of a number of dimensions, built once each."""
    work, built = tmp_path_factory.mktemp("doubling"), {}

    def of(dims: int):
        if dims not in built:
            built[dims] = shim.load(build_doubling(work, dims, "vulkan"))
        return built[dims]

    return of


def _staged(device, buf) -> bool:
    return ffi.cast("shim_vk_handle *", buf.raw.device).offset % device.alignment != 0


# --- what comes back --------------------------------------------------------------------------

@pytest.mark.parametrize("output", OUTPUTS)
def test_a_staged_input_is_never_copied_back_over_what_the_kernel_wrote(doubling, device,
                                                                         output):
    check_input_not_copied_back(doubling(2), device, output)


# A kernel that writes its first buffer only with atomics, reading its second: Halide 21 makes
# no atomics for Vulkan, but its module format carries any SPIR-V.
ATOMIC_ADD = Kernel("_kernel_atomic_add", "atomic_add.comp", 0, 2)
ATOMIC_ADD_GLSL = """
#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer Out { int out_data[]; };
layout(set = 0, binding = 1) buffer In { int in_data[]; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    atomicAdd(out_data[i], in_data[i]);
}
"""


def test_a_crop_written_only_by_atomics_is_copied_back(device, tmp_path):
    """Two crops of the same misaligned elements: the kernel adds the second's values to the
    first's atomically. Only the first comes back: twice the old values (the first not copied
    back, or the second copied back after it: the old values)."""
    source = tmp_path / ATOMIC_ADD.glsl
    source.write_text(ATOMIC_ADD_GLSL)
    spirv = tmp_path / "atomic_add.spv"
    subprocess.run([glslang(), "-V", "-e", ATOMIC_ADD.name, "--source-entrypoint",
                    "main", "-o", str(spirv), str(source)], check=True, capture_output=True)
    state = initialize_kernels(module_blob([(ATOMIC_ADD, spirv.read_bytes())]))[0]
    data = np.arange(64, dtype=np.int32)
    parent = shim.Buffer(data.copy())
    parent.copy_to_device(device)
    out, read = parent.cropped(0, 1, 8), parent.cropped(0, 1, 8)
    assert device.alignment <= 4 or (_staged(device, out) and _staged(device, read))
    sizes = ffi.new("size_t[]", [8, 8, 0])
    args = ffi.new("void *[]", [out.raw, read.raw, ffi.NULL])
    is_buffer = ffi.new("int8_t[]", [1, 1, 0])
    with shim.core.bridge.runtime_call("run") as check:
        check(lib.halide_vulkan_run(ffi.NULL, state, ATOMIC_ADD.name.encode(), 8, 1, 1, 1, 1, 1,
                                    0, sizes, args, is_buffer))
    expected = data.copy()
    expected[1:9] *= 2
    np.testing.assert_array_equal(device_contents(parent), expected)


# --- dimensions and memory --------------------------------------------------------------------

@pytest.mark.parametrize("permuted", [False, True], ids=["in order", "permuted"])
@pytest.mark.parametrize("dims", [3, 6, 8, 24])
def test_misaligned_crops_of_many_dimensions(doubling, device, dims, permuted):
    """Halide's buffers have any number of dimensions (a shim.Buffer, numpy's 64): staging walks
    a crop with one counter per dimension, however many (24: past the 16 a fixed array held,
    which the walk overran)."""
    check_many_dimensions(doubling(dims), device, dims, permuted)


BIG_CROP = """
import sys

import numpy as np

import shim


def vm(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) << 10 for line in status if line.startswith(field + ":"))


device = shim.device("vulkan")
crop_fill = shim.load(sys.argv[1])
data = np.full((2049, 2049), SENTINEL, np.int32)
parent = shim.Buffer(data)
parent.copy_to_device(device)
crop_fill(param=1, f=parent.cropped([(1, 8), (1, 8)]))  # the staged launch's path, warm
crop_fill(param=1, f=parent.cropped([(0, 2048), (0, 2048)]))  # the big one aligned: in place
crop = parent.cropped([(1, 2048), (1, 2048)])
assert device.alignment <= 4 or \
    shim.native.ffi.cast("shim_vk_handle *", crop.raw.device).offset % device.alignment != 0
peak = vm("VmPeak")
crop_fill(param=2, f=crop)
# Above what stays mapped (the staging buffer, kept for later launches) and the peak before.
print(vm("VmPeak") - max(peak, vm("VmSize")))
parent.copy_to_host()
ys, xs = np.mgrid[0:2049, 0:2049]
expected = np.full((2049, 2049), SENTINEL, np.int32)
expected[:2048, :2048] = (xs * 100 + ys + 10000)[:2048, :2048]
expected[1:, 1:] = (xs * 100 + ys + 20000)[1:, 1:]
assert np.array_equal(data, expected)
"""


def test_a_big_misaligned_crop_is_staged_in_memory_bounded_by_its_dimensions(device):
    """A 2048 x 2048 crop (4M elements in 2048 rows) written through staging: the copies back
    are recorded a batch of regions at a time as the walk finds each row, where one region per
    element (96 MiB) was allocated before. Measured in a fresh process: its peak of address
    space over the launch, beyond what stays."""
    crop_fill = build(Build("crop_fill", "vulkan", "no_runtime"))
    done = run_python(BIG_CROP.replace("SENTINEL", str(SENTINEL)), str(crop_fill))
    assert done.returncode == 0, done.stderr[-3000:]
    transient = int(done.stdout.split()[-1])
    assert transient < 24 << 20, f"the launch took {transient >> 20} MiB more for a while"
