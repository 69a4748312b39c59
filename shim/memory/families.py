"""Allocation families: the unit of locking in the device layer.

A family is one device allocation and every halide_buffer_t that aliases it: the buffer it
was made for, and the crops and slices taken of it. Each family has its own lock, created and
owned here; unrelated buffers never contend, and there is no global lock. (Halide's own
runtime serializes every device call in the process on one mutex.)

A halide_buffer_t finds its family in one of three ways:
 - it belongs to a shim.Buffer: the Buffer registered its struct's address here (its
   allocation may be one the native layer served while the family was idle,
   native_stubs/fast/buffer_families.c, which joins the family the first time Python takes its
   lock: ``locked``);
 - it carries a device handle the shim gave out: the handle is registered here, or it is one
   the native layer served without Python (a pipeline's own buffer: native_stubs/devices/served.c),
   which becomes a family here the first time Python meets it (``family_of_handle``);
 - neither (a pipeline's own buffer, not yet on a device): a lock of its own, kept only until
   the struct gets an allocation, so that two threads cannot allocate it twice.
Which of these applies can change while a thread waits for a lock, so ``locked`` re-checks
after acquiring and retries with the right one.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from shim.native import flags
from shim.native import interrupts
from shim.base import sections
from shim.base.errors import ShimError
from shim.backends.devices import backend_for_interface
from shim.native.flags import DEVICE_DIRTY, HOST_DIRTY
from shim.native import FamilyState, LockState, MemberPlans, ffi, lib, watch_buffer_families
from shim.native.regions import Layout, intersect, overlaps


class FamilyLock(LockState):
    """A mutex that knows which thread holds it (a signal handler using the family it
    interrupted is refused, not left waiting for itself) and counts as one of the layer's
    critical sections (shim/base/sections.py: a finalizer run inside it leaves its work for later). Its
    condition wakes threads waiting for pipeline calls on the family to end (``Family.uses``).
    ``owner`` and ``waiting`` are C fields of its base class: the C fast paths read them at
    every call (native_stubs/fast/call_records.c)."""

    __slots__ = ("_lock", "_changed", "abandoned", "awaiting")

    def __init__(self):
        self._lock = threading.Lock()
        # Made by the first wait(): most families never see a waiter, and a Condition costs
        # more than the rest of a Buffer's construction (it and notify_all run with the lock
        # held, so the first one's making it is never raced).
        self._changed = None
        self.owner = None
        self.waiting = 0  # threads in wait(): notify_all costs nothing without them
        # Threads (idents) in await_calls: operations waiting for the family's pipeline calls
        # to end, which new calls let go first (call_uses.begin_call). A tuple, replaced with
        # the lock held: most families never have one, and a Buffer makes no list for it.
        self.awaiting: tuple = ()
        # In a forked child: another thread of the parent was changing or using the family
        # at the fork (see after_fork_in_child), and never goes on here.
        self.abandoned = False

    def acquire(self) -> None:
        if self.abandoned:
            # (Whether or not its holder had it: that thread's half-done change or running
            # call never ends here. Its owner, ABANDONED, sends the C fast paths here too.)
            raise _abandoned_error()
        me = threading.get_ident()
        if self.owner == me:
            # (A signal handler run where the main thread waits inside the layer, holding this
            # lock, and using a Buffer of the same family: it would wait for itself forever.)
            raise ShimError("this thread already holds the lock of this Buffer's allocation "
                            "family (a signal handler that uses the Buffers of a device "
                            "operation it interrupted?): it would wait for itself forever")
        sections.enter()
        try:
            if not self._lock.acquire(blocking=False):
                if self.abandoned or forking():  # (then its holder is another thread's)
                    raise _abandoned_error()
                # Blocking here releases the GIL, so a thread waiting for a family never
                # stops the thread that holds it from running Python.
                self._lock.acquire()
        except BaseException:
            sections.leave()
            raise
        self.owner = me

    def release(self) -> None:
        self.owner = None
        self._lock.release()
        sections.leave()

    # ``with family.lock:`` for a family known not to change (a shim.Buffer's): cheaper than
    # ``locked``, which finds a struct's family first and checks it once it has the lock.
    def __enter__(self) -> FamilyLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def taken(self) -> bool:
        """Whether another thread holds it (or is in the middle of taking or giving it back:
        in a forked child, threading.Lock.locked() can say no of a lock whose semaphore a
        thread of the parent was still holding, so this asks the semaphore)."""
        if self._lock.acquire(blocking=False):
            self._lock.release()
            return False
        return True

    def wait(self, timeout: float) -> None:
        """With the lock held: release it until ``notify_all`` (or ``timeout``), then hold it
        again."""
        # Counted before owner is cleared, and owner set before the count drops: a thread
        # holding the lock always shows one of the two, which is what the native layer reads
        # for "nobody holds it" (native_stubs/fast/buffer_families.c).
        self.waiting += 1
        self.owner = None
        if self._changed is None:
            self._changed = threading.Condition(self._lock)
        try:
            self._changed.wait(timeout)
        finally:
            self.owner = threading.get_ident()
            self.waiting -= 1

    def notify_all(self) -> None:
        """With the lock held: wake the threads in ``wait``."""
        if self.waiting:
            self._changed.notify_all()


class Member:
    """A shim.Buffer's struct in a shared family, and its box in the root's coordinates.

    The box is fixed for the struct's lifetime, and what the family's operations work out from
    it depends only on the box and the family's regions (immutable sets). Calls on a member
    take the regions back and forth between the same few states (an output's box leaves them
    when a call starts and comes back when it ends), so the member remembers those results by
    state (``derived``): working them out on every call made a call on a crop cost several
    times the same call on a whole buffer."""

    __slots__ = ("raw", "address", "box", "_known")

    def __init__(self, raw, box):
        self.raw, self.address, self.box = raw, address_of(raw), box
        self._known: dict = {}

    def derived(self, function, regions: tuple, generation: int):
        """``function(box, host, device)``, a pure function, for this member's box and the
        family's ``regions`` (host, device). A result is remembered within one ``generation``
        of the family's members only, so that a state reached after the members changed is a
        new object (see Family)."""
        key = (function, regions, generation)
        known = self._known.get(key)
        if known is None:
            if len(self._known) >= _REMEMBERED_STATES:
                self._known.clear()  # a family that keeps reaching new states: start over
            known = self._known[key] = function(self.box, *regions)
        return known


# Results a member remembers (states times operations), so that a family that keeps reaching
# new states does not grow without bound.
_REMEMBERED_STATES = 64


_NO_REGIONS: tuple[frozenset, frozenset] = (frozenset(), frozenset())


def dirty_bits(box, host: frozenset, device: frozenset) -> int:
    """The dirty bits of a member with ``box``: a side's bit where it overlaps one of that
    side's regions."""
    return ((HOST_DIRTY if overlaps(host, box) else 0)
            | (DEVICE_DIRTY if overlaps(device, box) else 0))


