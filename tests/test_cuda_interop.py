"""DLPack and the CUDA Array Interface between the shim and real CUDA libraries, PyTorch and
CuPy, on the GPU: zero-copy both ways (the consumer's data pointer is the producer's device
memory) and stream-ordered (a result made on one non-default stream is read correctly on
another, with no device-wide synchronization, while the producing stream is held back by a
kernel that only spins).
Every test skips where this machine has no CUDA device, and where torch (with CUDA) or CuPy is
not installed. (The stream rules with a stand-in producer are in test_cuda.py.)"""

import numpy as np
import pytest

import shim
from shim.pipelines.build import RUNTIMES, Build, build_all

SPIN_CYCLES = 100_000_000  # some 50 ms at the GPU's clock: the consumer must not read before
SHAPE = (1024, 1536)


@pytest.fixture(scope="module")
def device(cuda):
    return cuda


@pytest.fixture(scope="module")
def libraries(device):
    specs = [Build("brighten", "cuda", runtime) for runtime in RUNTIMES]
    return {s.runtime: path for s, path in build_all(specs, progress=None).items()}


@pytest.fixture(scope="module")
def brighten(libraries):
    return shim.load(libraries["no_runtime"])


@pytest.fixture(scope="module")
def torch(device):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e '.[torch]')")
    if not torch.cuda.is_available():
        pytest.skip(f"this PyTorch ({torch.__version__}) has no CUDA")
    return torch


@pytest.fixture(scope="module")
def cupy(device):
    return pytest.importorskip("cupy", reason="CuPy is not installed (pip install cupy-cuda12x or -cuda13x)")


@pytest.fixture(scope="module")
def spin(cupy):
    """spin(cycles): a one-thread kernel that busy-waits on CuPy's current stream."""
    kernel = cupy.RawKernel(r"""
        extern "C" __global__ void spin(long long cycles) {
            long long start = clock64();
            while (clock64() - start < cycles) {}
        }""", "spin")
    return lambda cycles: kernel((1,), (1,), (np.int64(cycles),))


def image(seed=0):
    return np.random.default_rng(seed).random(SHAPE, dtype=np.float32)


# --- zero-copy -----------------------------------------------------------------------------

@pytest.mark.parametrize("runtime", RUNTIMES)
def test_torch_round_trip_is_zero_copy(libraries, device, torch, runtime):
    brighten = shim.load(libraries[runtime])
    x = torch.from_numpy(image(1)).cuda()
    imported = shim.from_dlpack(x)
    assert imported.raw.device == x.data_ptr()  # the tensor's memory, not a copy
    out = brighten(imported, scale=2.0, offset=1.0, output=SHAPE)
    y = torch.from_dlpack(out)
    assert y.is_cuda and y.data_ptr() == out.raw.device
    torch.testing.assert_close(y, x * 2 + 1, rtol=2e-7, atol=0)
    y.fill_(5)  # one memory: written through torch, read through the shim
    torch.cuda.synchronize()
    np.testing.assert_array_equal(out.numpy(), 5)


def test_a_torch_output_is_written_in_place(brighten, device, torch):
    x = torch.from_numpy(image(2)).cuda()
    target = torch.zeros(SHAPE, device="cuda")
    result = brighten(x, scale=0.5, offset=0.0, output=target)
    assert result is target
    torch.cuda.synchronize()
    torch.testing.assert_close(target, x * 0.5, rtol=2e-7, atol=0)


def test_cupy_round_trip_is_zero_copy(brighten, device, cupy):
    x = cupy.asarray(image(3))
    imported = shim.from_dlpack(x)
    assert imported.raw.device == x.data.ptr
    out = brighten(imported, scale=2.0, offset=1.0, output=SHAPE)
    y = cupy.from_dlpack(out)
    assert y.data.ptr == out.raw.device
    cupy.testing.assert_allclose(y, x * 2 + 1, rtol=2e-7, atol=0)
    y.fill(5)
    cupy.cuda.Device().synchronize()
    np.testing.assert_array_equal(out.numpy(), 5)


# --- stream order: the producer's stream is held back, the consumer must wait for it -------

def test_shim_result_on_a_stream_read_by_torch_on_another(brighten, device, torch):
    data = image(4)
    x = shim.Buffer(data)
    x.copy_to_device(device)
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(producer):
        torch.cuda._sleep(SPIN_CYCLES)  # the pipeline's kernels run after this, on producer
    with shim.stream(producer.cuda_stream):
        out = brighten(x, scale=2.0, offset=1.0, output=SHAPE)
    with torch.cuda.stream(consumer):
        y = torch.from_dlpack(out)  # __dlpack__(stream=consumer): consumer waits for producer
        copy = y.clone()
    consumer.synchronize()
    assert y.data_ptr() == out.raw.device
    np.testing.assert_allclose(copy.cpu().numpy(), data * 2 + 1, rtol=2e-7, atol=0)
    np.testing.assert_allclose(out.numpy(), data * 2 + 1, rtol=2e-7, atol=0)


