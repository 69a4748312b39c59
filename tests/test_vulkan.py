"""What only the Vulkan backend has, on the machine's Vulkan device (Mesa's lavapipe, a CPU
device, in CI): the API declarations against the Khronos headers, crops at offsets Vulkan
cannot bind (staged around each launch), Halide's stock runtime losing bytes the shim keeps,
modules made once, Halide's VkBuffer helpers and context hook, device selection by Halide's
variables, bad modules and launches as errors, threads, and forks. What every GPU backend does
alike is in test_gpu_backends.py."""

import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import shim
from gpu_cases import build_libraries, run_stock
from shim.backends.base import BackendError
from shim.native import ffi, lib
from shim.pipelines.build import RUNTIMES, Build, build
from support.sanitizers import THREADS_AFTER_FORK, unless
from support.threads import run_threads
from support.vulkan import (SELECTION, VulkanCapsule, initialize_kernels, run_python, tensor_of,
                            validation_layer)

NATIVE = pathlib.Path(__file__).resolve().parent.parent / "native_stubs"


def on_lavapipe(device) -> bool:
    return "llvmpipe" in device.name


@pytest.fixture(scope="module")
def device(vulkan):
    return vulkan


@pytest.fixture(scope="module")
def libraries(device):
    return build_libraries(device.kind)


# --- the API declarations -----------------------------------------------------------------

# Every struct and field the backend uses, and the constants whose values matter.
LAYOUT_PROBE = r"""
#include <stdio.h>
#include <stddef.h>
#include HEADER
#define S(T) printf(#T " %zu\n", sizeof(T));
#define F(T, f) printf(#T "." #f " %zu\n", offsetof(T, f));
int main(void) {
    S(VkApplicationInfo) S(VkInstanceCreateInfo) S(VkExtensionProperties)
    S(VkPhysicalDeviceLimits) F(VkPhysicalDeviceLimits, maxStorageBufferRange)
    F(VkPhysicalDeviceLimits, maxBoundDescriptorSets)
    F(VkPhysicalDeviceLimits, maxPerStageDescriptorStorageBuffers)
    F(VkPhysicalDeviceLimits, maxComputeSharedMemorySize)
    F(VkPhysicalDeviceLimits, minStorageBufferOffsetAlignment)
    F(VkPhysicalDeviceLimits, timestampPeriod) F(VkPhysicalDeviceLimits, nonCoherentAtomSize)
    S(VkPhysicalDeviceProperties) F(VkPhysicalDeviceProperties, deviceType)
    F(VkPhysicalDeviceProperties, deviceName) F(VkPhysicalDeviceProperties, limits)
    S(VkQueueFamilyProperties) S(VkPhysicalDeviceMemoryProperties)
    F(VkPhysicalDeviceMemoryProperties, memoryHeaps) S(VkPhysicalDeviceFeatures)
    S(VkPhysicalDeviceFeatures2) S(VkPhysicalDevice16BitStorageFeatures)
    S(VkPhysicalDevice8BitStorageFeatures) S(VkPhysicalDeviceShaderFloat16Int8Features)
    S(VkDeviceQueueCreateInfo) S(VkDeviceCreateInfo) F(VkDeviceCreateInfo, pEnabledFeatures)
    S(VkBufferCreateInfo) F(VkBufferCreateInfo, usage) S(VkMemoryRequirements)
    S(VkMemoryAllocateInfo) S(VkCommandPoolCreateInfo) S(VkCommandBufferAllocateInfo)
    S(VkCommandBufferBeginInfo) S(VkSubmitInfo) F(VkSubmitInfo, pCommandBuffers)
    S(VkFenceCreateInfo) S(VkBufferCopy) S(VkMemoryBarrier) S(VkShaderModuleCreateInfo)
    S(VkDescriptorSetLayoutBinding) S(VkDescriptorSetLayoutCreateInfo)
    S(VkPipelineLayoutCreateInfo) S(VkSpecializationMapEntry) S(VkSpecializationInfo)
    S(VkPipelineShaderStageCreateInfo) S(VkComputePipelineCreateInfo)
    F(VkComputePipelineCreateInfo, layout) S(VkDescriptorPoolSize) S(VkDescriptorPoolCreateInfo)
    S(VkDescriptorSetAllocateInfo) S(VkDescriptorBufferInfo) S(VkWriteDescriptorSet)
    F(VkWriteDescriptorSet, pBufferInfo)
    printf("%d %d %d %d %d\n", VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES,
           VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
           VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES,
           VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES,
           VK_ERROR_OUT_OF_POOL_MEMORY);
    return 0;
}
"""


def test_the_api_declarations_match_the_khronos_headers(tmp_path):
    """native_stubs/backends/vulkan_api.h declares the API without the SDK: each struct the
    same size, each field the backend reads at the same offset, as in vulkan_core.h."""
    khronos = pathlib.Path("/usr/include/vulkan/vulkan_core.h")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if not khronos.exists() or compiler is None:
        pytest.skip("the Khronos headers (Debian's libvulkan-dev) or a C compiler are not "
                    "installed: nothing to compare the declarations with")
    outputs = []
    for header in (f'"{NATIVE / "backends" / "vulkan_api.h"}"', "<vulkan/vulkan_core.h>"):
        source = tmp_path / "probe.c"
        source.write_text(LAYOUT_PROBE.replace("HEADER", header))
        subprocess.run([compiler, "-o", str(tmp_path / "probe"), str(source)], check=True)
        outputs.append(subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True,
                                      check=True).stdout)
    assert outputs[0] == outputs[1]


# --- the device -----------------------------------------------------------------------------

def test_the_device_and_its_facts(device):
    assert device.name and device.name in shim.backends.vulkan.VulkanBackend.available()
    assert device.compute_capability() >= (1, 0)  # the Vulkan version, as Halide reports it
    assert device.alignment >= 1 and device.alignment & (device.alignment - 1) == 0
    assert lib.halide_vulkan_is_initialized()
    assert ("vulkan", device.name) in shim.devices()


