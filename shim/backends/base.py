"""The protocol a device backend implements: the contract between the core and a backend.

The core (shim/core/runtime.py and the modules above it) does everything Halide's generic device
layer does: validation, locking, dirty bits, which copy to make, profiling. A backend only
allocates device memory, hands out handles into it, moves bytes between device memory and host
memory as a CopyPlan (shim/native/regions.py) describes, and, for a GPU, compiles kernels (``module``;
the native library launches them).

The contract:
- Facts live on the class: ``kind`` (the name shim.device() takes), ``index`` (enum
  shim_backend: the native interface), ``dlpack_device_type``, ``default_rank``. Nothing else
  names a backend; shim/backends/devices.py lists the classes.
- ``available()`` never raises and creates no context; creating the backend raises
  shim.DeviceUnavailable where its device cannot be used.
- ``write``, ``read`` and ``copy`` return only once the transfer has completed: the host
  memory may be reused, and the device memory holds the bytes, for any queue. The core clears
  a dirty bit right after they return, and the C fast paths, which skip the core whenever the
  bits say nothing needs copying, are right only because of this.
- Methods raise BackendError for what the driver refuses; the core turns it into the Halide
  error code of the operation (shim/core/bridge.py). A backend never imports the core: only the
  native layer and small shared helpers (regions, errors, streams, private_files, binary_cache).

A backend is bound to one device for the life of the process: Halide's handles (a cl_mem, a
CUdeviceptr) do not say which device they belong to, so there is one interface, one context
and one device per backend.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from abc import ABC, abstractmethod

from shim.base import sections
from shim.backends import pool as pools
from shim.native import ffi, lib
from shim.native.regions import CopyPlan, Layout


class BackendError(Exception):
    """A backend operation failed. The generic layer turns it into the Halide error code of
    the operation that failed (device_malloc_failed, copy_to_host_failed, ...)."""


class Memory:
    """One device allocation (or wrapped native memory), as its backend represents it."""

    def __init__(self, nbytes: int, owned: bool = True):
        self.nbytes = nbytes  # what the current holder asked for
        self.capacity = nbytes  # what the driver allocated (sizes round up while reuse is on)
        self.owned = owned  # False for wrapped native memory: never freed by the shim
        # Handed to a DLPack consumer, whose device work the shim cannot see: freed to the
        # driver (which waits for that work), never pooled.
        self.exported = False


class Transfers:
    """Bytes a backend moved, by direction: every copy the generic layer asks for, and those
    the native layer serves (native_stubs/devices/served.c) for ``served``, the backend's index
    (None: it serves none)."""

    def __init__(self):
        self._lock = sections.Lock()  # for the counters only
        self._moved = {"uploaded": 0, "downloaded": 0, "device_copied": 0}
        self.served: int | None = None

    def add(self, direction: str, nbytes: int) -> None:
        with self._lock:
            self._moved[direction] += nbytes

    def _served(self) -> tuple[int, int, int]:
        if self.served is None:
            return 0, 0, 0
        moved = ffi.new("uint64_t[3]")
        lib.shim_served_transferred(self.served, moved, moved + 1, moved + 2)
        return moved[0], moved[1], moved[2]

    @property
    def uploaded(self) -> int:
        return self._moved["uploaded"] + self._served()[0]

    @property
    def downloaded(self) -> int:
        return self._moved["downloaded"] + self._served()[1]

    @property
    def device_copied(self) -> int:
        return self._moved["device_copied"] + self._served()[2]

    def forget_after_fork(self) -> None:
        """In a forked child: a new lock, since another thread of the parent may have held
        this one at the fork (a count may miss that thread's last copy)."""
        self._lock = sections.Lock()

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
    #: Where shim.default_device() tries this kind among the others (lower first); None:
    #: never chosen by default.
    default_rank: int | None = None
    #: The Halide target feature of the pipelines whose kernels take this backend's memory,
    #: where it is not ``kind``: another kind of memory of the same API (OpenCL images).
    api: str | None = None

    @classmethod
    @abstractmethod
    def available(cls) -> list[str]:
        """Descriptions of this kind's devices on this machine, found without creating a
        context: [] where it has none, or no driver or Python package for them (never an
        exception: shim.devices() lists what is there)."""

    @property
    @abstractmethod
    def name(self) -> str:
        """The device's name, for people."""

    # --- memory: allocations, reused through the pool (shim/backends/pool.py) ---------------

    #: Whether freed allocations are pooled for reuse (when Halide's switch,
    #: halide_can_reuse_device_allocations, allows it).
    reuses_allocations = True
    #: Pool bounds: at most this many idle allocations (Halide's 32), and at most
    #: pool_max_bytes of them: 1/8 of the device's memory (``memory_size``), or this many bytes
    #: where the backend cannot tell.
    pool_max_count = pools.MAX_COUNT
    POOL_DEFAULT_BYTES = 256 << 20

    @abstractmethod
    def _allocate_new(self, nbytes: int) -> Memory:
        """A new allocation of ``nbytes`` from the driver (BackendError if it fails)."""

    @abstractmethod
    def _free_now(self, memory: Memory) -> None:
        """Give an owned allocation back to the driver."""

    def settle(self, memory: Memory) -> None:
        """Wait until device work still using ``memory`` has finished (called before it is
        pooled for reuse or freed)."""

    def reusable(self, memory: Memory) -> bool:
        """Whether nothing but the shim's own device work may still use ``memory``, so that it
        may be pooled once settled."""
        return True

    def memory_size(self) -> int | None:
        """The device's memory in bytes, if the backend can tell (bounds the pool)."""
        return None

    def placement(self, offset: int) -> int:
        """Bytes to leave before an allocation's data so that the element ``offset`` bytes into
        it is where this backend's kernels can take a handle directly. 0: anywhere will do."""
        return 0

    def allocate(self, nbytes: int) -> Memory:
        """An allocation of at least ``nbytes``: a pooled one that fits, else a new one. A new
        one that fails is tried again once the pool is emptied (as Halide does)."""
        pool = self._pool
        reuse = self._reusing()
        size = pools.quantize(nbytes) if reuse else nbytes
        memory = pool.take(size) if reuse else None
        if memory is None:
            try:
                memory = self._allocate_new(size)
            except BackendError:
                if not self.release_unused():
                    raise
                memory = self._allocate_new(size)
            memory.capacity = size
            pool.count(fresh=1)
        memory.nbytes = nbytes
        self._live[id(memory)] = memory
        return memory

    #: Whether memory is made for a buffer's layout and element type (``allocate_for``), not
    #: for a number of bytes: OpenCL images. The core makes a Layout only for such a backend.
    shaped_memory = False

    def allocate_for(self, layout: Layout, type_code: int, nbytes: int) -> Memory:
        """An allocation of ``nbytes`` for a buffer laid out as ``layout``, of elements of
        Halide type code ``type_code``: ``allocate``'s, where memory is plain bytes. A backend
        with ``shaped_memory`` makes it from the layout and type."""
        return self.allocate(nbytes)

    def free(self, memory: Memory) -> None:
        """Release an owned allocation (called once, when no handle into it remains): pooled
        for reuse once device work using it has finished, or given back to the driver."""
        self._live.pop(id(memory), None)
        try:
            self.settle(memory)
        except BaseException:
            # Not known to be idle: never reused, and freed once the whole device has finished
            # (the driver need not wait for work still using it), unless even that fails.
            with contextlib.suppress(BackendError):
                self.sync()
            self._free_all([memory])
            raise
        if self._reusing() and memory.owned and not memory.exported and self.reusable(memory):
            pool = self._pool
            if pool.max_bytes is None:
                size = self.memory_size()
                pool.max_bytes = size // 8 if size else self.POOL_DEFAULT_BYTES
            if pool.max_count != self.pool_max_count:
                pool.max_count = self.pool_max_count
            evicted = pool.put(memory)
            if not self._reusing():  # switched off meanwhile: its drain may have missed it
                evicted += pool.drain()
        else:
            evicted = [memory]
        self._free_all(evicted)

    # --- what the pool holds of a Memory (shim/backends/pool.py) -------------------------

    def into_pool(self, memory: Memory) -> int:
        """The native value the pool keeps for ``memory``, which the pool then owns. Here the
        Memory object waits in the backend, for out_of_pool to hand back as it was."""
        native = self.native(memory)
        self._pooled[native] = memory
        return native

    def out_of_pool(self, native: int, capacity: int) -> Memory:
        """The Memory for an entry taken out of the pool (``capacity`` bytes)."""
        memory = self._pooled.pop(native)
        memory.capacity = capacity
        return memory

    # --- allocations the native layer serves (native_stubs/devices/served.c) --------------

    #: Whether this backend's native side serves pipelines' own allocations without Python
    #: (set by a backend that registers an allocator there); such a backend implements
    #: adopt_served.
    serves_allocations = False

    def adopt_served(self, native: int, nbytes: int, capacity: int, handles: list) -> Memory:
        """The Memory of a served allocation the Python core takes over (its native value,
        the bytes asked for, its capacity, and the handles into it the native layer made, its
        own and its crops', which stay valid): live from now on, as if ``allocate`` had made
        it and ``handle`` the handles."""
        raise NotImplementedError(f"the {self.kind} backend serves no allocations natively")

    def release_unused(self) -> int:
        """Give every pooled allocation back to the driver; returns how many there were."""
        if self._forked:  # a forked child: nothing of the parent's is touched
            return 0
        entries = self._pool.drain()
        if entries:
            self._free_all(entries)
        return len(entries)

    def _free_all(self, entries: list) -> None:
        """_free_now each of ``entries``; the first failure is raised once all were tried."""
        failure = None
        for memory in entries:
            try:
                self._free_now(memory)
            except BaseException as e:  # noqa: BLE001 - raised below
                failure = failure or e
        if entries:
            self._pool.count(freed=len(entries))
        if failure is not None:
            raise failure

    def _reusing(self) -> bool:
        return (self.reuses_allocations and not self._forked
                and bool(lib.halide_can_reuse_device_allocations(ffi.NULL)))

    @property
    def pooled_allocations(self) -> int:
        """Idle allocations kept for reuse (not counted in live_allocations)."""
        return len(self._pool)

    @property
    def pooled_bytes(self) -> int:
        return self._pool.bytes

    @property
    def pool_max_bytes(self) -> int | None:
        """The pool's byte bound (None until the first allocation is pooled); settable."""
        return self._pool.max_bytes

    @pool_max_bytes.setter
    def pool_max_bytes(self, value: int) -> None:
        self._pool.max_bytes = value

    def allocation_counts(self) -> dict[str, int]:
        """How allocations were served so far: "new" (from the driver), "reused" (from the
        pool), "freed" (given back to the driver)."""
        pool = self._pool
        return {"new": pool.fresh, "reused": pool.reused, "freed": pool.freed}

    @abstractmethod
    def handle(self, memory: Memory, offset: int, nbytes: int) -> int:
        """The value Halide keeps in halide_buffer_t::device for a buffer whose min element is
        ``offset`` bytes into ``memory`` and which spans ``nbytes`` (Halide's handle layout for
        this API)."""

    def release_handle(self, memory: Memory, handle: int) -> None:
        """Forget a handle made by ``handle`` (for APIs whose handles own something)."""

    def detached(self, memory: Memory) -> None:
        """detach_native gave ``memory`` to the caller: the shim will not free it."""
        self._live.pop(id(memory), None)

    @abstractmethod
    def write(self, memory: Memory, plan: CopyPlan, host_address: int) -> None:
        """Host -> device: plan.src_* describe host memory at ``host_address``, plan.dst_* the
        allocation. Returns once the bytes are on the device (see the module's contract)."""

    @abstractmethod
    def read(self, memory: Memory, plan: CopyPlan, host_address: int) -> None:
        """Device -> host: plan.src_* describe the allocation, plan.dst_* host memory. Returns
        once the bytes are in host memory."""

    @abstractmethod
    def copy(self, src: Memory, dst: Memory, plan: CopyPlan) -> None:
        """Device -> device within this backend. Returns once the copy has completed."""

    def sync(self) -> None:
        """Wait until all work queued on the device has finished."""

    @abstractmethod
    def wrap(self, native: int) -> Memory:
        """Memory the caller allocated (a cl_mem, a CUdeviceptr, ...), not owned by the shim."""

    @abstractmethod
    def native(self, memory: Memory) -> int:
        """The native handle of an allocation (what ``wrap`` takes)."""

    def release(self) -> None:
        """halide_device_release: drop caches (compiled kernels); live allocations stay valid.
        (The generic layer empties the allocation pool first.)"""

    def compute_capability(self) -> tuple[int, int]:
        return (0, 0)

    def module(self, source: bytes):
        """GPU backends: the native module (what the native library's launches take) for a
        pipeline's kernel ``source`` (OpenCL C, PTX), compiled or loaded once per source."""
        raise BackendError(f"the {self.kind} backend runs no kernels")

    def __init__(self):
        self.transfers = Transfers()
        # What the backend itself allocated and has not freed, counted where the memory is made
        # and released (not by the generic layer), so that leak checks catch the generic
        # layer's mistakes too. Pooled memory is not live: it is counted by the pool.
        self._live: dict[int, Memory] = {}
        self._pool = pools.AllocationPool(self.pool_max_count, None, self.into_pool,
                                          self.out_of_pool)
        self._pooled: dict[int, Memory] = {}  # native -> Memory, for into_pool/out_of_pool
        self._forked = False
        _backends.add(self)

    @property
    def live_allocations(self) -> int:
        """Allocations held by Buffers, DLPack exports and pipelines' own buffers."""
        return len(self._live) + self._served_live()[0]

    @property
    def live_bytes(self) -> int:
        """Device bytes those hold (each allocation's capacity)."""
        return sum(m.capacity for m in list(self._live.values())) + self._served_live()[1]

    def _served_live(self) -> tuple[int, int]:
        """(allocations, bytes) the native layer serves for this backend now, never made
        into Memory objects (native_stubs/devices/served.c); (0, 0) for a backend it serves
        none for."""
        if not self.serves_allocations:
            return 0, 0
        nbytes = ffi.new("int64_t *")
        return lib.shim_served_live(self.index, nbytes), nbytes[0]

    # --- DLPack (shim/exchange/dlpack_export.py, shim/interop/dlpack.py) ---------------------------------------

    #: The DLPack device type of this backend's memory; None: its Buffers export host memory.
    dlpack_device_type: int | None = None
    #: Whether a Buffer exports this backend's memory only to a consumer that asks for it
    #: (``dl_device=``), its host memory otherwise: memory no mainstream consumer reads.
    dlpack_on_request_only = False

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

    # Whether order_before and ran_on do anything (a backend with several queues whose work
    # must be ordered): the prepared calls' C run leaves such pipelines to the Python run.
    orders_streams = False

    def order_before(self, memory: Memory, stream: int) -> None:
        """Work about to be enqueued on ``stream`` (shim.stream; 0 the default) uses
        ``memory``: make it follow the work still pending on it from other streams."""

    def ran_on(self, memory: Memory, stream: int) -> None:
        """A pipeline call enqueued work that uses ``memory`` on ``stream``: later copies,
        frees and DLPack consumers of ``memory`` must follow it, whatever stream they use
        and even once ``stream`` is gone."""

    # --- device timing, for profiles (shim/profiling/profiler.py) -----------------------------------

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

    def forget_after_fork(self) -> None:
        """In a forked child: it never touches the pools (their memory is the parent's driver
        state), and the locks the parent's other threads may have held are new. A backend
        with locks of its own that the child takes renews them here too."""
        self._forked = True
        self._pool.forget_after_fork()
        self.transfers.forget_after_fork()


# Every backend made, for the fork handler below.
_backends: weakref.WeakSet = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for backend in list(_backends):
        backend.forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def fork_guard(api: str):
    """A check for a GPU backend to run before it touches its driver: in a child forked after
    the backend was made, it raises BackendError. The child has a copy of the parent's driver
    state but none of the driver's threads, so any call may wait forever (PoCL does) or fail in
    the driver's own terms; the backend stays the parent's, since a process has one per kind."""
    parent = os.getpid()
    forked = False

    def after_fork_in_child() -> None:
        nonlocal forked
        forked = True

    def check() -> None:
        if forked:
            raise BackendError(f"the {api} device was initialized in the parent process "
                               f"({parent}); a forked child cannot use it (fork before the first "
                               f"{api} use, or start processes with multiprocessing's 'spawn')")

    os.register_at_fork(after_in_child=after_fork_in_child)
    return check


def interface_of(backend: Backend):
    """The backend's halide_device_interface_t, the one every pipeline in the process uses."""
    return lib.shim_backend_interface(backend.index)
