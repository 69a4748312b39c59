"""Reusing device allocations (shim/backends/pool.py, Halide's free list): the pool's rules on
a private simulated device with reuse switched on, many threads against a model, and on
OpenCL: what a pipeline called on fresh arrays allocates, Halide's switch, and the traps (a
reused allocation showing another Buffer's bytes, memory reused while a crop, a sub-buffer or
a DLPack export still holds it, a forked child handing out its parent's pool), with a
Hypothesis state machine comparing every Buffer with numpy while memory is recycled.

Longer runs: HALIDE_SHIM_LONG_TESTS=1 (150 examples), or HALIDE_SHIM_STATEFUL_EXAMPLES=500
"""

import gc
import random
import threading
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import shim
from shim.pipelines.build import Build, build
from shim.backends import pool as pools
from shim.backends.base import BackendError
from shim.backends.host import HostBackend
from shim.native import ffi, lib
from shim.native.regions import host_memory
from support.budget import scaled
from support.threads import run_threads
from test_fork import run_isolated

EXAMPLES = scaled(25, 150, "HALIDE_SHIM_STATEFUL_EXAMPLES")


@pytest.fixture(autouse=True)
def reuse_switched_on():
    """Every test starts (and leaves the process) with Halide's default: reuse on."""
    shim.reuse_device_allocations(True)
    yield
    shim.reuse_device_allocations(True)


@pytest.fixture
def pooled_host():
    """A simulated device of the test's own, with reuse switched on (the shared one never
    pools: see shim/backends/host.py)."""
    backend = HostBackend()
    backend.reuses_allocations = True
    yield backend
    backend.release_unused()


def counts(backend) -> dict:
    return backend.allocation_counts()


# --- the pool's rules ----------------------------------------------------------------------

def halide_quantize(size: int) -> int:
    """quantize_allocation_size from Halide 21's cuda.cpp, on 64-bit values."""
    z = 64 - size.bit_length()
    if z < 60:
        size -= 1
        size >>= 60 - z
        size += 1
        size <<= 60 - z
    return size


def test_sizes_round_up_to_four_significant_bits_as_in_halide():
    rng = random.Random(1)
    sizes = list(range(1, 4097)) + [rng.randrange(1, 1 << 40) for _ in range(2000)]
    for size in sizes:
        assert pools.quantize(size) == halide_quantize(size), size
        assert size <= pools.quantize(size) <= size + size // 8


def test_a_freed_allocation_serves_sizes_that_fit_with_little_slack(pooled_host):
    first = pooled_host.allocate(1000)
    assert first.capacity == 1024 and first.nbytes == 1000
    pooled_host.free(first)
    assert (pooled_host.pooled_allocations, pooled_host.live_allocations) == (1, 0)
    again = pooled_host.allocate(900)  # 960 after rounding: within 1/8 of 1024
    assert again is first and again.nbytes == 900
    pooled_host.free(again)
    smaller = pooled_host.allocate(800)  # 832: would waste more than 1/8
    larger = pooled_host.allocate(1100)  # does not fit
    assert smaller is not first and larger is not first
    assert counts(pooled_host) == {"new": 3, "reused": 1, "freed": 0}
    for memory in (smaller, larger):
        pooled_host.free(memory)
    assert pooled_host.pooled_allocations == 3
    best = pooled_host.allocate(830)  # both 832 and 1024 hold it; the best fit wins
    assert best is smaller
    pooled_host.free(best)


def test_the_pool_keeps_the_most_recent_allocations_within_its_bounds(pooled_host):
    held = [pooled_host.allocate(4096 + 512 * i) for i in range(40)]
    for memory in held:
        pooled_host.free(memory)
    assert pooled_host.pooled_allocations == pools.MAX_COUNT == 32
    assert counts(pooled_host)["freed"] == 8
    kept = {id(m) for m in pooled_host._pool.drain()}
    assert kept == {id(m) for m in held[8:]}  # the oldest went first
    pooled_host.pool_max_bytes = 10_000
    a, b, c, big = (pooled_host.allocate(n) for n in (4096, 4096, 4096, 20_000))
    for memory in (a, b, c, big):
        pooled_host.free(memory)
    assert pooled_host.pooled_bytes <= 10_000 and pooled_host.pooled_allocations == 2
    assert counts(pooled_host)["freed"] == 8 + 2  # a (the oldest), then big (alone too big)