def test_the_context_hook_gives_the_shims_device(device):
    """halide_vulkan_acquire_context, for native code that makes VkBuffers to wrap: the shim's
    instance, device and queue, and no Halide allocator."""
    # (The hook takes Vulkan's handle types, which cffi is not given: called through a cast.)
    hook = ffi.cast("int (*)(void *, void **, void **, void **, void **, void **, uint32_t *, "
                    "uint64_t *, bool)", _symbol("halide_vulkan_acquire_context"))
    out = [ffi.new("void **") for _ in range(5)]
    family, messenger = ffi.new("uint32_t *"), ffi.new("uint64_t *")
    assert hook(ffi.NULL, *out, family, messenger, True) == 0
    allocator, instance, vk_device, physical, queue = (o[0] for o in out)
    assert allocator == ffi.NULL and messenger[0] == 0
    assert all(h != ffi.NULL for h in (instance, vk_device, physical, queue))


def _symbol(name: str):
    """The address of one of the native library's exported functions."""
    import ctypes

    import shim._native as native

    return ffi.cast("void *", ctypes.cast(getattr(ctypes.CDLL(native.__file__), name),
                                          ctypes.c_void_p).value)


# --- crops at any offset ----------------------------------------------------------------------

@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("offset_x", [1, 2, 3, 4, 5])
def test_a_crop_at_any_offset_as_output(libraries, device, runtime, offset_x):
    """crop_fill realized into crops whose start is each residue of the device's binding
    alignment (lavapipe: 16 bytes, 4 int32s): those at a multiple are bound in place, the
    others staged; the crop gets its values and nothing around it changes, the gaps between
    its rows included."""
    crop_fill = shim.load(libraries["crop_fill", runtime])
    data = np.full((20, 40), -7, np.int32)
    parent = shim.Buffer(data)
    parent.copy_to_device(device)
    crop = parent.cropped([(offset_x, 6), (3, 5)])
    handle = ffi.cast("shim_vk_handle *", crop.raw.device)
    assert handle.offset == (3 * 40 + offset_x) * 4
    with shim.profile() as prof:
        crop_fill(param=2, f=crop)
    staged = [r.launch["staged"] for r in prof.records if r.kind == "launch"]
    assert staged == [0 if handle.offset % device.alignment == 0 else 1], staged
    parent.copy_to_host()
    ys, xs = np.mgrid[3:8, offset_x:offset_x + 6]
    np.testing.assert_array_equal(data[3:8, offset_x:offset_x + 6], xs * 100 + ys + 20000)
    outside = np.ones(data.shape, bool)
    outside[3:8, offset_x:offset_x + 6] = False
    assert np.all(data[outside] == -7)


def test_misaligned_crops_as_inputs_and_outputs_of_one_call(libraries, device):
    """sum_diff reading two crops of one parent and writing two crops of another, every crop at
    an offset Vulkan cannot bind: each of its two launches stages three buffers."""
    sum_diff = shim.load(libraries["sum_diff", "no_runtime"])
    rng = np.random.default_rng(3)
    source = rng.integers(-1000, 1000, size=(30, 50), dtype=np.int32)
    results = np.zeros((30, 50), np.int32)
    src, dst = shim.Buffer(source), shim.Buffer(results)
    src.copy_to_device(device)
    dst.copy_to_device(device)
    a, b = src.cropped([(1, 20), (2, 9)]), src.cropped([(7, 20), (13, 9)])
    total, difference = dst.cropped([(3, 20), (1, 9)]), dst.cropped([(25, 20), (17, 9)])
    for crop in (a, b, total, difference):
        # (misaligned wherever the device's alignment is over 4 bytes: lavapipe's is 16)
        assert device.alignment <= 4 or \
            ffi.cast("shim_vk_handle *", crop.raw.device).offset % device.alignment != 0
        crop.set_min([0, 0])  # (one coordinate space for the call: each crop's own from 0)
    with shim.profile() as prof:
        sum_diff(a, b, total, difference)
    # (Halide 21's kernels take no offsets: each of the two kernels stages the three crops it
    # gets, both inputs and its output, and the profile says so)
    assert [r.launch["staged"] for r in prof.records if r.kind == "launch"] == [3, 3]
    sum_diff(a, b, total, difference)  # (unprofiled: the same)
    dst.copy_to_host()
    expected = np.zeros_like(results)
    expected[1:10, 3:23] = source[2:11, 1:21] + source[13:22, 7:27]
    expected[17:26, 25:45] = source[2:11, 1:21] - source[13:22, 7:27]
    np.testing.assert_array_equal(results, expected)


def test_a_misaligned_slice_as_input(libraries, device):
    """A slice of a 3-D buffer at an odd plane and column offset, read by brighten."""
    brighten = shim.load(libraries["brighten", "bundled"])
    volume = np.random.default_rng(4).random((3, 10, 17), dtype=np.float32)
    buf = shim.Buffer(volume)
    buf.copy_to_device(device)
    plane = buf.sliced(2, 1).cropped([(1, 15), (0, 10)])  # Halide order: x, y
    assert device.alignment <= 4 or \
        ffi.cast("shim_vk_handle *", plane.raw.device).offset % device.alignment != 0
    plane.set_min([0, 0])
    out = brighten(plane, scale=2.0, offset=0.0, output=(10, 15))
    np.testing.assert_array_equal(out.numpy(), volume[1, :, 1:16] * 2)  # powers of two: exact


def test_the_stock_runtime_drops_what_the_shim_keeps(libraries, device, tmp_path):
    """Halide 21's stock Vulkan runtime moves whole multiples of nonCoherentAtomSize only (64
    bytes on lavapipe): a 17x23 float image (1564 bytes) comes back with its last 7 values
    never written. The shim's copies move every byte."""
    if not on_lavapipe(device):
        pytest.skip(f"what the stock runtime loses was measured on lavapipe, not {device.name}")
    image = np.arange(17 * 23, dtype=np.float32).reshape(17, 23)
    values = {"input": image, "scale": 2.0, "offset": 1.0}
    outputs = {"output": ((17, 23), np.float32)}
    stock = run_stock(libraries["brighten", "bundled"], "brighten", values, outputs, tmp_path)
    expected = image * 2 + 1
    assert not np.array_equal(stock["output"], expected)  # (when this fails, Halide fixed it)
    assert np.array_equal(stock["output"].ravel()[:384], expected.ravel()[:384])
    for runtime in RUNTIMES:
        out = shim.load(libraries["brighten", runtime])(**values, output=(17, 23))
        np.testing.assert_array_equal(out.numpy(), expected)


