"""DLPack exchange with numpy and PyTorch as real producers and consumers: zero-copy in both
directions (asserted by writing through one view and reading through the other), the
standard's capsule rules, lifetimes, and device memory round-tripping through shim.from_dlpack.
OpenCL results go to numpy and PyTorch as host memory (downloaded first), with the dirty bits
that keeps consumers' writes; the device export when asked for it. The CUDA stream rules are in
test_cuda.py."""

import ctypes
import gc
import weakref

import numpy as np
import pytest

import shim
from shim.exchange import dlpack_capsules
from shim.native import ffi
from shim.pipelines.build import Build, build
from support.producers import Producer
from support.threads import run_threads

torch = pytest.importorskip("torch", reason="PyTorch is an optional test dependency "
                                            "(pip install -e '.[torch]')")

KDL_CPU, KDL_OPENCL = 1, 4
READ_ONLY, IS_COPIED = 1, 2


# --- reading capsules independently of the code under test ------------------------------

class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _VersionedHead(ctypes.Structure):
    """The start of DLManagedTensorVersioned (dlpack.h): version, manager_ctx, deleter, flags."""
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64)]


# Prototypes of our own: ctypes.pythonapi's function objects are shared with every user.
_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def versioned_head(capsule) -> _VersionedHead:
    assert _is_valid(capsule, b"dltensor_versioned")
    return _VersionedHead.from_address(_pointer(capsule, b"dltensor_versioned"))


class CapsuleHolder:
    """Hands a consumer a capsule made earlier."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack_device__(self):
        return KDL_CPU, 0

    def __dlpack__(self, **kwargs):
        capsule, self.capsule = self.capsule, None
        return capsule


@pytest.fixture
def releases(monkeypatch):
    """manager_ctx -> how many times the shim's deleter ran for that exported tensor."""
    counts = {}
    original = dlpack_capsules._release

    def counting(managed):
        key = int(ffi.cast("uintptr_t", managed.manager_ctx))
        counts[key] = counts.get(key, 0) + 1
        original(managed)

    monkeypatch.setattr(dlpack_capsules, "_release", counting)
    return counts


@pytest.fixture(scope="module")
def brighten_opencl(opencl):
    return shim.load(build(Build("brighten", "opencl", "no_runtime")))


# --- export to numpy and PyTorch ---------------------------------------------------------

def test_numpy_sees_the_buffer_memory_without_a_copy():
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    buf = shim.Buffer(data)
    view = np.from_dlpack(buf)
    assert view.shape == (3, 4) and view.dtype == np.float32
    view[1, 2] = -5
    assert buf.numpy()[1, 2] == -5 and data[1, 2] == -5
    data[0, 0] = 42
    assert view[0, 0] == 42


def test_torch_sees_the_buffer_memory_without_a_copy():
    buf = shim.Buffer(np.arange(24, dtype=np.int32).reshape(2, 3, 4))
    tensor = torch.from_dlpack(buf)
    assert tuple(tensor.shape) == (2, 3, 4) and tensor.dtype == torch.int32
    tensor[1, 2, 3] = 1000
    assert buf.numpy()[1, 2, 3] == 1000
    buf.numpy()[0, 0, 0] = -1
    assert tensor[0, 0, 0].item() == -1


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.uint32, np.int64, np.float16,
                                   np.float64, np.bool_])
def test_element_types_survive_the_round_trip_through_torch(dtype):
    data = (np.arange(10) % 3).astype(dtype)
    back = shim.from_dlpack(torch.from_dlpack(shim.Buffer(data)))
    assert back.dtype == data.dtype
    np.testing.assert_array_equal(back.numpy(), data)


def test_crops_and_slices_export_as_strided_views():
    data = np.arange(6 * 8, dtype=np.int32).reshape(6, 8)
    buf = shim.Buffer(data)
    crop = buf.cropped([(2, 3), (1, 4)])  # x in [2, 5), y in [1, 5)
    view = np.from_dlpack(crop)
    np.testing.assert_array_equal(view, data[1:5, 2:5])
    assert view.strides == data.strides and np.shares_memory(view, data)
    row = torch.from_dlpack(buf.sliced(1, 3))  # y = 3
    np.testing.assert_array_equal(row.numpy(), data[3])
    row[0] = 777
    assert data[3, 0] == 777


