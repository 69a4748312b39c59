"""Allocations the native layer serves without Python (native_stubs/devices/served.c): a
pipeline's own device buffers, allocated and freed in C from the backend's pool, and taken
over by the Python core the first time it needs one (a crop, a copy, a profile).

The Python core is the implementation of record: every test here runs the same work with
serving switched on and off (shim_serve_allocations) and compares, and a Hypothesis state
machine runs random sequences of mallocs, frees, copies, crops and malformed buffers through
both paths side by side. A torture test runs the native pool and handles under threads.

Longer runs: HALIDE_SHIM_LONG_TESTS=1 (150 examples), or HALIDE_SHIM_STATEFUL_EXAMPLES=500
"""

import gc
import random
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, \
    run_state_machine_as_test

import shim
from shim.memory import families
from shim.native import ffi, lib
from shim.native.regions import Layout, NegativeStrides
from shim.pipelines.build import Build, build
from support.budget import scaled
from support.served import accounting, in_both_worlds, python_calls_during, served_live
from support.threads import run_threads
from test_device_layer import raw_like
from test_fork import run_isolated

EXAMPLES = scaled(25, 150, "HALIDE_SHIM_STATEFUL_EXAMPLES")
OPENCL = lib.SHIM_BACKEND_OPENCL
DIRTY = lib.halide_buffer_flag_host_dirty | lib.halide_buffer_flag_device_dirty


@pytest.fixture
def serve(opencl):
    """Switches serving on OpenCL on or off; every test leaves it on, with reuse on."""
    def switch(on: bool) -> None:
        lib.shim_serve_allocations(OPENCL, on)

    yield switch
    switch(True)
    shim.reuse_device_allocations(True)


def core_calls_during(work) -> set[str]:
    """The Python core's device operations (shim/core/runtime.py) that ran, on any thread,
    while ``work()`` ran."""
    return {name.rsplit(".", 1)[1] for name in python_calls_during(work, "shim.core.runtime")}