# --- modules and launches -----------------------------------------------------------------------

def test_modules_are_made_once_per_source(libraries, device):
    """Each library's module is made at its first call; later calls, of it or of another
    library with the same kernels, make none."""
    for runtime in RUNTIMES:
        pipeline = shim.load(libraries["crop_fill", runtime])
        assert pipeline(param=0, f=(4, 4)).numpy()[0, 0] == 0
        made = dict(device._modules)
        for param in range(1, 4):
            assert pipeline(param=param, f=(4, 4)).numpy()[0, 0] == param * 10000
        assert device._modules == made
    source = b"(any bytes: the module is looked up by digest before anything parses it)"
    device._modules[__import__("hashlib").sha256(source).digest()] = sentinel = ffi.new("int *")
    try:
        assert device.module(source) is sentinel
    finally:
        device._modules.pop(__import__("hashlib").sha256(source).digest())


def _brighten_source(libraries, device, tmp_path) -> bytes:
    """brighten's Vulkan module, as its library hands it to the backend."""
    sources = []
    original = device.module
    device.module = lambda source: sources.append(source) or original(source)
    try:
        # A copy of the library, loaded afresh: its kernels' state is new, so its first call
        # hands the module's source to module().
        copy = tmp_path / "brighten-copy.so"
        shutil.copyfile(libraries["brighten", "no_runtime"], copy)
        brighten = shim.load(copy)
        np.testing.assert_array_equal(
            brighten(np.ones((4, 4), np.float32), scale=2.0, offset=0.0, output=(4, 4)).numpy(), 2)
    finally:
        device.module = original
    return sources[0]


@pytest.fixture
def brighten_state(libraries, device, tmp_path):
    """The state halide_vulkan_initialize_kernels gives code of the default release for
    brighten's module: what halide_vulkan_run takes."""
    return initialize_kernels(_brighten_source(libraries, device, tmp_path))[0]


@pytest.mark.parametrize("source", [b"", b"\x01\x00\x00\x00", b"\xff" * 64,
                                    np.array([1, 16, 3, 0x6f6f66, 99, 5, 0, 0],
                                             np.uint32).tobytes()],
                         ids=["empty", "no kernels", "garbage", "a lying header"])
def test_a_module_that_does_not_parse_is_a_device_error(device, source):
    with pytest.raises(shim.DeviceError) as e:
        initialize_kernels(source)
    assert "Vulkan" in str(e.value)


def test_modules_with_damaged_headers_are_refused_or_made_never_a_crash(libraries, device,
                                                                       tmp_path):
    """Every word of a real module's headers (the entry points before each SPIR-V module)
    replaced by other values, and the module cut short at each of them: each is refused with
    a DeviceError or made, and the process goes on. (The SPIR-V itself is the driver's to
    check; it gets only what starts with SPIR-V's magic number and fits in the module.)"""
    source = np.frombuffer(_brighten_source(libraries, device, tmp_path), np.uint32)
    spirv = int(np.flatnonzero(source == 0x07230203)[0])  # where the first SPIR-V starts
    rng = np.random.default_rng(11)
    outcomes = set()
    for index in range(spirv):
        for value in (0, 1, 0xFFFFFFFF, int(source[index]) + 1, int(rng.integers(0, 1 << 32))):
            damaged = source.copy()
            damaged[index] = value
            for candidate in (damaged.tobytes(), source[:index].tobytes()):
                try:
                    initialize_kernels(candidate)
                    outcomes.add("made")
                except shim.DeviceError as e:
                    assert "Vulkan" in str(e)
                    outcomes.add("refused")
    assert "refused" in outcomes


def test_launching_an_entry_point_the_module_lacks_is_a_device_error(device, brighten_state):
    buf = shim.Buffer(np.zeros(4, np.int32))
    buf.copy_to_device(device)
    sizes = ffi.new("size_t[]", [8, 0])
    args = ffi.new("void *[]", [buf.raw, ffi.NULL])
    is_buffer = ffi.new("int8_t[]", [1, 0])
    with pytest.raises(shim.DeviceError) as e:
        with shim.core.bridge.runtime_call("run") as check:
            check(lib.halide_vulkan_run(ffi.NULL, brighten_state, b"no_such_kernel", 1, 1, 1, 1,
                                        1, 1, 0, sizes, args, is_buffer))
    assert e.value.code == -29 and "no entry point no_such_kernel" in str(e.value)


def test_a_kernel_argument_off_the_device_is_a_device_error(device, brighten_state):
    host_only = shim.Buffer(np.zeros(4, np.int32))
    sizes = ffi.new("size_t[]", [8, 0])
    args = ffi.new("void *[]", [host_only.raw, ffi.NULL])
    is_buffer = ffi.new("int8_t[]", [1, 0])
    with pytest.raises(shim.DeviceError) as e:
        with shim.core.bridge.runtime_call("run") as check:
            check(lib.halide_vulkan_run(ffi.NULL, brighten_state, b"x", 1, 1, 1, 1, 1, 1, 0, sizes,
                                        args, is_buffer))
    assert "not on the Vulkan device" in str(e.value)


def test_an_allocation_the_device_cannot_make_is_a_backend_error(device):
    with pytest.raises(BackendError) as e:
        device._allocate_new(1 << 62)
    assert "VK_ERROR" in str(e.value)


# --- profiles ---------------------------------------------------------------------------------

