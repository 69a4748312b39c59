"""The Buffer the device layer manages: a halide_buffer_t that Python owns, over host memory
numpy can see, in an allocation family (shim/memory/families.py), with its dirty bits, its
device memory and the operations on it (halide.Buffer's device methods), and what the shim's
own modules need of a Buffer (``raw``, ``family``, ``box``, ``call_record``, ``mark_read``...).
shim.Buffer (shim/buffers/buffer.py) is halide.Buffer's API over it; every Buffer is one."""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple, Self

import numpy as np

from shim.base import sections
from shim.base.errors import ArgumentError, DeviceError, DirtyBufferWarning
from shim.base.types import HalideType, is_halide
from shim.native import HostExporter, ffi, flags, interrupts, lib
from shim.native.flags import DEVICE_DIRTY, HOST_DIRTY
from shim.backends import devices
from shim.backends.base import Backend, interface_of
from shim.memory import families
from shim.memory.aliasing import has_allocation
from shim.memory.families import Family
from shim.core import buffer_operations, shutdown
from shim.core.bridge import runtime_call
from shim.buffers.buffer_arguments import dimensions_of


class ManagedBuffer(HostExporter):
    """A halide_buffer_t that Python owns, and its place in the device layer. Made only as a
    shim.Buffer (its subclass), whose constructors fill it through ``_init_from_array``."""

    # The struct and what describes it: what an in-place crop or slice takes from the new view
    # (see _replace).
    _STRUCT = ("_raw", "_dims", "_array", "_type", "_family", "_box", "_exposed", "_unread",
               "_root_box", "_root_dims", "_keepalive", "_record")

    # ``_pending``: None, or, in a PipelineResult whose struct is not made yet
    # (shim/buffers/pipeline_result.py), the name of the argument it is the result for.
    __slots__ = _STRUCT + ("_name", "_superseded", "_pending", "__weakref__")

    def _init_from_array(self, array: np.ndarray, argument: str, mins=None,
                         family: Family | None = None, keepalive=None,
                         mins_argument: str = "mins") -> None:
        try:
            htype = HalideType.from_dtype(array.dtype)
        except TypeError as e:
            raise ArgumentError(argument, str(e)) from None
        dims = dimensions_of(array, mins, argument, mins_argument)
        self._name, self._superseded, self._pending = "", None, None
        self._raw = ffi.new("halide_buffer_t *")
        raw = self._raw
        raw.host = ffi.cast("uint8_t *", array.ctypes.data)
        htype.to_c(raw.type)
        self._set_dims(dims)
        self._array = array
        self._type = htype
        # Where this Buffer lies in its family's root (itself, unless it is a crop or slice):
        # its box in the root's coordinates, and which root dimension each of its is (None for
        # one that embedded() added).
        self._root_box, self._root_dims = self._box, tuple(range(len(dims)))
        # Whether anyone outside the shim can see the host memory (then device results must
        # reach it before the device memory goes), and whether results a pipeline wrote here
        # have not been read by anyone yet (then dropping the Buffer is worth a warning).
        self._exposed = True
        self._unread = False
        # What the memory belongs to, if not the shim (a DLPack producer's tensor).
        self._keepalive = keepalive
        family = Family() if family is None else family
        # Last, and in one piece (signal handlers held): the struct joins its family, which
        # _finalize takes as the sign that there is something to give back. Joined with an
        # attribute still missing, the finalizer failed and the registry kept the entry.
        with interrupts.deferred():
            self._family = family
            families.register_owned(raw, family)
            # What the C fast paths need to record calls on this Buffer (never changes).
            self._record = families.call_record(raw, family, array)

    def _set_dims(self, dims) -> None:
        """Give the struct ``dims``: (min, extent, stride) per Halide dimension, x first."""
        self._dims = ffi.new("halide_dimension_t[]", [(lo, n, s, 0) for lo, n, s in dims] or 1)
        self._raw.dim = self._dims
        self._raw.dimensions = len(dims)  # after dim: a reader never sees more than it holds
        # (min, extent) per Halide dimension: what bounds queries compare, kept in Python.
        self._box = tuple((lo, n) for lo, n, _ in dims)

    def _view(self, array: np.ndarray, mins, root_box, root_dims,
              mins_argument: str = "mins") -> Self:
        """A Buffer over ``array`` (a view of this one's memory) that joins this Buffer's
        family: it aliases the family's device allocation, or carries the proxy interface
        until there is one (shim/memory/aliasing.py). ``mins_argument`` names what gave ``mins``,
        for errors."""
        view = type(self).__new__(type(self))
        view._init_as_view(self, array, mins, root_box, root_dims, mins_argument)
        return view

    def _init_as_view(self, parent: ManagedBuffer, array: np.ndarray, mins, root_box, root_dims,
                      mins_argument: str = "mins") -> None:
        # In one piece (signal handlers held): a view registered in its family but never
        # adopted as its member would be one the family does not know.
        with interrupts.deferred():
            # (Memory a DLPack producer owns outlives every view.)
            self._init_from_array(array, "crop", mins=mins, family=parent._family,
                                  keepalive=parent._keepalive, mins_argument=mins_argument)
            self._root_box, self._root_dims = root_box, root_dims
            # Part of the parent's host memory: seen where the parent's is, or once read.
            self._exposed = parent._exposed
            buffer_operations.adopt(parent._raw, parent._root_box, self._raw, root_box)

    def _reshape(self, array: np.ndarray, mins, root_dims, argument: str) -> None:
        """Give this Buffer's own struct another geometry over the same elements, as
        halide.Buffer's in-place methods do: ``array`` is a view of its memory starting at the
        same element, ``mins`` its coordinates, ``root_dims`` which root dimension each
        dimension is. Pipeline calls using the Buffer finish first."""
        dims = dimensions_of(array, mins, argument, mins_argument=argument)

        def change(family: Family) -> None:
            self._set_dims(dims)
            self._array = array
            if family.shared:
                self._root_dims = root_dims
            else:
                # No other Buffer is placed in this one's coordinates yet: they become the
                # family's (the root's, read when a first view shares it: Family.share).
                self._root_box, self._root_dims = self._box, tuple(range(len(dims)))

        buffer_operations.reshape(self._raw, change)

    def _replace(self, view: ManagedBuffer) -> None:
        """Make this Buffer ``view`` (a crop or slice of it), as halide.Buffer's in-place crop
        and slice do. A struct covers the same elements for its whole life (its box in the
        family, shim/memory/families.py), so this Buffer takes the view's struct, and keeps its
        previous one, still in the family, until it goes itself: a PreparedCall made with it
        still runs on it."""
        def swap(family: Family) -> None:
            for slot in ManagedBuffer._STRUCT:
                mine = getattr(self, slot)
                setattr(self, slot, getattr(view, slot))
                setattr(view, slot, mine)
            view._superseded, self._superseded = self._superseded, view

        buffer_operations.reshape(self._raw, swap)

    # --- dirty bits ----------------------------------------------------------------------

    def host_dirty(self) -> bool:
        """Whether the host memory holds changes the device copy lacks."""
        return bool(flags.of(self._raw) & HOST_DIRTY)

    def device_dirty(self) -> bool:
        """Whether the device copy holds changes the host memory lacks."""
        # (A PipelineResult whose struct is not made yet has no device copy.)
        return self._pending is None and bool(flags.of(self._raw) & DEVICE_DIRTY)

    def set_host_dirty(self, dirty: bool = True) -> None:
        """Say that the host memory holds changes the device copy lacks (or, False, not)."""
        buffer_operations.mark_dirty(self._raw, HOST_DIRTY, dirty)

    def set_device_dirty(self, dirty: bool = True) -> None:
        """Say that the device copy holds changes the host memory lacks (or, False, not).
        Only a Buffer with a device allocation and writable host memory can be device-dirty:
        otherwise every later read would fail, or write into memory that must not change."""
        if dirty and not self.writeable:
            raise ArgumentError("dirty", "this Buffer's host memory is read-only: changes on the "
                                         "device could never be copied back to it")
        buffer_operations.mark_dirty(self._raw, DEVICE_DIRTY, dirty)
        self._unread = dirty

    # --- device --------------------------------------------------------------------------
    # As halide.Buffer's, the methods return 0; a failure raises DeviceError (with Halide's
    # error code) instead of returning it. A device is named as the shim names it ("opencl",
    # shim.device(...)) or as halide.Buffer's methods take it (a halide.DeviceAPI, a
    # halide.Target): see _requested_device.

    def has_device_allocation(self) -> bool:
        return has_allocation(self._raw)

    @property
    def device(self) -> Backend | None:
        """The device holding this Buffer's device allocation, if any."""
        # The interface is read once, before the check: another thread freeing the memory in
        # between leaves a stale answer (which the caller's next device step refuses cleanly),
        # never a null interface to look up.
        interface = self._raw.device_interface
        if interface == ffi.NULL or not self.has_device_allocation():
            return None
        return devices.backend_for_interface(interface)

    # ``device``: a kind ("opencl"), a device (shim.device()) or a halide.DeviceAPI; ``target``:
    # a halide.Target (halide has no types: any of its values passes a type check).
    def device_malloc(self, device: str | Backend | None = None, target: Any = None) -> int:
        """Allocate device memory (default: on the shim's default device). Does nothing if
        already allocated. Unlike halide.Buffer's, it makes the host memory the newer copy:
        the next copy_to_device uploads it (new device memory holds nothing)."""
        buffer_operations.malloc_device(self._raw, interface_of(_device(device, target)))
        return 0

    def copy_to_device(self, device: str | Backend | None = None, target: Any = None) -> int:
        """Make the device allocation current: allocate it if needed, upload if host-dirty.
        A Buffer on another device moves: its data comes home, that allocation is freed, and
        the data goes up to ``device`` (Halide refuses with error -42 instead)."""
        requested = _requested_device(device, target)
        if requested is None and self._raw.device:
            interface = ffi.NULL  # the interface it already has
        else:
            interface = interface_of(requested or devices.default_device())
        if self.has_device_allocation() and interface != ffi.NULL \
                and self._raw.device_interface != interface:
            buffer_operations.move_device(self._raw, interface)
            return 0
        try:
            self._runtime("copy_to_device", lib.halide_copy_to_device, self._raw, interface)
        except DeviceError as e:
            # Another thread put the buffer on another device after the check above: the
            # move decides again, under the family's lock.
            switched = e.code == lib.halide_error_code_incompatible_device_interface
            if interface == ffi.NULL or not switched:
                raise
            buffer_operations.move_device(self._raw, interface)
        return 0

    def copy_to_host(self) -> int:
        """Make the host memory current: download if device-dirty."""
        families.refuse_if_abandoned(self._family)  # (the native layer looks at the bits only)
        self._runtime("copy_to_host", lib.halide_copy_to_host, self._raw)
        self.mark_read()
        return 0

    def _current_host(self) -> np.ndarray:
        """The host memory, for a read (or a write) through the Buffer: device results are
        copied back first. A Buffer another thread of the parent was changing or calling a
        pipeline on when this process was forked is refused first, whatever its dirty bits
        say: that thread may have cleared them before writing (a call's output), and its
        results never reach this process."""
        if self._pending is None:  # (a PipelineResult not made yet: the CPU call is over)
            families.refuse_if_abandoned(self._family)
            if flags.of(self._raw) & DEVICE_DIRTY:
                self.copy_to_host()
        return self._array

    def device_sync(self) -> int:
        """Wait for the work queued on this Buffer's device to finish."""
        interface = self._raw.device_interface  # one read: another thread may free the buffer
        if interface != ffi.NULL:
            self._runtime("device_sync", lib.halide_device_sync_global, interface)
        return 0

    def device_free(self) -> int:
        """Free the device allocation, once pipeline calls running on it have finished. Results
        that exist only on the device are copied back to host memory first: freeing never loses
        data, and the next device use uploads it again."""
        if self._raw.device:
            buffer_operations.free_device(self._raw)
        return 0

    def device_deallocate(self) -> int:
        """device_free(): what halide.Buffer's device_deallocate does for a Buffer that is the
        only one holding its allocation, as every shim.Buffer is (crops hold handles of their
        own)."""
        return self.device_free()

    def _runtime(self, what, function, *args) -> None:
        with runtime_call(what) as check:
            check(function(ffi.NULL, *args))

    # --- for the shim's own modules, not the public API ------------------------------------
    # What pipeline calls (shim/calls/) and DLPack (shim/exchange/, shim/interop/) need of a
    # Buffer, so that they never reach into its attributes. (The C fast paths read and
    # write two slots by name, native_stubs/fast/call_records.c: _record, and _unread, which they
    # set after a run as mark_read / mark_written do. Renaming either means changing the C.)

    @classmethod
    def over_array(cls, array: np.ndarray, argument: str, *, exposed: bool = True, mins=None,
                   keepalive=None) -> Self:
        """A Buffer over ``array`` with clean flags, for memory the shim passes to pipelines
        (``argument`` names it in errors). ``exposed=False`` when the shim allocated the array
        and nobody else holds it yet; ``mins``: the Halide coordinates of its first element
        (zeros by default); ``keepalive``: what owns the memory if not the array (a DLPack
        producer's tensor), kept alive as long as the Buffer and its crops."""
        buf = cls.__new__(cls)
        buf._init_from_array(array, argument, mins=mins, keepalive=keepalive)
        buf._exposed = exposed
        return buf

    @property
    def raw(self):
        """The halide_buffer_t (a cffi struct) that pipelines and the runtime see."""
        return self._raw

    @property
    def family(self) -> Family:
        """The allocation family this Buffer belongs to (shim/memory/families.py)."""
        return self._family

    @property
    def box(self) -> tuple[tuple[int, int], ...]:
        """(min, extent) per Halide dimension, x first."""
        return self._box

    @property
    def call_record(self) -> tuple:
        """What the C fast paths record pipeline calls on this Buffer with
        (families.call_record)."""
        return self._record

    def is_over(self, array: np.ndarray) -> bool:
        """Whether this Buffer's host memory is ``array`` itself (not a copy, nor a view)."""
        return self._array is array

    def mark_written(self) -> None:
        """A pipeline wrote results here that nobody has read yet: dropping the Buffer before
        they are read is worth a warning."""
        self._unread = True

    def mark_read(self) -> None:
        """The results here have been read (or handed to someone who will)."""
        self._unread = False

    def copy_on_device(self, backend: Backend) -> Self:
        """A new, dense Buffer on ``backend`` holding a copy of this one's data, made on the
        device: DLPack's ``copy=True``, both ways."""
        copy = type(self).over_array(np.empty_like(self._array, order="C"), "copy", exposed=False,
                                 mins=[lo for lo, _ in self._box])
        self.copy_into(copy, backend, "copy for DLPack")
        return copy

    def copy_into(self, dst: ManagedBuffer, backend: Backend | None, what: str) -> None:
        """halide_buffer_copy: this Buffer's elements at the coordinates both Buffers have, into
        ``dst``'s allocation on ``backend`` (made if it has none), or into its host memory
        (``backend`` None). Halide's paths: device to device where both are on one device,
        else through host memory; ``what`` names the copy in a DeviceError."""
        interface = ffi.NULL if backend is None else interface_of(backend)
        with runtime_call(what) as check:
            check(lib.halide_buffer_copy(ffi.NULL, self._raw, interface, dst._raw))

    # The finalizer (Finalized's, which runs this with Ctrl-C held: a KeyboardInterrupt here
    # would leave the struct registered and its device memory allocated for good).
    def _finalize(self):
        pending = getattr(self, "_pending", None)
        if pending is not None:
            # A PipelineResult whose struct was never made: nothing to release. It is marked,
            # for a finalizer of the same dying cycle that uses it after this.
            self._pending = Released(pending)
            return
        raw = getattr(self, "_raw", None)
        if raw is None or getattr(self, "_family", None) is None:
            return  # construction failed before the struct joined a family: nothing to release
        if shutdown.shut_down():
            return  # the interpreter is exiting: device memory goes with the process
        if families.forking() or families.abandoned(self._family):
            return  # a forked child: another thread's Buffer, as it left it (see families)
        inside = sections.inside()
        if not raw.device and not self._family.shared and not inside:
            # No device memory, and no other struct in the family: leaving the registry is
            # all there is to do (what _Dropped.release comes to then). Nothing else can reach
            # the struct now: a call that passes it holds the Buffer.
            families.unregister_owned(raw)
            return
        dropped = _Dropped(raw, self._dims, self._array, self._keepalive, self._family,
                           self._exposed, self._unread, repr(self))
        if inside:
            # The collector ran this inside one of the layer's critical sections on this
            # thread: the release waits until the thread is out of them (shim/base/sections.py).
            sections.later(dropped.release)
        else:
            dropped.release()  # (its warnings name the line that dropped the Buffer)