def blur3x3_reference(image: np.ndarray) -> np.ndarray:
    a = image.astype(np.uint32)
    bx = ((a[:, :-2] + a[:, 1:-1] + a[:, 2:]) // 3).astype(np.uint16).astype(np.uint32)
    return ((bx[:-2] + bx[1:-1] + bx[2:]) // 3).astype(np.uint16)


def test_a_pipelines_own_buffers_never_reach_python(opencl, serve):
    """blur3x3 on OpenCL allocates and frees its compute_root stage on the device at every
    call: served in C, the Python core's device_malloc and device_free never run; switched
    off, they do. The results are numpy's either way, and the driver is asked for memory once."""
    blur = shim.load(build(Build("blur3x3", "opencl", "no_runtime")))
    image = (np.arange(34 * 70, dtype=np.uint16).reshape(34, 70) * 37) % 4099
    source = shim.Buffer(image)
    out = shim.Buffer(np.empty((32, 68), np.uint16))
    source.copy_to_device(opencl)
    out.device_malloc(opencl)
    blur(source, out)  # compiles, and pools the stage's memory
    new = opencl.allocation_counts()["new"]
    for on in (True, False, True):
        serve(on)
        ran = core_calls_during(lambda: blur(source, out))
        assert ("device_malloc" in ran or "device_free" in ran) is not on, ran
        out.set_device_dirty()
        np.testing.assert_array_equal(out.numpy(), blur3x3_reference(image))
    assert opencl.allocation_counts()["new"] == new
    assert served_live() == 0


def test_a_served_allocation_becomes_pythons_when_python_needs_it(opencl, serve):
    """A bare struct's allocation, served in C, then cropped (which only the Python core
    does): the family appears then, the crop aliases the same memory, its data goes through
    the device and back, and the free goes to the pool through Python."""
    start, before, handles = served_live(), accounting(opencl), families.live_counts()
    interface = lib.halide_opencl_device_interface()
    parent = raw_like(np.arange(16 * 32, dtype=np.int32).reshape(16, 32), mins=(0, 0))
    assert lib.halide_device_malloc(ffi.NULL, parent.raw, interface) == 0
    assert served_live() == start + 1
    assert families.live_counts() == handles  # no Python object for it
    assert families.family_of(parent.raw) is not None  # met by Python: adopted
    assert served_live() == start
    # The struct's host data to the device (it is host-dirty), then a crop read back.
    parent.raw.flags |= lib.halide_buffer_flag_host_dirty
    assert lib.halide_copy_to_device(ffi.NULL, parent.raw, interface) == 0
    # A crop as generated code makes one: the parent's strides, host memory of its own here
    # (rows as long as the parent's), so that what it reads back is its own.
    crop_host = np.zeros((4, 32), np.int32)
    crop = raw_like(crop_host[:, :8], mins=(8, 4))
    assert lib.halide_device_crop(ffi.NULL, parent.raw, crop.raw) == 0
    assert lib.halide_opencl_get_cl_mem(ffi.NULL, crop.raw) == \
        lib.halide_opencl_get_cl_mem(ffi.NULL, parent.raw)
    crop.raw.flags = lib.halide_buffer_flag_device_dirty
    assert lib.halide_copy_to_host(ffi.NULL, crop.raw) == 0
    np.testing.assert_array_equal(crop_host[:, :8], parent.array[4:8, 8:16])
    assert lib.halide_device_release_crop(ffi.NULL, crop.raw) == 0
    assert lib.halide_device_free(ffi.NULL, parent.raw) == 0
    assert parent.raw.device == 0 and parent.raw.device_interface == ffi.NULL
    assert accounting(opencl) == before and served_live() == start
    assert families.live_counts() == handles


def test_a_stages_copies_never_reach_python(opencl, serve):
    """A bare struct's upload (allocating it) and download, served in C like its malloc and
    free: no Python, the bytes counted, the dirty bits as the Python core leaves them. A struct
    whose rows have gaps goes to Python for its copies, with the same result."""
    interface = lib.halide_opencl_device_interface()
    for gapped in (False, True):
        wide = np.arange(8 * 20, dtype=np.int32).reshape(8, 20)
        data = wide[:, :16] if gapped else wide[:, :16].copy()
        buf = raw_like(data, mins=(0, 0))
        buf.raw.flags = lib.halide_buffer_flag_host_dirty
        uploaded, downloaded = opencl.transfers.uploaded, opencl.transfers.downloaded

        def round_trip():
            assert lib.halide_copy_to_device(ffi.NULL, buf.raw, interface) == 0
            assert buf.raw.flags & DIRTY == 0 and buf.raw.device != 0
            buf.array[:] = -1
            buf.raw.flags = lib.halide_buffer_flag_device_dirty
            assert lib.halide_copy_to_host(ffi.NULL, buf.raw) == 0
            assert buf.raw.flags & DIRTY == 0

        ran = core_calls_during(round_trip)
        assert bool(ran & {"copy_to_device", "copy_to_host"}) is gapped, ran
        np.testing.assert_array_equal(buf.array, wide[:, :16] if gapped else np.arange(8 * 20).reshape(8, 20)[:, :16])
        assert opencl.transfers.uploaded - uploaded == 8 * 16 * 4
        assert opencl.transfers.downloaded - downloaded == 8 * 16 * 4
        if gapped:
            np.testing.assert_array_equal(wide[:, 16:], np.arange(8 * 20).reshape(8, 20)[:, 16:])
        assert lib.halide_device_free(ffi.NULL, buf.raw) == 0
    assert served_live() == 0


def test_device_and_host_malloc_and_free_never_reach_python(opencl, serve):
    """halide_device_and_host_malloc and _free of a bare struct, served in C: host memory from
    halide_malloc of the struct's span and a device allocation, both usable (bytes through the
    device and back), then both given back with the dirty bits cleared; switched off, the
    Python core does the same, with the same flags, bytes and pool."""
    interface = lib.halide_opencl_device_interface()
    results = []
    for on in (False, True):  # (the Python core's first free sets the pool's byte bound,
        serve(on)             # which served frees need: served.c's serve_free)
        shape = raw_like(np.empty((6, 7), np.int16), mins=(3, -2))
        raw = shape.raw
        raw.host = ffi.NULL
        before = accounting(opencl)
        seen = {}

        def work():
            assert lib.halide_device_and_host_malloc(ffi.NULL, raw, interface) == 0
            assert raw.host != ffi.NULL and raw.device != 0 and raw.flags & DIRTY == 0
            seen["served"] = served_live()
            host = np.frombuffer(ffi.buffer(raw.host, 6 * 7 * 2), np.int16)
            host[:] = np.arange(host.size, dtype=np.int16) * 3
            raw.flags = lib.halide_buffer_flag_host_dirty
            assert lib.halide_copy_to_device(ffi.NULL, raw, interface) == 0
            host[:] = 0
            raw.flags = lib.halide_buffer_flag_device_dirty
            assert lib.halide_copy_to_host(ffi.NULL, raw) == 0
            seen["bytes"] = host.copy()
            raw.flags = lib.halide_buffer_flag_device_dirty  # (what is dropped with it)
            assert lib.halide_device_and_host_free(ffi.NULL, raw) == 0

        ran = core_calls_during(work)
        assert bool(ran & {"device_and_host_malloc", "device_and_host_free"}) is not on, ran
        assert seen["served"] == (1 if on else 0)
        assert raw.host == ffi.NULL and raw.device == 0 and raw.device_interface == ffi.NULL
        assert raw.flags & DIRTY == 0
        assert accounting(opencl) == before and served_live() == 0
        results.append(seen["bytes"])
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], np.arange(42, dtype=np.int16) * 3)