class Use(NamedTuple):
    """A pipeline call running on a member of a family right now."""

    call: int  # the call context's id
    address: int  # the member's halide_buffer_t
    box: tuple | None  # its box in the root's coordinates (None: not a shared family)
    output: bool  # whether the call writes it
    # Whether the call writes it without reading it first (no input of the call overlaps
    # it): then what either side held there before no longer matters.
    replaces: bool


class Family(FamilyState):
    """One allocation (``memory``, made by ``backend``) and the handles into it.

    A family whose root Buffer has crops or slices is *shared*: its members are windows on one
    host region (the root's) and one device allocation mirroring it. Which parts are newer on
    which side is kept as boxes in the root's coordinates (``host_regions``,
    ``device_regions``, frozensets: replaced, never changed in place, so that a state can be
    recognized (see Member)), never both at once, and every member's dirty bits are derived from
    them, so that the C fast paths, which read only a struct's own flags, stay right for the
    whole family. The operations on shared families live in shim/memory/aliasing.py.

    The two sets are kept together as one tuple, ``regions`` (a field of the C base class),
    replaced as a whole: the C fast paths remember what a call does to a family by the
    identity of its ``regions`` object (native_stubs/fast/shared_records.c), with no look at their
    contents. What a call does also depends on the members, so a change of the members starts
    a new ``generation``: ``regions`` becomes a new object, and Member.derived never gives an
    object of an earlier generation again.
    """

    __slots__ = ("lock", "backend", "memory", "handles", "members", "root_host",
                 "root_layout", "device_base", "generation", "uses", "exposed", "__weakref__")

    def __init__(self, backend=None, lock: FamilyLock | None = None):
        self.lock = lock or FamilyLock()
        self.backend = backend
        self.memory = None
        # handle -> [byte offset into its memory, number of halide_buffer_t (and DLPack
        # exports) carrying it, that memory, its backend]
        self.handles: dict[int, list] = {}
        # Shared families only (see share()).
        self.members: dict[int, Member] | None = None
        self.root_host = 0
        self.device_base = 0  # where the root starts in the device allocation (aliasing.allocate)
        self.root_layout = None
        self.regions: tuple[frozenset, frozenset] = _NO_REGIONS
        self.generation = 0
        # The pipeline calls running on members right now. Generated code may be setting their
        # flags and its kernels reading or writing their memory: operations of other threads
        # wait for the calls that touch the same elements (await_calls), and derived dirty
        # bits leave their members alone.
        self.uses: list[Use] = []
        # Shared families: whether a member dropped so far had its host memory seen outside
        # the shim (ManagedBuffer._exposed). With the last member gone and none seen, nobody
        # can read the host memory: device-only data then goes with the allocation.
        self.exposed = False

    @property
    def shared(self) -> bool:
        return self.members is not None

    def has_member(self, raw) -> bool:
        """Whether ``raw`` is one of a shared family's members, not a struct that only holds a
        handle into its memory (a crop generated code made with halide_device_crop)."""
        return self.shared and address_of(raw) in self.members

    @property
    def host_regions(self) -> frozenset:
        return self.regions[0]

    @host_regions.setter
    def host_regions(self, boxes: frozenset) -> None:
        self.regions = (boxes, self.regions[1])

    @property
    def device_regions(self) -> frozenset:
        return self.regions[1]

    @device_regions.setter
    def device_regions(self, boxes: frozenset) -> None:
        self.regions = (self.regions[0], boxes)

    def share(self, root_raw, root_box) -> None:
        """Become a shared family whose root is ``root_raw``; its dirty bits become regions."""
        if self.shared:
            return
        self.root_host = int(ffi.cast("uintptr_t", root_raw.host))
        self.root_layout = Layout.of(root_raw)
        self.members = {}
        self.add_member(Member(root_raw, root_box))
        flags.assign(root_raw, flags.REGIONS, True)
        bits = flags.of(root_raw)
        self.regions = (frozenset([root_box] if bits & HOST_DIRTY else []),
                        frozenset([root_box] if bits & DEVICE_DIRTY else []))

    def add_member(self, member: Member) -> None:
        self.members[member.address] = member
        self._next_generation()

    def drop_member(self, address: int) -> None:
        if self.members.pop(address, None) is not None:
            self._next_generation()

    def _next_generation(self) -> None:
        self.generation += 1
        self.regions = (self.regions[0], self.regions[1])  # the same boxes, a new object

    def member_of(self, raw) -> Member:
        return self.members[address_of(raw)]

    def root_box(self) -> tuple:
        return self.root_layout.box

    def in_use(self, address: int) -> bool:
        return any(use.address == address for use in self.uses)

    def refresh_bits(self, active=None, only=None) -> None:
        """Set each member's dirty bits from the regions: dirty where it overlaps one. Members
        a pipeline is running on are left alone (their kernels set their bits, and the call's
        end takes them in), except ``active``, the member the current operation is for.
        ``only``: refresh that member alone (nothing else changed). (Members cannot come or
        go meanwhile: that takes the lock, which the caller holds.)"""
        regions = self.regions
        busy = self.uses and [use.address for use in self.uses]
        members = (self.member_of(only),) if only is not None else self.members.values()
        for member in members:
            if member.address in busy and member.raw != active:
                continue
            flags.put_dirty(member.raw, member.derived(dirty_bits, regions, self.generation))

    def add_handle(self, handle: int, offset: int) -> None:
        """One more halide_buffer_t (or DLPack export) carries ``handle``, ``offset`` bytes
        into the current memory. Each handle remembers its memory and backend: a pinned one
        may outlive the family's move to new memory, or to another device."""
        entry = self.handles.setdefault(handle, [offset, 0, self.memory, self.backend])
        entry[1] += 1
        _by_handle[self.backend.index, handle] = self

    def offset_of(self, handle: int) -> int:
        return self.handles[handle][0]

    def memory_of(self, handle: int):
        return self.handles[handle][2]

    def _handles_into(self, memory) -> int:
        return sum(1 for entry in self.handles.values() if entry[2] is memory)

    def last_handle(self, handle: int) -> bool:
        """Whether dropping ``handle`` would leave no handle into the current memory."""
        entry = self.handles.get(handle)
        return (entry is not None and entry[1] == 1 and entry[2] is self.memory
                and self._handles_into(self.memory) == 1)

    def drop_handle(self, handle: int, *, free: bool = True):
        """One halide_buffer_t no longer carries ``handle``. Its memory goes when the last
        handle into it does (a crop keeps its parent's allocation alive), unless ``free`` is
        False: detach_native hands the memory to the caller instead. Returns the backend
        whose memory went, None if none did."""
        entry = self.handles.get(handle)
        if entry is None:
            return None
        entry[1] -= 1
        if entry[1] > 0:
            return None
        del self.handles[handle]
        memory, backend = entry[2], entry[3]
        _by_handle.pop((backend.index, handle), None)
        backend.release_handle(memory, handle)
        if self._handles_into(memory):
            return None
        if memory is self.memory:
            self.memory = None
        if free and memory.owned:
            backend.free(memory)
        elif not free:
            backend.detached(memory)
        return backend


