"""A shim.Buffer's device allocations served by the native layer where its family is idle
(native_stubs/fast/buffer_families.c): halide_device_malloc / halide_device_free of its
struct (generated code, a C program) and Buffer.device_malloc / device_free, in C, with the
Python core as the implementation of record. Every test compares with serving switched off, or
checks that the Python core takes over exactly where the family is not idle (its lock held, a
call of another thread using it, a crop, results only on the device); a Hypothesis state machine
runs random work on Buffers through both paths side by side, and threads work on the same
Buffers at once.

Longer runs: HALIDE_SHIM_LONG_TESTS=1, or HALIDE_SHIM_STATEFUL_EXAMPLES=500
"""

import gc
import random
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, \
    run_state_machine_as_test

import shim
from shim.core import call_uses
from shim.memory import families
from shim.native import ffi, lib
from shim.pipelines.build import Build, build
from support.budget import scaled
from support.served import accounting, in_both_worlds, served_live
from support.threads import run_threads
from test_served_allocations import OPENCL, core_calls_during, serve  # noqa: F401 (a fixture)

EXAMPLES = scaled(25, 150, "HALIDE_SHIM_STATEFUL_EXAMPLES")
DIRTY = lib.halide_buffer_flag_host_dirty | lib.halide_buffer_flag_device_dirty
HOST_DIRTY, DEVICE_DIRTY = lib.halide_buffer_flag_host_dirty, lib.halide_buffer_flag_device_dirty


def interface():
    return lib.halide_opencl_device_interface()


def state(buf) -> tuple:
    raw = buf.raw
    return raw.device != 0, raw.device_interface != ffi.NULL, raw.flags & DIRTY


def test_a_buffers_allocation_and_copies_never_reach_python(opencl, serve):
    """malloc and free through the C entry points and through the Buffer's methods, and the
    copies between: served, no Python core operation runs, no Python record of the allocation
    exists; switched off, the Python core does it all, and every state on the way is the same."""
    data = np.arange(32 * 16, dtype=np.float32).reshape(32, 16)
    def upload(b):
        assert lib.halide_copy_to_device(ffi.NULL, b.raw, interface()) == 0

    def download(b):  # as after a kernel: only the device holds the data
        b.numpy()[:] = -1  # (clean after the upload: numpy() is the array itself)
        b.raw.flags = (b.raw.flags & ~DIRTY) | DEVICE_DIRTY
        assert lib.halide_copy_to_host(ffi.NULL, b.raw) == 0
        np.testing.assert_array_equal(b.numpy(), data)

    steps = {
        "entry malloc": lambda b: lib.halide_device_malloc(ffi.NULL, b.raw, interface()),
        "entry free": lambda b: lib.halide_device_free(ffi.NULL, b.raw),
        "method malloc": lambda b: b.device_malloc(opencl),  # (host-dirty: the host has the data)
        "upload": upload,
        "download": download,
        "method free": lambda b: b.device_free(),
    }
    warm_up = shim.Buffer(data.copy())  # (the pool's bounds are set by the first free)
    warm_up.device_malloc(opencl)
    warm_up.device_free()
    for on in (True, False):
        serve(on)
        buf, seen, before = shim.Buffer(data.copy()), [], families.live_counts()["handles"]
        for name, step in steps.items():
            served = served_live()
            ran = core_calls_during(lambda: step(buf))
            seen.append((name, state(buf)))
            assert bool(ran) is not on, (name, ran)
            if on and "malloc" in name:
                assert served_live() == served + 1
                assert families.live_counts()["handles"] == before  # only in the handle
        if on:
            served_states = seen
        else:
            assert seen == served_states
    assert served_live() == 0