def test_a_buffer_whose_flags_were_assigned_whole_keeps_its_allocation(opencl, serve):
    """Code that assigns a shim.Buffer's struct flags as a whole (``raw.flags = 1``) drops the
    bit that keeps the native layer from serving it: an allocation served then joins the
    Buffer's family the first time Python meets it, and everything works and is given back."""
    data = np.arange(64, dtype=np.float32).reshape(8, 8)
    buf = shim.Buffer(data)
    interface = lib.halide_opencl_device_interface()
    live = opencl.live_allocations
    buf.raw.flags = lib.halide_buffer_flag_host_dirty
    assert lib.halide_device_malloc(ffi.NULL, buf.raw, interface) == 0
    assert lib.halide_copy_to_device(ffi.NULL, buf.raw, interface) == 0
    buf.raw.flags = lib.halide_buffer_flag_device_dirty
    data[:] = -1  # (the Buffer's host memory: only the device holds the values now)
    np.testing.assert_array_equal(buf.numpy(), np.arange(64).reshape(8, 8))  # brought home
    crop = buf.cropped([(2, 4), (2, 4)])
    crop.copy_to_device(opencl)
    np.testing.assert_array_equal(crop.numpy(), np.arange(64).reshape(8, 8)[2:6, 2:6])
    del crop, buf
    gc.collect()
    assert opencl.live_allocations == live and served_live() == 0


def test_a_profile_sees_every_allocation(opencl, serve):
    """Served allocations would be invisible to a profile: while one records, the Python core
    serves them all, and an allocation served before it started is freed through Python."""
    interface = lib.halide_opencl_device_interface()
    early = raw_like(np.zeros((8, 8), np.float32), mins=(0, 0))
    late = raw_like(np.zeros((8, 8), np.float32), mins=(0, 0))
    assert lib.halide_device_malloc(ffi.NULL, early.raw, interface) == 0
    with shim.profile() as profile:
        ran = core_calls_during(lambda: (
            lib.halide_device_malloc(ffi.NULL, late.raw, interface),
            lib.halide_device_free(ffi.NULL, late.raw),
            lib.halide_device_free(ffi.NULL, early.raw)))
    assert {"device_malloc", "device_free"} <= ran
    assert len(profile.calls("device_malloc")) == 1 and len(profile.calls("device_free")) == 2
    assert early.raw.device == 0 and late.raw.device == 0


def malformed(kind: str):
    array = np.zeros((6, 10), np.float32)
    buf = raw_like(array, mins=(0, 0))
    if kind == "negative stride":
        buf.dims[0].stride = -1
    elif kind == "empty":
        buf.dims[1].extent = 0
    elif kind == "both dirty":
        buf.raw.flags = DIRTY
    elif kind == "interface without device":
        buf.raw.device_interface = lib.halide_opencl_device_interface()
    return buf


@pytest.mark.parametrize("kind", ["negative stride", "empty", "both dirty",
                                  "interface without device", "null"])
def test_malformed_buffers_get_the_python_cores_answer(opencl, serve, kind):
    interface = lib.halide_opencl_device_interface()
    outcomes = []
    for on in (True, False):
        serve(on)
        buf = None if kind == "null" else malformed(kind)
        raw = ffi.NULL if buf is None else buf.raw
        malloc = lib.halide_device_malloc(ffi.NULL, raw, interface)
        state = None if buf is None else (buf.raw.device != 0, buf.raw.flags)
        free = lib.halide_device_free(ffi.NULL, raw)
        outcomes.append((malloc, state, free))
        if buf is not None and kind != "both dirty":
            assert buf.raw.device == 0
    assert outcomes[0] == outcomes[1]
    assert served_live() == 0


FORK_SCENARIO = r"""
import os, sys
import numpy as np
import shim
from shim.native import ffi, lib
sys.path.insert(0, sys.argv[1])
from test_device_layer import raw_like

opencl = shim.device("opencl")
interface = lib.halide_opencl_device_interface()
kept = raw_like(np.zeros((16, 16), np.float32), mins=(0, 0))
assert lib.halide_device_malloc(ffi.NULL, kept.raw, interface) == 0
pid = os.fork()
if pid == 0:
    child = raw_like(np.zeros((16, 16), np.float32), mins=(0, 0))
    print("child malloc", lib.halide_device_malloc(ffi.NULL, child.raw, interface) != 0, flush=True)
    print("child free", lib.halide_device_free(ffi.NULL, kept.raw), kept.raw.device == 0, flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0
kept.raw.flags = lib.halide_buffer_flag_host_dirty
kept.array[:] = 5
assert lib.halide_copy_to_device(ffi.NULL, kept.raw, interface) == 0
kept.array[:] = 0
kept.raw.flags = lib.halide_buffer_flag_device_dirty
assert lib.halide_copy_to_host(ffi.NULL, kept.raw) == 0
assert (kept.array == 5).all()
assert lib.halide_device_free(ffi.NULL, kept.raw) == 0
print("parent intact", flush=True)
"""


