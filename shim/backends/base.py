"""The protocol a device backend implements.

The generic layer (shim/runtime.py) does everything Halide's generic device layer does:
validation, locking, dirty bits, which copy to make. A backend only allocates device memory,
hands out handles into it, and moves bytes between device memory and host memory as a
CopyPlan (shim/regions.py) describes. GPU backends also compile and launch kernels, through the
entry points of their own modules.

A backend is bound to one device for the life of the process: Halide's handles (a cl_mem, a
CUdeviceptr) do not say which device they belong to, so there is one interface, one context
and one device per backend.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod

from shim import profiler
from shim.regions import CopyPlan


class BackendError(Exception):
    """A backend operation failed. The generic layer turns it into the Halide error code of
    the operation that failed (device_malloc_failed, copy_to_host_failed, ...)."""


class Memory:
    """One device allocation (or wrapped native memory), as its backend represents it."""

    def __init__(self, nbytes: int, owned: bool = True):
        self.nbytes = nbytes
        self.owned = owned  # False for wrapped native memory: never freed by the shim


class Transfers:
    """Bytes a backend moved, by direction; the generic layer counts every copy it asks for."""

    def __init__(self):
        self._lock = threading.Lock()  # for the counters only
        self.uploaded = self.downloaded = self.device_copied = 0

    def add(self, direction: str, nbytes: int) -> None:
        with self._lock:
            setattr(self, direction, getattr(self, direction) + nbytes)

    @property
    def total(self) -> int:
        return self.uploaded + self.downloaded + self.device_copied

    def __repr__(self) -> str:
        return (f"Transfers(uploaded={self.uploaded}, downloaded={self.downloaded}, "
                f"device_copied={self.device_copied})")


class Backend(ABC):
    #: "host", "opencl" or "cuda": the key in shim.device(kind) and the native interface.
    kind: str
    #: Index of this backend's interface in the native library (enum shim_backend).
    index: int
    #: Bytes moved so far (see Transfers).
    transfers: Transfers

    @property
    @abstractmethod
    def name(self) -> str:
        """The device's name, for people."""

    @abstractmethod
    def allocate(self, nbytes: int) -> Memory:
        """A new allocation of at least ``nbytes``."""

    @abstractmethod
    def free(self, memory: Memory) -> None:
        """Release an owned allocation (called once, when no handle into it remains)."""

    @abstractmethod
    def handle(self, memory: Memory, offset: int, nbytes: int) -> int:
        """The value Halide keeps in halide_buffer_t::device for a buffer whose min element is
        ``offset`` bytes into ``memory`` and which spans ``nbytes`` (Halide's handle layout for
        this API)."""

    def release_handle(self, memory: Memory, handle: int) -> None:
        """Forget a handle made by ``handle`` (for APIs whose handles own something)."""

    def detached(self, memory: Memory) -> None:
        """detach_native gave ``memory`` to the caller: the shim will not free it."""
        self._released(memory)

    @abstractmethod
    def write(self, memory: Memory, plan: CopyPlan, host_address: int) -> None:
        """Host -> device: plan.src_* describe host memory at ``host_address``, plan.dst_* the
        allocation."""

    @abstractmethod
    def read(self, memory: Memory, plan: CopyPlan, host_address: int) -> None:
        """Device -> host: plan.src_* describe the allocation, plan.dst_* host memory."""

    @abstractmethod
    def copy(self, src: Memory, dst: Memory, plan: CopyPlan) -> None:
        """Device -> device within this backend."""

    def sync(self) -> None:
        """Wait until all work queued on the device has finished."""

    @abstractmethod
    def wrap(self, native: int) -> Memory:
        """Memory the caller allocated (a cl_mem, a CUdeviceptr, ...), not owned by the shim."""

    @abstractmethod
    def native(self, memory: Memory) -> int:
        """The native handle of an allocation (what ``wrap`` takes)."""

    def release(self) -> None:
        """halide_device_release: drop caches (compiled kernels); live allocations stay valid."""

    def compute_capability(self) -> tuple[int, int]:
        return (0, 0)

    def __init__(self):
        self.transfers = Transfers()
        # What the backend itself allocated and has not freed, counted where the memory is made
        # and released (not by the generic layer), so that leak checks catch the generic
        # layer's mistakes too.
        self._live: dict[int, Memory] = {}

    def _allocated(self, memory: Memory) -> Memory:
        self._live[id(memory)] = memory
        profiler.memory_changed(self)
        return memory

    def _released(self, memory: Memory) -> None:
        if self._live.pop(id(memory), None) is not None:
            profiler.memory_changed(self)

    @property
    def live_allocations(self) -> int:
        return len(self._live)

    @property
    def live_bytes(self) -> int:
        return sum(m.nbytes for m in list(self._live.values()))

    # --- DLPack (shim/dlpack.py) -----------------------------------------------------------

    #: The DLPack device type of this backend's memory; None: its Buffers export host memory.
    dlpack_device_type: int | None = None

    def dlpack_device_id(self) -> int:
        return 0

    def dlpack_stream(self):
        """The ``stream`` this backend passes to a DLPack producer: where its own work runs."""
        return None

    def dlpack_data(self, handle: int) -> tuple[int, int]:
        """DLTensor's ``data`` and ``byte_offset`` for a buffer whose device handle is
        ``handle``."""
        raise BufferError(f"{self.kind} memory has no DLPack representation")

    def make_visible(self, stream, memory: Memory) -> None:
        """Order the work still pending on ``memory`` before work a DLPack consumer submits on
        ``stream`` (what the consumer passed to __dlpack__, already checked)."""

    # --- ordering across streams, for backends with more than one queue -------------------

    def order_before(self, memory: Memory, stream: int) -> None:
        """Work about to be enqueued on ``stream`` (shim.stream; 0 the default) uses
        ``memory``: make it follow the work still pending on it from other streams."""

    def ran_on(self, memory: Memory, stream: int) -> None:
        """A pipeline call enqueued work that uses ``memory`` on ``stream``: later copies,
        frees and DLPack consumers of ``memory`` must follow it, whatever stream they use
        and even once ``stream`` is gone."""

    # --- device timing, for profiles (shim/profiler.py) -----------------------------------

    def timing_origin(self):
        """A device timestamp taken now, with the host's perf_counter_ns at that moment, for
        ``timing_read``; None: this backend cannot time device work."""
        return None

    def timing_track(self, stream) -> str:
        """The name of the device queue or stream that work enqueued on ``stream`` runs in
        (None: where this backend's copies for the current call go)."""
        return f"{self.kind} device"

    def timing_marker(self, stream):
        """A mark enqueued on ``stream`` now, timestamped when the device reaches it."""
        return None

    def timing_read(self, origin, before, after) -> tuple[int, int]:
        """(host perf_counter_ns when the device reached ``before``, ns from ``before`` to
        ``after``), once the device has reached both."""
        raise NotImplementedError

    def timing_close(self, origin) -> None:
        """Release what ``timing_origin`` made."""

    def matches(self, **options) -> bool:
        """Whether this backend's device is the one ``options`` would select."""
        return not options

    def __repr__(self) -> str:
        return f"<shim device {self.kind}: {self.name}>"


def interface_of(backend: Backend):
    """The backend's halide_device_interface_t, the one every pipeline in the process uses."""
    from shim.native import lib

    return lib.shim_backend_interface(backend.index)