# (backend index, handle) -> Family, for every handle the shim has given out.
_by_handle: dict[tuple[int, int], Family] = {}
# address of a shim.Buffer's halide_buffer_t -> its Family.
_owned: dict[int, Family] = {}
# address of a struct with neither -> its own lock, until it is allocated.
_unallocated: dict[int, FamilyLock] = {}


# The native layer serves a Buffer's allocation where its family is idle, reading these
# (native_stubs/fast/buffer_families.c); the allocation stays in its handle until family_of
# adopts it.
watch_buffer_families(_owned, Family, FamilyLock)


def live_counts() -> dict[str, int]:
    """How many entries each registry holds: structs of live shim.Buffers ("owned"), device
    handles given out ("handles"), structs waiting for their first allocation
    ("unallocated"). Leak checks compare them before and after a piece of work."""
    return {"owned": len(_owned), "handles": len(_by_handle), "unallocated": len(_unallocated)}


def address_of(raw) -> int:
    return int(ffi.cast("uintptr_t", raw))


def register_owned(raw, family: Family) -> None:
    """``raw``, a new struct with no device memory, is a shim.Buffer's, in ``family``."""
    flags.assign(raw, flags.PYTHON, True)  # never served by the native layer
    _owned[address_of(raw)] = family


def unregister_owned(raw) -> None:
    address = address_of(raw)
    family = _owned.pop(address, None)
    if family is not None and family.shared:
        family.drop_member(address)