def test_a_profile_times_launches_and_copies_on_the_device(libraries, device):
    """Each launch and copy gets device times from the queue's timestamps, on the queue's
    track, in the order the device ran them."""
    if not device._timestamps:
        pytest.skip(f"{device.name}'s compute queue has no timestamps")
    brighten = shim.load(libraries["brighten", "no_runtime"])
    image = np.ones((32, 32), np.float32)
    with shim.profile() as prof:
        out = brighten(image, scale=2.0, offset=1.0, output=image.shape)
        np.testing.assert_array_equal(out.numpy(), image * 3)
    launches = [r for r in prof.records if r.kind == "launch"]
    assert len(launches) == 1 and launches[0].backend == "vulkan"
    timed = [r for r in prof.records if r.device_ns is not None]
    assert launches[0] in timed and all(r.device_ns >= 0 for r in timed)
    assert {r.device_track for r in timed} == {f"Vulkan queue ({device.name})"}
    starts = [r.device_start_ns for r in sorted(timed, key=lambda r: r.start_ns)]
    assert starts == sorted(starts)


# --- allocations served in C (native_stubs/devices/served.c) ---------------------------------

def _served_live() -> int:
    return lib.shim_served_live(lib.SHIM_BACKEND_VULKAN, ffi.new("int64_t *"))


@pytest.fixture
def serve(device):
    def switch(on: bool) -> None:
        lib.shim_serve_allocations(lib.SHIM_BACKEND_VULKAN, on)

    yield switch
    switch(True)


def test_a_pipelines_own_buffers_never_reach_python(device, serve):
    """blur3x3's compute_root stage, allocated and freed at every call, served in C: the
    Python core's device_malloc and device_free never run (switched off, they do), the driver
    is asked for memory once, and the results are numpy's either way."""
    from gpu_cases import blur_reference
    from support.served import python_calls_during

    blur = shim.load(build(Build("blur3x3", "vulkan", "no_runtime")))
    image = (np.arange(34 * 70, dtype=np.uint16).reshape(34, 70) * 37) % 4099
    source, out = shim.Buffer(image), shim.Buffer(np.empty((32, 68), np.uint16))
    source.copy_to_device(device)
    out.device_malloc(device)
    blur(source, out)  # makes the module, and pools the stage's memory
    new = device.allocation_counts()["new"]
    for on in (True, False, True):
        serve(on)
        ran = {name.rsplit(".", 1)[1]
               for name in python_calls_during(lambda: blur(source, out), "shim.core.runtime")}
        assert ("device_malloc" in ran or "device_free" in ran) is not on, ran
        out.set_device_dirty()
        np.testing.assert_array_equal(out.numpy(), blur_reference(image))
    assert device.allocation_counts()["new"] == new
    assert _served_live() == 0


def test_a_served_allocation_becomes_pythons_when_python_needs_it(device, serve):
    """A bare struct's allocation, served in C, then cropped (in C too) and the crop copied
    home (which only the Python core does for a crop): it is adopted then, with its crop, the
    crop's VkBuffer is the parent's, its data goes through the device and back, and the free
    goes to the pool through Python."""
    from test_device_layer import raw_like

    start = _served_live()
    interface = lib.halide_vulkan_device_interface()
    parent = raw_like(np.arange(16 * 32, dtype=np.int32).reshape(16, 32), mins=(0, 0))
    assert lib.halide_device_malloc(ffi.NULL, parent.raw, interface) == 0
    assert _served_live() == start + 1
    parent.raw.flags |= lib.halide_buffer_flag_host_dirty
    assert lib.halide_copy_to_device(ffi.NULL, parent.raw, interface) == 0
    crop_host = np.zeros((4, 32), np.int32)
    crop = raw_like(crop_host[:, :8], mins=(9, 4))  # (36 bytes in: staged if a kernel took it)
    assert lib.halide_device_crop(ffi.NULL, parent.raw, crop.raw) == 0
    assert _served_live() == start + 1  # cropped in C (native_stubs/devices/served.c)
    assert lib.halide_vulkan_get_vk_buffer(ffi.NULL, crop.raw) == \
        lib.halide_vulkan_get_vk_buffer(ffi.NULL, parent.raw)
    crop.raw.flags = lib.halide_buffer_flag_device_dirty
    assert lib.halide_copy_to_host(ffi.NULL, crop.raw) == 0
    assert _served_live() == start  # adopted by the Python core
    np.testing.assert_array_equal(crop_host[:, :8], parent.array[4:8, 9:17])
    assert lib.halide_device_release_crop(ffi.NULL, crop.raw) == 0
    assert lib.halide_device_free(ffi.NULL, parent.raw) == 0
    assert parent.raw.device == 0 and _served_live() == start


def test_fresh_arrays_in_threads_with_served_allocations(libraries, device):
    """numpy arrays in and out of a GPU pipeline from four threads: the arrays' device memory
    served in C, each thread's results its own."""
    brighten = shim.load(libraries["brighten", "no_runtime"])
    failures = []

    def work(index):
        image = np.full((24, 40), index, np.float32)
        out = np.empty_like(image)
        for _ in range(30):
            brighten(image, 2.0, 1.0, out)
            if not np.array_equal(out, image * 2 + 1):
                failures.append(index)

    run_threads(4, work)
    assert not failures and _served_live() == 0


# --- native handles -----------------------------------------------------------------------------

def test_the_vk_buffer_helpers(device):
    """halide_vulkan_get_vk_buffer gives the VkBuffer (a crop: its parent's); a VkBuffer
    detached from one Buffer and wrapped by another is the same memory."""
    data = np.arange(64, dtype=np.int32).reshape(8, 8)
    first = shim.Buffer(data.copy())
    first.copy_to_device(device)
    vk_buffer = lib.halide_vulkan_get_vk_buffer(ffi.NULL, first.raw)
    assert vk_buffer != 0
    with shim.core.bridge.runtime_call("detach") as check:
        check(lib.halide_vulkan_detach_vk_buffer(ffi.NULL, first.raw))
    assert not first.has_device_allocation()
    second = shim.Buffer(np.zeros((8, 8), np.int32))
    second.set_host_dirty(False)
    with shim.core.bridge.runtime_call("wrap") as check:
        check(lib.halide_vulkan_wrap_vk_buffer(ffi.NULL, second.raw, vk_buffer))
    assert lib.halide_vulkan_get_vk_buffer(ffi.NULL, second.raw) == vk_buffer
    second.set_device_dirty()
    np.testing.assert_array_equal(second.numpy(), data)  # through the wrapped VkBuffer
    with shim.core.bridge.runtime_call("detach") as check:
        check(lib.halide_vulkan_detach_vk_buffer(ffi.NULL, second.raw))


