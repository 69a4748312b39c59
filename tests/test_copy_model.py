"""Random copies between host buffers, device buffers, crops and slices, through the native
layer's C paths and through the Python core, against a numpy model of every byte and flag.

A Hypothesis state machine keeps bare halide_buffer_t structs (as generated code makes them: no
shim.Buffer, no family) in two worlds side by side:
 - the C world calls the generic ``lib.halide_*`` entry points, which serve what they can in C
   (native_stubs/devices/served.c: a pipeline's own allocations, their copies, crops, slices,
   releases and syncs; host_copy.c: halide_buffer_copy between host memories) and hand the rest
   to the Python core;
 - the Python world makes the same calls with the backend's serving switched off
   (``shim_serve_allocations``) and halide_buffer_copy through ``lib.shim_py_buffer_copy``, the
   Python core's entry point (shim/core/runtime.py), the implementation of record.
The structs are roots (host memory of their own: dense, gapped or transposed layouts, any
mins, one to three dimensions), and crops and slices of them and of each other, whose host
pointers point into their parent's memory and whose device handles come from
``halide_device_crop`` / ``halide_device_slice`` (Halide's ``_halide_buffer_crop``: the flags
copied from the source). Rules write host bytes (host-dirty), write device bytes as a kernel
would (device-dirty, through the driver), allocate, free, copy to and from the device, copy
between any two structs either way (host to host, host to device, device to device, device to
host, crops and slices included), crop, slice, release crops and sync.

The model follows Halide's runtime (src/runtime/device_interface.cpp: copy_to_host/device,
halide_buffer_copy_already_locked's choice of paths and its flags) and the shim's one
documented difference (an allocation made for a copy to the device uploads the whole host
side: runtime.allocate_behind_host). Device memory is modelled per allocation, so that crops
see their parent's bytes; bytes nothing wrote (fresh memory, the gaps between rows) are
unknown and never compared; a device copy between overlapping bytes of one allocation, which
Halide leaves to the driver (OpenCL refuses it), is not made. After each rule the return codes,
the flags, which structs hold a device handle, every host byte and every device byte (read
through the driver, which changes no flag and adopts nothing) must agree between the worlds
and with the model.

Each C-world call also records whether any of the shim's Python ran: at the end of a run,
every kind of call the backend serves in C must have been served so at least once (so the
test cannot pass by always falling back to Python), and calls run inside a profile must have
been counted as served by the native counters (``shim_profile_count``).

Not here: shim.Buffer's structs and shared families (whose copies only the Python core makes:
tests/test_stateful.py), device_and_host_malloc/free, wrap/detach native.

300 examples of up to 40 steps a backend; HALIDE_SHIM_LONG_TESTS=1: 1000; or
HALIDE_SHIM_COPY_MODEL_EXAMPLES=n.
"""

from __future__ import annotations

import collections
import contextlib

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, \
    rule, \
    run_state_machine_as_test

import shim
from shim.memory import families
from shim.native import ffi, lib
from support.budget import scaled
from support.served import python_calls_during
from test_host_copy import overlap

EXAMPLES = scaled(300, 1000, "HALIDE_SHIM_COPY_MODEL_EXAMPLES")
STEPS = 40
ELEM = 4  # int32 elements
HOST_DIRTY = lib.halide_buffer_flag_host_dirty
DEVICE_DIRTY = lib.halide_buffer_flag_device_dirty
DIRTY = HOST_DIRTY | DEVICE_DIRTY
BACKENDS = {"host": lib.SHIM_BACKEND_HOST, "opencl": lib.SHIM_BACKEND_OPENCL,
            "vulkan": lib.SHIM_BACKEND_VULKAN}
MAX_ROOTS, MAX_STRUCTS = 3, 10

# The calls each backend serves in C (the C world must serve each at least once in a run), and
# those a profile counts as served (SHIM_OUTCOME_SERVED). The host device registers no native
# allocator: only copies between host memories are served there; on OpenCL and Vulkan also
# halide_buffer_copy to or from a served allocation ("buffer_copy").
SERVED_KINDS = {
    "host": {"host copy"},
    "opencl": {"host copy", "buffer_copy", "malloc", "free", "copy_to_device", "copy_to_host",
               "crop", "slice", "release_crop", "sync"},
    "vulkan": {"host copy", "buffer_copy", "malloc", "free", "copy_to_device", "copy_to_host",
               "crop", "slice", "release_crop", "sync"},
}
COUNTED = {"host copy": lib.SHIM_FN_BUFFER_COPY, "buffer_copy": lib.SHIM_FN_BUFFER_COPY,
           "crop": lib.SHIM_FN_DEVICE_CROP,
           "slice": lib.SHIM_FN_DEVICE_SLICE, "release_crop": lib.SHIM_FN_DEVICE_RELEASE_CROP,
           "sync": lib.SHIM_FN_DEVICE_SYNC}