def family_of_handle(interface, handle: int) -> Family | None:
    index = lib.shim_backend_of(interface)
    family = _by_handle.get((index, handle))
    if family is None and handle:
        family = _adopted(index, interface, handle)
    return family


# Taken while an allocation served by the native layer becomes a family (reentrant: a signal
# handler run meanwhile that meets the same handle finds no family, which is an error, not a
# wait for itself).
_adopting = threading.RLock()


def _adopted(index: int, interface, handle: int, into: Family | None = None) -> Family | None:
    """The family of ``handle`` if it is an allocation the native layer served without Python
    (native_stubs/devices/served.c): from now on an ordinary family's (``into``, or a new one),
    which the native layer never serves again. None if it is not one."""
    with _adopting:
        family = _by_handle.get((index, handle))
        if family is not None or (into is not None and into.memory is not None):
            return family
        served = ffi.new("uint64_t[4]")  # native, bytes asked for, capacity, its own handle
        if not lib.shim_served_adopt(index, handle, served, served + 1, served + 2, served + 3):
            return None
        root = served[3]
        crops = _served_crops(index, root)
        backend = backend_for_interface(interface)
        family = into if into is not None else Family(backend)
        family.backend = backend
        family.memory = backend.adopt_served(served[0], served[1], served[2],
                                             [root] + [crop for crop, _ in crops])
        family.add_handle(root, 0)
        for crop, offset in crops:  # each carried by one struct, as _crop_into counts it
            family.add_handle(crop, offset)
        return family