def test_the_capsule_keeps_the_memory_alive_after_the_buffer_is_dropped():
    buf = shim.Buffer(np.arange(1000, dtype=np.float64))
    alive = weakref.ref(buf)
    capsule = buf.__dlpack__()
    del buf
    gc.collect()
    assert alive() is not None  # held by the capsule nobody has consumed yet
    view = np.from_dlpack(CapsuleHolder(capsule))
    del capsule
    gc.collect()
    np.testing.assert_array_equal(view, np.arange(1000))
    del view
    gc.collect()
    assert alive() is None  # the consumer's deleter let it go


def test_the_deleter_runs_exactly_once(releases):
    buf = shim.Buffer(np.ones(16, np.float32))
    unconsumed = buf.__dlpack__(max_version=(1, 0))
    legacy = buf.__dlpack__()
    del unconsumed, legacy  # their capsules' destructors
    by_numpy = np.from_dlpack(buf)
    by_torch = torch.from_dlpack(buf)
    del by_numpy, by_torch  # the consumers' deleter calls
    gc.collect()
    assert sorted(releases.values()) == [1, 1, 1, 1]


# --- the standard's arguments ------------------------------------------------------------

def test_versioned_capsules_when_the_consumer_allows_them():
    buf = shim.Buffer(np.zeros(4, np.uint8))
    assert _is_valid(buf.__dlpack__(), b"dltensor")
    assert _is_valid(buf.__dlpack__(max_version=(0, 8)), b"dltensor")
    head = versioned_head(buf.__dlpack__(max_version=(1, 0)))
    assert (head.version.major, head.version.minor) == (1, 0) and head.flags == 0
    head = versioned_head(buf.__dlpack__(max_version=(2, 3)))
    assert head.version.major == 1 and head.version.minor >= 1


def test_read_only_memory_is_flagged_and_needs_a_versioned_capsule():
    data = np.arange(5, dtype=np.int32)
    data.setflags(write=False)
    buf = shim.Buffer(data)
    assert versioned_head(buf.__dlpack__(max_version=(1, 0))).flags == READ_ONLY
    assert not np.from_dlpack(buf).flags.writeable
    with pytest.raises(BufferError, match="read-only"):
        buf.__dlpack__()  # a legacy capsule cannot say so


def test_copy_true_gives_independent_memory_flagged_as_copied():
    data = np.arange(6, dtype=np.float32)
    buf = shim.Buffer(data)
    assert versioned_head(buf.__dlpack__(max_version=(1, 0), copy=True)).flags == IS_COPIED
    copied = np.from_dlpack(buf, copy=True)
    copied[0] = 99
    assert data[0] == 0
    same = np.from_dlpack(buf, copy=False)
    same[0] = 99
    assert data[0] == 99


def test_bad_arguments_are_refused_clearly():
    buf = shim.Buffer(np.zeros(3, np.float32))
    with pytest.raises(BufferError, match="dl_device"):
        buf.__dlpack__(dl_device="cpu")
    with pytest.raises(BufferError, match="ROCM"):
        buf.__dlpack__(dl_device=(10, 0))  # kDLROCM: data on the CPU cannot go there
    with pytest.raises(TypeError, match="max_version"):
        buf.__dlpack__(max_version=1)
    with pytest.raises(ValueError, match="stream"):
        buf.__dlpack__(stream=5)  # host memory has no stream to order
    with pytest.raises(shim.ArgumentError, match="obj"):
        shim.from_dlpack([1, 2, 3])


# --- import from numpy and PyTorch --------------------------------------------------------

def test_torch_tensors_import_without_a_copy():
    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    buf = shim.from_dlpack(tensor)
    buf.numpy()[2, 3] = -1
    assert tensor[2, 3].item() == -1
    transposed = shim.from_dlpack(tensor.T)  # strided, not copied
    assert transposed.shape == (4, 3) and transposed.dim(0).stride() == 4
    np.testing.assert_array_equal(transposed.numpy(), tensor.T.numpy())


def test_from_dlpack_copy_argument():
    data = np.arange(4, dtype=np.int16)
    copied = shim.from_dlpack(data, copy=True)
    copied.numpy()[0] = 9
    assert data[0] == 0
    shim.from_dlpack(data, copy=False).numpy()[0] = 9
    assert data[0] == 9


