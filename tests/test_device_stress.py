"""Concurrency torture on the simulated host device: many threads, shared buffers, delays
injected into allocations and copies to widen every race window, and injected faults.

Every run is bounded (fixed thread and iteration counts, seeded random choices). A watchdog
turns a deadlock into a failure with every thread's stack instead of a hung suite.
"""

import gc
import random
import threading

import numpy as np
import pytest

import shim
from shim.native import ffi, lib
from support.threads import run_threads



@pytest.fixture
def device():
    backend = shim.device("host")
    backend.clear_faults()
    gc.collect()
    before = backend.live_allocations
    yield backend
    backend.clear_faults()
    gc.collect()
    assert backend.live_allocations == before, "device memory leaked"


def device_value(buf):
    """The first element of ``buf``'s device allocation (host device: handles are addresses)."""
    return np.frombuffer(ffi.buffer(ffi.cast("int32_t *", buf.raw.device), 4), np.int32)[0]


def test_threads_racing_to_allocate_one_buffer_allocate_once(device):
    device.set_faults(delay=0.01)
    buf = shim.Buffer(np.zeros((64, 64), np.int32))
    start = threading.Barrier(8)
    before = device.live_allocations

    def allocate(_):
        start.wait()
        buf.device_malloc(device)

    run_threads(8, allocate)
    assert device.live_allocations == before + 1


def test_threads_racing_to_upload_one_buffer_upload_once(device):
    device.set_faults(delay=0.01)
    buf = shim.Buffer(np.ones((32, 32), np.int32))
    start = threading.Barrier(8)
    copied = device.transfers.total

    def upload(_):
        start.wait()
        buf.copy_to_device(device)

    run_threads(8, upload)
    assert device.transfers.total - copied == 32 * 32 * 4
    assert not buf.host_dirty()


def test_threads_racing_on_a_struct_the_shim_does_not_own(device):
    """Pipelines hand the runtime their own halide_buffer_t: the per-struct lock must stop a
    double allocation there too."""
    device.set_faults(delay=0.01)
    host = np.zeros(100, np.uint8)
    dims = ffi.new("halide_dimension_t[1]", [(0, 100, 1, 0)])
    raw = ffi.new("halide_buffer_t *")
    raw.host, raw.dimensions, raw.dim = ffi.cast("uint8_t *", host.ctypes.data), 1, dims
    raw.type.code, raw.type.bits, raw.type.lanes = 1, 8, 1
    interface = lib.shim_backend_interface(device.index)
    before = device.live_allocations
    start = threading.Barrier(8)
    results = []

    def allocate(_):
        start.wait()
        results.append(lib.halide_device_malloc(ffi.NULL, raw, interface))

    run_threads(8, allocate)
    assert results == [0] * 8
    assert device.live_allocations == before + 1
    assert lib.halide_device_free(ffi.NULL, raw) == 0


def test_random_operations_on_shared_buffers(device):
    device.set_faults(delay=0.0005)
    buffers = [shim.Buffer(np.zeros((16, 16), np.int32)) for _ in range(4)]
    # The test's own rule for writers of host or device data; the runtime must stay correct
    # for everything the other threads do around them.
    writers = [threading.Lock() for _ in buffers]
    baseline = device.live_allocations
    worst = []

    def work(index):
        rng = random.Random(1000 + index)
        for _ in range(150):
            k = rng.randrange(len(buffers))
            buf, op = buffers[k], rng.choice(
                ["upload", "download", "sync", "read", "malloc", "write", "kernel", "free"])
            if op == "upload":
                buf.copy_to_device(device)
            elif op == "download":
                buf.copy_to_host()
            elif op == "sync":
                buf.device_sync()
            elif op == "read":
                buf.numpy()
            elif op == "malloc":
                buf.device_malloc(device)
            elif op == "write":
                with writers[k]:
                    value = rng.randrange(1, 1 << 30)
                    buf.numpy()[...] = value  # numpy() first brings device results home
                    buf.set_host_dirty()
                    buf.copy_to_device(device)
                    assert device_value(buf) == value, "upload lost a host write"
            elif op == "kernel":
                with writers[k]:
                    value = rng.randrange(1, 1 << 30)
                    buf.copy_to_device(device)
                    device_array = np.frombuffer(ffi.buffer(ffi.cast("int32_t *", buf.raw.device),
                                                            16 * 16 * 4), np.int32)
                    device_array[...] = value  # what a kernel would write
                    buf.set_device_dirty()
                    assert int(buf.numpy()[3, 5]) == value, "download lost a device write"
            elif op == "free":
                with writers[k]:
                    buf.device_free()
            worst.append(device.live_allocations - baseline)

    run_threads(8, work)
    assert max(worst) <= len(buffers), "a buffer held two allocations at once"
    for buf in buffers:
        assert not (buf.host_dirty() and buf.device_dirty())
        buf.device_free()
    assert device.live_allocations == baseline


def test_random_operations_with_injected_faults(device):
    buffers = [shim.Buffer(np.full((8, 8), i, np.int32)) for i in range(3)]
    # Marking device results and freeing exclude each other in the test's own rules, so only
    # the runtime can produce an invalid state.
    owners = {id(buf): threading.Lock() for buf in buffers}
    baseline = device.live_allocations
    failures = []

    def work(index):
        rng = random.Random(2000 + index)
        for _ in range(150):
            if rng.random() < 0.2:
                device.set_faults(fail_allocation=rng.randrange(1, 4),
                                  fail_copy=rng.randrange(1, 4), delay=0.0002)
            buf = rng.choice(buffers)
            op = rng.choice(["upload", "download", "malloc", "free", "dirty"])
            try:
                if op == "upload":
                    buf.copy_to_device(device)
                elif op == "download":
                    buf.copy_to_host()
                elif op == "malloc":
                    buf.device_malloc(device)
                elif op == "free":
                    with owners[id(buf)]:
                        buf.device_free()
                else:
                    with owners[id(buf)]:
                        if buf.has_device_allocation() and not buf.host_dirty():
                            buf.set_device_dirty()  # as a kernel's results would
            except shim.DeviceError as e:
                assert e.code in (-14, -15, -16), e  # the injected failures, nothing else
                failures.append(e.code)

    run_threads(6, work)
    device.clear_faults()
    assert failures, "the faults were never hit"
    for buf in buffers:
        assert not (buf.host_dirty() and buf.device_dirty())
        buf.device_free()  # copies back whatever the device holds, then frees
        assert not buf.has_device_allocation()
    assert device.live_allocations == baseline
