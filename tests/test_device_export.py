"""Exporting a Buffer's device memory to another library (shim/exchange/device_export.py): DLPack's device
export and ``shim.to_pyopencl`` here, on the machine's OpenCL device (``__cuda_array_interface__``
takes the same steps: tests/test_cuda_fake_driver.py). Another thread may free the memory, move
it or write the host memory at any point of an export: the export then fails with a BufferError
that names the Buffer, or succeeds with memory that stays allocated for the consumer, and never
leaves a pin behind or the Buffer's dirty bits wrong. A device operation that fails is a
DeviceError, as anywhere else. Each race is made to land at an exact point (support.hooks),
then left to threads."""

import gc
import threading

import numpy as np
import pytest

import shim
from shim.core import bridge
from shim.core import buffer_operations
from shim.base.errors import DeviceError
from shim.native import lib
from support.hooks import OnEntry
from support.threads import run_threads

cl = pytest.importorskip("pyopencl")
pytest.importorskip("pyopencl.array")

KDL_OPENCL = 4

EXPORTERS = {
    "dlpack": lambda buf: buf.__dlpack__(max_version=(1, 0), dl_device=(KDL_OPENCL, 0)),
    "pyopencl": shim.to_pyopencl,
}


@pytest.fixture(params=sorted(EXPORTERS))
def export(request):
    return EXPORTERS[request.param]


def on_opencl(data, opencl):
    buf = shim.Buffer(data)
    buf.copy_to_device(opencl)
    return buf


def on_another_thread(action):
    """Run ``action`` to its end on a thread of its own (what another thread of the program
    does, landing between two steps of this thread's export)."""
    errors = []

    def body():
        try:
            action()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def at_entry(function, action):
    """``action`` on another thread, as this thread enters ``function``."""
    return OnEntry(function.__code__, lambda: on_another_thread(action))


def raced(export, buf, function, action) -> str:
    """The message of the BufferError that ``export(buf)`` raises when ``action`` lands, on
    another thread, as this one enters ``function``. (The message only: the exception's
    traceback would keep the Buffer alive.)"""
    with at_entry(function, action):
        try:
            export(buf)
        except BufferError as e:
            return str(e)
    pytest.fail("the export succeeded")


def live_allocations(opencl) -> int:
    """The device's allocations once dropped Buffers are gone and the pool is emptied: a pin
    that a failed export left behind keeps its allocation among them."""
    gc.collect()
    shim.release_unused_device_allocations()
    return opencl.live_allocations


@pytest.fixture
def baseline(opencl):
    return live_allocations(opencl)


def test_a_host_write_before_the_device_dirty_mark_is_a_buffer_error(opencl, export, baseline):
    # Between the upload and the mark that makes the device copy the truth, another thread
    # writes the host memory: the export cannot say the device holds the newest data.
    # (to_pyopencl and __cuda_array_interface__ let the conflict's DeviceError through.)
    data = np.arange(32, dtype=np.float32).reshape(4, 8)
    buf = on_opencl(data.copy(), opencl)

    def write():
        buf.numpy()[...] = -data
        buf.set_host_dirty()

    message = raced(export, buf, shim.Buffer.set_device_dirty, write)
    assert "during the export" in message and repr(buf) in message, message
    assert buf.host_dirty() and not buf.device_dirty()  # the write stands, to be uploaded
    np.testing.assert_array_equal(buf.numpy(), -data)
    exported = export(buf)  # the next export succeeds, with what the host holds
    assert buf.device_dirty()
    del exported
    np.testing.assert_array_equal(buf.numpy(), -data)
    buf = None  # (write's too: it is the same variable)
    assert live_allocations(opencl) == baseline


def test_a_device_free_before_the_device_dirty_mark_is_a_buffer_error(opencl, export, baseline):
    data = np.arange(32, dtype=np.float32).reshape(4, 8)
    buf = on_opencl(data.copy(), opencl)
    message = raced(export, buf, shim.Buffer.set_device_dirty, buf.device_free)
    assert "during the export" in message and repr(buf) in message, message
    assert not buf.has_device_allocation() and not buf.device_dirty()
    np.testing.assert_array_equal(buf.numpy(), data)
    del buf
    assert live_allocations(opencl) == baseline


def test_a_device_free_before_the_pin_is_a_buffer_error(opencl, export, baseline):
    data = np.arange(32, dtype=np.float32).reshape(4, 8)
    buf = on_opencl(data.copy(), opencl)
    message = raced(export, buf, buffer_operations.pin_device, buf.device_free)
    assert "during the export" in message and repr(buf) in message, message
    assert not buf.has_device_allocation()
    np.testing.assert_array_equal(buf.numpy(), data)  # the device copy came home first
    del buf
    assert live_allocations(opencl) == baseline