def test_a_forked_child_never_serves_or_frees_the_parents_memory(opencl):
    """In a child forked after the parent served an allocation, the driver is the parent's:
    nothing is served there, and freeing the parent's allocation forgets it without a driver
    call; the parent's memory and data are untouched."""
    from pathlib import Path

    done = run_isolated(FORK_SCENARIO, str(Path(__file__).parent))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.split("\n")
    assert lines[0] == "child malloc True", done.stdout + done.stderr  # refused: an error code
    assert lines[1].startswith("child free ") and lines[2] == "parent intact", done.stdout


@settings(max_examples=300, deadline=None)
@given(bits=st.sampled_from([1, 8, 16, 32, 64]),
       dims=st.lists(st.tuples(st.integers(-3, 40), st.integers(-4, 5000)), max_size=5))
def test_the_native_span_is_the_python_cores(bits, dims):
    """shim_buffer_span, the size served allocations get, against Layout.nbytes_span: equal
    wherever the native side decides, and where it declines the Python core gives no positive
    size without an error (an empty buffer, a negative stride or extent)."""
    dim = ffi.new("halide_dimension_t[]", max(len(dims), 1))
    for i, (extent, stride) in enumerate(dims):
        dim[i].extent, dim[i].stride = extent, stride
    raw = ffi.new("halide_buffer_t *")
    raw.type.code, raw.type.bits, raw.type.lanes = 1, bits, 1
    raw.dimensions, raw.dim = len(dims), dim
    span = ffi.new("uint64_t *")
    try:
        python = Layout.of(raw).nbytes_span
    except NegativeStrides:
        python = None
    if lib.shim_buffer_span(raw, span):
        assert span[0] == python
    else:
        assert python is None or python <= 0 or any(e < 0 for e, _ in dims) or python >= 1 << 60


# --- the same random work through both paths ----------------------------------------------

SHAPES = [(8, 16), (8, 15), (16, 16), (4, 4), (3, 5)]


class World:
    """Bare structs over host arrays, operated with serving on or off."""

    def __init__(self, on: bool):
        self.on = on
        self.buffers: list = []  # raw_like
        self.crops: list = []  # (crop raw_like, parent index)