def test_a_pipeline_takes_and_returns_torch_tensors(load):
    brighten = load("brighten")
    image = torch.rand(12, 16)
    out = torch.zeros(12, 16)
    result = brighten(image, scale=2.0, offset=1.0, output=out)
    assert result is out  # the caller's tensor, written in place
    torch.testing.assert_close(out, image * 2 + 1, rtol=0, atol=0)
    strided = brighten(image.T.contiguous().T, scale=2.0, offset=1.0, output=(12, 16))
    np.testing.assert_array_equal(strided.numpy(), (image * 2 + 1).numpy())


def test_a_pipeline_takes_dlpack_objects_of_unknown_libraries(load):
    brighten = load("brighten")
    image = np.random.default_rng(1).random((5, 7), dtype=np.float32)
    out = np.zeros_like(image)
    result = brighten(Producer(shim.Buffer(image)), scale=3.0, offset=0.0,
                      output=Producer(shim.Buffer(out)))
    assert isinstance(result, Producer)
    np.testing.assert_array_equal(out, image * 3)


# --- OpenCL: host memory by default, the device when asked for ----------------------------

class OpenCLProducer(Producer):
    """Another OpenCL library's array: its data is on the OpenCL device, and exported there."""

    def __dlpack_device__(self):
        return KDL_OPENCL, 0

    def __dlpack__(self, **kwargs):
        return super().__dlpack__(dl_device=(KDL_OPENCL, 0), **kwargs)


def on_opencl(data, opencl):
    buf = shim.Buffer(data)
    buf.copy_to_device(opencl)
    return buf


def device_dirty_on_opencl(data, opencl, brighten_opencl):
    """A Buffer whose current data, ``data``, exists only on the OpenCL device."""
    buf = shim.Buffer(np.zeros_like(data))
    brighten_opencl(data, scale=1.0, offset=0.0, output=buf)
    assert buf.device is opencl and buf.device_dirty()
    return buf


def test_the_readme_example_runs_on_opencl(opencl, brighten_opencl):
    image = np.random.default_rng(4).random((48, 64), dtype=np.float32)
    out = brighten_opencl(image, scale=2.0, offset=0.0, output=image.shape)   # a shim.Buffer
    t = torch.from_dlpack(out)
    a = np.from_dlpack(out)             # host memory (device results are downloaded first)
    np.testing.assert_array_equal(a, image * 2)
    np.testing.assert_array_equal(t.numpy(), image * 2)
    assert np.shares_memory(a, out.numpy()) and np.shares_memory(t.numpy(), a)  # no copies


def test_where_a_buffer_exports_by_default(opencl, brighten_opencl):
    host = shim.Buffer(np.zeros(4, np.float32))
    assert host.__dlpack_device__() == (KDL_CPU, 0)
    clean = on_opencl(np.zeros(4, np.float32), opencl)
    assert not clean.host_dirty() and not clean.device_dirty()
    assert clean.__dlpack_device__() == (KDL_CPU, 0)
    written = device_dirty_on_opencl(np.ones((2, 2), np.float32), opencl, brighten_opencl)
    assert written.__dlpack_device__() == (KDL_CPU, 0)
    clean.numpy()[0] = 1
    clean.set_host_dirty()
    assert clean.__dlpack_device__() == (KDL_CPU, 0)
    for buf in (host, clean, written):  # what __dlpack__() gives without dl_device agrees
        assert np.from_dlpack(buf).__dlpack_device__() == (KDL_CPU, 0)


def test_device_results_are_downloaded_into_the_buffers_own_memory(opencl, brighten_opencl):
    image = np.arange(48 * 64, dtype=np.float32).reshape(48, 64)
    out = device_dirty_on_opencl(image, opencl, brighten_opencl)
    downloads = opencl.transfers.downloaded
    head = versioned_head(out.__dlpack__(max_version=(1, 0), copy=False))  # no copy needed
    assert head.flags == 0  # neither copied nor read-only
    assert opencl.transfers.downloaded == downloads + image.nbytes
    view = torch.from_dlpack(out)
    assert opencl.transfers.downloaded == downloads + image.nbytes  # once
    np.testing.assert_array_equal(view.numpy(), image)
    assert np.shares_memory(view.numpy(), out.numpy()) and not out.device_dirty()