def test_a_failed_allocation_empties_the_pool_and_is_tried_once_more(pooled_host):
    for memory in [pooled_host.allocate(n) for n in (256, 512, 1024)]:
        pooled_host.free(memory)
    pooled_host.set_faults(fail_allocation=1)
    memory = pooled_host.allocate(1 << 20)  # fails once, succeeds after the pool went
    assert pooled_host.pooled_allocations == 0
    assert counts(pooled_host) == {"new": 4, "reused": 0, "freed": 3}
    pooled_host.free(memory)
    pooled_host.release_unused()
    pooled_host.set_faults(fail_allocation=1)
    with pytest.raises(BackendError, match="injected"):  # nothing to release: no retry
        pooled_host.allocate(1 << 20)


def test_switched_off_nothing_is_pooled_or_rounded(pooled_host):
    shim.reuse_device_allocations(False)
    assert not shim.can_reuse_device_allocations()
    memory = pooled_host.allocate(1000)
    assert memory.capacity == 1000
    pooled_host.free(memory)
    assert pooled_host.pooled_allocations == 0 and counts(pooled_host)["freed"] == 1


def test_many_threads_allocating_and_freeing_never_share_memory(pooled_host):
    """Each thread keeps a few allocations, fills each with its own pattern and checks the
    pattern is intact when it frees it: an allocation handed to two holders at once, or
    pooled while held, shows up as a wrong byte. Accounting must add up at the end."""
    sizes = [300, 320, 512, 1000, 1024, 4000, 4096]
    held_now: set[int] = set()
    guard = threading.Lock()

    def worker(index):
        rng = random.Random(index)
        mine = []
        for step in range(400):
            if mine and (len(mine) > 4 or rng.random() < 0.5):
                memory, pattern = mine.pop(rng.randrange(len(mine)))
                view = host_memory(memory.address, memory.nbytes)
                assert (view == pattern).all(), f"thread {index}: another holder wrote here"
                with guard:
                    held_now.remove(id(memory))
                pooled_host.free(memory)
            else:
                memory = pooled_host.allocate(rng.choice(sizes))
                with guard:
                    assert id(memory) not in held_now, "one allocation handed out twice"
                    held_now.add(id(memory))
                pattern = (index * 31 + step) % 251
                host_memory(memory.address, memory.nbytes)[:] = pattern
                mine.append((memory, pattern))
        for memory, _ in mine:
            with guard:
                held_now.remove(id(memory))
            pooled_host.free(memory)

    run_threads(8, worker)
    made = counts(pooled_host)
    assert pooled_host.live_allocations == 0
    assert made["new"] - made["freed"] == pooled_host.pooled_allocations <= pools.MAX_COUNT
    assert made["reused"] > made["new"]  # the point of it
    pooled_bytes = pooled_host.pooled_bytes
    assert pooled_bytes == sum(m.capacity for m in pooled_host._pool.drain())


# --- OpenCL --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cl_pipelines(opencl):
    return {(name, runtime): shim.load(build(Build(name, "opencl", runtime)))
            for name in ("brighten", "crop_fill") for runtime in ("no_runtime", "bundled")}


@pytest.fixture
def driver_allocations(opencl, monkeypatch):
    """A list that gets the size of every clCreateBuffer the backend makes from now on."""
    made = []
    allocate_new = opencl._allocate_new

    def counting(nbytes):
        made.append(nbytes)
        return allocate_new(nbytes)

    monkeypatch.setattr(opencl, "_allocate_new", counting)
    return made


def cl_mem(buf) -> int:
    return lib.halide_opencl_get_cl_mem(ffi.NULL, buf.raw)


@pytest.mark.parametrize("runtime", ["no_runtime", "bundled"])
def test_a_pipeline_on_fresh_arrays_reuses_its_allocations(opencl, cl_pipelines, runtime):
    # Counted by the pool (native_stubs/devices/pool.c), which sees every driver allocation,
    # whether the Python core or the served paths in C made it.
    brighten = cl_pipelines["brighten", runtime]
    rng = np.random.default_rng(3)
    live = opencl.live_allocations
    start = opencl.allocation_counts()
    for call in range(20):
        image = rng.random((48, 64), dtype=np.float32)
        out = np.empty_like(image)
        brighten(image, scale=2.0, offset=float(call), output=out)
        np.testing.assert_allclose(out, image * 2 + call, rtol=1e-6)
        if call == 0:
            first = opencl.allocation_counts()
    assert first["new"] - start["new"] <= 2
    after = opencl.allocation_counts()
    assert after["new"] == first["new"], "fresh arrays of one shape allocated again"
    assert after["reused"] - first["reused"] >= 19 * 2
    assert opencl.live_allocations == live and opencl.pooled_allocations >= 1

    shim.reuse_device_allocations(False)  # Halide's switch: the pool empties, and stays empty
    assert opencl.pooled_allocations == 0
    before = opencl.allocation_counts()
    for call in range(5):
        image = rng.random((48, 64), dtype=np.float32)
        out = np.empty_like(image)
        brighten(image, scale=2.0, offset=0.0, output=out)
        np.testing.assert_allclose(out, image * 2, rtol=1e-6)
    after = opencl.allocation_counts()
    assert after["new"] - before["new"] == 2 * 5
    assert after["reused"] == before["reused"]
    assert opencl.pooled_allocations == 0
    assert opencl.live_allocations == live