def test_a_move_before_the_pin_is_a_buffer_error(opencl, export, baseline):
    data = np.arange(32, dtype=np.float32).reshape(4, 8)
    buf = on_opencl(data.copy(), opencl)
    host = shim.device("host")
    message = raced(export, buf, buffer_operations.pin_device,
                    lambda: buf.copy_to_device(host))
    assert "during the export" in message and repr(buf) in message, message
    assert buf.device is host
    np.testing.assert_array_equal(buf.numpy(), data)
    buf = None  # (the lambda's too: it is the same variable)
    assert live_allocations(opencl) == baseline


def test_a_failing_device_operation_in_the_mark_stays_a_device_error(opencl, export,
                                                                     monkeypatch, baseline):
    # (A crop's mark uploads what other members of its family hold newer on the host: that
    # upload can fail as any other.) Only a conflict with another thread's write is the race.
    buf = on_opencl(np.zeros((4, 8), np.float32), opencl)

    def failing(raw, bit, value):
        raise DeviceError(lib.halide_error_code_copy_to_device_failed, "injected")

    monkeypatch.setattr(buffer_operations, "mark_dirty", failing)
    try:
        export(buf)
    except DeviceError as e:
        assert e.code == lib.halide_error_code_copy_to_device_failed and "injected" in str(e)
    else:
        pytest.fail("the export succeeded")
    monkeypatch.undo()
    del buf
    assert live_allocations(opencl) == baseline


def test_an_export_that_fails_once_the_pin_has_a_keeper_gives_it_up_once(opencl, monkeypatch,
                                                                          baseline):
    # pyopencl's Array refuses to be made after its memory object took the pin: the pin goes
    # at once, and the memory object's finalizer, later, lets go of nothing more.
    buf = on_opencl(np.arange(8, dtype=np.float32), opencl)

    def refuse(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(cl.array.Array, "__init__", refuse)
    with pytest.raises(RuntimeError, match="injected"):
        shim.to_pyopencl(buf)
    monkeypatch.undo()
    gc.collect()  # (the memory object goes: its finalizer runs)
    buf.device_free()
    assert live_allocations(opencl) == baseline  # no pin kept it
    np.testing.assert_array_equal(shim.to_pyopencl(buf).get(), np.arange(8))
    del buf
    assert live_allocations(opencl) == baseline


def test_a_buffer_another_thread_puts_on_another_device_first_still_moves(opencl, baseline):
    # copy_to_device(opencl) finds no allocation and leaves the work to Halide's entry point;
    # before that runs, another thread puts the buffer on the host device. The entry point
    # refuses to switch interfaces (-42); the Buffer method moves the buffer, as it would
    # have had it seen the other allocation first (an export's first step: the race the
    # threads below ran into).
    data = np.arange(32, dtype=np.float32).reshape(4, 8)
    buf = shim.Buffer(data.copy())
    host = shim.device("host")
    with at_entry(bridge.runtime_call.__enter__, lambda: buf.copy_to_device(host)):
        buf.copy_to_device(opencl)
    assert buf.device is opencl
    buf.copy_to_host()
    np.testing.assert_array_equal(buf.numpy(), data)
    del buf
    assert live_allocations(opencl) == baseline


def test_threads_export_while_others_free_move_and_write_the_buffer(opencl, baseline):
    # Exports of both kinds on several threads while another frees the device memory, moves
    # it, brings it back and writes the host memory: every export succeeds, with what the
    # Buffer held, or fails with the race's BufferError; no pin is left behind.
    host = shim.device("host")
    buf = on_opencl(np.full((16, 16), 7, np.float32), opencl)
    stop = threading.Event()
    succeeded = {name: 0 for name in EXPORTERS}
    lock = threading.Lock()

    def churn():
        step = 0
        while not stop.is_set():
            step += 1
            if step % 3 == 0:
                buf.device_free()
            elif step % 3 == 1:
                buf.copy_to_device(host if step % 2 else opencl)
            else:
                buf.copy_to_host()
                try:
                    buf.set_host_dirty()
                except DeviceError as e:  # an export made the device copy the truth meanwhile
                    assert e.code == lib.halide_error_code_host_and_device_dirty, e
            buf.copy_to_device(opencl)

    def exporter(name):
        try:
            for _ in range(150):
                try:
                    exported = EXPORTERS[name](buf)
                except BufferError as e:
                    assert "during the export" in str(e) or "no device allocation" in str(e) \
                        or "its allocation on host" in str(e), e
                    continue
                with lock:
                    succeeded[name] += 1
                del exported
        finally:
            stop.set()

    names = sorted(EXPORTERS)
    run_threads(5, lambda i: churn() if i == 0 else exporter(names[i % 2]))
    # Which exports won their races depends on the scheduling (on a loaded machine every
    # DLPack export can lose); some did, and once the churn is over each kind succeeds.
    assert sum(succeeded.values()) > 0, succeeded
    for name in names:
        exported = EXPORTERS[name](buf)
        if name == "pyopencl":
            np.testing.assert_array_equal(exported.get(), 7)
        del exported
    np.testing.assert_array_equal(buf.numpy(), 7)
    buf = None  # (the closures' too: it is the same variable)
    assert live_allocations(opencl) == baseline