def test_writes_by_the_consumer_reach_the_next_device_use(opencl, brighten_opencl):
    image = np.ones((16, 16), np.float32)
    out = device_dirty_on_opencl(image, opencl, brighten_opencl)
    view = np.from_dlpack(out)
    assert out.host_dirty()  # the consumer may write: the host is the truth now
    view[...] = 5
    uploads = opencl.transfers.uploaded
    again = brighten_opencl(out, scale=2.0, offset=0.0, output=image.shape)
    assert opencl.transfers.uploaded == uploads + image.nbytes
    np.testing.assert_array_equal(again.numpy(), 10)
    # Later writes are the program's to announce, as writes through numpy() are.
    view[...] = 7
    out.set_host_dirty()
    np.testing.assert_array_equal(brighten_opencl(out, scale=1.0, offset=0.0,
                                                  output=image.shape).numpy(), 7)


def test_a_copy_leaves_the_buffer_as_it_was(opencl, brighten_opencl):
    image = np.full((8, 8), 3, np.float32)
    out = device_dirty_on_opencl(image, opencl, brighten_opencl)
    head = versioned_head(out.__dlpack__(max_version=(1, 0), copy=True))
    assert head.flags == IS_COPIED
    copied = np.from_dlpack(out, copy=True)
    copied[...] = -1
    assert not out.host_dirty()
    np.testing.assert_array_equal(out.numpy(), image)


def test_read_only_buffers_export_read_only_and_stay_clean(opencl):
    data = np.arange(12, dtype=np.int32).reshape(3, 4)
    data.setflags(write=False)
    buf = on_opencl(data, opencl)
    head = versioned_head(buf.__dlpack__(max_version=(1, 0)))
    assert head.flags == READ_ONLY
    view = np.from_dlpack(buf)
    assert not view.flags.writeable and not buf.host_dirty()
    np.testing.assert_array_equal(torch.from_dlpack(buf).numpy(), data)
    with pytest.raises(BufferError, match="read-only"):
        buf.__dlpack__()  # a legacy capsule cannot say so
    with pytest.raises(BufferError, match="read-only"):
        buf.__dlpack__(dl_device=(KDL_OPENCL, 0))


@pytest.mark.parametrize("x", [1, 32])  # a misaligned and an aligned byte offset
def test_crops_of_device_results_export_their_region_of_host_memory(opencl, brighten_opencl, x):
    data = np.arange(8 * 48, dtype=np.float32).reshape(8, 48)
    parent = on_opencl(np.zeros_like(data), opencl)
    crop = parent.cropped([(x, 6), (2, 3)])
    brighten_opencl(data, scale=1.0, offset=0.0, output=crop)  # on the device
    assert crop.device_dirty()
    view = np.from_dlpack(crop)
    np.testing.assert_array_equal(view, data[2:5, x:x + 6])
    assert np.shares_memory(view, parent.numpy()) and view.strides == data.strides
    row = torch.from_dlpack(crop.sliced(1, 3))  # y = 3
    np.testing.assert_array_equal(row.numpy(), data[3, x:x + 6])
    view[0, 0] = -1  # the crop is host-dirty: its next device use sees this
    out = shim.Buffer(np.zeros_like(data)).cropped([(x, 6), (2, 3)])
    brighten_opencl(crop, scale=1.0, offset=0.0, output=out)
    np.testing.assert_array_equal(out.numpy(), view)
    assert out.numpy()[0, 0] == -1


def test_exported_host_memory_outlives_the_buffer(opencl, brighten_opencl, releases):
    gc.collect()
    live = opencl.live_allocations
    image = np.arange(64, dtype=np.float32).reshape(8, 8)
    out = device_dirty_on_opencl(image, opencl, brighten_opencl)
    alive = weakref.ref(out)
    view, tensor = np.from_dlpack(out), torch.from_dlpack(out)
    del out
    gc.collect()
    assert alive() is not None  # the consumers hold it
    np.testing.assert_array_equal(view, image)
    np.testing.assert_array_equal(tensor.numpy(), image)
    del view, tensor
    gc.collect()
    assert alive() is None and opencl.live_allocations <= live
    assert sorted(releases.values()) == [1, 1]