def test_copies_of_the_python_cores_allocation_never_reach_python(opencl, serve):
    """A Buffer whose allocation the Python core made (Buffer.copy_to_device, a crop taken
    meanwhile and dropped): its copies both ways, through the C entry points and the Buffer's
    methods, move the bytes in C, with no Python core operation, into the memory the family
    holds; switched off, the Python core moves the same bytes. Its crops' copies, and the copies
    while another thread holds the family's lock, stay with the Python core."""
    data = np.arange(24 * 16, dtype=np.int32).reshape(24, 16)
    for on in (True, False):
        serve(on)
        buf = shim.Buffer(data.copy())
        buf.copy_to_device(opencl)  # (the Python core's allocation)
        family = buf.family
        assert family.memory is not None and buf.raw.device in family.handles
        native = lib.halide_opencl_get_cl_mem(ffi.NULL, buf.raw)
        uploaded, downloaded = opencl.transfers.uploaded, opencl.transfers.downloaded

        def round_trip():
            buf.numpy()[:] = data * 3
            buf.set_host_dirty()
            assert lib.halide_copy_to_device(ffi.NULL, buf.raw, interface()) == 0
            buf.numpy()[:] = -1
            buf.raw.flags = (buf.raw.flags & ~DIRTY) | DEVICE_DIRTY
            assert lib.halide_copy_to_host(ffi.NULL, buf.raw) == 0
            np.testing.assert_array_equal(buf.numpy(), data * 3)
            buf.numpy()[:] = data
            buf.set_host_dirty()
            buf.copy_to_device(opencl)
            buf.numpy()[:] = -1
            buf.raw.flags = (buf.raw.flags & ~DIRTY) | DEVICE_DIRTY
            buf.copy_to_host()
            np.testing.assert_array_equal(buf.numpy(), data)

        ran = core_calls_during(round_trip)
        assert bool(ran & {"copy_to_host", "copy_to_device"}) is not on, ran
        assert opencl.transfers.uploaded - uploaded == 2 * data.nbytes
        assert opencl.transfers.downloaded - downloaded == 2 * data.nbytes
        assert lib.halide_opencl_get_cl_mem(ffi.NULL, buf.raw) == native
        assert family.memory is not None and buf.raw.device in family.handles
        crop = buf.cropped([(2, 4), (8, 8)])  # (a shared family from now on: Python's)
        crop.set_device_dirty()
        assert "copy_to_host" in core_calls_during(crop.copy_to_host)
        np.testing.assert_array_equal(crop.numpy(), data[8:16, 2:6])
        del crop
        other = shim.Buffer(data.copy())
        other.copy_to_device(opencl)
        other.set_device_dirty()
        holding, done = threading.Event(), threading.Event()

        def hold():
            with other.family.lock:
                holding.set()
                done.wait()

        holder = threading.Thread(target=hold)
        holder.start()
        holding.wait()
        ran = []
        copier = threading.Thread(
            target=lambda: ran.append(core_calls_during(other.copy_to_host)))
        copier.start()
        copier.join(0.2)
        assert copier.is_alive()  # waiting for the lock, in Python: not served meanwhile
        done.set()
        holder.join()
        copier.join()
        assert "copy_to_host" in ran[0]
        np.testing.assert_array_equal(other.numpy(), data)
        del buf, other
        gc.collect()


def test_python_adopts_a_served_allocation_the_first_time_it_needs_it(opencl, serve):
    """Each Python operation that needs a Buffer's served allocation finds it in the Buffer's
    family: the upload goes to the memory generated code got, a crop aliases it, a DLPack-style
    pin keeps it, and dropping the Buffer gives it back."""
    start = accounting(opencl)
    data = np.arange(24 * 8, dtype=np.int32).reshape(24, 8)
    for operation in ("copy_to_device", "cropped", "set_host_dirty", "drop", "numpy", "move"):
        buf = shim.Buffer(data.copy())
        assert lib.halide_device_malloc(ffi.NULL, buf.raw, interface()) == 0
        native = lib.halide_opencl_get_cl_mem(ffi.NULL, buf.raw)
        assert served_live() == 1
        if operation == "copy_to_device":
            buf.set_host_dirty()
            buf.copy_to_device(opencl)
            assert lib.halide_opencl_get_cl_mem(ffi.NULL, buf.raw) == native
            buf.numpy()[:] = -1  # the device now holds the only copy, as after a kernel
            buf.raw.flags = (buf.raw.flags & ~DIRTY) | DEVICE_DIRTY
            np.testing.assert_array_equal(buf.numpy(), data)
        elif operation == "cropped":
            crop = buf.cropped([(2, 4), (8, 8)])
            crop.copy_to_device(opencl)
            assert lib.halide_opencl_get_cl_mem(ffi.NULL, crop.raw) == native
            np.testing.assert_array_equal(crop.numpy(), data[8:16, 2:6])
            del crop
        elif operation == "set_host_dirty":
            buf.set_host_dirty()
            assert buf.raw.flags & DIRTY == HOST_DIRTY
        elif operation == "numpy":
            np.testing.assert_array_equal(buf.numpy(), data)  # clean: nothing to bring home
        elif operation == "move":
            buf.copy_to_device("host")  # to another device: the served memory goes back
            assert buf.device.kind == "host"
        assert served_live() == (operation in ("numpy", "drop")), operation  # (need none)
        del buf
        gc.collect()
        assert served_live() == 0, operation
    assert accounting(opencl) == start