# --- device memory, read and written through the driver ---------------------------------------

class Driver:
    """Reads and writes the bytes from a struct's device handle on, as a kernel would: no flag
    changes, no adoption by the Python core (the handle's layout is the backend's: the host
    device's is the min element's address, OpenCL's a shim_cl_handle, Vulkan's a
    shim_vk_handle)."""

    def __init__(self, kind: str, device):
        self.kind, self.device = kind, device

    def read(self, raw, nbytes: int) -> np.ndarray:
        out = np.zeros(nbytes, np.uint8)
        self._move(raw, out, to_device=False)
        return out

    def write(self, raw, data: np.ndarray) -> None:
        self._move(raw, np.ascontiguousarray(data, np.uint8), to_device=True)

    def _move(self, raw, host: np.ndarray, to_device: bool) -> None:
        """``host``'s bytes to the device from the handle on, or the device's into ``host``."""
        if self.kind == "host":
            device = ffi.buffer(ffi.cast("uint8_t *", raw.device), host.size)
            if to_device:
                device[:] = host.tobytes()
            else:
                host[:] = np.frombuffer(device, np.uint8)
        elif self.kind == "opencl":
            import pyopencl as cl

            handle = ffi.cast("shim_cl_handle *", raw.device)
            mem = cl.Buffer.from_int_ptr(int(ffi.cast("uintptr_t", handle.mem)), retain=True)
            offset = int(handle.offset)
            if to_device:
                cl.enqueue_copy(self.device.queue, mem, host, dst_offset=offset, is_blocking=True)
            else:
                cl.enqueue_copy(self.device.queue, host, mem, src_offset=offset, is_blocking=True)
            mem.release()
        else:
            handle = ffi.cast("shim_vk_handle *", raw.device)
            offset = int(handle.offset)
            if to_device:
                self._vulkan(0, ffi.NULL, handle.memory, host, 0, offset)
            else:
                self._vulkan(1, handle.memory, ffi.NULL, host, offset, 0)

    @staticmethod
    def _vulkan(direction, src, dst, host: np.ndarray, src_offset, dst_offset) -> None:
        shape, strides = ffi.new("int64_t[1]", [host.size]), ffi.new("int64_t[1]")
        message = ffi.new("char[256]")
        code = lib.shim_vk_transfer(direction, src, dst, ffi.cast("void *", host.ctypes.data),
                                    shape, strides, strides, 0, src_offset, dst_offset,
                                    message, 256)
        assert code == 0, ffi.string(message).decode()


# --- the model's memory -----------------------------------------------------------------------

class Memory:
    """Bytes the model knows: values, and which of them anything wrote."""

    def __init__(self, nbytes: int, values: np.ndarray | None = None):
        self.values = np.zeros(nbytes, np.uint8) if values is None else values.copy()
        self.known = np.full(nbytes, values is not None)


def span(dims) -> int:
    """Bytes from the min element to the end of the last (strides are positive here)."""
    return (sum((extent - 1) * stride for _, extent, stride in dims) + 1) * ELEM


def element_bytes(dims, box) -> np.ndarray:
    """Byte offsets from the min element of a struct with ``dims`` of the bytes of its
    elements in ``box`` (over the dimensions the box has; the rest at their min), one row of
    ELEM bytes an element, the elements in C order over the box: the same order for every
    struct, so that a copy pairs them up."""
    grids = np.indices([extent for _, extent in box], dtype=np.int64)
    at = np.zeros(grids.shape[1:], np.int64)
    for d, (lo, _) in enumerate(box):
        d_min, _, stride = dims[d]
        at += (grids[d] + lo - d_min) * stride * ELEM
    return at.reshape(-1)[:, None] + np.arange(ELEM)


