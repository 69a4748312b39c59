"""Adversarial checks of the interop paths: DLPack's host export of OpenCL Buffers, pyopencl
Arrays both ways, and pickling (Buffers and Pipelines), under threads, lifetimes that end in an
awkward order, odd geometries and pickles the shim never made. The standard: no crash, hang,
leak or silently wrong value; a clear shim exception naming the argument is fine."""

import gc
import pickle

import numpy as np
import pytest

import shim
from shim.pipelines.build import Build, build
from support.threads import run_threads

cl = pytest.importorskip("pyopencl")
cla = pytest.importorskip("pyopencl.array")


@pytest.fixture(scope="module")
def brighten_opencl(opencl):
    return shim.load(build(Build("brighten", "opencl", "no_runtime")))


@pytest.fixture(scope="module")
def brighten_host():
    return shim.load(build(Build("brighten", "host", "no_runtime")))


def on_opencl(data, opencl):
    buf = shim.Buffer(data)
    buf.copy_to_device(opencl)
    return buf


SHAPE = (256, 512)


# --- DLPack host export of OpenCL Buffers -------------------------------------------------------

def test_a_host_export_never_shows_a_torn_device_write(opencl, brighten_opencl):
    """An export downloads the device's data whole, never in the middle of a call writing it.
    (One exporting thread: a second one's download would write into the host memory the first
    is reading through its view, as any two threads sharing a numpy array without a lock
    can tear each other's reads; this failed so, rarely, with two exporters.)"""
    buf = on_opencl(np.zeros(SHAPE, np.float32), opencl)
    source = np.zeros(SHAPE, np.float32)

    def work(i):
        for value in range(1, 30):
            if i == 0:
                brighten_opencl(source, scale=0.0, offset=float(value), output=buf)
            else:
                view = np.from_dlpack(buf)
                assert np.unique(view).size == 1, np.unique(view)

    run_threads(2, work)
    np.testing.assert_array_equal(np.from_dlpack(buf), 29)


def test_the_host_export_outlives_the_buffer_and_its_device_memory(opencl, brighten_opencl):
    image = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    out = brighten_opencl(image, scale=2.0, offset=1.0, output=image.shape)
    view = np.from_dlpack(out)
    tensor = None
    try:
        import torch
        tensor = torch.from_dlpack(out)
    except ImportError:
        pass
    del out
    gc.collect()
    # Other allocations churn the memory the Buffer had.
    for _ in range(5):
        brighten_opencl(np.zeros_like(image), scale=0.0, offset=-3.0, output=image.shape)
        np.ones(image.shape, np.float32) * 7  # (host churn)
    gc.collect()
    np.testing.assert_array_equal(view, image * 2 + 1)
    if tensor is not None:
        np.testing.assert_array_equal(tensor.numpy(), image * 2 + 1)


def test_writes_through_the_second_export_reach_the_device(opencl, brighten_opencl):
    buf = on_opencl(np.zeros((16, 16), np.float32), opencl)
    first = np.from_dlpack(buf)
    second = np.from_dlpack(buf)
    first[...] = 3
    second[0, 0] = 5
    out = brighten_opencl(buf, scale=1.0, offset=0.0, output=(16, 16)).numpy()
    expected = np.full((16, 16), 3, np.float32)
    expected[0, 0] = 5
    np.testing.assert_array_equal(out, expected)


def test_threads_export_overlapping_crops_while_pipelines_write_them(opencl, brighten_opencl):
    parent = on_opencl(np.zeros((32, 64), np.float32), opencl)
    crops = [parent.cropped(0, x, 32) for x in (0, 16, 32)]
    source = np.zeros((32, 64), np.float32)

    def work(i):
        crop = crops[i % 3]
        for value in range(1, 15):
            if i < 3:
                brighten_opencl(source, scale=0.0, offset=float(10 * i + value), output=crop)
            else:
                view = np.from_dlpack(crop)
                # Each column range is written whole by one call at a time.
                for half in (view[:, :16], view[:, 16:]):
                    assert np.unique(half).size == 1, np.unique(half)

    run_threads(6, work)
    final = parent.numpy()
    assert np.unique(final[:, :16]).size == 1 and np.unique(final[:, 48:]).size == 1


# --- pyopencl: to_pyopencl ----------------------------------------------------------------------

def test_an_array_keeps_its_memory_after_device_free(opencl, brighten_opencl):
    image = np.arange(128 * 128, dtype=np.float32).reshape(128, 128)
    buf = brighten_opencl(image, scale=1.0, offset=0.0, output=image.shape)
    array = shim.to_pyopencl(buf)
    buf.device_free()
    others = [brighten_opencl(image, scale=0.0, offset=-1.0, output=image.shape)
              for _ in range(4)]
    np.testing.assert_array_equal(array.get(), image)
    np.testing.assert_array_equal(buf.numpy(), image)
    del others


