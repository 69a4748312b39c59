"""The ``host`` device: a simulated device whose memory is separate host memory.

It behaves like a GPU as far as Halide's buffer protocol goes (its own allocations, explicit
copies in both directions, handles that are not host pointers of the buffer), so code that
manages device state can be tested on any machine. It also injects faults: the Nth allocation
or copy from now fails, copies sleep to widen race windows, and it counts live allocations for
leak checks.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from shim.base import sections
from shim.backends.base import Backend, BackendError, Memory
from shim.native import lib
from shim.native.regions import CopyPlan, host_memory

ALIGNMENT = 128


class HostMemory(Memory):
    def __init__(self, nbytes: int, address: int, array: np.ndarray | None = None):
        super().__init__(nbytes, owned=array is not None)
        self.address = address
        self.array = array  # keeps owned memory alive; None for wrapped memory


class Faults(NamedTuple):
    """What to break. Counts are "the Nth from now" (1 = the next one); None disables."""

    fail_allocation: int | None = None
    fail_copy: int | None = None
    delay: float = 0.0


class HostBackend(Backend):
    kind = "host"
    index = lib.SHIM_BACKEND_HOST
    description = "simulated device in host memory"

    @classmethod
    def available(cls) -> list[str]:
        return [cls.description]

    def __init__(self):
        super().__init__()
        self._faults = Faults()
        self._counter_lock = sections.Lock()  # guards the counters below, never held across work
        self._allocations_seen = 0
        self._copies_seen = 0
        # Detached allocations now belong to whoever detached them; host memory has no
        # native allocator to hand them to, so they stay valid as long as the backend.
        self._detached: list[HostMemory] = []

    @property
    def name(self) -> str:
        return self.description

    # --- fault injection -----------------------------------------------------------------

    def set_faults(self, *, fail_allocation: int | None = None, fail_copy: int | None = None,
                   delay: float = 0.0) -> None:
        """Make the ``fail_allocation``-th allocation and the ``fail_copy``-th copy from now
        fail (1 = the next), and every allocation and copy sleep ``delay`` seconds first, to
        widen race windows."""
        with self._counter_lock:
            self._faults = Faults(
                None if fail_allocation is None else self._allocations_seen + fail_allocation,
                None if fail_copy is None else self._copies_seen + fail_copy,
                delay)

    def clear_faults(self) -> None:
        self.set_faults()

    def forget_after_fork(self) -> None:
        super().forget_after_fork()
        self._counter_lock = sections.Lock()  # (the host device works in a forked child)

    def _before_allocation(self) -> None:
        with self._counter_lock:
            self._allocations_seen += 1
            fail = self._allocations_seen == self._faults.fail_allocation
            delay = self._faults.delay
        if delay:
            time.sleep(delay)
        if fail:
            raise BackendError("injected allocation failure")

    def _before_copy(self) -> None:
        with self._counter_lock:
            self._copies_seen += 1
            fail = self._copies_seen == self._faults.fail_copy
            delay = self._faults.delay
        if delay:
            time.sleep(delay)
        if fail:
            raise BackendError("injected copy failure")

    # --- memory --------------------------------------------------------------------------

    # Freed memory is not pooled (reuses_allocations): numpy allocates as fast as a pool
    # lookup, Halide has no host "device" whose allocations it reuses, and this device is the
    # test double whose fault injection and leak counts must see every allocation. Tests that
    # exercise the generic pool switch it on for an instance of their own.
    reuses_allocations = False

    def _allocate_new(self, nbytes: int) -> HostMemory:
        self._before_allocation()
        raw = np.empty(max(nbytes, 1) + ALIGNMENT, np.uint8)
        start = -raw.ctypes.data % ALIGNMENT
        return HostMemory(nbytes, raw.ctypes.data + start, raw)

    def _free_now(self, memory: HostMemory) -> None:
        pass  # numpy frees the memory with the HostMemory object

    def detached(self, memory: HostMemory) -> None:
        super().detached(memory)
        self._detached.append(memory)

    def handle(self, memory: HostMemory, offset: int, nbytes: int) -> int:
        return memory.address + offset

    def wrap(self, native: int) -> HostMemory:
        # Native memory for this device is any host address; the size is unknown, so
        # copies trust Halide's shapes, as a GPU API would.
        if native == 0:
            raise BackendError("cannot wrap a null address")
        return HostMemory(0, native)

    def native(self, memory: HostMemory) -> int:
        return memory.address

    # --- copies --------------------------------------------------------------------------

    def write(self, memory: HostMemory, plan: CopyPlan, host_address: int) -> None:
        self._before_copy()
        source = host_memory(host_address, plan.src_span)
        np.copyto(plan.dst_view(host_memory(memory.address, plan.dst_span)), plan.src_view(source))

    def read(self, memory: HostMemory, plan: CopyPlan, host_address: int) -> None:
        self._before_copy()
        target = host_memory(host_address, plan.dst_span)
        np.copyto(plan.dst_view(target), plan.src_view(host_memory(memory.address, plan.src_span)))

    def copy(self, src: HostMemory, dst: HostMemory, plan: CopyPlan) -> None:
        self._before_copy()
        np.copyto(plan.dst_view(host_memory(dst.address, plan.dst_span)),
                  plan.src_view(host_memory(src.address, plan.src_span)))