def test_a_gpu_pipeline_allocates_a_fresh_buffer_output_in_c(opencl, serve):
    """brighten on OpenCL with a new shim.Buffer as its output at every call: generated code
    allocates it (served), the result read back is numpy's, and dropping the Buffers leaves
    nothing behind; the same as the Python core gives."""
    brighten = shim.load(build(Build("brighten", "opencl", "no_runtime")))
    image = np.random.default_rng(3).random((16, 24), dtype=np.float32)
    source = shim.Buffer(image)
    start = accounting(opencl)
    results = {}
    for on in (True, False):
        serve(on)
        out = shim.Buffer(np.zeros_like(image))
        brighten(source, 2.0, 1.0, out)
        assert out.raw.device != 0
        results[on] = out.numpy().copy()
        del out
        gc.collect()
    np.testing.assert_allclose(results[True], image * 2 + 1, rtol=1e-6)
    np.testing.assert_array_equal(results[True], results[False])
    source.device_free()
    assert served_live() == 0 and accounting(opencl) == start


def test_a_held_lock_leaves_the_malloc_to_python(opencl, serve):
    """While another thread holds the Buffer's family lock, a malloc of its struct is not
    served: it goes to the Python core, which waits for the lock, and then allocates once."""
    buf = shim.Buffer(np.zeros((8, 8), np.float32))
    holding, release, done = threading.Event(), threading.Event(), threading.Event()

    def holder():
        with buf.family.lock:
            holding.set()
            release.wait(10)

    def allocator():
        assert lib.halide_device_malloc(ffi.NULL, buf.raw, interface()) == 0
        done.set()

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    assert holding.wait(10)
    threads.append(threading.Thread(target=allocator))
    threads[1].start()
    assert not done.wait(0.3), "allocated while another thread held the family's lock"
    release.set()
    for thread in threads:
        thread.join(10)
    assert done.is_set() and served_live() == 0  # Python's: recorded in the family
    assert buf.raw.device in buf.family.handles
    buf.device_free()


def test_a_free_waits_for_another_threads_call_using_the_buffer(opencl, serve):
    """A call recorded on the Buffer (as a running pipeline call is) keeps a free from another
    thread waiting, through the Python core, until the call ends; a malloc does not wait."""
    buf = shim.Buffer(np.zeros((8, 8), np.float32))
    assert lib.halide_device_malloc(ffi.NULL, buf.raw, interface()) == 0
    assert served_live() == 1  # a malloc is served whatever calls use the Buffer
    uses = call_uses.begin_call(10**9, [(buf.raw, buf.family, True)], host_write=False)
    freed = threading.Event()

    def free():
        assert lib.halide_device_free(ffi.NULL, buf.raw) == 0
        freed.set()

    thread = threading.Thread(target=free)
    thread.start()
    assert not freed.wait(0.3), "freed under a running call"
    call_uses.end_call(10**9, uses)
    thread.join(10)
    assert freed.is_set() and buf.raw.device == 0 and served_live() == 0


def test_device_only_results_go_home_before_buffer_device_free(opencl, serve):
    """Buffer.device_free never loses results only the device holds: served where there are
    none, brought home by the Python core where there are."""
    data = np.arange(64, dtype=np.int32).reshape(8, 8)
    buf = shim.Buffer(data.copy())
    buf.device_malloc(opencl)
    buf.copy_to_device(opencl)  # (adopted: the upload is Python's)
    buf.device_free()
    buf.device_malloc(opencl)  # served again: the family is idle and holds nothing
    assert served_live() == 1
    buf.copy_to_device(opencl)
    buf.numpy()[:] = 0
    buf.raw.flags = (buf.raw.flags & ~DIRTY) | DEVICE_DIRTY
    buf.device_free()
    np.testing.assert_array_equal(buf.numpy(), data)


# --- the served and Python paths side by side, on random work -------------------------------

SHAPES = [(8, 16), (8, 15), (4, 4), (3, 5)]


class World:
    """shim.Buffers operated with serving on or off."""

    def __init__(self, on: bool):
        self.on = on
        self.buffers: list = []
        self.crops: list = []  # (crop, parent index)