def own_box(dims):
    return tuple((lo, extent) for lo, extent, _ in dims)


class Entry:
    """A struct in both worlds, and what the model says of it."""

    def __init__(self, root: int, start: int, dims, flags: int, kind: str):
        self.root, self.start, self.dims, self.flags, self.kind = root, start, dims, flags, kind
        self.device = None  # (the model's Memory, byte offset of the min element)
        self.cropped = False  # whether the handle came from a crop or slice (else: its own)
        self.raws, self.keep = [], []

    @property
    def span(self) -> int:
        return span(self.dims)


class World:
    """One side of the comparison: the roots' host memories and the structs over them."""

    def __init__(self, name: str, python: bool):
        self.name, self.python = name, python
        self.interface = lib.shim_backend_interface(BACKENDS[name])
        self.hosts: list[np.ndarray] = []

    def new_struct(self, entry: Entry):
        raw = ffi.new("halide_buffer_t *")
        dim = ffi.new("halide_dimension_t[]", max(len(entry.dims), 1))
        for i, (lo, extent, stride) in enumerate(entry.dims):
            dim[i].min, dim[i].extent, dim[i].stride = lo, extent, stride
        raw.host = ffi.cast("uint8_t *", self.hosts[entry.root].ctypes.data + entry.start)
        raw.type.code, raw.type.bits, raw.type.lanes = lib.halide_type_int, 32, 1
        raw.dimensions, raw.dim, raw.flags = len(entry.dims), dim, entry.flags
        entry.raws.append(raw)
        entry.keep.append(dim)
        return raw


# --- the machine -------------------------------------------------------------------------------

evidence: dict[str, collections.Counter] = {}  # backend -> kind -> C-world calls served in C
counted: dict[str, collections.Counter] = {}  # backend -> kind -> calls a profile counted served


def served_state(backend: int) -> tuple[int, int, int, int]:
    """What only served.c's work changes: its live allocations and the bytes its copies moved."""
    moved = ffi.new("uint64_t[3]")
    lib.shim_served_transferred(backend, moved, moved + 1, moved + 2)
    return lib.shim_served_live(backend, ffi.new("int64_t *")), moved[0], moved[1], moved[2]