class ServedAgainstPython(RuleBasedStateMachine):
    """Every rule runs the same operation on two worlds of bare structs: one with the native
    layer serving allocations, one with the Python core doing everything. Return codes,
    device state, dirty bits and the data that comes back must agree, and both must agree
    with a numpy model of each buffer; the driver's accounting must add up throughout."""

    def __init__(self):
        super().__init__()
        self.opencl = shim.device("opencl")
        self.interface = lib.halide_opencl_device_interface()
        self.worlds = (World(True), World(False))
        self.models: list[np.ndarray] = []
        self.start = accounting(self.opencl)
        self.value = 0

    def both(self, operation):
        """operation(world) on each world with its setting; the results must agree."""
        return in_both_worlds(self.worlds, operation)

    def state(self, buf) -> tuple:
        return (buf.raw.device != 0, buf.raw.device_interface != ffi.NULL, buf.raw.flags & DIRTY)

    @rule(shape=st.sampled_from(SHAPES), gapped=st.booleans())
    def new(self, shape, gapped):
        """A new struct over host memory: dense, or rows with a gap after each (as a crop of a
        wider image has), whose copies only the Python core makes."""
        self.value += 1
        model = np.full(shape, self.value, np.int32)
        self.models.append(model)
        for world in self.worlds:
            array = np.full((shape[0], shape[1] + 3 * gapped), -7, np.int32)[:, :shape[1]]
            array[:] = model
            world.buffers.append(raw_like(array, mins=(0, 0)))

    def pick(self, i) -> int:
        return i % len(self.models)

    @precondition(lambda self: self.models)
    @rule(i=st.integers(0, 99))
    def malloc(self, i):
        i = self.pick(i)
        fresh = self.worlds[0].buffers[i].raw.device == 0
        served = served_live()
        self.both(lambda w: (lib.halide_device_malloc(ffi.NULL, w.buffers[i].raw, self.interface),
                             self.state(w.buffers[i])))
        if fresh:  # the serving world's malloc was served (the other's was not)
            assert served_live() == served + 1

    @rule(shape=st.sampled_from(SHAPES), read_back=st.booleans())
    def pipeline_stage(self, shape, read_back):
        """A pipeline's compute_root stage, whole: a new struct allocated, written by a
        kernel, maybe read back, freed."""
        self.value += 1
        expected = np.full(shape, self.value, np.int32)
        stage = [raw_like(np.zeros(shape, np.int32), mins=(0, 0)) for _ in self.worlds]
        served = served_live()
        self.both(lambda w: lib.halide_device_malloc(
            ffi.NULL, stage[w is self.worlds[1]].raw, self.interface))
        assert served_live() == served + 1
        for buf in stage:
            self.device_writes(buf, expected)
        if read_back:
            self.both(lambda w: lib.halide_copy_to_host(ffi.NULL, stage[w is self.worlds[1]].raw))
            for buf in stage:
                np.testing.assert_array_equal(buf.array, expected)
        self.both(lambda w: (lib.halide_device_free(ffi.NULL, stage[w is self.worlds[1]].raw),
                             self.state(stage[w is self.worlds[1]])))
        assert served_live() == served

    def device_writes(self, buf, values: np.ndarray) -> None:
        """What a kernel does: device memory written behind the shim's back (here through
        the driver), then the device-dirty bit set as generated code sets it."""
        import pyopencl as cl  # (the opencl fixture made sure it is there)

        # The device mirrors the host layout from the min element: rows `stride` apart.
        height, width = values.shape
        stride = buf.dims[1].stride
        laid_out = np.zeros((height, stride), np.int32)
        laid_out[:, :width] = values
        mem = cl.Buffer.from_int_ptr(lib.halide_opencl_get_cl_mem(ffi.NULL, buf.raw), retain=True)
        cl.enqueue_copy(self.opencl.queue, mem, laid_out.reshape(-1)[:(height - 1) * stride + width],
                        is_blocking=True)
        mem.release()
        buf.raw.flags = (buf.raw.flags & ~DIRTY) | lib.halide_buffer_flag_device_dirty

    @precondition(lambda self: self.models)
    @rule(i=st.integers(0, 99))
    def kernel_write(self, i):
        i = self.pick(i)
        if self.worlds[0].buffers[i].raw.device == 0:
            return
        self.value += 1
        self.models[i] = np.full(self.models[i].shape, self.value, np.int32)
        for world in self.worlds:
            self.device_writes(world.buffers[i], self.models[i])

    @precondition(lambda self: self.models)
    @rule(i=st.integers(0, 99))
    def free(self, i):
        i = self.pick(i)
        if any(parent == i for _, parent in self.worlds[0].crops):
            return  # (Halide: a crop's parent outlives it)
        device_only = self.worlds[0].buffers[i].raw.flags & lib.halide_buffer_flag_device_dirty
        self.both(lambda w: (lib.halide_device_free(ffi.NULL, w.buffers[i].raw),
                             self.state(w.buffers[i])))
        if device_only:  # lost with the memory, as in Halide: the host's older data is current
            self.models[i] = self.worlds[0].buffers[i].array.copy()
            np.testing.assert_array_equal(self.worlds[1].buffers[i].array, self.models[i])

    @precondition(lambda self: self.models)
    @rule(i=st.integers(0, 99))
    def host_write(self, i):
        """The host side changes: first current there, as a caller must make it."""
        i = self.pick(i)
        self.value += 1
        self.both(lambda w: lib.halide_copy_to_host(ffi.NULL, w.buffers[i].raw))
        self.models[i][0, :] = self.value
        for world in self.worlds:
            buf = world.buffers[i]
            buf.array[0, :] = self.value
            buf.raw.flags = (buf.raw.flags & ~DIRTY) | lib.halide_buffer_flag_host_dirty

    @precondition(lambda self: self.models)
    @rule(i=st.integers(0, 99))
    def copy_to_device(self, i):
        i = self.pick(i)
        self.both(lambda w: (lib.halide_copy_to_device(ffi.NULL, w.buffers[i].raw, self.interface),
                             self.state(w.buffers[i])))

    @precondition(lambda self: len(self.models) >= 2)
    @rule(i=st.integers(0, 99), j=st.integers(0, 99))
    def device_copy(self, i, j):
        """halide_buffer_copy of one buffer into another on the device, over their overlap:
        the destination becomes device-dirty with the source's values there."""
        i, j = self.pick(i), self.pick(j)
        if i == j:
            return
        for k in (i, j):  # both current on the device: memory fresh from malloc holds garbage
            self.current_on_device(k)
        code = self.both(lambda w: lib.halide_buffer_copy(
            ffi.NULL, w.buffers[i].raw, self.interface, w.buffers[j].raw))
        if code == 0:
            h = min(self.models[i].shape[0], self.models[j].shape[0])
            v = min(self.models[i].shape[1], self.models[j].shape[1])
            self.models[j][:h, :v] = self.models[i][:h, :v]

    def current_on_device(self, i):
        self.both(lambda w: lib.halide_copy_to_host(ffi.NULL, w.buffers[i].raw))
        for world in self.worlds:
            buf = world.buffers[i]
            buf.raw.flags = (buf.raw.flags & ~DIRTY) | lib.halide_buffer_flag_host_dirty
        self.both(lambda w: lib.halide_copy_to_device(ffi.NULL, w.buffers[i].raw, self.interface))

    @precondition(lambda self: self.models)
    @rule(i=st.integers(0, 99), y=st.integers(0, 2), x=st.integers(0, 2))
    def crop(self, i, y, x):
        i = self.pick(i)
        height, width = self.models[i].shape
        for world in self.worlds:
            array = np.zeros((max(height - y - 1, 1), max(width - x - 1, 1)), np.int32)
            world.crops.append((raw_like(array, mins=(x, y)), i))
        self.both(lambda w: (lib.halide_device_crop(ffi.NULL, w.buffers[i].raw, w.crops[-1][0].raw),
                             self.state(w.crops[-1][0])))

    @precondition(lambda self: self.worlds[0].crops)
    @rule(k=st.integers(0, 99))
    def release_crop(self, k):
        k %= len(self.worlds[0].crops)
        self.both(lambda w: lib.halide_device_release_crop(ffi.NULL, w.crops.pop(k)[0].raw))

    @rule(shape=st.sampled_from(SHAPES), layout=st.sampled_from(["dense", "gapped", "in place"]))
    def call_on_fresh_arrays(self, shape, layout):
        """A GPU pipeline called with new numpy arrays (the fast path once the shape passed the
        bounds query): uploaded, allocated, downloaded and freed around the run, in C in the
        serving world. Numpy's result in both; nothing stays allocated (the invariants)."""
        self.value += 1
        image = np.random.default_rng(self.value).random(shape, dtype=np.float32)
        if layout == "gapped":
            wide = np.zeros((shape[0], shape[1] + 2), np.float32)
            wide[:, :shape[1]] = image
            image = wide[:, :shape[1]]
        self.both(lambda w: brighten_on_arrays(image, layout))  # the same bytes in both

    @rule(on=st.booleans())
    def switch_reuse(self, on):
        shim.reuse_device_allocations(on)

    @rule()
    def release_unused(self):
        shim.release_unused_device_allocations(self.opencl)

    @precondition(lambda self: self.models)
    @rule(i=st.integers(0, 99))
    def read(self, i):
        i = self.pick(i)
        assert self.both(lambda w: lib.halide_copy_to_host(ffi.NULL, w.buffers[i].raw)) == 0
        for world in self.worlds:
            np.testing.assert_array_equal(world.buffers[i].array, self.models[i])

    @invariant()
    def the_worlds_agree(self):
        for a, b in zip(*(w.buffers for w in self.worlds)):
            assert self.state(a) == self.state(b)

    @invariant()
    def allocations_add_up(self):
        assert accounting(self.opencl) == self.start
        assert self.opencl.pooled_allocations <= self.opencl.pool_max_count
        if not shim.can_reuse_device_allocations():
            assert self.opencl.pooled_allocations == 0

    def teardown(self):
        codes, arrays = [], []
        for world in self.worlds:  # everything freed, even after a failure, then checked
            lib.shim_serve_allocations(OPENCL, world.on)
            for crop, _ in world.crops:
                codes.append(lib.halide_device_release_crop(ffi.NULL, crop.raw))
            for buf in world.buffers:
                codes.append(lib.halide_copy_to_host(ffi.NULL, buf.raw))
                arrays.append(buf.array)
                codes.append(lib.halide_device_free(ffi.NULL, buf.raw))
        lib.shim_serve_allocations(OPENCL, True)
        shim.reuse_device_allocations(True)
        gc.collect()
        assert set(codes) <= {0} and served_live() == 0
        for array, model in zip(arrays, self.models + self.models):
            np.testing.assert_array_equal(array, model)