def _served_crops(index: int, root: int) -> list[tuple[int, int]]:
    """(handle, byte offset) of each crop of the adopted allocation ``root`` that the native
    layer made (its list, frozen by the adoption)."""
    count = lib.shim_served_crops(index, root, ffi.NULL, ffi.NULL, 0)
    handles, offsets = ffi.new("uint64_t[]", count), ffi.new("uint64_t[]", count)
    lib.shim_served_crops(index, root, handles, offsets, count)
    return list(zip(handles, offsets))


def family_of(raw, address: int | None = None) -> Family | None:
    """The family ``raw`` belongs to: its shim.Buffer's, or that of the handle it carries."""
    family = _owned.get(address_of(raw) if address is None else address)
    if family is None and raw.device:
        family = family_of_handle(raw.device_interface, raw.device)
    return family


def _adopt_served(raw, family: Family) -> None:
    """With the lock of ``family``, a shim.Buffer's, held: an allocation the native layer served
    its struct while the family was idle (native_stubs/fast/buffer_families.c), or while
    someone's assigning the flags whole had lost the PYTHON bit, joins the family. Only with
    the lock held: until then the native layer may free the allocation, and its handle with it."""
    if raw.device and not family.shared and raw.device not in family.handles:
        _adopted(lib.shim_backend_of(raw.device_interface), raw.device_interface, raw.device,
                 into=family)
        flags.assign(raw, flags.PYTHON, True)


def _target(raw, address: int):
    """(lock, family or None) that guards ``raw`` right now."""
    family = family_of(raw, address)
    if family is not None:
        return family.lock, family
    lock = _unallocated.get(address)
    if lock is None:
        lock = _unallocated.setdefault(address, FamilyLock())
    return lock, None


def family_for(raw, backend) -> Family:
    """A family for ``raw``, a struct that had none and is getting an allocation. It keeps the
    struct's own lock, which the caller holds: a thread that finds the family through the new
    handle meanwhile waits for the same lock."""
    return Family(backend, lock=_unallocated.get(address_of(raw)))


def _retire(address: int, lock: FamilyLock) -> None:
    """A struct's own lock, still held, is no longer needed (it got a family, or was done
    with without one: a pipeline's buffer freed, copied, never allocated). Forgotten before
    it is released, so a thread that was waiting for it finds, once it has it, that it no
    longer guards the struct and retries with the current one (see ``locked``)."""
    if _unallocated.get(address) is lock:
        del _unallocated[address]