class CopyModel(RuleBasedStateMachine):
    kind = "host"  # set per backend by the test
    device = None

    def __init__(self):
        super().__init__()
        self.backend = BACKENDS[self.kind]
        self.driver = Driver(self.kind, self.device)
        self.worlds = (World(self.kind, False), World(self.kind, True))
        self.hosts: list[Memory] = []  # the model of each root's host memory
        self.entries: list[Entry] = []
        self.gone: list[Entry] = []  # released crops (their structs kept alive to the end)
        self.rng = np.random.default_rng(0)
        self.served_before = served_state(self.backend)
        self.evidence = evidence.setdefault(self.kind, collections.Counter())
        self.counted = counted.setdefault(self.kind, collections.Counter())

    # --- running one call in both worlds ---------------------------------------------------

    def call(self, kind: str, operation, expected: int, work: bool, profiled: bool = False):
        """operation(world, raws...) in the C world, then in the Python world with serving
        off; both must return ``expected``. ``work``: whether the model says the call moves
        or allocates anything (a served no-op is no evidence of serving). Inside a profile
        (``profiled``), a call C served without Python must be counted as served."""
        function = COUNTED.get(kind)
        results = []
        with shim.profile() if profiled else contextlib.nullcontext():
            before = function is not None and lib.shim_profile_count(function,
                                                                     lib.SHIM_OUTCOME_SERVED)
            ran = python_calls_during(lambda: results.append(operation(self.worlds[0])), "shim.")
            after = function is not None and lib.shim_profile_count(function,
                                                                    lib.SHIM_OUTCOME_SERVED)
        if work and not ran:
            self.evidence[kind] += 1
            if profiled and function is not None:
                assert after - before == 1, f"{kind} served in C, not counted as served"
                self.counted[kind] += 1
        elif profiled and function is not None:
            assert after == before, f"{kind} counted as served, but Python ran: {ran}"
        lib.shim_serve_allocations(self.backend, False)
        try:
            state = served_state(self.backend)
            results.append(operation(self.worlds[1]))
            assert served_state(self.backend) == state, "the Python world was served in C"
        finally:
            lib.shim_serve_allocations(self.backend, True)
        assert results == [expected, expected], (kind, results, expected)

    # --- model helpers ------------------------------------------------------------------------

    def host_bytes(self, entry: Entry, box) -> tuple[np.ndarray, Memory]:
        return entry.start + element_bytes(entry.dims, box), self.hosts[entry.root]

    def device_bytes(self, entry: Entry, box) -> tuple[np.ndarray, Memory]:
        memory, offset = entry.device
        return offset + element_bytes(entry.dims, box), memory

    @staticmethod
    def move(src, dst) -> None:
        """The model's copy: every source byte read, then written (numpy's copyto, which the
        Python core uses and host_copy.c matches, reads an overlapping source whole first)."""
        (s_at, s_mem), (d_at, d_mem) = src, dst
        values, known = s_mem.values[s_at].copy(), s_mem.known[s_at].copy()
        d_mem.values[d_at], d_mem.known[d_at] = values, known

    def allocate(self, entry: Entry) -> None:
        entry.device, entry.cropped = (Memory(entry.span), 0), False

    def pick(self, i: int, which=lambda e: True) -> Entry | None:
        chosen = [e for e in self.entries if which(e)]
        return chosen[i % len(chosen)] if chosen else None

    # --- rules ------------------------------------------------------------------------------

    @initialize(extents=st.lists(st.integers(1, 5), min_size=1, max_size=3),
                mins=st.lists(st.integers(-2, 3), min_size=3, max_size=3),
                transposed=st.booleans(), gap=st.sampled_from([0, 0, 0, 1, 3]),
                seed=st.integers(0, 2**32 - 1))
    def first_root(self, extents, mins, transposed, gap, seed):
        self.new_root(extents, mins, transposed, gap, seed)

    @precondition(lambda self: len(self.hosts) < MAX_ROOTS and len(self.entries) < MAX_STRUCTS)
    @rule(extents=st.lists(st.integers(1, 5), min_size=1, max_size=3),
          mins=st.lists(st.integers(-2, 3), min_size=3, max_size=3),
          transposed=st.booleans(), gap=st.sampled_from([0, 0, 0, 1, 3]),
          seed=st.integers(0, 2**32 - 1))
    def new_root(self, extents, mins, transposed, gap, seed):
        """A struct with host memory of its own: dense, or with a gap after each row."""
        order = list(range(len(extents)))[::-1] if transposed else list(range(len(extents)))
        strides, step = [0] * len(extents), 1
        for n, d in enumerate(order):
            strides[d] = step
            step *= extents[d] + (gap if n == 0 and len(extents) > 1 else 0)
        dims = tuple((mins[d], extents[d], strides[d]) for d in range(len(extents)))
        values = np.random.default_rng(seed).integers(0, 256, span(dims), dtype=np.uint8)
        self.hosts.append(Memory(values.size, values))
        entry = Entry(len(self.hosts) - 1, 0, dims, 0, "root")
        for world in self.worlds:
            world.hosts.append(values.copy())
            world.new_struct(entry)
        self.entries.append(entry)

    @precondition(lambda self: self.entries)
    @rule(i=st.integers(0, 99), seed=st.integers(0, 2**32 - 1))
    def device_malloc(self, i, seed):
        """Memory of its own for a struct without any, filled through the driver as a kernel
        would have filled it (flags unchanged: device_malloc leaves them)."""
        entry = self.pick(i, lambda e: e.device is None)
        if entry is None:
            return
        self.allocate(entry)
        self.call("malloc", lambda w: lib.halide_device_malloc(
            ffi.NULL, entry.raws[w.python], w.interface), 0, True)
        fill = np.random.default_rng(seed).integers(0, 256, entry.span, dtype=np.uint8)
        for raw in entry.raws:
            self.driver.write(raw, fill)
        memory = entry.device[0]
        memory.values[:], memory.known[:] = fill, True

    @precondition(lambda self: self.entries)
    @rule(i=st.integers(0, 99))
    def device_free(self, i):
        """A struct's own allocation freed (crops keep what they alias: Halide's OpenCL
        sub-buffers retain their parent's memory, and the shim keeps it for every backend);
        what only the device held is lost, and device_dirty is cleared."""
        entry = self.pick(i, lambda e: not e.cropped)
        work = entry.device is not None
        entry.device, entry.flags = None, entry.flags & ~DEVICE_DIRTY
        self.call("free", lambda w: lib.halide_device_free(ffi.NULL, entry.raws[w.python]), 0,
                  work)

    @precondition(lambda self: self.entries and len(self.entries) < MAX_STRUCTS)
    @rule(i=st.integers(0, 99), box=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)),
                                             min_size=3, max_size=3), profiled=st.booleans())
    def crop(self, i, box, profiled):
        src = self.pick(i)
        dims, within = [], 0
        for (lo, extent, stride), (a, b) in zip(src.dims, box):
            first = a % extent
            dims.append((lo + first, 1 + b % (extent - first), stride))
            within += first * stride * ELEM
        dst = self.view(src, tuple(dims), within, "crop")
        self.call("crop", lambda w: lib.halide_device_crop(
            ffi.NULL, src.raws[w.python], dst.raws[w.python]), 0, src.device is not None,
            profiled)

    @precondition(lambda self: self.entries and len(self.entries) < MAX_STRUCTS)
    @rule(i=st.integers(0, 99), d=st.integers(0, 2), pos=st.integers(0, 9),
          profiled=st.booleans())
    def slice(self, i, d, pos, profiled):
        src = self.pick(i, lambda e: e.dims)
        if src is None:
            return
        d %= len(src.dims)
        lo, extent, stride = src.dims[d]
        pos = lo + pos % extent
        dst = self.view(src, src.dims[:d] + src.dims[d + 1:], (pos - lo) * stride * ELEM,
                        "slice")
        self.call("slice", lambda w: lib.halide_device_slice(
            ffi.NULL, src.raws[w.python], d, pos, dst.raws[w.python]), 0,
            src.device is not None, profiled)

    def view(self, src: Entry, dims, within: int, kind: str) -> Entry:
        """A struct over ``src``'s host memory, its min element ``within`` bytes past src's,
        with src's flags (as _halide_buffer_crop makes one); in the model, its device handle
        aliases src's memory at the same offset."""
        dst = Entry(src.root, src.start + within, dims, src.flags, kind)
        for world in self.worlds:
            world.new_struct(dst)
        if src.device is not None:
            memory, offset = src.device
            dst.device, dst.cropped = (memory, offset + within), True
        self.entries.append(dst)
        return dst

    @precondition(lambda self: any(e.cropped for e in self.entries))
    @rule(i=st.integers(0, 99), profiled=st.booleans())
    def release_crop(self, i, profiled):
        """A crop's handle released (its flags stay, as Halide leaves them); the struct is
        done with, as generated code is done with it."""
        entry = self.pick(i, lambda e: e.cropped)
        self.call("release_crop", lambda w: lib.halide_device_release_crop(
            ffi.NULL, entry.raws[w.python]), 0, True, profiled)
        entry.device, entry.cropped = None, False
        self.entries.remove(entry)
        self.gone.append(entry)

    @precondition(lambda self: self.entries)
    @rule(i=st.integers(0, 99), seed=st.integers(0, 2**32 - 1))
    def write_host(self, i, seed):
        """New values in a struct's elements on the host, marked host-dirty (first current on
        the host, as a caller must make it)."""
        entry = self.pick(i)
        if entry.flags & DEVICE_DIRTY:
            self.copy_to_host(self.entries.index(entry))
        at, memory = self.host_bytes(entry, own_box(entry.dims))
        values = np.random.default_rng(seed).integers(0, 256, at.shape, dtype=np.uint8)
        memory.values[at], memory.known[at] = values, True
        for world, raw in zip(self.worlds, entry.raws):
            world.hosts[entry.root][at] = values
            raw.flags = raw.flags | HOST_DIRTY
        entry.flags |= HOST_DIRTY

    @precondition(lambda self: any(e.device is not None for e in self.entries))
    @rule(i=st.integers(0, 99), seed=st.integers(0, 2**32 - 1))
    def kernel_write(self, i, seed):
        """New values in a struct's elements on the device, as a kernel writes them, marked
        device-dirty (first current on the device)."""
        entry = self.pick(i, lambda e: e.device is not None)
        if entry.flags & HOST_DIRTY:
            self.copy_to_device(self.entries.index(entry))
        at, memory = self.device_bytes(entry, own_box(entry.dims))
        values = np.random.default_rng(seed).integers(0, 256, at.shape, dtype=np.uint8)
        memory.values[at], memory.known[at] = values, True
        local = at - entry.device[1]
        for raw in entry.raws:
            data = self.driver.read(raw, entry.span)
            data[local] = values
            self.driver.write(raw, data)
            raw.flags = raw.flags | DEVICE_DIRTY
        entry.flags |= DEVICE_DIRTY

    @precondition(lambda self: self.entries)
    @rule(i=st.integers(0, 99))
    def copy_to_host(self, i):
        entry = self.pick(i)
        work = bool(entry.flags & DEVICE_DIRTY)
        if work:  # (no struct here is device-dirty without a device: see device_free)
            box = own_box(entry.dims)
            self.move(self.device_bytes(entry, box), self.host_bytes(entry, box))
            entry.flags &= ~DEVICE_DIRTY
        self.call("copy_to_host", lambda w: lib.halide_copy_to_host(ffi.NULL, entry.raws[w.python]),
                  0, work)

    @precondition(lambda self: self.entries)
    @rule(i=st.integers(0, 99))
    def copy_to_device(self, i):
        """To the device; a struct without memory gets its own, and (the shim's policy,
        runtime.allocate_behind_host: new memory holds nothing) is marked host-dirty first."""
        entry = self.pick(i)
        if entry.device is None:
            self.allocate(entry)
            entry.flags |= HOST_DIRTY
        work = bool(entry.flags & HOST_DIRTY)
        if work:
            box = own_box(entry.dims)
            self.move(self.host_bytes(entry, box), self.device_bytes(entry, box))
            entry.flags &= ~HOST_DIRTY
        self.call("copy_to_device", lambda w: lib.halide_copy_to_device(
            ffi.NULL, entry.raws[w.python], w.interface), 0, work)

    @precondition(lambda self: self.entries)
    @rule(i=st.integers(0, 99), j=st.integers(0, 99), to_device=st.booleans(),
          profiled=st.booleans())
    def buffer_copy(self, i, j, to_device, profiled):
        """halide_buffer_copy_already_locked's paths: device to device where the source's
        device side is current; else host to host, device to host, or host to device. The
        destination is host-dirty after a copy to the host, device-dirty after one to the
        device (unless it is the source)."""
        src, dst = self.pick(i), self.pick(j)
        box = overlap(src.dims, dst.dims)
        allocating = to_device and dst.device is None  # (halide_device_malloc comes first)
        from_device_valid = ((src.device is not None or (allocating and src is dst))
                             and not src.flags & HOST_DIRTY)
        from_host_valid = not src.flags & DEVICE_DIRTY or src.device is None
        if to_device and from_device_valid and box is not None:
            if src is dst:
                return  # a device copy onto itself: drivers refuse overlapping ranges
            if dst.device is not None:
                (s_at, s_mem), (d_at, d_mem) = (self.device_bytes(src, box),
                                                self.device_bytes(dst, box))
                if s_mem is d_mem and np.intersect1d(s_at, d_at).size:
                    return  # overlapping ranges of one allocation: likewise
        if allocating:
            self.allocate(dst)  # (what the copy leaves out is unknown)
        if box is not None:
            if to_device and from_device_valid:
                route = self.device_bytes(src, box), self.device_bytes(dst, box)
            elif to_device:
                route = self.host_bytes(src, box), self.device_bytes(dst, box)
            elif from_host_valid:
                route = self.host_bytes(src, box), self.host_bytes(dst, box)
            else:
                route = self.device_bytes(src, box), self.host_bytes(dst, box)
            self.move(*route)
        if src is not dst:
            dst.flags = (dst.flags & ~DIRTY) | (DEVICE_DIRTY if to_device else HOST_DIRTY)
        host_copy = not to_device and src.device is None and dst.device is None

        def copy(w):
            copy_entry = lib.shim_py_buffer_copy if w.python else lib.halide_buffer_copy
            return copy_entry(ffi.NULL, src.raws[w.python],
                              w.interface if to_device else ffi.NULL, dst.raws[w.python])

        self.call("host copy" if host_copy else "buffer_copy", copy, 0, True, profiled)

    @precondition(lambda self: self.entries)
    @rule(i=st.integers(0, 99), profiled=st.booleans())
    def sync(self, i, profiled):
        entry = self.pick(i)
        expected = 0 if entry.device is not None else lib.halide_error_code_no_device_interface
        # (the host device's sync waits for nothing: a no-op decided in C, not served)
        self.call("sync", lambda w: lib.halide_device_sync(ffi.NULL, entry.raws[w.python]),
                  expected, entry.device is not None and self.kind != "host", profiled)

    # --- after each rule ----------------------------------------------------------------------

    @invariant()
    def worlds_agree_with_the_model(self):
        for r, memory in enumerate(self.hosts):
            for world in self.worlds:
                host = world.hosts[r]
                assert np.array_equal(host[memory.known], memory.values[memory.known]), \
                    (world.python, r, np.flatnonzero((host != memory.values) & memory.known))
        for n, entry in enumerate(self.entries):
            for world, raw in zip(self.worlds, entry.raws):
                where = (world.python, n, entry.kind, entry.dims)
                assert raw.flags & DIRTY == entry.flags, (where, raw.flags, entry.flags)
                assert (raw.device != 0) == (entry.device is not None), where
                assert (raw.device_interface != ffi.NULL) == (entry.device is not None), where
                if entry.device is not None:
                    assert raw.device_interface == world.interface, where
                    memory, offset = entry.device
                    got = self.driver.read(raw, entry.span)
                    known = memory.known[offset:offset + entry.span]
                    want = memory.values[offset:offset + entry.span]
                    assert np.array_equal(got[known], want[known]), \
                        (where, np.flatnonzero((got != want) & known))

    def teardown(self):
        """Every crop released and every allocation freed, in both worlds; nothing served
        stays live."""
        codes = []
        for world in self.worlds:
            lib.shim_serve_allocations(self.backend, not world.python)
            for entry in self.entries:
                if entry.cropped:
                    codes.append(lib.halide_device_release_crop(ffi.NULL, entry.raws[world.python]))
            for entry in self.entries:
                if not entry.cropped:
                    codes.append(lib.halide_device_free(ffi.NULL, entry.raws[world.python]))
        lib.shim_serve_allocations(self.backend, True)
        assert set(codes) <= {0}, codes
        assert served_state(self.backend)[0] == self.served_before[0]