_brighten = []


def brighten_on_arrays(image: np.ndarray, layout: str) -> bytes:
    """brighten (OpenCL) on a fresh output, or in place: the output's bytes, checked against
    numpy's."""
    if not _brighten:
        _brighten.append(shim.load(build(Build("brighten", "opencl", "no_runtime"))))
    out = image.copy() if layout == "in place" else np.empty(image.shape, np.float32)
    expected = image * 2 + 1
    _brighten[0](out if layout == "in place" else image, 2.0, 1.0, out)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    return out.tobytes()


def test_served_and_python_paths_agree_on_random_work(opencl, serve):
    run_state_machine_as_test(ServedAgainstPython, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=30, deadline=None, database=None,
        print_blob=True, suppress_health_check=[HealthCheck.too_slow]))


# --- the native pool and handles under threads ----------------------------------------------

def test_threads_allocating_freeing_and_adopting_never_share_memory(opencl, serve):
    """Threads malloc and free bare structs (served), some adopted by Python midway (a copy
    through the device), one switching reuse and emptying the pool, while each live
    allocation's cl_mem is checked to have one holder. Each thread's data must come back as
    it wrote it, and the accounting must add up at the end."""
    interface = lib.halide_opencl_device_interface()
    start = accounting(opencl)
    holders: dict[int, int] = {}
    guard = threading.Lock()
    steps = scaled(150, 1500)

    def hold(buf, owner):
        mem = lib.halide_opencl_get_cl_mem(ffi.NULL, buf.raw)
        with guard:
            assert holders.setdefault(mem, owner) == owner, "one cl_mem with two holders"

    def let_go(buf):
        mem = lib.halide_opencl_get_cl_mem(ffi.NULL, buf.raw)
        with guard:
            del holders[mem]

    def worker(index):
        rng = random.Random(index)
        if index == 0:
            for step in range(steps // 5):
                shim.reuse_device_allocations(step % 3 != 0)
                shim.release_unused_device_allocations(opencl)
            shim.reuse_device_allocations(True)
            return
        mine = []
        for step in range(steps):
            if mine and (len(mine) > 3 or rng.random() < 0.5):
                buf, value = mine.pop(rng.randrange(len(mine)))
                if rng.random() < 0.3:  # through the device and back: adopted by Python
                    buf.array[:] = value
                    buf.raw.flags = lib.halide_buffer_flag_host_dirty
                    assert lib.halide_copy_to_device(ffi.NULL, buf.raw, interface) == 0
                    buf.array[:] = -1
                    buf.raw.flags = lib.halide_buffer_flag_device_dirty
                    assert lib.halide_copy_to_host(ffi.NULL, buf.raw) == 0
                    assert (buf.array == value).all(), f"thread {index}: another holder wrote"
                let_go(buf)
                assert lib.halide_device_free(ffi.NULL, buf.raw) == 0
            else:
                shape = rng.choice([(8, 8), (8, 9), (16, 16), (32, 8)])
                buf = raw_like(np.zeros(shape, np.int32), mins=(0, 0))
                assert lib.halide_device_malloc(ffi.NULL, buf.raw, interface) == 0
                hold(buf, index)
                mine.append((buf, index * 1000 + step))
        for buf, _ in mine:
            let_go(buf)
            assert lib.halide_device_free(ffi.NULL, buf.raw) == 0

    run_threads(6, worker)
    assert served_live() == 0 and not holders
    assert accounting(opencl) == start
    made = opencl.allocation_counts()
    assert made["reused"] > 0


# --- halide_buffer_copy from a served allocation into host memory -----------------------------

def served_source(opencl, data: np.ndarray, mins, where: str):
    """A bare struct over ``data`` with a served allocation holding ``data``, where its data
    is: "device only" (no host memory, as a GPU stage's buffer), "device newer"
    (device-dirty) or "both" (in sync); or "host only", with no device allocation."""
    src = raw_like(data, mins=mins)
    if where == "host only":
        return src
    interface = lib.halide_opencl_device_interface()
    src.raw.flags = lib.halide_buffer_flag_host_dirty
    assert lib.halide_copy_to_device(ffi.NULL, src.raw, interface) == 0
    assert lib.shim_served_live(OPENCL, ffi.new("int64_t *")) >= 1
    if where == "device newer":
        src.raw.flags = lib.halide_buffer_flag_device_dirty
    elif where == "device only":
        src.raw.host = ffi.NULL
    return src


def served_destination(opencl, dh: int, dw: int, mins) -> tuple:
    """A dense bare struct (its host rows, the struct) whose served allocation holds -1s."""
    rows = np.full((dh, dw), -1, np.int32)
    dst = raw_like(rows, mins=mins)
    dst.raw.flags = lib.halide_buffer_flag_host_dirty
    assert lib.halide_copy_to_device(ffi.NULL, dst.raw, lib.halide_opencl_device_interface()) == 0
    rows.fill(-9)  # (what only a download can bring back)
    return rows, dst


def one_run(box, width, height) -> bool:
    """Whether the part ``box`` ((x0, x1), (y0, y1)) of a dense width x height int32 buffer is
    one run of bytes."""
    (x0, x1), (y0, y1) = box
    return x0 >= x1 or y0 >= y1 or y1 - y0 == 1 or x1 - x0 == width


@settings(max_examples=scaled(60, 300), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(src_box=st.tuples(st.integers(-3, 3), st.integers(1, 9), st.integers(-3, 3),
                         st.integers(1, 7)),
       dst_box=st.tuples(st.integers(-5, 5), st.integers(1, 9), st.integers(-5, 5),
                         st.integers(1, 7)),
       gap=st.integers(0, 3),
       where=st.sampled_from(["device only", "device newer", "both", "host only"]),
       to_device=st.booleans())
def test_a_copy_with_a_served_allocation_is_the_python_cores(opencl, serve, src_box, dst_box,
                                                            gap, where, to_device):
    """halide_buffer_copy from a buffer with a served allocation (its data on the device, with
    or without host memory, or on both) or from host memory alone, into a host buffer of another
    box (rows with gaps or not) or into another served allocation (the device's bytes around
    the overlap kept, its data from the source's device where that holds it): the
    codes, bytes and flags the Python core's buffer_copy gives (lib.shim_py_buffer_copy, run on
    a twin), numpy's over the boxes' overlap, and no Python entered where the native layer can
    prove the copy the same (a copy between two devices: where the overlap is one run of bytes
    on both)."""
    sx, sw, sy, sh = src_box
    dx, dw, dy, dh = dst_box
    gap = 0 if to_device else gap
    data = (np.arange(sh * sw, dtype=np.int32).reshape(sh, sw) + 1) * 7
    interface = lib.halide_opencl_device_interface()
    overlap = ((max(sx, dx), min(sx + sw, dx + dw)), (max(sy, dy), min(sy + sh, dy + dh)))
    (x0, x1), (y0, y1) = overlap
    between_devices = to_device and where != "host only"
    in_c = not between_devices or (
        one_run(((x0 - sx, x1 - sx), (y0 - sy, y1 - sy)), sw, sh)
        and one_run(((x0 - dx, x1 - dx), (y0 - dy, y1 - dy)), dw, dh))
    results = []
    for python in (False, True):
        src = served_source(opencl, data.copy(), (sx, sy), where)
        if to_device:
            dst_rows, dst = served_destination(opencl, dh, dw, (dx, dy))
        else:
            dst_rows = np.full((dh, dw + gap), -1, np.int32)
            dst = raw_like(dst_rows[:, :dw], mins=(dx, dy))
            dst.raw.flags = lib.halide_buffer_flag_device_dirty  # (cleared by the copy)
        target = interface if to_device else ffi.NULL
        codes = []
        if python:
            codes.append(lib.shim_py_buffer_copy(ffi.NULL, src.raw, target, dst.raw))
            ran = set()
        else:
            ran = core_calls_during(
                lambda: codes.append(lib.halide_buffer_copy(ffi.NULL, src.raw, target, dst.raw)))
        flags_after = int(dst.raw.flags) & DIRTY
        if to_device:
            assert lib.halide_copy_to_host(ffi.NULL, dst.raw) == 0
            assert lib.halide_device_free(ffi.NULL, dst.raw) == 0
        results.append((codes[0], flags_after, dst_rows.tobytes(), int(src.raw.flags)))
        assert not ran if in_c else True, ran
        if src.raw.device:
            assert lib.halide_device_free(ffi.NULL, src.raw) == 0
    assert results[0] == results[1]
    expected = np.full((dh, dw + gap), -1, np.int32)
    if x0 < x1 and y0 < y1:
        expected[y0 - dy:y1 - dy, x0 - dx:x1 - dx] = data[y0 - sy:y1 - sy, x0 - sx:x1 - sx]
    assert results[0][0] == 0
    np.testing.assert_array_equal(np.frombuffer(results[0][2], np.int32).reshape(dh, dw + gap),
                                  expected)
    newer = lib.halide_buffer_flag_device_dirty if to_device else lib.halide_buffer_flag_host_dirty
    assert results[0][1] == newer
    assert served_live() == 0


@pytest.fixture(scope="module")
def gpu_copy_to_host(tmp_path_factory):
    """a(x, y) = x + y on the GPU (compute_root, gpu_tile'd), its wrapper copy_to_host() (one
    halide_buffer_copy from the stage's device buffer into the wrapper's host buffer a call),
    out = wrapper * 2 on the CPU: OpenCL, no_runtime."""
    import subprocess

    import halide as hl

    from shim.pipelines.build import TARGETS

    x, y, xo, yo, xi, yi = hl.vars("x y xo yo xi yi")
    # (names no other test's Funcs have: Halide renames a Func whose name the process used)
    a, out = hl.Func("gpu_copy_a"), hl.Func("gpu_copy_out")
    a[x, y] = x + y
    wrapper = a.in_()
    out[x, y] = wrapper[x, y] * 2
    a.compute_root().gpu_tile(x, y, xo, yo, xi, yi, 16, 16)
    wrapper.compute_root().copy_to_host()
    work = tmp_path_factory.mktemp("gpu_copy")
    obj, library = work / "gpu_copy.o", work / "gpu_copy.so"
    out.compile_to({hl.OutputFileType.object: str(obj)}, [], "gpu_copy",
                   hl.Target(f"{TARGETS['opencl']}-no_runtime"))
    subprocess.run(["cc", "-shared", "-o", str(library), str(obj)], check=True)
    return shim.load(library)


def test_a_gpu_stages_copy_to_host_never_reaches_python(opencl, serve, gpu_copy_to_host):
    """The copy stage of a GPU producer (Func::copy_to_host) is served in C with the stage's
    malloc and free: no Python operation of the core runs a call; switched off, the Python
    core copies. The output is numpy's either way."""
    out = np.empty((40, 70), np.int32)
    expected = 2 * np.add.outer(np.arange(40), np.arange(70)).astype(np.int32)
    gpu_copy_to_host(out)  # compiles, and pools the stage's memory
    for on in (True, False, True):
        serve(on)
        out.fill(-1)
        ran = core_calls_during(lambda: gpu_copy_to_host(out))
        assert ("buffer_copy" in ran) is not on, ran
        np.testing.assert_array_equal(out, expected)
    assert served_live() == 0