class locked:
    """``with locked(*raws) as families:`` -- hold the locks of the families of ``raws`` (in a
    fixed order, so two threads locking the same pair never deadlock). Gives the families, None
    for a struct with no family (one family, or None, for one struct). Signal handlers wait
    until the locks are released (shim/native/interrupts.py). A class, not a generator: every
    device operation of the Python core enters one, and a generator's machinery cost more than
    the locking itself."""

    __slots__ = ("_raws", "_addresses", "_targets", "_locks")

    def __init__(self, *raws):
        self._raws = raws

    def __enter__(self):
        _DEFERRED.__enter__()
        try:
            raws = self._raws
            addresses = [address_of(raw) for raw in raws]
            while True:
                targets = [_target(raw, address) for raw, address in zip(raws, addresses)]
                locks = [targets[0][0]] if len(targets) == 1 else \
                    sorted({id(lock): lock for lock, _ in targets}.values(), key=id)
                _acquire_all(locks)
                if all(_target(raw, address)[0] is lock
                       for raw, address, (lock, _) in zip(raws, addresses, targets)):
                    break
                for lock in reversed(locks):
                    lock.release()
            try:
                for raw, address, (_, family) in zip(raws, addresses, targets):
                    if family is not None and _owned.get(address) is family:
                        _adopt_served(raw, family)
            except BaseException:
                for lock in reversed(locks):
                    lock.release()
                raise
        except BaseException as e:
            _DEFERRED.__exit__(type(e), e, e.__traceback__)
            raise
        self._addresses, self._targets, self._locks = addresses, targets, locks
        return [family for _, family in targets] if len(raws) > 1 else targets[0][1]

    def __exit__(self, *exc) -> None:
        try:
            for address, (lock, family) in zip(self._addresses, self._targets):
                if family is None:
                    _retire(address, lock)
            for lock in reversed(self._locks):
                lock.release()
        finally:
            _DEFERRED.__exit__(*exc)


_DEFERRED = interrupts.deferred()


def _acquire_all(locks: list) -> None:
    """Acquire ``locks`` in order; if one refuses, those already held are released."""
    for i, lock in enumerate(locks):
        try:
            lock.acquire()
        except BaseException:
            for held in reversed(locks[:i]):
                held.release()
            raise


def _inside_pipeline_call() -> bool:
    """Whether the calling thread works for a running pipeline call (its generated code, on
    the caller's thread or one of Halide's workers)."""
    call = lib.shim_current_call()
    return call != ffi.NULL and lib.shim_call_in_pipeline(call)


def await_calls(family: Family | None, raw=None, *, writers_only: bool = False) -> None:
    """Called with the family's lock held, by an operation a program asked for: wait, with
    the lock released, until no running pipeline call uses the elements ``raw`` covers (all
    the family's, for None): neither its kernels nor its flags may change under it. A
    pipeline's own device calls never wait (they are its generated code, ordered as Halide
    orders them), and a call holds no uses while it prepares its buffers (PreparedCall), so
    no two calls ever wait for each other."""
    if family is None or not family.uses or _inside_pipeline_call():
        return
    if abandoned(family):
        raise _abandoned_error()  # (the calls it would wait for never end in this child)
    member = family.members.get(address_of(raw)) if family.shared and raw is not None else None
    box = member.box if member is not None else None
    if not any(_conflicts(use, box, writers_only) for use in family.uses):
        return
    # Counted while it waits: a new call on the family waits for it before it begins (else a
    # thread calling pipelines back to back would keep this one waiting for good), and the
    # C fast paths, which see a waiter, leave their calls to Python, which does that.
    me = threading.get_ident()
    family.lock.awaiting += (me,)
    try:
        while any(_conflicts(use, box, writers_only) for use in family.uses):
            interrupts.run_pending()  # (a safe point: a handler's exception ends the wait)
            family.lock.wait(0.05)
    finally:
        mine = family.lock.awaiting.index(me)
        family.lock.awaiting = family.lock.awaiting[:mine] + family.lock.awaiting[mine + 1:]
        family.lock.notify_all()  # (calls waiting for it)


def await_operations(family: Family) -> None:
    """Called with the family's lock held, by a pipeline call before it records any use: wait,
    with the lock released, while other threads' operations wait for the family's calls to
    end (await_calls), so that they go first. A call that waits holds no use, so no operation
    waits for it: nothing waits in a circle."""
    if _inside_pipeline_call():
        return  # (an extern stage's call: the call it runs in may be what they wait for)
    me = threading.get_ident()
    while any(thread != me for thread in family.lock.awaiting):
        if abandoned(family):
            raise _abandoned_error()
        interrupts.run_pending()
        family.lock.wait(0.05)