def test_threads_export_results_while_others_compute_them(opencl, brighten_opencl):
    shared = device_dirty_on_opencl(np.full((32, 32), 2, np.float32), opencl, brighten_opencl)

    def work(i):
        image = np.full((32, 32), i, np.float32)
        for _ in range(20):
            out = brighten_opencl(image, scale=2.0, offset=1.0, output=image.shape)
            np.testing.assert_array_equal(np.from_dlpack(out), image * 2 + 1)
            np.testing.assert_array_equal(torch.from_dlpack(out).numpy(), image * 2 + 1)
            np.testing.assert_array_equal(np.from_dlpack(shared), 2)

    run_threads(6, work)


def test_exports_of_a_crop_another_thread_overwrites_on_the_device(opencl, brighten_opencl):
    # Each export marks its crop host-dirty; the other thread's results overlap half of it.
    # Whatever the interleaving, the exports see whole writes and the last write stays.
    parent = on_opencl(np.zeros((16, 64), np.float32), opencl)
    exported, written = parent.cropped(0, 0, 32), parent.cropped(0, 16, 32)
    values = list(range(1, 41))
    source = np.ones((16, 64), np.float32)

    def work(i):
        for value in values:
            if i == 0:
                view = np.from_dlpack(exported)
                assert (view[:, :16] == 0).all()
                assert np.unique(view[:, 16:]).size == 1 and view[0, 16] in [0, *values]
            else:
                brighten_opencl(source, scale=0.0, offset=float(value), output=written)

    run_threads(2, work)
    final = parent.numpy()
    np.testing.assert_array_equal(final[:, 16:48], values[-1])
    np.testing.assert_array_equal(final[:, :16], 0)


def test_the_device_export_on_request(opencl, brighten_opencl):
    image = np.arange(6, dtype=np.int32)
    buf = on_opencl(image, opencl)
    head = versioned_head(buf.__dlpack__(max_version=(1, 0), dl_device=(KDL_OPENCL, 0),
                                         copy=False))
    assert head.flags == 0 and buf.device_dirty()  # the consumer may write on the device
    buf.numpy()[...] = 9  # the host is newer now: the device export uploads first
    buf.set_host_dirty()
    uploads = opencl.transfers.uploaded
    imported = shim.from_dlpack(OpenCLProducer(buf))
    assert opencl.transfers.uploaded == uploads + image.nbytes
    np.testing.assert_array_equal(imported.numpy(), 9)
    with pytest.raises(BufferError, match="no device allocation.*copy_to_device"):
        shim.Buffer(image).__dlpack__(dl_device=(KDL_OPENCL, 0))
    with pytest.raises(BufferError, match="CUDA:0.*opencl"):
        buf.__dlpack__(dl_device=(2, 0))


def test_opencl_memory_round_trips_through_from_dlpack_without_a_copy(opencl, brighten_opencl):
    source = on_opencl(np.arange(20, dtype=np.float32).reshape(4, 5), opencl)
    producer = OpenCLProducer(source)
    imported = shim.from_dlpack(producer)
    assert producer.calls[0]["stream"] == opencl.queue.int_ptr  # the shim's own queue
    assert imported.device is opencl
    assert opencl.native(imported.family.memory) == opencl.native(source.family.memory)
    before = opencl.transfers.total
    brighten_opencl(imported, scale=2.0, offset=1.0, output=imported)  # in place, on the device
    assert opencl.transfers.total == before
    np.testing.assert_array_equal(source.numpy(), np.arange(20, dtype=np.float32).reshape(4, 5) * 2 + 1)


def test_device_tensors_as_arguments_move_no_bytes(opencl, brighten_opencl):
    image = np.arange(64, dtype=np.float32).reshape(8, 8)
    source, target = on_opencl(image, opencl), on_opencl(np.zeros_like(image), opencl)
    before = opencl.transfers.total
    result = brighten_opencl(OpenCLProducer(source), scale=2.0, offset=0.0,
                             output=OpenCLProducer(target))
    del result
    gc.collect()  # the call's Buffers over the tensors are gone: nothing was copied home
    assert opencl.transfers.total == before
    np.testing.assert_array_equal(target.numpy(), image * 2)


