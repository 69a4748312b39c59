"""What only the CUDA backend has, on an NVIDIA GPU: crops as pointer arithmetic, the caller's
streams, Halide's device pointer helpers, wrapped device memory, DLPack's stream rules. What
every GPU backend does alike is in test_gpu_backends.py. Every test skips where this machine
has no CUDA device (no driver, or no GPU); benchmarks/gpu_kit.py runs them on a GPU machine."""

import numpy as np
import pytest

import shim
from gpu_cases import build_libraries
from shim.backends import cuda as cuda_backend
from shim.native import ffi, lib
from support.producers import Producer


@pytest.fixture(scope="module")
def device(cuda):
    return cuda


@pytest.fixture(scope="module")
def libraries(device):
    return build_libraries(device.kind)


@pytest.mark.parametrize("offset_x", [1, 5])
def test_a_crop_is_its_parents_pointer_plus_its_offset(device, offset_x):
    """A crop's handle is a plain device pointer, its parent's plus the offset, at any offset.
    (Kernels writing through crops: test_gpu_backends.py.)"""
    parent = shim.Buffer(np.zeros((20, 40), np.int32))
    parent.copy_to_device(device)
    crop = parent.cropped([(offset_x, 6), (3, 5)])
    assert crop.raw.device == parent.raw.device + (3 * 40 + offset_x) * 4


def test_pipelines_run_on_the_stream_the_caller_chooses(libraries, device):
    driver = cuda_backend._driver()
    stream = cuda_backend._check(driver.cuStreamCreate(1), "cuStreamCreate")  # non-blocking
    brighten = shim.load(libraries["brighten", "no_runtime"])
    image = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    with shim.stream(int(stream)):
        out = brighten(image, scale=2.0, offset=0.0, output=image.shape)
        result = out.numpy()  # the download is ordered after the kernel on that stream
    np.testing.assert_array_equal(result, image * 2)
    cuda_backend._check(driver.cuStreamDestroy(stream), "cuStreamDestroy")


def test_the_handle_helpers_are_halides(device):
    buf = shim.Buffer(np.zeros((4, 4), np.float32))
    buf.device_malloc(device)
    assert lib.halide_cuda_get_device_ptr(ffi.NULL, buf.raw) == buf.raw.device
    major, minor = device.compute_capability()
    assert major >= 5


def test_wrapping_device_memory(device):
    driver = cuda_backend._driver()
    data = np.arange(16, dtype=np.int32)
    pointer = int(cuda_backend._check(driver.cuMemAlloc(data.nbytes), "cuMemAlloc"))
    cuda_backend._check(driver.cuMemcpyHtoD(pointer, data.ctypes.data, data.nbytes), "cuMemcpyHtoD")
    buf = shim.Buffer(np.zeros(16, np.int32))
    buf.set_host_dirty(False)
    with shim.core.bridge.runtime_call("wrap") as check:
        check(lib.halide_cuda_wrap_device_ptr(ffi.NULL, buf.raw, pointer))
    buf.set_device_dirty()
    np.testing.assert_array_equal(buf.numpy(), data)
    with shim.core.bridge.runtime_call("detach") as check:
        check(lib.halide_cuda_detach_device_ptr(ffi.NULL, buf.raw))
    assert not buf.has_device_allocation()
    cuda_backend._check(driver.cuMemFree(pointer), "cuMemFree")


# --- DLPack: the stream rules ------------------------------------------------------------

def _read_on_stream(tensor, nbytes: int, stream: int) -> np.ndarray:
    """Copy a consumed DLTensor's memory to the host on ``stream``, as a consumer would."""
    driver = cuda_backend._driver()
    host = np.empty(nbytes, np.uint8)
    pointer = int(ffi.cast("uintptr_t", tensor.data)) + int(tensor.byte_offset)
    cuda_backend._check(driver.cuMemcpyDtoHAsync(host.ctypes.data, pointer, nbytes, stream),
                        "cuMemcpyDtoHAsync")
    cuda_backend._check(driver.cuStreamSynchronize(stream), "cuStreamSynchronize")
    return host


def test_dlpack_stream_values(device):
    buf = shim.Buffer(np.zeros(8, np.float32))
    buf.copy_to_device(device)
    assert buf.__dlpack_device__() == (2, device.ordinal)
    with pytest.raises(ValueError, match="ambiguous"):
        buf.__dlpack__(stream=0)
    with pytest.raises(ValueError, match="stream"):
        buf.__dlpack__(stream=-7)
    for stream in (None, 1, 2, -1):  # legacy default, per-thread default, no synchronization
        assert buf.__dlpack__(stream=stream, max_version=(1, 0)) is not None


def test_a_consumer_stream_waits_for_the_kernels_without_a_device_sync(libraries, device,
                                                                       monkeypatch):
    from shim.exchange import dlpack_capsules

    driver = cuda_backend._driver()
    producer = int(cuda_backend._check(driver.cuStreamCreate(1), "cuStreamCreate"))
    consumer = int(cuda_backend._check(driver.cuStreamCreate(1), "cuStreamCreate"))
    brighten = shim.load(libraries["brighten", "no_runtime"])
    image = np.random.default_rng(4).random((2048, 2048), dtype=np.float32)
    with shim.stream(producer):
        out = brighten(image, scale=2.0, offset=1.0, output=image.shape)
    monkeypatch.setattr(device, "sync", lambda: pytest.fail("a device-wide synchronization"))
    imported = dlpack_capsules.ImportedTensor(Producer(out), consumer)  # __dlpack__(stream=consumer)
    host = _read_on_stream(imported.managed.dl_tensor, image.nbytes, consumer).view(np.float32)
    np.testing.assert_array_equal(host.reshape(image.shape), image * 2 + 1)
    del imported
    for stream in (producer, consumer):
        cuda_backend._check(driver.cuStreamDestroy(stream), "cuStreamDestroy")


def test_the_shim_as_consumer_passes_its_own_stream(device):
    driver = cuda_backend._driver()
    stream = int(cuda_backend._check(driver.cuStreamCreate(1), "cuStreamCreate"))
    source = shim.Buffer(np.arange(10, dtype=np.int32))
    source.copy_to_device(device)
    producer = Producer(source)
    shim.from_dlpack(producer)
    with shim.stream(stream):
        imported = shim.from_dlpack(producer)
    # Outside any shim.stream, DLPack's legacy default stream.
    assert [call["stream"] for call in producer.calls] == [1, stream]
    assert imported.raw.device == source.raw.device  # the same memory, not a copy
    np.testing.assert_array_equal(imported.numpy(), np.arange(10))
    cuda_backend._check(driver.cuStreamDestroy(stream), "cuStreamDestroy")


def test_a_stream_ordered_chain_through_dlpack(libraries, device):
    driver = cuda_backend._driver()
    stream = int(cuda_backend._check(driver.cuStreamCreate(1), "cuStreamCreate"))
    brighten = shim.load(libraries["brighten", "no_runtime"])
    image = np.random.default_rng(5).random((512, 512), dtype=np.float32)
    with shim.stream(stream):
        first = brighten(image, scale=2.0, offset=0.0, output=image.shape)
        handed_over = shim.from_dlpack(Producer(first))  # a library boundary, same stream
        second = brighten(handed_over, scale=0.5, offset=0.0, output=image.shape)
        result = second.numpy()
    np.testing.assert_array_equal(result, image)
    cuda_backend._check(driver.cuStreamDestroy(stream), "cuStreamDestroy")
