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

The pool's lock guards its list and counters only: it is never held across a driver call.
"""

from __future__ import annotations

from shim.base import sections

#: Halide's number (cuda.cpp): how many freed allocations are kept, the most recent first.
MAX_COUNT = 32


def quantize(nbytes: int) -> int:
    """``nbytes`` rounded up to its 4 most significant bits (Halide's
    quantize_allocation_size): 17 -> 18, 1000 -> 1024, 1025 -> 1152."""
    if nbytes < 16:
        return nbytes
    shift = nbytes.bit_length() - 4
    return (((nbytes - 1) >> shift) + 1) << shift


def fits(size: int, capacity: int) -> bool:
    """Whether an allocation of ``size`` (quantized) may take pooled memory of ``capacity``:
    it fits, and wastes at most 1/8 of it (Halide's rule)."""
    return capacity // 8 * 7 <= size <= capacity


class AllocationPool:
    """One backend's idle allocations (Memory objects, each with ``capacity`` bytes), oldest
    first, with counts of what the backend's allocations did."""

    def __init__(self, max_count: int, max_bytes: int):
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._lock = sections.Lock()
        self._entries: list = []
        self.bytes = 0
        # Allocations made by the driver, served from the pool, and freed to the driver.
        self.fresh = self.reused = self.freed = 0
        # In a child forked after the parent used the pool: the parent's driver objects, kept
        # alive and never touched (releasing them would call a driver the child cannot use).
        self.abandoned: list = []

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, size: int):
        """The best-fitting pooled allocation for ``size`` bytes (quantized), removed from the
        pool, or None."""
        with self._lock:
            best = None
            for i in range(len(self._entries) - 1, -1, -1):  # newest first: ties go to them
                capacity = self._entries[i].capacity
                if fits(size, capacity) and (best is None or capacity < self._entries[best].capacity):
                    best = i
            if best is None:
                return None
            memory = self._entries.pop(best)
            self.bytes -= memory.capacity
            self.reused += 1
            return memory

    def put(self, memory) -> list:
        """Pool ``memory``; returns what must be freed now (the oldest entries beyond the
        bounds, or ``memory`` itself if it alone exceeds them), for the caller to free
        outside the lock."""
        if memory.capacity > self.max_bytes or self.max_count <= 0:
            return [memory]
        with self._lock:
            self._entries.append(memory)
            self.bytes += memory.capacity
            evicted = []
            while len(self._entries) > self.max_count or self.bytes > self.max_bytes:
                oldest = self._entries.pop(0)
                self.bytes -= oldest.capacity
                evicted.append(oldest)
            return evicted

    def drain(self) -> list:
        """Empty the pool; returns what it held, for the caller to free."""
        with self._lock:
            entries, self._entries, self.bytes = self._entries, [], 0
            return entries

    def count(self, fresh: int = 0, freed: int = 0) -> None:
        with self._lock:
            self.fresh += fresh
            self.freed += freed

    def forget_after_fork(self) -> None:
        """In a forked child: the pool's memory is the parent's. Keep it referenced forever
        and hand none of it out; a new lock, since another thread of the parent may have held
        this one at the fork."""
        self._lock = sections.Lock()
        self.abandoned.extend(self._entries)
        self._entries, self.bytes = [], 0