@pytest.mark.parametrize("x", [1, 32])  # a misaligned and an aligned byte offset
def test_opencl_crops_export_with_their_byte_offset(opencl, brighten_opencl, x):
    data = np.arange(8 * 48, dtype=np.float32).reshape(8, 48)
    parent = on_opencl(data.copy(), opencl)
    crop = parent.cropped([(x, 6), (2, 3)])
    imported = shim.from_dlpack(OpenCLProducer(crop))
    np.testing.assert_array_equal(imported.numpy(), data[2:5, x:x + 6])
    brighten_opencl(imported, scale=0.0, offset=5.0, output=imported)
    expected = data.copy()
    expected[2:5, x:x + 6] = 5
    np.testing.assert_array_equal(parent.numpy(), expected)


def test_exported_opencl_memory_outlives_the_buffer(opencl, releases):
    gc.collect()  # earlier tests' garbage
    buf = on_opencl(np.arange(64, dtype=np.int32), opencl)
    live = opencl.live_allocations
    capsule_holder = OpenCLProducer(buf)
    imported = shim.from_dlpack(capsule_holder)
    del buf, capsule_holder
    gc.collect()
    np.testing.assert_array_equal(imported.numpy(), np.arange(64))
    assert opencl.live_allocations == live
    del imported
    gc.collect()
    assert opencl.live_allocations == live - 1  # freed once the importer let go
    assert list(releases.values()) == [1]


def test_device_copies_stay_on_the_device(opencl):
    buf = on_opencl(np.arange(6, dtype=np.int32), opencl)
    downloads = opencl.transfers.downloaded
    copy = shim.from_dlpack(OpenCLProducer(buf), copy=True)
    assert copy.device is opencl and opencl.transfers.downloaded == downloads
    np.testing.assert_array_equal(copy.numpy(), np.arange(6))


def test_a_consumer_queue_waits_for_the_shims_work(opencl, brighten_opencl):
    import pyopencl as cl

    image = np.random.default_rng(2).random((64, 64), dtype=np.float32)
    out = brighten_opencl(image, scale=2.0, offset=0.0, output=image.shape)
    consumer = cl.CommandQueue(opencl.context)
    capsule_holder = OpenCLProducer(out)
    imported = dlpack_capsules.ImportedTensor(capsule_holder, consumer.int_ptr)
    tensor = imported.managed.dl_tensor
    host = np.empty_like(image)
    mem = cl.Buffer.from_int_ptr(int(ffi.cast("uintptr_t", tensor.data)), retain=True)
    cl.enqueue_copy(consumer, host, mem, src_offset=int(tensor.byte_offset), is_blocking=True)
    np.testing.assert_array_equal(host, image * 2)
    with pytest.raises(TypeError, match="stream"):
        out.__dlpack__(stream="queue", dl_device=(KDL_OPENCL, 0))
    with pytest.raises(ValueError, match="stream must be None"):
        out.__dlpack__(stream=consumer.int_ptr)  # to the CPU, as the standard has it


def test_a_pipeline_writes_into_imported_device_memory(opencl, load):
    target = on_opencl(np.zeros((6, 6), np.float32), opencl)
    image = np.random.default_rng(3).random((6, 6), dtype=np.float32)
    load("brighten")(image, scale=1.0, offset=2.0, output=OpenCLProducer(target))  # a CPU pipeline
    assert target.device_dirty()  # the results went to its device memory
    np.testing.assert_array_equal(target.numpy(), image + 2)


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_an_exception_raised_as_a_consumer_drops_an_export_is_not_lost(versioned):
    """numpy frees an array it has just made when the next bytecode raises (the list below,
    still on Python's stack, goes as the NameError unwinds it), and so runs the export's
    deleter with that exception set: the deleter's Python code ran with it, cffi reported a
    SystemError and cleared both, and the program went on as if nothing had been raised."""
    buf = shim.Buffer(np.zeros((4, 4), np.int32))
    capsule_of = (lambda: buf.__dlpack__(max_version=(1, 0))) if versioned else buf.__dlpack__

    class Consumer:
        def __dlpack__(self, **kwargs):
            return capsule_of()

        def __dlpack_device__(self):
            return buf.__dlpack_device__()

    with pytest.raises(NameError, match="undefined_name"):
        [np.from_dlpack(Consumer())][undefined_name]  # noqa: F821, B018
    gc.collect()
    assert buf.numpy().sum() == 0  # (and the pin is gone: the Buffer is used as before)