@pytest.fixture(params=sorted(BACKENDS))
def backend(request):
    """Each backend: the simulated host device always; OpenCL and Vulkan through their
    fixtures, which skip (saying why) where this machine has no such device."""
    if request.param == "host":
        device = shim.device("host")
    else:
        device = request.getfixturevalue(request.param)
    lib.shim_serve_allocations(BACKENDS[request.param], True)
    yield request.param, device
    lib.shim_serve_allocations(BACKENDS[request.param], True)


def test_random_copies_in_c_and_python_match_the_model(backend):
    kind, device = backend
    machine = type(f"CopyModel_{kind}", (CopyModel,), {"kind": kind, "device": device})
    evidence.pop(kind, None)
    counted.pop(kind, None)
    handles = families.live_counts()
    run_state_machine_as_test(machine, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, database=None,
        print_blob=True, suppress_health_check=[HealthCheck.too_slow]))
    assert families.live_counts() == handles
    missing = SERVED_KINDS[kind] - {k for k, n in evidence[kind].items() if n}
    assert not missing, f"never served in C on {kind}: {sorted(missing)} ({dict(evidence[kind])})"
    # (A copy to or from a served allocation is not served while profiling, as served.c's
    # copies are not: only a buffer_copy from a source's host memory may be counted then.)
    profiled = {k for k in SERVED_KINDS[kind] if k in COUNTED} - {"buffer_copy"}
    assert profiled <= set(counted[kind]), (dict(counted[kind]), profiled)