def test_a_crops_vk_buffer_is_its_parents(device):
    parent = shim.Buffer(np.zeros((8, 8), np.int32))
    parent.copy_to_device(device)
    crop = parent.cropped(0, 1, 2)
    assert lib.halide_vulkan_get_vk_buffer(ffi.NULL, crop.raw) == \
        lib.halide_vulkan_get_vk_buffer(ffi.NULL, parent.raw) != 0


def test_the_vk_buffer_of_another_interfaces_memory_is_refused(device):
    buf = shim.Buffer(np.zeros(4, np.int32))
    buf.copy_to_device(shim.device("host"))
    with pytest.raises(shim.DeviceError) as e:
        with shim.core.bridge.runtime_call("get") as check:
            assert lib.halide_vulkan_get_vk_buffer(ffi.NULL, buf.raw) == 0
            check(-42)
    assert "another device interface" in str(e.value)


# --- DLPack -----------------------------------------------------------------------------------

class _AsVulkan:
    """A producer that hands a Buffer's memory over as kDLVulkan (what a Vulkan consumer asks)."""

    def __init__(self, buf):
        self.buf = buf

    def __dlpack_device__(self):
        return (7, 0)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return self.buf.__dlpack__(stream=stream, max_version=max_version, dl_device=(7, 0))


def test_dlpack_exports_host_memory_unless_vulkan_is_asked_for(libraries, device):
    brighten = shim.load(libraries["brighten", "no_runtime"])
    image = np.random.default_rng(6).random((8, 16), dtype=np.float32)
    out = brighten(image, scale=2.0, offset=0.0, output=image.shape)
    assert out.__dlpack_device__() == (1, 0)  # (as for OpenCL: no mainstream consumer reads it)
    np.testing.assert_array_equal(np.from_dlpack(out), image * 2)
    out.copy_to_device(device)
    imported = shim.from_dlpack(_AsVulkan(out))  # the VkBuffer itself, zero-copy
    assert lib.halide_vulkan_get_vk_buffer(ffi.NULL, imported.raw) == \
        lib.halide_vulkan_get_vk_buffer(ffi.NULL, out.raw)
    np.testing.assert_array_equal(imported.numpy(), image * 2)
    with pytest.raises(BufferError, match="no stream for Vulkan"):
        out.__dlpack__(stream=5, dl_device=(7, 0))


def test_dlpack_import_refuses_what_is_not_the_shims_vk_buffer(device):
    buf = shim.Buffer(np.zeros((4, 4), np.float32))
    buf.copy_to_device(device)
    capsule = buf.__dlpack__(dl_device=(7, 0))
    # The capsule's tensor, its data changed to a VkBuffer value nobody made.
    tensor_of(capsule).dl_tensor.data = ffi.cast("void *", 0x1234)
    with pytest.raises(shim.ArgumentError, match="not a VkBuffer of the shim's"):
        shim.from_dlpack(VulkanCapsule(capsule))


# --- threads --------------------------------------------------------------------------------------

def test_threads_launch_into_misaligned_crops_at_once(libraries, device):
    crop_fill = shim.load(libraries["crop_fill", "bundled"])
    failures = []

    def work(index):
        data = np.full((10, 24), -1, np.int32)
        parent = shim.Buffer(data)
        parent.copy_to_device(device)
        crop = parent.cropped([(1 + index % 3, 9), (1, 7)])
        for param in range(15):
            crop_fill(param=param, f=crop)
            parent.copy_to_host()
            x0 = 1 + index % 3
            ys, xs = np.mgrid[1:8, x0:x0 + 9]
            if not np.array_equal(data[1:8, x0:x0 + 9], xs * 100 + ys + param * 10000) or \
                    data[0, 0] != -1 or data[9, 23] != -1:
                failures.append((index, param))

    run_threads(6, work)
    assert not failures


# Halide's async GPU schedules (test_async.py runs them on OpenCL): a GPU stage overlapped with
# a CPU stage, FRAMES frames each.
OVERLAP = ["async_gpu_to_cpu", "async_cpu_to_gpu"]
FRAMES = 16


@pytest.mark.parametrize("name", OVERLAP)
def test_async_gpu_and_cpu_stages_on_vulkan(device, name, tmp_path):
    """Two threads calling an async pipeline on one device-resident input, a third reading
    that input meanwhile: every result is the stock runtime's, bit for bit, and numpy's."""
    paths = {runtime: build(Build(name, "vulkan", runtime)) for runtime in RUNTIMES}
    image = (np.arange(64 * 64) % 997).astype(np.int32).reshape(64, 64)
    expected = image * sum(range(1, FRAMES + 1))
    stock = run_stock(paths["bundled"], name, {"input": image},
                      {"output": (image.shape, np.int32)}, tmp_path)["output"]
    np.testing.assert_array_equal(stock, expected)
    shared = shim.Buffer(image)
    shared.copy_to_device(device)
    failures = []

    def work(index):
        if index == 2:  # the bystander
            for _ in range(50):
                if not np.array_equal(shared.numpy(), image):
                    failures.append("input")
            return
        pipeline = shim.load(paths[RUNTIMES[index]])
        for _ in range(20):
            if not np.array_equal(pipeline(shared, output=image.shape).numpy(), stock):
                failures.append(RUNTIMES[index])

    run_threads(3, work)
    assert not failures