def test_device_release_and_the_release_call_empty_the_pool(opencl):
    for _ in range(2):
        buf = shim.Buffer(np.ones((16, 16), np.float32))
        buf.copy_to_device(opencl)
        buf.device_free()
        assert opencl.pooled_allocations >= 1
        if _ == 0:
            assert shim.release_unused_device_allocations(opencl) >= 1
        else:
            lib.halide_device_release(ffi.NULL, lib.halide_opencl_device_interface())
        assert opencl.pooled_allocations == 0


def test_a_registered_pool_is_told_when_reuse_is_switched_off():
    told = []
    release = ffi.callback("int(void *)", lambda uc: told.append(uc) or 0)
    pool = ffi.new("struct halide_device_allocation_pool *")
    pool.release_unused = release
    _registered.append((release, pool))  # Halide's contract: global lifetime
    lib.halide_register_device_allocation_pool(pool)
    assert lib.halide_reuse_device_allocations(ffi.NULL, True) == 0
    assert told == []
    assert lib.halide_reuse_device_allocations(ffi.NULL, False) == 0
    assert len(told) == 1


_registered = []


def test_reused_memory_never_shows_its_last_holders_data(opencl, cl_pipelines):
    """New device memory holds nothing defined (Halide's semantics), and reused memory holds
    the last holder's bytes: the dirty bits and regions must make every read show this
    Buffer's own data."""
    crop_fill = cl_pipelines["crop_fill", "no_runtime"]
    stale = shim.Buffer(np.full((16, 32), 7, np.int32))
    stale.copy_to_device(opencl)
    stale_mem = cl_mem(stale)
    stale.device_free()

    fresh = shim.Buffer(np.zeros((16, 32), np.int32))
    fresh.device_malloc(opencl)
    assert cl_mem(fresh) == stale_mem  # the same memory, with 7s in it
    fresh.copy_to_host()
    np.testing.assert_array_equal(fresh.numpy(), 0)
    # A pipeline into a crop: only the crop's elements come from the device.
    crop = fresh.cropped([(4, 8), (2, 5)])
    crop_fill(param=3, f=crop)
    expected = np.zeros((16, 32), np.int32)
    ys, xs = np.mgrid[2:7, 4:12]
    expected[2:7, 4:12] = xs * 100 + ys + 30000
    np.testing.assert_array_equal(fresh.numpy(), expected)
    del crop
    fresh.device_free()

    # A pipeline reading a Buffer whose reused memory was never written: it reads the host's
    # data (uploaded first), not the last holder's.
    brighten = cl_pipelines["brighten", "no_runtime"]
    ones = shim.Buffer(np.ones((16, 32), np.float32))
    ones.copy_to_device(opencl)
    ones.device_free()  # clean now: the host and the (gone) device agreed
    assert not ones.host_dirty()
    stale = shim.Buffer(np.full((16, 32), 7, np.float32))
    stale.copy_to_device(opencl)
    stale_mem = cl_mem(stale)
    stale.device_free()
    ones.device_malloc(opencl)
    assert cl_mem(ones) == stale_mem
    np.testing.assert_array_equal(brighten(ones, scale=1.0, offset=0.0, output=(16, 32)).numpy(), 1)
    ones.device_free()

    # A device-only output of a pipeline that writes it whole is defined everywhere.
    again = crop_fill(param=1, f=(16, 32))
    assert cl_mem(again) == stale_mem
    ys, xs = np.mgrid[0:16, 0:32]
    np.testing.assert_array_equal(again.numpy(), xs * 100 + ys + 10000)