def test_an_array_keeps_its_memory_after_the_buffer_moves_and_goes(opencl, brighten_opencl):
    image = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    buf = brighten_opencl(image, scale=1.0, offset=1.0, output=image.shape)
    array = shim.to_pyopencl(buf)
    buf.copy_to_device("host")  # moves: the OpenCL allocation is freed (deferred by the pin)
    assert buf.device is not opencl
    del buf
    gc.collect()
    others = [brighten_opencl(image, scale=0.0, offset=-1.0, output=image.shape)
              for _ in range(4)]
    np.testing.assert_array_equal(array.get(), image + 1)
    del others


def test_writes_through_the_array_after_the_buffer_was_freed_do_not_reach_anyone(
        opencl, brighten_opencl):
    image = np.ones((32, 32), np.float32)
    buf = on_opencl(image.copy(), opencl)
    array = shim.to_pyopencl(buf)
    buf.device_free()
    fresh = [on_opencl(np.full((32, 32), 4, np.float32), opencl) for _ in range(4)]
    array.fill(99)
    opencl.queue.finish()
    for f in fresh:
        f.set_host_dirty(False)
        np.testing.assert_array_equal(shim.to_pyopencl(f).get(), 4)


def test_threads_export_and_import_one_buffer_while_pipelines_write_it(opencl, brighten_opencl):
    parent = on_opencl(np.zeros((32, 64), np.float32), opencl)
    crops = [parent, parent.cropped(0, 0, 32), parent.cropped(0, 16, 32)]
    source = np.zeros((32, 64), np.float32)

    def work(i):
        for value in range(1, 12):
            crop = crops[(i + value) % 3]
            if i % 3 == 0:
                brighten_opencl(source, scale=0.0, offset=float(value), output=crop)
            elif i % 3 == 1:
                array = shim.to_pyopencl(crop)
                out = brighten_opencl(array, scale=1.0, offset=0.0, output=crop.shape)
                assert out.shape == crop.shape
            else:
                array = shim.to_pyopencl(crop)
                again = shim.from_pyopencl(array)
                assert again.shape == crop.shape
                np.from_dlpack(again)

    run_threads(6, work)
    parent.numpy()


# --- pyopencl: from_pyopencl of odd Arrays ------------------------------------------------------

def test_an_array_with_an_offset(opencl, brighten_opencl):
    data = np.arange(10 * 16, dtype=np.float32).reshape(10, 16)
    whole = cla.to_device(opencl.queue, data)
    view = whole[3:]
    assert view.offset == 3 * 16 * 4
    out = brighten_opencl(view, scale=1.0, offset=1.0, output=(7, 16)).numpy()
    np.testing.assert_array_equal(out, data[3:] + 1)
    buf = shim.from_pyopencl(view)
    np.testing.assert_array_equal(buf.numpy(), data[3:])


def test_a_non_contiguous_array(opencl, brighten_opencl):
    data = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    whole = cla.to_device(opencl.queue, data)
    view = whole[:, ::2]
    assert not view.flags.forc
    buf = shim.from_pyopencl(view)
    np.testing.assert_array_equal(buf.numpy(), data[:, ::2])
    rows = whole[::2]  # (brighten wants x dense: rows skipped instead)
    out = brighten_opencl(rows, scale=2.0, offset=0.0, output=(4, 16)).numpy()
    np.testing.assert_array_equal(out, data[::2] * 2)
    # As an output: only its own elements change.
    target = cla.to_device(opencl.queue, np.full((8, 16), -1, np.float32))
    brighten_opencl(np.ones((4, 16), np.float32), scale=1.0, offset=4.0, output=target[1::2])
    opencl.queue.finish()
    got = target.get()
    np.testing.assert_array_equal(got[1::2], 5)
    np.testing.assert_array_equal(got[::2], -1)


def test_an_array_at_an_offset_no_sub_buffer_can_take(opencl, brighten_opencl):
    raw = np.arange(64, dtype=np.uint8)
    base = cla.to_device(opencl.queue, raw)
    view = cla.Array(opencl.queue, (2, 2), np.float32, data=base.base_data, offset=1)
    expected = raw[1:17].view(np.float32).reshape(2, 2)
    np.testing.assert_array_equal(view.get(), expected)
    np.testing.assert_array_equal(shim.from_pyopencl(view).numpy(), expected)
    out = brighten_opencl(view, scale=1.0, offset=0.0, output=(2, 2)).numpy()
    np.testing.assert_array_equal(out, expected)