STAGED = """
import sys
import numpy as np
import shim
from shim.pipelines.build import Build, build

vulkan = shim.device("vulkan")
assert not vulkan.maps_memory
rng = np.random.default_rng(9)
# Uploads and downloads of a whole buffer and of a crop with gaps between its rows.
data = rng.integers(-100, 100, size=(30, 50), dtype=np.int32)
buf = shim.Buffer(data.copy())
buf.copy_to_device(vulkan)
crop = buf.cropped([(3, 17), (5, 11)])
changed = rng.integers(-100, 100, size=(11, 17), dtype=np.int32)
buf.numpy()[5:16, 3:20] = changed
crop.set_host_dirty()
crop.copy_to_device(vulkan)
buf.numpy()[:] = 0
buf.set_device_dirty()
buf.copy_to_host()
expected = data.copy()
expected[5:16, 3:20] = changed
np.testing.assert_array_equal(buf.numpy(), expected)
# Device to device.
copy = buf.copy_on_device(vulkan)
np.testing.assert_array_equal(copy.numpy(), expected)
# Pipelines: fresh arrays, and misaligned and aligned crops of device-resident buffers.
brighten = shim.load(build(Build("brighten", "vulkan", sys.argv[1])))
image = rng.random((33, 47), dtype=np.float32)
np.testing.assert_array_equal(brighten(image, scale=2.0, offset=0.0, output=image.shape).numpy(),
                              image * 2)
crop_fill = shim.load(build(Build("crop_fill", "vulkan", sys.argv[1])))
parent = shim.Buffer(np.full((20, 40), -7, np.int32))
parent.copy_to_device(vulkan)
for x, y in ((1, 2), (4, 10)):  # (disjoint crops)
    crop_fill(param=x, f=parent.cropped([(x, 6), (y, 5)]))
parent.copy_to_host()
for x, y in ((1, 2), (4, 10)):
    ys, xs = np.mgrid[y:y + 5, x:x + 6]
    np.testing.assert_array_equal(parent.numpy()[y:y + 5, x:x + 6], xs * 100 + ys + x * 10000)
print("ok")
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("mode", ["staged copies", "staged copies, each launch waited for",
                                  "each launch waited for"])
def test_other_ways_of_copying_and_launching(device, runtime, mode):
    """Where a Buffer's memory is not host-visible (a discrete GPU's), every copy goes through
    a staging buffer and the driver's copies; where the device has no timeline semaphores,
    each launch is waited for. Forced on this device, the same work gives the same results."""
    env = {"HALIDE_SHIM_VULKAN_STAGED_COPIES": "0", "HALIDE_SHIM_VULKAN_WAIT_EACH_LAUNCH": "0"}
    if "staged" in mode:
        env["HALIDE_SHIM_VULKAN_STAGED_COPIES"] = "1"
    if "waited" in mode:
        env["HALIDE_SHIM_VULKAN_WAIT_EACH_LAUNCH"] = "1"
    script = STAGED.replace("assert not vulkan.maps_memory",
                            f"assert vulkan.maps_memory is {'staged' not in mode}\n"
                            f"assert not (vulkan.launches_async and {'waited' in mode})")
    done = run_python(script, runtime, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "ok"


def test_launches_left_running_are_waited_for_by_whatever_reads(libraries, device):
    """Two hundred launches into one crop, each overwriting the last, none waited for (where
    the device has timeline semaphores): the host reads the last one's values, and a crop of
    the same memory freed meanwhile is freed after the launches that used it."""
    crop_fill = shim.load(libraries["crop_fill", "no_runtime"])
    parent = shim.Buffer(np.full((64, 64), -1, np.int32))
    parent.copy_to_device(device)
    crop = parent.cropped([(3, 50), (5, 40)])
    with crop_fill.prepare(param=0, f=crop) as first:
        first()
    for param in range(200):
        crop_fill(param=param, f=crop)
    scratch = shim.Buffer(np.zeros((32, 32), np.int32))
    crop_fill(param=9, f=scratch)
    scratch.set_device_dirty(False)  # (its results are not wanted)
    scratch.device_free()  # its memory goes back while its launch may still run
    parent.copy_to_host()
    ys, xs = np.mgrid[5:45, 3:53]
    np.testing.assert_array_equal(parent.numpy()[5:45, 3:53], xs * 100 + ys + 199 * 10000)
    assert parent.numpy()[0, 0] == -1


# --- processes: device selection and forks ------------------------------------------------------

def test_the_device_type_variable_is_halides(device):
    """HL_VK_DEVICE_TYPE=cpu chooses the CPU device; a type the machine lacks falls back to
    the first device, as Halide's runtime does; and Halide's getter reads the variable."""
    done = run_python(SELECTION, env={"HL_VK_DEVICE_TYPE": "cpu"})
    assert done.returncode == 0, done.stderr
    if "llvmpipe" in device.name:
        assert done.stdout.startswith(f"device: {device.name} | cpu"), done.stdout
    done = run_python(SELECTION, env={"HL_VK_DEVICE_TYPE": "virtual-gpu"})
    assert done.returncode == 0 and done.stdout.startswith("device: "), done.stdout + done.stderr


EXTENSIONS = """
import shim
from shim.native import ffi, lib
names = ffi.string(lib.halide_vulkan_get_extension_names(ffi.NULL)).decode()
device = shim.device("vulkan")
print(names, "|", device.name)
"""


def test_extension_names_are_halides_and_unknown_ones_are_left_out(device):
    """HL_VK_EXTENSIONS as Halide's getter reads it; names the device lacks are left out (Halide
    21 enables none of them), so the device is made all the same."""
    wanted = "VK_KHR_shader_non_semantic_info:VK_SHIM_no_such_extension"
    done = run_python(EXTENSIONS, env={"HL_VK_EXTENSIONS": wanted})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{wanted} | {device.name}"


def test_a_layer_that_is_not_installed_makes_the_device_unavailable(device):
    done = run_python(SELECTION, env={"HL_VK_LAYERS": "VK_LAYER_SHIM_no_such_layer"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("unavailable:") and "VK_ERROR_LAYER_NOT_PRESENT" in done.stdout


NO_DEVICE = """
import sys
import numpy as np
import shim

brighten = shim.load(sys.argv[1])
try:
    brighten(np.ones((4, 4), np.float32), scale=2.0, offset=0.0, output=(4, 4))
except shim.ShimError as e:
    print(type(e).__name__, "|", e)
else:
    print("ran")
"""


def test_a_pipeline_without_a_usable_device_gets_an_error(libraries, device):
    """A Vulkan pipeline in a process whose device cannot be made (a layer that is not
    installed): the call raises with the reason, and the process goes on."""
    for runtime in RUNTIMES:
        done = run_python(NO_DEVICE, str(libraries["brighten", runtime]),
                           env={"HL_VK_LAYERS": "VK_LAYER_SHIM_no_such_layer"})
        assert done.returncode == 0, done.stderr
        assert "VK_ERROR_LAYER_NOT_PRESENT" in done.stdout and "ran" not in done.stdout, done.stdout


VALIDATED = """
import sys
import numpy as np
import shim
from shim.pipelines.build import Build, build