class BuffersServedAgainstPython(RuleBasedStateMachine):
    """Every rule runs the same operation on two worlds of shim.Buffers: one with the native
    layer serving allocations, one with the Python core doing everything. Return codes, device
    state, dirty bits and the data that comes back must agree with each other and with a numpy
    model of each Buffer; the driver's accounting adds up throughout, and in the serving world
    a malloc of an idle Buffer is served."""

    def __init__(self):
        super().__init__()
        self.opencl = shim.device("opencl")
        self.worlds = (World(True), World(False))
        self.models: list[np.ndarray] = []
        self.start = accounting(self.opencl)
        self.value = 0

    def both(self, operation):
        """operation(world) on each world with its setting; the results (or the ShimErrors'
        types) must agree."""
        return in_both_worlds(self.worlds, operation, shim.ShimError)

    def pick(self, i) -> int:
        return i % len(self.models)

    def cropped(self, i) -> bool:
        return any(parent == i for _, parent in self.worlds[0].crops)

    @rule(shape=st.sampled_from(SHAPES))
    def new(self, shape):
        self.value += 1
        self.models.append(np.full(shape, self.value, np.int32))
        for world in self.worlds:
            world.buffers.append(shim.Buffer(self.models[-1].copy()))

    @precondition(lambda self: self.models)
    @rule(i=st.integers(0, 99), method=st.booleans())
    def malloc(self, i, method):
        i = self.pick(i)
        buf = self.worlds[0].buffers[i]  # (a Buffer ever cropped keeps a shared family)
        idle = buf.raw.device == 0 and not buf.family.shared and not buf.family.handles
        served = served_live()
        self.both(lambda w: (w.buffers[i].device_malloc(self.opencl) if method else
                             lib.halide_device_malloc(ffi.NULL, w.buffers[i].raw, interface()),
                             state(w.buffers[i])))
        if idle:
            assert served_live() == served + 1

    @precondition(lambda self: self.models)
    @rule(i=st.integers(0, 99), method=st.booleans())
    def free(self, i, method):
        i = self.pick(i)
        if self.cropped(i) and not method:
            return  # (Halide: a crop's parent keeps its allocation while the crop does)
        device_only = self.worlds[0].buffers[i].raw.flags & DEVICE_DIRTY
        self.both(lambda w: (w.buffers[i].device_free() if method else
                             lib.halide_device_free(ffi.NULL, w.buffers[i].raw),
                             state(w.buffers[i])))
        if device_only and not method:  # lost with the memory, as in Halide
            self.models[i] = self.worlds[0].buffers[i].numpy().copy()

    @precondition(lambda self: self.models)
    @rule(i=st.integers(0, 99))
    def kernel_write(self, i):
        """What a kernel does: device memory written through the driver, then the device-dirty
        bit set as generated code sets it (on a Buffer never cropped: a shared family keeps
        its bits as regions, which only its operations change)."""
        import pyopencl as cl  # (the opencl fixture made sure it is there)

        i = self.pick(i)
        buf = self.worlds[0].buffers[i]
        if buf.raw.device == 0 or buf.family.shared:
            return
        self.both(lambda w: w.buffers[i].copy_to_host())  # (what the host held goes first)
        self.value += 1
        self.models[i] = np.full(self.models[i].shape, self.value, np.int32)
        for world in self.worlds:
            raw = world.buffers[i].raw
            mem = cl.Buffer.from_int_ptr(lib.halide_opencl_get_cl_mem(ffi.NULL, raw), retain=True)
            cl.enqueue_copy(self.opencl.queue, mem, self.models[i].reshape(-1), is_blocking=True)
            mem.release()
            raw.flags = (raw.flags & ~DIRTY) | DEVICE_DIRTY

    @precondition(lambda self: self.models)
    @rule(i=st.integers(0, 99))
    def host_write(self, i):
        i = self.pick(i)
        self.value += 1
        self.both(lambda w: w.buffers[i].copy_to_host())
        self.models[i][0, :] = self.value
        for world in self.worlds:
            world.buffers[i].numpy()[0, :] = self.value
        self.both(lambda w: (w.buffers[i].set_host_dirty(), state(w.buffers[i])))

    @precondition(lambda self: self.models)
    @rule(i=st.integers(0, 99), entry=st.booleans())
    def copy_to_device(self, i, entry):
        i = self.pick(i)
        self.both(lambda w: (lib.halide_copy_to_device(ffi.NULL, w.buffers[i].raw, interface())
                             if entry else w.buffers[i].copy_to_device(self.opencl),
                             state(w.buffers[i])))

    @precondition(lambda self: self.models)
    @rule(i=st.integers(0, 99), x=st.integers(0, 2), y=st.integers(0, 2))
    def crop(self, i, x, y):
        i = self.pick(i)
        height, width = self.models[i].shape
        box = [(x, max(width - x - 1, 1)), (y, max(height - y - 1, 1))]
        for world in self.worlds:
            world.crops.append((world.buffers[i].cropped(box), i))
        self.both(lambda w: (w.crops[-1][0].copy_to_host(), state(w.crops[-1][0])))
        for world in self.worlds:
            (lo_x, w_x), (lo_y, h_y) = box
            np.testing.assert_array_equal(world.crops[-1][0].numpy(),
                                          self.models[i][lo_y:lo_y + h_y, lo_x:lo_x + w_x])

    @precondition(lambda self: self.worlds[0].crops)
    @rule(k=st.integers(0, 99))
    def drop_crop(self, k):
        k %= len(self.worlds[0].crops)
        for world in self.worlds:
            del world.crops[k]
        gc.collect()

    @precondition(lambda self: self.models)
    @rule(i=st.integers(0, 99))
    def drop(self, i):
        """A Buffer dropped (its device results, if any, come home first: nobody sees them,
        but the rule keeps the model simple by reading them before)."""
        i = self.pick(i)
        self.read(i)
        for world in self.worlds:
            world.crops = [(c, p - (p > i)) for c, p in world.crops if p != i]
            del world.buffers[i]
        del self.models[i]
        gc.collect()

    @precondition(lambda self: self.models)
    @rule(i=st.integers(0, 99))
    def read(self, i):
        i = self.pick(i)
        self.both(lambda w: w.buffers[i].copy_to_host())
        for world in self.worlds:
            np.testing.assert_array_equal(world.buffers[i].numpy(), self.models[i])

    @invariant()
    def the_worlds_agree(self):
        for a, b in zip(*(w.buffers for w in self.worlds)):
            assert state(a) == state(b)

    @invariant()
    def allocations_add_up(self):
        assert accounting(self.opencl) == self.start

    def teardown(self):
        arrays = []
        for world in self.worlds:  # everything dropped, even after a failure, then checked
            lib.shim_serve_allocations(OPENCL, world.on)
            world.crops.clear()
            for buf in world.buffers:
                arrays.append(buf.numpy())  # (device results come home first)
            world.buffers.clear()
        lib.shim_serve_allocations(OPENCL, True)
        gc.collect()
        assert served_live() == 0 and accounting(self.opencl) == self.start
        for array, model in zip(arrays, self.models + self.models):
            np.testing.assert_array_equal(array, model)