class Released(str):
    """The ``_pending`` of a PipelineResult whose finalizer ran before its struct was made
    (shim/buffers/pipeline_result.py): the argument's name, still."""

    __slots__ = ()


class _Dropped(NamedTuple):
    """What a dropped Buffer leaves to release: its struct and everything its memory needs."""

    raw: object
    dims: object
    array: np.ndarray
    keepalive: object
    family: Family
    exposed: bool
    unread: bool
    name: str

    def release(self) -> None:
        """Leave the family and give the device memory back; device results go to host memory
        when anyone can see it. A failure loses those results (with a warning), never the
        memory."""
        raw = self.raw
        dirty = bool(flags.of(raw) & DEVICE_DIRTY) and not self.family.shared
        # (Results in a DLPack producer's memory outlive this Buffer: nothing to say.)
        if dirty and self.unread and self.keepalive is None and raw.device:
            warnings.warn(f"{self.name} was dropped holding pipeline results nobody read",
                          DirtyBufferWarning, stacklevel=3)
        try:
            buffer_operations.release(raw, copy_back=self.exposed)
        except Exception as e:  # noqa: BLE001 - a finalizer must not raise
            warnings.warn(f"releasing the device memory of a dropped Buffer failed: {e}",
                          RuntimeWarning, stacklevel=3)


