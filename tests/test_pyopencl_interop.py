"""pyopencl interop on the machine's OpenCL device: shim.to_pyopencl gives a pyopencl Array over
a Buffer's device memory, shim.from_pyopencl (and any pipeline argument) takes an Array's
memory, both without copying, which the shim's transfer counters prove; crops as views,
lifetimes, queues, threads, and every Array the shim cannot use refused by name. Values are
checked against numpy, read through pyopencl's own transfers (which the shim does not count)."""

import gc
import threading

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


def counters(device) -> tuple:
    t = device.transfers
    return t.uploaded, t.downloaded, t.device_copied


def image(shape=(48, 64), seed=0):
    return np.random.default_rng(seed).random(shape, dtype=np.float32)


def on_opencl(data, opencl):
    buf = shim.Buffer(data)
    buf.copy_to_device(opencl)
    return buf


# --- zero-copy, both ways ------------------------------------------------------------------

def test_a_pyopencl_round_trip_moves_no_bytes(opencl, brighten_opencl):
    data = image()
    x = cla.to_device(opencl.queue, data)  # pyopencl's upload, not the shim's
    y = cla.empty(opencl.queue, data.shape, np.float32)
    before = counters(opencl)
    result = brighten_opencl(x, scale=2.0, offset=1.0, output=y)  # Array in, Array out
    assert result is y
    out = brighten_opencl(y, scale=0.5, offset=0.0, output=data.shape)  # an Array in, a Buffer out
    exported = shim.to_pyopencl(out)  # and back to pyopencl
    again = shim.to_pyopencl(shim.from_pyopencl(exported))
    del result, out
    gc.collect()  # the calls' Buffers over the Arrays are gone too: nothing went home
    assert counters(opencl) == before
    assert again.base_data.int_ptr == exported.base_data.int_ptr
    np.testing.assert_allclose(y.get(), data * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(exported.get(), (data * 2 + 1) * 0.5, rtol=1e-6)


def test_the_array_is_the_buffers_memory_on_the_shims_context_and_queue(opencl, brighten_opencl):
    out = brighten_opencl(image(), scale=1.0, offset=0.0, output=(48, 64))
    array = shim.to_pyopencl(out)
    assert isinstance(array, cla.Array)
    assert array.queue.int_ptr == opencl.queue.int_ptr
    assert array.context.int_ptr == opencl.context.int_ptr
    assert array.base_data.int_ptr == opencl.native(out.family.memory)  # the cl_mem itself
    assert array.offset == 0 and array.shape == out.shape and array.dtype == out.dtype
    assert array.strides == out.numpy().strides and array.flags.c_contiguous


def test_device_results_are_current_in_the_array(opencl, brighten_opencl):
    data = image(seed=1)
    fresh = shim.Buffer(data.copy())  # no device memory yet: it goes up
    uploads = opencl.transfers.uploaded
    np.testing.assert_array_equal(shim.to_pyopencl(fresh).get(), data)
    assert fresh.device is opencl and opencl.transfers.uploaded == uploads + data.nbytes
    fresh.numpy()[0, 0] = -7  # newer on the host: uploaded again
    fresh.set_host_dirty()
    assert shim.to_pyopencl(fresh).get()[0, 0] == -7
    computed = brighten_opencl(data, scale=3.0, offset=0.0, output=data.shape)
    assert computed.device_dirty()
    before = counters(opencl)
    np.testing.assert_allclose(shim.to_pyopencl(computed).get(), data * 3, rtol=1e-6)
    assert counters(opencl) == before


def test_a_buffer_on_another_device_moves_to_opencl(opencl):
    data = np.arange(12, dtype=np.int32).reshape(3, 4)
    buf = shim.Buffer(data.copy())
    buf.copy_to_device(shim.device("host"))
    buf.set_host_dirty(False)
    buf.set_device_dirty()
    np.testing.assert_array_equal(shim.to_pyopencl(buf).get(), data)
    assert buf.device is opencl


def test_writes_through_the_array_reach_the_buffer(opencl, brighten_opencl):
    buf = on_opencl(np.zeros((8, 8), np.float32), opencl)
    array = shim.to_pyopencl(buf)
    assert buf.device_dirty()  # pyopencl may write: the device is the truth now
    array.fill(7)
    np.testing.assert_array_equal(buf.numpy(), 7)
    # Later writes are the program's to announce, as DLPack's device export says.
    array.fill(3)
    buf.set_device_dirty()
    np.testing.assert_array_equal(buf.numpy(), 3)
    np.testing.assert_array_equal(brighten_opencl(buf, scale=2.0, offset=0.0,
                                                  output=(8, 8)).numpy(), 6)


def test_imported_arrays_read_and_write_on_the_device(opencl, brighten_opencl):
    data = image(seed=2)
    x = cla.to_device(opencl.queue, data)
    buf = shim.from_pyopencl(x)
    assert buf.device is opencl and buf.device_dirty() and buf.shape == data.shape
    before = counters(opencl)
    brighten_opencl(buf, scale=2.0, offset=0.0, output=buf)  # in place, in the Array's memory
    assert counters(opencl) == before
    np.testing.assert_array_equal(x.get(), data * 2)
    np.testing.assert_array_equal(buf.numpy(), data * 2)  # downloaded into the shim's staging


def test_cpu_pipelines_take_and_fill_arrays(opencl, load):
    brighten = load("brighten")
    data = image(seed=3)
    x = cla.to_device(opencl.queue, data)
    y = cla.zeros(opencl.queue, data.shape, np.float32)
    assert brighten(x, scale=1.0, offset=4.0, output=y) is y
    np.testing.assert_array_equal(y.get(), data + 4)


# --- crops ---------------------------------------------------------------------------------

@pytest.mark.parametrize("x", [0, 1, 32])  # x = 1: an offset OpenCL has no sub-buffer at
def test_crops_are_views_at_their_offset(opencl, brighten_opencl, x):
    data = np.arange(8 * 48, dtype=np.float32).reshape(8, 48)
    parent = on_opencl(np.zeros_like(data), opencl)
    brighten_opencl(data, scale=1.0, offset=0.0, output=parent)
    rows = shim.to_pyopencl(parent.cropped(1, 2, 3))  # y in [2, 5): contiguous
    assert rows.base_data.int_ptr == opencl.native(parent.family.memory)
    assert rows.offset == 2 * 48 * 4 and rows.flags.c_contiguous
    np.testing.assert_array_equal(rows.get(), data[2:5])
    crop = parent.cropped([(x, 6), (2, 3)])
    view = shim.to_pyopencl(crop)
    assert view.base_data.int_ptr == rows.base_data.int_ptr
    assert view.offset == (2 * 48 + x) * 4 and view.strides == (48 * 4, 4)
    assert not view.flags.forc  # strided: pyopencl's own operations refuse it, kernels take it
    with pytest.raises(Exception, match="contiguous"):
        view.get()
    host = np.empty_like(data)
    cl.enqueue_copy(opencl.queue, host, view.base_data, is_blocking=True)
    np.testing.assert_array_equal(host, data)
    rows.fill(-1)  # writes through a crop's Array reach the parent
    expected = data.copy()
    expected[2:5] = -1
    np.testing.assert_array_equal(parent.numpy(), expected)


# --- lifetimes -----------------------------------------------------------------------------

def test_the_array_keeps_the_memory_after_the_buffer_goes(opencl):
    gc.collect()
    data = np.arange(256, dtype=np.int32)
    buf = on_opencl(data, opencl)
    live, pooled = opencl.live_allocations, opencl.pooled_allocations
    array = shim.to_pyopencl(buf)
    view = array[16:]  # shares the Array's pyopencl buffer
    del buf, array
    gc.collect()
    assert opencl.live_allocations == live  # the view holds it
    np.testing.assert_array_equal(view.get(), data[16:])
    del view
    gc.collect()
    # Gone to the driver, never pooled: a pyopencl queue may still have used it.
    assert opencl.live_allocations == live - 1 and opencl.pooled_allocations == pooled


def test_memory_an_array_holds_is_never_given_to_another_buffer(opencl):
    data = np.arange(1024, dtype=np.float32)
    buf = on_opencl(data, opencl)
    array = shim.to_pyopencl(buf)
    buf.device_free()  # the Buffer lets go; the Array does not
    others = [on_opencl(np.full_like(data, -1), opencl) for _ in range(4)]
    assert array.base_data.int_ptr not in {opencl.native(o.family.memory) for o in others}
    np.testing.assert_array_equal(array.get(), data)
    buf.copy_to_device(opencl)  # new memory for the Buffer, the Array keeps the old
    assert opencl.native(buf.family.memory) != array.base_data.int_ptr


def test_an_imported_array_outlives_its_caller(opencl, brighten_opencl):
    data = image(seed=4)
    buf = shim.from_pyopencl(cla.to_device(opencl.queue, data))  # the Buffer holds the Array
    gc.collect()
    brighten_opencl(buf, scale=1.0, offset=1.0, output=buf)
    np.testing.assert_array_equal(buf.numpy(), data + 1)
    crop = buf.cropped(0, 3, 5)
    del buf
    gc.collect()
    np.testing.assert_array_equal(crop.numpy(), data[:, 3:8] + 1)


# --- queues and threads --------------------------------------------------------------------

def test_an_array_on_another_queue_is_waited_for(opencl, brighten_opencl):
    data = image(seed=5)
    theirs = cl.CommandQueue(opencl.context)
    x = cla.empty(theirs, data.shape, np.float32)
    gate = cl.UserEvent(opencl.context)  # their copy waits for it, set 0.3 s from now
    # (Held: pyopencl's event for a copy from host memory waits for the copy when dropped.)
    copied = cl.enqueue_copy(theirs, x.base_data, data, wait_for=[gate], is_blocking=False)
    threading.Timer(0.3, lambda: gate.set_status(cl.command_execution_status.COMPLETE)).start()
    out = brighten_opencl(x, scale=2.0, offset=0.0, output=data.shape)  # after their copy
    np.testing.assert_array_equal(out.numpy(), data * 2)
    copied.wait()


def test_threads_exchange_arrays_and_buffers(opencl, brighten_opencl):
    shared = on_opencl(np.full((32, 32), 2, np.float32), opencl)

    def work(i):
        data = np.full((32, 32), i, np.float32)
        for _ in range(10):
            x = cla.to_device(opencl.queue, data)
            y = cla.empty(opencl.queue, data.shape, np.float32)
            brighten_opencl(x, scale=2.0, offset=1.0, output=y)
            out = brighten_opencl(y, scale=1.0, offset=0.0, output=data.shape)
            np.testing.assert_array_equal(shim.to_pyopencl(out).get(), data * 2 + 1)
            np.testing.assert_array_equal(shim.to_pyopencl(shared).get(), 2)

    run_threads(6, work)


# --- what cannot be used -------------------------------------------------------------------

def test_arrays_of_another_context_are_refused_by_name(opencl, brighten_opencl):
    other = cl.CommandQueue(cl.Context([opencl.queue.device]))
    foreign = cla.to_device(other, image())
    with pytest.raises(shim.ArgumentError, match=r"^array: .*another OpenCL context.*shim.device"):
        shim.from_pyopencl(foreign)
    with pytest.raises(shim.ArgumentError, match=r"^input: .*another OpenCL context"):
        brighten_opencl(foreign, scale=1.0, offset=0.0, output=(48, 64))
    with pytest.raises(shim.ArgumentError, match=r"^output: .*another OpenCL context"):
        brighten_opencl(image(), scale=1.0, offset=0.0, output=foreign)


def test_arrays_the_shim_cannot_use_are_refused_by_name(opencl, brighten_opencl):
    queue = opencl.queue
    with pytest.raises(shim.ArgumentError, match=r"^input: expected float32 elements, got float64"):
        brighten_opencl(cla.zeros(queue, (4, 4), np.float64), scale=1.0, offset=0.0, output=(4, 4))
    with pytest.raises(shim.ArgumentError, match=r"^output: expected a 2-D buffer"):
        brighten_opencl(image((4, 4)), scale=1.0, offset=0.0, output=cla.zeros(queue, 16, np.float32))
    with pytest.raises(shim.ArgumentError, match=r"^array: .*complex64"):
        shim.from_pyopencl(cla.zeros(queue, 4, np.complex64))
    memory = cl.Buffer(opencl.context, cl.mem_flags.READ_WRITE, 64)
    backwards = cla.Array(queue, (4,), np.float32, data=memory, offset=12, strides=(-4,))
    with pytest.raises(shim.ArgumentError, match=r"^array: strides \(-4,\)"):
        shim.from_pyopencl(backwards)
    torn = cla.Array(queue, (4,), np.float32, data=memory, strides=(6,))
    with pytest.raises(shim.ArgumentError, match="multiples of the element size"):
        shim.from_pyopencl(torn)
    beyond = cla.Array(queue, (16,), np.float32, data=memory, offset=8)
    with pytest.raises(shim.ArgumentError, match=r"bytes \[8, 72\) of a pyopencl buffer of 64"):
        shim.from_pyopencl(beyond)
    with pytest.raises(shim.ArgumentError, match="empty Array"):
        shim.from_pyopencl(cla.empty(queue, (0,), np.float32))
    with pytest.raises(shim.ArgumentError, match=r"^array: expected a pyopencl.array.Array, got ndarray"):
        shim.from_pyopencl(np.zeros(3))
    with pytest.raises(shim.ArgumentError, match=r"^buf: expected a shim.Buffer"):
        shim.to_pyopencl(np.zeros(3))
    read_only = np.zeros(4, np.float32)
    read_only.setflags(write=False)
    with pytest.raises(shim.ArgumentError, match=r"^buf: .*read-only"):
        shim.to_pyopencl(shim.Buffer(read_only))


def test_a_half_imported_pyopencl_array_is_no_reason_to_fail_a_call(load, monkeypatch):
    """While another thread imports pyopencl.array, sys.modules holds the module before its
    class Array exists: the shim read module.Array and the call failed with a bare
    AttributeError ("partially initialized module")."""
    import sys
    import types

    brighten = load("brighten")
    monkeypatch.setitem(sys.modules, "pyopencl.array", types.ModuleType("pyopencl.array"))
    x = image((5, 7))  # (a shape not seen before: the general path, which asks each argument)
    out = brighten(x, scale=2.0, offset=1.0, output=x.shape)
    np.testing.assert_array_equal(out.numpy(), x * 2.0 + 1.0)


def test_calls_racing_the_first_import_of_pyopencl_array_all_succeed():
    """The same race for real: a fresh process whose main thread calls a pipeline while
    another thread imports pyopencl.array (460-4139 failed calls in 6 of 7 processes)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import sys, threading
        import numpy as np
        import shim
        from shim.pipelines.build import Build, build

        assert "pyopencl.array" not in sys.modules
        brighten = shim.load(build(Build("brighten", "host", "bundled")))
        imported = threading.Event()
        threading.Thread(target=lambda: (__import__("pyopencl.array"), imported.set())).start()
        calls, failures = 0, []
        while not imported.is_set() or calls < 50:
            x = np.full((3 + calls % 5, 4), calls, np.float32)
            try:
                out = brighten(x, scale=2.0, offset=0.0, output=x.shape)
                assert (out.numpy() == 2.0 * calls).all()
            except Exception as e:
                failures.append(repr(e))
            calls += 1
        print("calls", calls, "failures", len(failures), failures[:1])
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert " failures 0 " in done.stdout, done.stdout