# --- forks ------------------------------------------------------------------------------------
#
# A forked child has only the thread that forked. A family another thread of the parent was
# changing (its lock held) or using (a pipeline call recorded on it) stays as that thread left
# it, and that thread never goes on there: its operations would wait for good. Such a family is
# abandoned: operations on its Buffers raise ShimError instead, and its Buffers' finalizers let
# go without giving anything back (the memory goes with the process). Python runs finalizers
# inside os.fork itself, as it deletes the other threads' states (for the Buffers only their
# frames held: other threads' Buffers), before the at-fork hooks, while the shim's locks other
# threads held are still held: until the last hook (after_fork_in_child, which shim/__init__.py
# registers after every module's own) has run, the child is ``forking()``, finalizers give
# nothing back, and ``abandoned`` judges each family as that hook will. (A call of the forking
# thread's own, from an extern stage that forked, records uses that do end: with one running,
# only families whose lock is held are abandoned.)

# The id of the process this is, as the native library's fork handler keeps it (renewed in a
# child before anything else runs there, forked from Python or from C): read without the system
# call os.getpid() makes, since every read of a Buffer's host memory asks
# (``refuse_if_abandoned``).
_current_process = lib.shim_process_id()
_process = _current_process[0]  # the process whose threads the families' locks and uses are

# A FamilyLock's owner in a child where its family is abandoned: never a thread's id, and not
# None, so that the C fast paths, which take a family whose lock has no owner as free
# (native_stubs/fast/call_records.c, buffer_families.c), leave its Buffers' calls to Python,
# whose acquire refuses them.
ABANDONED = "abandoned at a fork"


def forking() -> bool:
    """Whether this is a forked child whose at-fork hooks have not all run yet."""
    return _current_process[0] != _process


def _left_by_another_thread(family: Family) -> bool:
    return family.lock.taken() or bool(family.uses and lib.shim_current_call() == ffi.NULL)


def abandoned(family: Family) -> bool:
    """Whether ``family`` was left by another thread of the parent process at a fork."""
    return family.lock.abandoned or (forking() and _left_by_another_thread(family))


def refuse_if_abandoned(family: Family) -> None:
    """ShimError if ``family`` is abandoned: its memory and dirty bits are as another thread of
    the parent left them, in the middle of a change or of a pipeline call (which may have
    cleared the bits of an output it had not written yet), so nothing read from it can be
    trusted, whatever its bits say."""
    # (forking(), inlined: this runs at every read)
    if family.lock.abandoned or (_current_process[0] != _process
                                 and _left_by_another_thread(family)):
        raise _abandoned_error()


def _abandoned_error() -> ShimError:
    return ShimError("this Buffer was in use by another thread of the parent process when this "
                     "process was forked, and that thread does not exist here: the Buffer cannot "
                     "be used in this process (make it again, or fork when no other thread is "
                     "using it)")


def after_fork_in_child() -> None:
    global _process
    me = threading.get_ident()
    for family in {id(f): f for f in (*_owned.values(), *_by_handle.values())}.values():
        if _left_by_another_thread(family):
            family.lock.abandoned = True
            family.lock.owner = ABANDONED
        # Operations of the parent's other threads that waited for calls do not exist here:
        # new calls must not wait for them (await_operations).
        family.lock.awaiting = tuple(thread for thread in family.lock.awaiting if thread == me)
    _process = _current_process[0]


def _conflicts(use: Use, box, writers_only: bool) -> bool:
    if writers_only and not use.output:
        return False
    return box is None or use.box is None or intersect(box, use.box) is not None


def call_record(raw, family: Family, array) -> tuple:
    """What the C fast paths need to record pipeline calls on the struct ``raw`` of a
    shim.Buffer over ``array`` in its ``family`` (native_stubs/fast/members.h, RECORD_*): made once
    per Buffer, since none of them ever changes. The Uses are the ones a call on a plain family
    records; their ``call`` is 0, as nothing reads it back. MemberPlans is where the C fast
    paths keep what calls on this struct do once its family is shared
    (native_stubs/fast/shared_records.c)."""
    address = address_of(raw)
    return (address, raw, family, family.lock, family.uses,
            Use(0, address, None, False, False), Use(0, address, None, True, True),
            Use(0, address, None, True, False), array, MemberPlans())