def test_memory_held_by_a_crop_or_an_export_is_never_reused(opencl, driver_allocations):
    parent = shim.Buffer(np.arange(64 * 64, dtype=np.int32).reshape(64, 64))
    parent.copy_to_device(opencl)
    crop = parent.cropped([(0, 64), (8, 8)])  # 2 KiB in: an OpenCL sub-buffer
    crop.copy_to_device(opencl)
    memory_of_parent = cl_mem(parent)
    pooled = opencl.pooled_allocations
    del parent
    gc.collect()
    assert opencl.pooled_allocations == pooled  # the crop holds it
    other = shim.Buffer(np.full((64, 64), -1, np.int32))
    other.copy_to_device(opencl)
    assert cl_mem(other) != memory_of_parent
    crop.set_device_dirty()  # read it back from the device
    np.testing.assert_array_equal(crop.numpy(), np.arange(64 * 64).reshape(64, 64)[8:16])
    memory = next(m for m in list(opencl._live.values()) if m.buffer.int_ptr == memory_of_parent)
    del crop
    gc.collect()
    assert opencl.pooled_allocations == pooled + 1 and memory.handles == {}  # sub-buffer gone
    other.device_free()

    exported = shim.Buffer(np.ones((64, 64), np.int32))
    exported.copy_to_device(opencl)
    capsule = exported.__dlpack__(stream=None, dl_device=(4, 0))  # kDLOpenCL: the device
    freed = counts(opencl)["freed"]
    pooled = opencl.pooled_allocations
    del exported
    gc.collect()
    assert opencl.pooled_allocations == pooled  # the capsule holds it
    del capsule
    gc.collect()
    # A consumer's queue may still use what it was given: back to the driver, never pooled.
    assert opencl.pooled_allocations == pooled and counts(opencl)["freed"] == freed + 1