def test_torch_result_on_a_stream_read_by_the_shim_on_another(brighten, device, torch):
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(producer):
        torch.cuda._sleep(SPIN_CYCLES)
        x = torch.full(SHAPE, 3.0, device="cuda")  # written after the spin, on producer
        with shim.stream(consumer.cuda_stream):
            imported = shim.from_dlpack(x)  # torch makes consumer wait for producer
            out = brighten(imported, scale=2.0, offset=1.0, output=SHAPE)  # on consumer
            result = out.numpy()  # downloaded on consumer, after the kernel
    assert imported.raw.device == x.data_ptr()
    np.testing.assert_array_equal(result, 7)


def test_shim_result_on_a_stream_read_by_cupy_on_another(brighten, device, cupy, spin):
    data = image(5)
    x = shim.Buffer(data)
    x.copy_to_device(device)
    producer = cupy.cuda.Stream(non_blocking=True)
    consumer = cupy.cuda.Stream(non_blocking=True)
    with producer:
        spin(SPIN_CYCLES)
    with shim.stream(producer.ptr):
        out = brighten(x, scale=2.0, offset=1.0, output=SHAPE)
    with consumer:
        y = cupy.from_dlpack(out)
        copy = y.copy()
    consumer.synchronize()
    assert y.data.ptr == out.raw.device
    np.testing.assert_allclose(cupy.asnumpy(copy), data * 2 + 1, rtol=2e-7, atol=0)
    np.testing.assert_allclose(out.numpy(), data * 2 + 1, rtol=2e-7, atol=0)


def test_cupy_result_on_a_stream_read_by_the_shim_on_another(brighten, device, cupy, spin):
    producer = cupy.cuda.Stream(non_blocking=True)
    consumer = cupy.cuda.Stream(non_blocking=True)
    with producer:
        spin(SPIN_CYCLES)
        x = cupy.full(SHAPE, 3.0, dtype=cupy.float32)
        with shim.stream(consumer.ptr):
            imported = shim.from_dlpack(x)  # CuPy makes consumer wait for producer
            out = brighten(imported, scale=2.0, offset=1.0, output=SHAPE)
            result = out.numpy()
    assert imported.raw.device == x.data.ptr
    np.testing.assert_array_equal(result, 7)


def test_default_streams_torch_and_cupy_in_one_chain(brighten, device, torch, cupy):
    """Each library on its default stream, as most code runs: torch -> shim -> CuPy -> shim."""
    x = torch.from_numpy(image(6)).cuda()
    first = brighten(x, scale=2.0, offset=0.0, output=SHAPE)
    y = cupy.from_dlpack(first)
    second = brighten(y, scale=0.5, offset=1.0, output=SHAPE)
    np.testing.assert_allclose(second.numpy(), image(6) + 1, rtol=2e-7, atol=0)


# --- the CUDA Array Interface: what CuPy, Numba and torch.as_tensor read ------------------

def test_cupy_reads_and_writes_a_buffer_through_the_cuda_array_interface(brighten, device, cupy):
    data = image(7)
    out = brighten(data, scale=2.0, offset=1.0, output=SHAPE)
    assert hasattr(out, "__cuda_array_interface__")
    assert not hasattr(shim.Buffer(data), "__cuda_array_interface__")  # host memory
    y = cupy.asarray(out)  # through __cuda_array_interface__, no copy
    assert y.data.ptr == out.raw.device and y.shape == SHAPE
    cupy.testing.assert_allclose(y, cupy.asarray(data) * 2 + 1, rtol=2e-7, atol=0)
    y.fill(5)
    cupy.cuda.Device().synchronize()
    np.testing.assert_array_equal(out.numpy(), 5)  # device-dirty since the export: downloaded


def test_a_crop_through_the_cuda_array_interface(brighten, device, torch):
    data = image(8)
    out = brighten(data, scale=1.0, offset=0.0, output=SHAPE)
    crop = out.cropped([(16, 100), (8, 50)])
    t = torch.as_tensor(crop, device="cuda")  # torch reads __cuda_array_interface__
    assert t.data_ptr() == out.raw.device + (8 * SHAPE[1] + 16) * 4
    np.testing.assert_array_equal(t.cpu().numpy(), data[8:58, 16:116])


def test_cuda_array_interface_consumer_on_another_stream_waits(brighten, device, cupy, spin):
    data = image(9)
    x = shim.Buffer(data)
    x.copy_to_device(device)
    producer = cupy.cuda.Stream(non_blocking=True)
    consumer = cupy.cuda.Stream(non_blocking=True)
    with producer:
        spin(SPIN_CYCLES)
    with shim.stream(producer.ptr):
        out = brighten(x, scale=2.0, offset=1.0, output=SHAPE)
    with consumer:
        copy = cupy.asarray(out).copy()  # CuPy waits for the CAI's stream (the legacy one)
    consumer.synchronize()
    np.testing.assert_allclose(cupy.asnumpy(copy), data * 2 + 1, rtol=2e-7, atol=0)
