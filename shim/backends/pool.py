"""Reusing device allocations: Halide's free list, for every backend (see Backend.allocate).

Halide 21's CUDA runtime (cuda.cpp, allocation_cache.cpp) keeps freed device memory on a free
list while ``halide_can_reuse_device_allocations`` says so (on by default), and serves later
allocations from it. Its rules, which this pool follows:

- sizes are rounded up to their 4 most significant bits while reuse is on
  (``quantize``: at most 1/8 wasted, about 4% on average), so that nearby sizes share a class;
- an allocation takes the smallest pooled one that fits and wastes at most 1/8 of it
  (``fits``);
- at most 32 allocations stay pooled, the most recently freed;
- when a fresh allocation fails, the pool is emptied and the allocation tried once more;
- ``halide_reuse_device_allocations(false)``, ``halide_cuda_release_unused_device_allocations``
  and ``halide_device_release`` empty it.

Halide additionally matches the context (a backend here has one) and the stream memory was
freed on (the shim instead waits, in Backend.settle, for device work still using memory before
pooling it, so pooled memory is idle and fits any stream). Unlike Halide, the pool is also
bounded in bytes (Backend.pool_max_bytes): memory kept idle here is memory other users of the
device (PyTorch's caching allocator, other processes) cannot have, and their out-of-memory
failures do not empty this pool as the shim's own do.

The pool itself is native (native_stubs/devices/pool.c): the allocations the native layer serves
without Python (native_stubs/devices/served.c) come from it and go back to it, so one pool, one set
of bounds and one set of counts cover both paths. This module is its Python face: entries go in
and out as a backend's Memory objects, through the backend's ``into_pool``/``out_of_pool``
(the pool itself holds native values). The native pool's lock guards its list and counters
only: it is never held across a driver call.
"""

from __future__ import annotations

import threading

from shim.native import ffi, lib

#: Halide's number (cuda.cpp): how many freed allocations are kept, the most recent first.
MAX_COUNT = 32


def quantize(nbytes: int) -> int:
    """``nbytes`` rounded up to its 4 most significant bits (Halide's
    quantize_allocation_size): 17 -> 18, 1000 -> 1024, 1025 -> 1152."""
    return lib.shim_pool_quantize(nbytes)


def fits(size: int, capacity: int) -> bool:
    """Whether an allocation of ``size`` (quantized) may take pooled memory of ``capacity``:
    it fits, and wastes at most 1/8 of it (Halide's rule)."""
    return lib.shim_pool_fits(size, capacity)


class AllocationPool:
    """One backend's idle allocations, oldest first, with counts of what the backend's
    allocations did. ``into_pool(memory)`` gives a Memory's native value to the pool (which
    then owns it); ``out_of_pool(native, capacity)`` makes a Memory of one taken out."""

    def __init__(self, max_count: int, max_bytes: int | None, into_pool, out_of_pool):
        self.native = ffi.gc(lib.shim_pool_new(), lib.shim_pool_delete)
        if self.native == ffi.NULL:
            raise MemoryError("no memory for an allocation pool")
        self._into, self._out = into_pool, out_of_pool
        lib.shim_pool_set_bounds(self.native, max_count, -1 if max_bytes is None else max_bytes)

    def __len__(self) -> int:
        return lib.shim_pool_length(self.native)

    @property
    def bytes(self) -> int:
        return lib.shim_pool_bytes(self.native)

    @property
    def max_count(self) -> int:
        return lib.shim_pool_max_count(self.native)

    @max_count.setter
    def max_count(self, value: int) -> None:
        lib.shim_pool_set_bounds(self.native, value, lib.shim_pool_max_bytes(self.native))

    @property
    def max_bytes(self) -> int | None:
        """The byte bound; None until set (nothing is pooled until then)."""
        value = lib.shim_pool_max_bytes(self.native)
        return None if value < 0 else value

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        lib.shim_pool_set_bounds(self.native, self.max_count, value)

    def _counts(self) -> tuple[int, int, int]:
        counts = ffi.new("uint64_t[3]")
        lib.shim_pool_counts(self.native, counts, counts + 1, counts + 2)
        return counts[0], counts[1], counts[2]

    @property
    def fresh(self) -> int:
        """Allocations made by the driver."""
        return self._counts()[0]

    @property
    def reused(self) -> int:
        """Allocations served from the pool."""
        return self._counts()[1]

    @property
    def freed(self) -> int:
        """Allocations given back to the driver."""
        return self._counts()[2]

    def take(self, size: int):
        """The best-fitting pooled allocation for ``size`` bytes (quantized), removed from the
        pool, or None."""
        capacity = _capacity()
        native = lib.shim_pool_take(self.native, size, capacity)
        return self._out(native, capacity[0]) if native else None

    def put(self, memory) -> list:
        """Pool ``memory``; returns what must be freed now (the oldest entries beyond the
        bounds, or ``memory`` itself if it alone exceeds them), for the caller to free
        outside the lock."""
        capacity = memory.capacity
        native = self._into(memory)
        pooled = lib.shim_pool_put(self.native, native, capacity)
        if pooled == 0:
            return []
        evicted = [self._out(native, capacity)] if pooled < 0 else []
        return evicted + self._drained(lib.shim_pool_evict)

    def drain(self) -> list:
        """Empty the pool; returns what it held, for the caller to free."""
        return self._drained(lib.shim_pool_pop)

    def _drained(self, remove) -> list:
        entries = []
        capacity = _capacity()
        while native := remove(self.native, capacity):
            entries.append(self._out(native, capacity[0]))
        return entries

    def count(self, fresh: int = 0, freed: int = 0) -> None:
        lib.shim_pool_count(self.native, fresh, freed)

    def forget_after_fork(self) -> None:
        """In a forked child: the pool's memory is the parent's. It is forgotten, never
        handed out or released (that would call a driver the child cannot use), and the
        native pool takes a new lock, since another thread of the parent may have held it at
        the fork."""
        lib.shim_pool_forget_after_fork(self.native)


_scratch = threading.local()


def _capacity():
    """The calling thread's own out-parameter for an entry's capacity (a cffi allocation per
    call would cost more than the pool's work)."""
    try:
        return _scratch.capacity
    except AttributeError:
        _scratch.capacity = ffi.new("uint64_t *")
        return _scratch.capacity