# --- what the model found ----------------------------------------------------------------------

def root_struct(values: np.ndarray):
    """A bare 1-d int32 struct over ``values``: (struct, its dims, to keep alive)."""
    raw, dim = ffi.new("halide_buffer_t *"), ffi.new("halide_dimension_t[1]")
    dim[0].min, dim[0].extent, dim[0].stride = 0, values.size, 1
    raw.host = ffi.cast("uint8_t *", values.ctypes.data)
    raw.type.code, raw.type.bits, raw.type.lanes = lib.halide_type_int, 32, 1
    raw.dimensions, raw.dim = 1, dim
    return raw, dim


@pytest.mark.parametrize("python", [False, True])
def test_a_copy_to_the_device_onto_itself_allocates_and_succeeds(python):
    """halide_buffer_copy(buf, interface, buf) of a struct with no device memory: Halide
    allocates it, then copies its (current) device side onto itself. The Python core looked
    the source's allocation up from before the allocation and failed with internal_error."""
    values = np.arange(3, dtype=np.int32)
    raw, _dim = root_struct(values)
    interface = lib.shim_backend_interface(lib.SHIM_BACKEND_HOST)
    shim.device("host")
    copy = lib.shim_py_buffer_copy if python else lib.halide_buffer_copy
    assert copy(ffi.NULL, raw, interface, raw) == 0
    assert raw.device != 0 and raw.flags & DIRTY == 0  # (the source's flags: unchanged)
    assert lib.halide_device_free(ffi.NULL, raw) == 0
    np.testing.assert_array_equal(values, np.arange(3))