def test_a_zero_size_array_is_refused_by_name(opencl):
    empty = cla.empty(opencl.queue, (0, 4), np.float32)
    with pytest.raises(shim.ArgumentError, match="thing"):
        shim.from_pyopencl(empty, "thing")


def test_a_buffer_keeps_the_array_memory_after_the_array_queue_and_context_refs_go(
        opencl, brighten_opencl):
    data = np.arange(32, dtype=np.float32)
    queue = cl.CommandQueue(opencl.context)
    array = cla.to_device(queue, data)
    buf = shim.from_pyopencl(array)
    queue.finish()
    del array, queue
    gc.collect()
    churn = [cla.to_device(opencl.queue, np.full(32, 7, np.float32)) for _ in range(8)]
    np.testing.assert_array_equal(buf.numpy(), data)
    del churn


def test_a_zero_stride_array(opencl, brighten_opencl):
    base = cla.to_device(opencl.queue, np.arange(4, dtype=np.float32))
    broadcast = cla.Array(opencl.queue, (3, 4), np.float32, data=base.base_data,
                          strides=(0, 4))
    buf = shim.from_pyopencl(broadcast)
    np.testing.assert_array_equal(buf.numpy(), np.broadcast_to(np.arange(4, dtype=np.float32),
                                                               (3, 4)))


# --- pickling -----------------------------------------------------------------------------------

def test_pickling_while_another_thread_writes_on_the_device(opencl, brighten_opencl):
    buf = on_opencl(np.zeros(SHAPE, np.float32), opencl)
    source = np.zeros(SHAPE, np.float32)

    def work(i):
        for value in range(1, 25):
            if i == 0:
                brighten_opencl(source, scale=0.0, offset=float(value), output=buf)
            else:
                again = pickle.loads(pickle.dumps(buf))
                assert np.unique(again.numpy()).size == 1

    run_threads(3, work)


def test_crops_of_crops_pickle_their_own_elements_at_their_coordinates(opencl, brighten_opencl):
    data = np.arange(20 * 30, dtype=np.int32).reshape(20, 30)
    parent = on_opencl(data.copy(), opencl)
    inner = parent.cropped(0, 5, 20).cropped(1, 3, 10).cropped(0, 10, 5)
    again = pickle.loads(pickle.dumps(inner))
    assert again.shape == (10, 5)
    assert [again.dim(i).min() for i in range(2)] == [inner.dim(i).min() for i in range(2)]
    np.testing.assert_array_equal(again.numpy(), data[3:13, 10:15])
    sliced = pickle.loads(pickle.dumps(parent.cropped(0, 5, 20).sliced(1, 7)))
    np.testing.assert_array_equal(sliced.numpy(), data[7, 5:25])


@pytest.mark.parametrize("mins, name", [
    ([2 ** 40, 0], "b"),      # a min no int32 holds
    ([0.5, 0], "b"),          # not integers
    ([0, 0, 0], "b"),         # too many
    (["x", 0], "b"),          # not numbers
    ([0, 0], 7),              # a name that is not a string
])
def test_a_pickle_the_shim_never_made_is_refused_clearly(mins, name):
    with pytest.raises((shim.ShimError, TypeError, ValueError)):
        shim.Buffer._from_pickle(np.zeros((3, 4), np.float32), mins, name, True)


def test_a_pickle_whose_extent_plus_min_overflows_is_refused():
    with pytest.raises((shim.ShimError, ValueError)):
        shim.Buffer._from_pickle(np.zeros((3, 4), np.float32), [2 ** 31 - 2, 0], "b", True)


def test_a_pipeline_pickled_for_another_architecture(tmp_path, monkeypatch, brighten_host):
    import hashlib
    monkeypatch.setenv("HALIDE_SHIM_CACHE", str(tmp_path / "cache"))
    data = bytearray(open(brighten_host.path, "rb").read())
    data[18:20] = (183).to_bytes(2, "little")  # e_machine: AArch64
    digest = hashlib.sha256(data).hexdigest()
    with pytest.raises(shim.ShimError):
        shim.Pipeline._from_pickle(digest, "brighten", bytes(data))
    garbage = b"not an ELF file at all" * 10
    with pytest.raises(shim.ShimError):
        shim.Pipeline._from_pickle(hashlib.sha256(garbage).hexdigest(), "brighten", garbage)


def test_a_pipeline_pickle_with_a_name_the_library_lacks(tmp_path, monkeypatch, brighten_host):
    import hashlib
    monkeypatch.setenv("HALIDE_SHIM_CACHE", str(tmp_path / "cache"))
    data = open(brighten_host.path, "rb").read() + b"\0name test"
    with pytest.raises(shim.ShimError):
        shim.Pipeline._from_pickle(hashlib.sha256(data).hexdigest(), "nope", data)