device = shim.device("vulkan")
rng = np.random.default_rng(0)
brighten = shim.load(build(Build("brighten", "vulkan", "no_runtime")))
image = rng.random((33, 47), dtype=np.float32)
assert np.array_equal(brighten(image, scale=2.0, offset=0.0, output=image.shape).numpy(), image * 2)
crop_fill = shim.load(build(Build("crop_fill", "vulkan", "bundled")))
parent = shim.Buffer(np.full((20, 40), -7, np.int32))
parent.copy_to_device(device)
for x, y in ((1, 2), (4, 10)):  # misaligned and aligned
    crop_fill(param=x, f=parent.cropped([(x, 6), (y, 5)]))
parent.copy_to_host()
assert parent.numpy()[2, 1] == 10102 and parent.numpy()[10, 4] == 40410
rows = shim.Buffer(np.full((301, 9), -7, np.int32))
rows.copy_to_device(device)
crop_fill(param=5, f=rows.cropped([(1, 8), (1, 300)]))  # 300 rows back: batches of regions
rows.copy_to_host()
assert rows.numpy()[300, 8] == 51100 and rows.numpy()[0, 0] == -7
read = shim.Buffer(image.copy())
read.copy_to_device(device)
staged = read.cropped([(1, 40), (0, 33)])  # staged, read only: never copied back
staged.set_min([0, 0])
assert np.array_equal(brighten(staged, scale=2.0, offset=0.0, output=(33, 40)).numpy(),
                      image[:, 1:41] * 2)
blur = shim.load(build(Build("blur3x3", "vulkan", "no_runtime")))
assert (blur(np.full((34, 70), 3, np.uint16), output=(32, 68)).numpy() == 3).all()
overlap = shim.load(build(Build("async_gpu_to_cpu", "vulkan", "no_runtime")))
assert (overlap(np.ones((64, 64), np.int32), output=(64, 64)).numpy() == 136).all()
with shim.profile():
    brighten(image, scale=2.0, offset=0.0, output=image.shape).numpy()
assert np.array_equal(parent.copy_on_device(device).numpy(), parent.numpy())
print("done")
"""

STOCK_CROP = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[2])
from pipelines.stock import StockRuntime

stock = StockRuntime(sys.argv[1], "const struct halide_device_interface_t "
                                  "*halide_vulkan_device_interface(void); int crop_fill_argv(void **);")
ffi, lib = stock.ffi, stock.lib
data = np.full((20, 40), -7, np.int32)


def buffer(host, mins, extents):
    dim = ffi.new("halide_dimension_t[2]", [(mins[0], extents[0], 1, 0), (mins[1], extents[1], 40, 0)])
    raw = ffi.new("halide_buffer_t *")
    raw.host = ffi.cast("uint8_t *", host)
    raw.type.code, raw.type.bits, raw.type.lanes = 0, 32, 1
    raw.dimensions, raw.dim = 2, dim
    return raw, dim


parent, _pd = buffer(data.ctypes.data, (0, 0), (40, 20))
parent.flags = 1
assert lib.halide_copy_to_device(ffi.NULL, parent, lib.halide_vulkan_device_interface()) == 0
crop, _cd = buffer(data.ctypes.data + (2 * 40 + 1) * 4, (1, 2), (6, 5))  # 324 bytes in
assert lib.halide_device_crop(ffi.NULL, parent, crop) == 0
param = ffi.new("struct halide_scalar_value_t *")
param.u.i32 = 1
print("run", lib.crop_fill_argv(ffi.new("void *[]", [param, crop])), flush=True)
# The device released while the validation layer is whole, as an application would: left to the
# runtime's destructor at exit, it runs after the layer's own statics are gone (a use after free
# inside the layer, which AddressSanitizer reports).
lib.halide_device_release(ffi.NULL, lib.halide_vulkan_device_interface())
"""


def test_the_khronos_validation_layer_finds_nothing_in_the_shims_vulkan_work(libraries, device):
    """Pipelines (misaligned and aligned crops, written and read, a stage of the pipeline's
    own, async stages), copies both ways and on the device, and a profile's timestamps, under
    Khronos's validation layer, the way copies and launches go by default, with staged copies,
    and with each launch waited for: not one message. Halide 21's own runtime, binding a crop at a 4-byte offset,
    breaks the rule the shim stages such crops for (minStorageBufferOffsetAlignment), which the
    layer names."""
    layer = validation_layer()
    for extra in ({}, {"HALIDE_SHIM_VULKAN_STAGED_COPIES": "1"},
                  {"HALIDE_SHIM_VULKAN_WAIT_EACH_LAUNCH": "1"}):
        done = run_python(VALIDATED, env={**layer, "HALIDE_SHIM_VULKAN_STAGED_COPIES": "0",
                                           "HALIDE_SHIM_VULKAN_WAIT_EACH_LAUNCH": "0", **extra})
        assert done.returncode == 0, done.stdout + done.stderr
        # (the layer writes what it finds to stdout)
        assert done.stdout.strip() == "done", (extra, done.stdout[-3000:] + done.stderr[-3000:])
        assert "VUID" not in done.stderr and "Validation" not in done.stderr, done.stderr[-3000:]
    root = pathlib.Path(__file__).resolve().parent.parent
    stock = subprocess.run([sys.executable, "-c", STOCK_CROP, str(libraries["crop_fill", "bundled"]),
                            str(root)], capture_output=True, text=True, cwd=root,
                           env={**os.environ, **layer})
    assert stock.returncode == 0, stock.stderr
    assert "VUID-VkWriteDescriptorSet-descriptorType-00328" in stock.stdout + stock.stderr