FORK_SCENARIO = r"""
import os, sys
import numpy as np
import shim

opencl = shim.device("opencl")
buf = shim.Buffer(np.ones((32, 32), np.float32))
buf.copy_to_device(opencl)
buf.device_free()
assert opencl.pooled_allocations == 1
pid = os.fork()
if pid == 0:
    assert opencl.pooled_allocations == 0, "the child sees the parent's pool"
    try:
        shim.Buffer(np.ones((32, 32), np.float32)).copy_to_device(opencl)
    except shim.DeviceError as e:
        assert "parent process" in str(e), e
        print("allocation: refused", flush=True)
    shim.reuse_device_allocations(False)
    print("release: nothing touched", flush=True)
    sys.exit(0)
_, status = os.waitpid(pid, 0)
assert opencl.pooled_allocations == 1, "the child emptied the parent's pool"
again = shim.Buffer(np.full((32, 32), 2, np.float32))
again.copy_to_device(opencl)
assert opencl.allocation_counts()["reused"] == 1
again.set_device_dirty()
np.testing.assert_array_equal(again.numpy(), 2)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_never_touches_the_parents_pool(opencl):
    done = run_isolated(FORK_SCENARIO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split("\n")[:2] == ["allocation: refused", "release: nothing touched"]


# --- a model of Buffers on recycled memory -------------------------------------------------

SHAPES = [(8, 16), (8, 15), (16, 16), (4, 4)]  # 512, 480 (fits 512), 1024, 64 bytes


class RecycledMemory(RuleBasedStateMachine):
    """Buffers of a few sizes made, computed into, written, freed and dropped in random order
    on OpenCL, so that memory passes from Buffer to Buffer: after every step every Buffer
    must read as its numpy model, no two families may hold the same cl_mem, and what the
    driver allocated must equal what is live plus what is pooled."""

    def __init__(self):
        super().__init__()
        self.opencl = shim.device("opencl")
        self.brighten = _machine_pipelines["brighten"]
        self.crop_fill = _machine_pipelines["crop_fill"]
        gc.collect()
        self.start = (counts(self.opencl), self.opencl.live_allocations,
                      self.opencl.pooled_allocations)
        self.buffers: list = []  # [Buffer, model]
        self.crops: list = []  # [crop Buffer, its root's entry, (y0, x0)]
        self.value = 0

    def fresh_value(self) -> float:
        self.value += 1
        return float(self.value)

    def pick(self, i):
        return self.buffers[i % len(self.buffers)]

    @rule(shape=st.sampled_from(SHAPES), on_device=st.booleans())
    def new(self, shape, on_device):
        model = np.full(shape, self.fresh_value(), np.float32)
        buf = shim.Buffer(model.copy())
        if on_device:
            buf.copy_to_device(self.opencl)
        self.buffers.append([buf, model])

    @precondition(lambda self: self.buffers)
    @rule(i=st.integers(0, 99), into=st.integers(-1, 99))
    def compute(self, i, into):
        """brighten into a new Buffer (into < 0) or an existing one of the same shape."""
        source = self.pick(i)
        scale, offset = 2.0, self.fresh_value()
        targets = [entry for entry in self.buffers
                   if entry[0].shape == source[0].shape and entry is not source]
        if into < 0 or not targets:
            out = self.brighten(source[0], scale=scale, offset=offset, output=source[1].shape)
            self.buffers.append([out, source[1] * scale + offset])
        else:
            target = targets[into % len(targets)]
            self.brighten(source[0], scale=scale, offset=offset, output=target[0])
            target[1] = source[1] * scale + offset

    @precondition(lambda self: self.buffers)
    @rule(i=st.integers(0, 99))
    def host_write(self, i):
        buf, model = entry = self.pick(i)
        array = buf.numpy()  # current first
        value = self.fresh_value()
        array[0, :] = value
        buf.set_host_dirty()
        entry[1] = model.copy()
        entry[1][0, :] = value

    @precondition(lambda self: self.buffers)
    @rule(i=st.integers(0, 99))
    def device_free(self, i):
        self.pick(i)[0].device_free()

    @precondition(lambda self: self.buffers)
    @rule(i=st.integers(0, 99))
    def drop(self, i):
        buf, model = self.buffers.pop(i % len(self.buffers))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", shim.DirtyBufferWarning)
            del buf
            gc.collect()

    @rule(y0=st.integers(0, 3), x0=st.integers(0, 4))
    def crop_into(self, y0, x0):
        """crop_fill (int32) into a crop of a new root, which is dropped at once: the crop
        alone holds the family's memory (and maybe a sub-buffer into it) from then on."""
        root = shim.Buffer(np.zeros((4, 8), np.int32))
        crop = root.cropped([(x0, 4), (y0, 1)])
        param = int(self.fresh_value())
        self.crop_fill(param=param, f=crop)
        expected = np.zeros((4, 8), np.int32)
        expected[y0, x0:x0 + 4] = np.arange(x0, x0 + 4) * 100 + y0 + param * 10000
        self.crops.append([crop, expected[y0:y0 + 1, x0:x0 + 4]])
        del root
        gc.collect()

    @precondition(lambda self: self.crops)
    @rule(i=st.integers(0, 99))
    def drop_crop(self, i):
        crop, expected = self.crops.pop(i % len(self.crops))
        np.testing.assert_array_equal(crop.numpy(), expected)
        del crop
        gc.collect()

    @rule(on=st.booleans())
    def switch(self, on):
        shim.reuse_device_allocations(on)

    @rule()
    def release_unused(self):
        shim.release_unused_device_allocations(self.opencl)

    @precondition(lambda self: self.buffers)
    @rule(i=st.integers(0, 99))
    def read(self, i):
        buf, model = self.pick(i)
        np.testing.assert_array_equal(buf.numpy(), model)

    @invariant()
    def families_never_share_memory(self):
        owners = {}
        for owner, buf in [(id(e), e[0]) for e in self.buffers] + \
                          [(id(c), c[0]) for c in self.crops]:
            if buf.has_device_allocation():
                mem = cl_mem(buf)
                assert owners.setdefault(mem, owner) == owner, "two families hold one cl_mem"

    @invariant()
    def allocations_add_up(self):
        (before, live, pooled) = self.start
        now = counts(self.opencl)
        made = now["new"] - before["new"] - (now["freed"] - before["freed"])
        grown = (self.opencl.live_allocations - live) + (self.opencl.pooled_allocations - pooled)
        assert made == grown
        assert self.opencl.pooled_allocations <= self.opencl.pool_max_count

    def teardown(self):
        for buf, model in self.buffers:
            np.testing.assert_array_equal(buf.numpy(), model)
        for crop, expected in self.crops:
            np.testing.assert_array_equal(crop.numpy(), expected)
        self.buffers.clear()
        self.crops.clear()
        gc.collect()
        shim.reuse_device_allocations(True)


_machine_pipelines = {}


def test_buffers_on_recycled_memory_read_as_their_model(opencl, cl_pipelines):
    _machine_pipelines.update({name: cl_pipelines[name, "no_runtime"]
                               for name in ("brighten", "crop_fill")})
    run_state_machine_as_test(RecycledMemory, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=25, deadline=None, database=None,
        print_blob=True, suppress_health_check=[HealthCheck.too_slow]))