def test_served_and_python_paths_agree_on_random_buffer_work(opencl, serve):
    run_state_machine_as_test(BuffersServedAgainstPython, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=30, deadline=None, database=None,
        print_blob=True, report_multiple_bugs=False, suppress_health_check=[HealthCheck.too_slow]))


# --- threads on the same Buffers --------------------------------------------------------------

def test_threads_on_the_same_buffers_never_lose_memory_or_data(opencl, serve):
    """Threads malloc, free, upload and read the same few Buffers at once, through the C entry
    points (served while the family is idle) and the methods, one switching serving on and off: every read gives the Buffer's
    data (host memory always holds it: nothing writes the device), and at the end nothing is
    allocated that the accounting does not know of."""
    start = accounting(opencl)
    buffers = [shim.Buffer(np.full((8, 8 + k), k, np.int32)) for k in range(3)]
    steps = scaled(150, 1500)
    # Two threads allocating and freeing one struct through the C entry points at once race in
    # Halide's contract too: one may find the struct half changed, and gets Halide's error.
    racing = {0, lib.halide_error_code_no_device_interface,
              lib.halide_error_code_device_interface_no_device}

    def worker(index):
        rng = random.Random(index)
        if index == 0:
            for step in range(steps // 5):
                lib.shim_serve_allocations(OPENCL, step % 3 != 0)
            lib.shim_serve_allocations(OPENCL, True)
            return
        for _ in range(steps):
            k = rng.randrange(len(buffers))
            buf = buffers[k]
            action = rng.randrange(6)
            if action == 0:
                assert lib.halide_device_malloc(ffi.NULL, buf.raw, interface()) in racing
            elif action == 1:
                buf.device_malloc(opencl)
            elif action == 2:
                assert lib.halide_device_free(ffi.NULL, buf.raw) in racing
            elif action == 3:
                buf.device_free()
            elif action == 4:  # as generated code uploads an input it was given
                buf.raw.flags |= HOST_DIRTY
                assert lib.halide_copy_to_device(ffi.NULL, buf.raw, interface()) in racing
            else:
                buf.copy_to_device(opencl)
                assert (buf.numpy() == k).all(), f"thread {index}: buffer {k} changed"

    run_threads(6, worker)
    for buf in buffers:
        buf.device_free()
    assert served_live() == 0 and accounting(opencl) == start