def test_an_opencl_copy_from_a_row_into_a_column_of_one_allocation(opencl):
    """A device copy from a 2 x 3 buffer into its slice at x = 0 (a column, elements two apart),
    over the dimension both have: its first row's two elements into the column's first two
    (found by the model): OpenCL refuses a rectangle copy within one buffer whose two sides'
    pitches differ (CL_INVALID_VALUE); run by run, the shim copies it."""
    values = np.arange(6, dtype=np.int32)
    root, dims = ffi.new("halide_buffer_t *"), ffi.new("halide_dimension_t[2]")
    (dims[0].min, dims[0].extent, dims[0].stride), (dims[1].min, dims[1].extent, dims[1].stride) = \
        (0, 2, 1), (-1, 3, 2)
    root.host = ffi.cast("uint8_t *", values.ctypes.data)
    root.type.code, root.type.bits, root.type.lanes = lib.halide_type_int, 32, 1
    root.dimensions, root.dim = 2, dims
    interface = lib.shim_backend_interface(lib.SHIM_BACKEND_OPENCL)
    root.flags = HOST_DIRTY
    assert lib.halide_copy_to_device(ffi.NULL, root, interface) == 0
    column, column_dim = ffi.new("halide_buffer_t *"), ffi.new("halide_dimension_t[1]")
    column_dim[0].min, column_dim[0].extent, column_dim[0].stride = -1, 3, 2
    column.host, column.type, column.dimensions, column.dim = root.host, root.type, 1, column_dim
    assert lib.halide_device_slice(ffi.NULL, root, 0, 0, column) == 0
    assert lib.halide_buffer_copy(ffi.NULL, root, interface, column) == 0
    assert column.flags & DIRTY == DEVICE_DIRTY
    assert lib.halide_copy_to_host(ffi.NULL, column) == 0
    # column coordinates 0 and 1 (elements 2 and 4) get the row's x = 0 and 1 (elements 0, 1)
    np.testing.assert_array_equal(values, [0, 1, 0, 3, 1, 5])
    assert lib.halide_device_release_crop(ffi.NULL, column) == 0
    assert lib.halide_device_free(ffi.NULL, root) == 0


def test_an_opencl_copy_between_neighbouring_ranges_of_one_allocation(opencl):
    """A device copy from one element of an allocation to the next (a buffer to its slice):
    PoCL refuses the rectangle copy (MEM_COPY_OVERLAP) though no byte is shared; Halide's
    runtime, which copies run by run, succeeds, and so must the shim."""
    values = np.array([7, 9], np.int32)
    root, _dim = root_struct(values)
    interface = lib.shim_backend_interface(lib.SHIM_BACKEND_OPENCL)
    root.flags = HOST_DIRTY
    assert lib.halide_copy_to_device(ffi.NULL, root, interface) == 0
    second = ffi.new("halide_buffer_t *")
    second.host, second.type, second.dimensions = root.host + 4, root.type, 0
    assert lib.halide_device_slice(ffi.NULL, root, 0, 1, second) == 0
    assert lib.halide_buffer_copy(ffi.NULL, root, interface, second) == 0
    assert second.flags & DIRTY == DEVICE_DIRTY
    assert lib.halide_copy_to_host(ffi.NULL, second) == 0
    np.testing.assert_array_equal(values, [7, 7])
    assert lib.halide_device_release_crop(ffi.NULL, second) == 0
    assert lib.halide_device_free(ffi.NULL, root) == 0