def _device(device, target=None) -> Backend:
    return _requested_device(device, target) or devices.default_device()


# halide.DeviceAPI's names of the APIs the shim has backends for (Default_GPU: the target's).
_DEVICE_APIS = {"OpenCL": "opencl", "CUDA": "cuda", "Default_GPU": None}


# The GPU features of a halide.Target, in the order Halide picks its default device API.
_TARGET_APIS = ("opencl", "cuda")


def _requested_device(device, target) -> Backend | None:
    """The device a device method names, None for the default: a kind ("opencl"), a device from
    shim.device(), or what halide.Buffer's methods take, a halide.DeviceAPI or a halide.Target
    (``target``; a Target with a GPU feature names that API, any other stands for the default,
    as halide.Target() stands for the JIT target in Halide). halide is not imported for this:
    the shim does not need it."""
    if is_halide(device, "DeviceAPI"):
        if device.name not in _DEVICE_APIS:
            raise ArgumentError("device_api", f"the shim has no backend for "
                                              f"halide.DeviceAPI.{device.name}; it has OpenCL "
                                              f"and CUDA")
        kind = _DEVICE_APIS[device.name]
        if kind is not None:
            return devices.device(kind)
        device = None  # Default_GPU: the target's
    if device is None:
        device = target
    if is_halide(device, "Target"):
        features = set(device.to_string().split("-"))
        return next((devices.device(kind) for kind in _TARGET_APIS if kind in features), None)
    return None if device is None else devices.device(device)