APPLICATION = """
import ctypes, sys
import numpy as np
import shim
from shim.native import ffi, lib
from shim.pipelines.build import Build, build

app = ctypes.CDLL(None)
app.app_make_buffer.restype = ctypes.c_uint64
app.app_make_buffer.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
app.app_device.restype = ctypes.c_uint64
app.app_read_buffer.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64]
device = shim.device("vulkan")
assert app.app_acquired() >= 1, "the shim did not take the application's context"
brighten = shim.load(build(Build("brighten", "vulkan", sys.argv[1])))
image = np.arange(16 * 32, dtype=np.float32).reshape(16, 32)
source = app.app_make_buffer(image.ctypes.data, image.nbytes)
zeros = np.zeros_like(image)  # (named: .ctypes.data of a temporary is freed before the call)
target = app.app_make_buffer(zeros.ctypes.data, zeros.nbytes)
assert source and target
inp, out = shim.Buffer(np.zeros_like(image)), shim.Buffer(np.zeros_like(image))
for buf, vk in ((inp, source), (out, target)):
    buf.set_host_dirty(False)
    assert lib.halide_vulkan_wrap_vk_buffer(ffi.NULL, buf.raw, vk) == 0
inp.set_device_dirty()
before = app.app_acquired()
brighten(inp, scale=2.0, offset=1.0, output=out)
device.sync()
assert app.app_acquired() > before, "submissions did not take the application's context"
seen = np.zeros_like(image)
assert app.app_read_buffer(target, seen.ctypes.data, seen.nbytes) == 0
np.testing.assert_array_equal(seen, image * 2 + 1)  # written into the application's VkBuffer
np.testing.assert_array_equal(out.numpy(), image * 2 + 1)  # and read back through the shim
for buf in (inp, out):
    assert lib.halide_vulkan_detach_vk_buffer(ffi.NULL, buf.raw) == 0
print("ok", device.name)
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_pipelines_run_on_an_applications_own_context(device, runtime, tmp_path):
    """Halide issue 8715's case: an application with a Vulkan instance, device and queue of its
    own, which it gives through Halide's halide_vulkan_acquire_context (defined by the
    application, here a preloaded library: tests/support/vulkan_application.c), wraps VkBuffers
    it made there. The shim takes that context instead of making one (through the hooks at
    every submission), and a pipeline reads one of the application's buffers and writes the
    other, which the application then reads through its own mapping."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the application")
    library = tmp_path / "vulkan_application.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-I", str(NATIVE), "-o", str(library),
                    str(pathlib.Path(__file__).parent / "support" / "vulkan_application.c"),
                    "-lpthread", "-ldl"], check=True)
    build(Build("brighten", "vulkan", runtime))
    # After any preload the environment has: a sanitizer's runtime must stay first
    # (.ci/sanitizers runs this file under one).
    preload = " ".join(filter(None, [os.environ.get("LD_PRELOAD"), str(library)]))
    done = run_python(APPLICATION, runtime, env={"LD_PRELOAD": preload})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("ok ")


FORK = """
import os, sys
import numpy as np
import shim

crop_fill = shim.load(sys.argv[1])
vulkan = shim.device("vulkan")
resident = crop_fill(param=1, f=(4, 4))
resident.set_device_dirty()


def refused(what, action):
    try:
        action()
    except shim.DeviceError as e:
        assert "parent process" in str(e) and "fork" in str(e), f"{what}: {e}"
        print(f"{what}: refused", flush=True)
        return
    raise AssertionError(f"{what}: no DeviceError")


pid = os.fork()
if pid == 0:
    refused("launch", lambda: crop_fill(param=2, f=(4, 4)))
    refused("upload", lambda: shim.Buffer(np.zeros(4, np.int32)).copy_to_device(vulkan))
    refused("download", resident.copy_to_host)
    sys.exit(0)
_, status = os.waitpid(pid, 0)
assert resident.numpy()[0, 0] == 10000  # the parent's device is intact
sys.exit(os.waitstatus_to_exitcode(status))
"""


@unless(THREADS_AFTER_FORK)
def test_a_forked_child_is_refused_the_device(libraries, device):
    done = run_python(FORK, str(libraries["crop_fill", "no_runtime"]))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split("\n")[:3] == ["launch: refused", "upload: refused",
                                           "download: refused"]


def test_the_bundled_runtime_is_the_shims(libraries, device):
    """A bundled Vulkan build calls the shim's entry points (the shim's library is loaded
    first), so its device memory is the shim's: a result of the bundled build goes into the
    no_runtime build without a copy, in either direction."""
    bundled = shim.load(libraries["brighten", "bundled"])
    no_runtime = shim.load(libraries["brighten", "no_runtime"])
    image = np.random.default_rng(5).random((16, 32), dtype=np.float32)
    first = bundled(image, scale=2.0, offset=0.0, output=image.shape)
    assert first.raw.device_interface == lib.halide_vulkan_device_interface()
    moved = (device.transfers.uploaded, device.transfers.downloaded)
    second = no_runtime(first, scale=4.0, offset=0.0, output=image.shape)
    assert (device.transfers.uploaded, device.transfers.downloaded) == moved
    np.testing.assert_array_equal(second.numpy(), image * 8)


def test_the_command_line_runs_on_vulkan(libraries, device, tmp_path):
    """python -m shim run --device vulkan (RunGen's flags), and info on a Vulkan build."""
    library = libraries["brighten", "no_runtime"]
    done = subprocess.run([sys.executable, "-m", "shim", "run", str(library), "--device", "vulkan",
                           "--input=random:1:[40,24]", "--scale=2", "--offset=1",
                           f"--output={tmp_path / 'out.npy'}"], capture_output=True, text=True,
                          cwd=pathlib.Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    assert "inputs on vulkan" in done.stdout
    out = np.load(tmp_path / "out.npy")
    assert out.shape == (24, 40) and out.dtype == np.float32
    done = subprocess.run([sys.executable, "-m", "shim", "info", str(libraries["brighten", "bundled"])],
                          capture_output=True, text=True,
                          cwd=pathlib.Path(__file__).resolve().parent.parent)
    assert done.returncode == 0 and "-vulkan" in done.stdout, done.stderr


def test_build_for_vulkan_is_in_the_build_tool():
    assert build(Build("brighten", "vulkan", "no_runtime")).name.startswith("brighten-vulkan-")
