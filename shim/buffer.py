"""shim.Buffer: a halide_buffer_t that Python owns, over host memory numpy can see.

Axis order follows halide.Buffer: Halide's dimension 0 (x, the innermost) is numpy's last
axis, so a numpy array of shape (height, width) is a Halide buffer of extents (width, height).
"""

from __future__ import annotations

import math
import operator
import os
import warnings
from typing import NamedTuple

import numpy as np

from shim import buffer_operations, devices, dlpack_export, families, flags, shutdown
from shim.aliasing import has_allocation
from shim.backends.base import Backend, interface_of
from shim.bridge import runtime_call
from shim.dlpack_capsules import host_array
from shim.errors import ArgumentError, DirtyBufferWarning
from shim.families import Family
from shim.flags import DEVICE_DIRTY, HOST_DIRTY
from shim.metadata import dimension_label
from shim.native import Finalized, ffi, lib
from shim.types import INT32_MAX, HalideType

# Host memory the shim will allocate or copy at most at once: more than the machine has can
# never be computed with (numpy fails, or the kernel kills the process once the pages fill).
PHYSICAL_MEMORY = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class Dimension(NamedTuple):
    """One halide_dimension_t: coordinates and stride in elements."""

    min: int
    extent: int
    stride: int


def as_host_array(value, argument: str) -> np.ndarray:
    """A zero-copy numpy view of a CPU array-like: numpy arrays, objects with ``__dlpack__``
    on the CPU, or anything with the buffer protocol."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, Buffer):
        return value.numpy()
    if hasattr(value, "__dlpack__"):
        return host_array(value, argument)  # checked: numpy trusts hostile tensors
    try:
        return np.asarray(memoryview(value))
    except TypeError:
        raise ArgumentError(argument, "expected a numpy array, a shim.Buffer, or an object with "
                                      f"the buffer protocol or __dlpack__; got {type(value).__name__}"
                            ) from None


class Buffer(Finalized):
    """A Halide buffer over host memory, with an optional device allocation.

    ``Buffer(array)`` wraps a numpy array (or any object ``as_host_array`` accepts) without
    copying; ``Buffer(shape=..., dtype=...)`` allocates zeroed memory. Shapes are in numpy order.
    A new Buffer is host-dirty: its host memory is the only copy of its data.

    Device methods follow halide.Buffer. Reading the host data through this class
    (``numpy()``, ``np.asarray``) copies device results back first, and dropping a Buffer frees
    its device memory, copying unread device results back to host memory (with a warning).
    """

    __slots__ = ("_raw", "_dims", "_array", "_type", "_family", "_box", "_exposed", "_unread",
                 "_root_box", "_root_dims", "_keepalive", "_record", "__weakref__")

    def __init__(self, data=None, *, shape=None, dtype=None):
        if data is None:
            if shape is None or dtype is None:
                raise ArgumentError("shape", "Buffer() needs an array, or both shape= and dtype=")
            data = zeroed(shape_tuple(shape, "shape"), _element_dtype(dtype), "shape")
        elif shape is not None or dtype is not None:
            raise ArgumentError("data", "pass either an array or shape= and dtype=, not both")
        self._init_from_array(as_host_array(data, "data"), "data")
        self.set_host_dirty(True)

    def _init_from_array(self, array: np.ndarray, argument: str, mins=None,
                         family: Family | None = None, keepalive=None) -> None:
        try:
            htype = HalideType.from_dtype(array.dtype)
        except TypeError as e:
            raise ArgumentError(argument, str(e)) from None
        itemsize = array.dtype.itemsize
        n = array.ndim
        self._raw = ffi.new("halide_buffer_t *")
        self._dims = ffi.new("halide_dimension_t[]", max(n, 1))
        mins = mins or (0,) * n
        # (min, extent) per Halide dimension: what bounds queries compare, kept in Python.
        self._box = tuple((mins[i], array.shape[n - 1 - i]) for i in range(n))
        for i in range(n):
            axis = n - 1 - i
            extent, stride_bytes = array.shape[axis], array.strides[axis]
            if stride_bytes % itemsize:
                raise ArgumentError(argument, f"stride of axis {axis} ({stride_bytes} bytes) is not "
                                              f"a multiple of the element size ({itemsize})")
            stride = stride_bytes // itemsize
            if extent > INT32_MAX or abs(stride) > INT32_MAX:
                raise ArgumentError(argument, f"axis {axis} is too large for Halide's 32-bit "
                                              f"extents and strides")
            self._dims[i].min, self._dims[i].extent, self._dims[i].stride = mins[i], extent, stride
        raw = self._raw
        raw.host = ffi.cast("uint8_t *", array.ctypes.data)
        htype.to_c(raw.type)
        raw.dimensions = n
        raw.dim = self._dims
        self._array = array
        self._type = htype
        self._family = Family() if family is None else family
        families.register_owned(raw, self._family)
        # What the C fast paths need to record calls on this Buffer (never changes either).
        self._record = families.call_record(raw, self._family, array)
        # Where this Buffer lies in its family's root (itself, unless it is a crop or slice):
        # its box in the root's coordinates, and which root dimension each of its is.
        self._root_box, self._root_dims = self._box, tuple(range(n))
        # Whether anyone outside the shim can see the host memory (then device results must
        # reach it before the device memory goes), and whether results a pipeline wrote here
        # have not been read by anyone yet (then dropping the Buffer is worth a warning).
        self._exposed = True
        self._unread = False
        # What the memory belongs to, if not the shim (a DLPack producer's tensor).
        self._keepalive = keepalive

    # --- shape ---------------------------------------------------------------------------

    @property
    def type(self) -> HalideType:
        return self._type

    @property
    def dtype(self) -> np.dtype:
        return self._array.dtype

    @property
    def dimensions(self) -> int:
        return self._raw.dimensions

    @property
    def shape(self) -> tuple[int, ...]:
        """Extents in numpy order (outermost first)."""
        return self._array.shape

    @property
    def writeable(self) -> bool:
        """Whether the host memory may be written (False over a read-only array, ``bytes`` or
        a read-only mmap): such a Buffer is no pipeline output and never device-dirty."""
        return bool(self._array.flags.writeable)

    def dim(self, i: int) -> Dimension:
        """Halide's dimension ``i`` (0 is x, the innermost; numpy's last axis)."""
        i = _integer(i, "i")
        if not 0 <= i < self.dimensions:
            raise ArgumentError("i", f"dimension {i} out of range for a {self.dimensions}-D buffer")
        d = self._dims[i]
        return Dimension(d.min, d.extent, d.stride)

    # --- crops and slices ------------------------------------------------------------------

    def cropped(self, dim_or_ranges, min: int | None = None, extent: int | None = None) -> Buffer:
        """A Buffer over part of this one, in Halide coordinates: ``cropped(d, min, extent)``
        crops dimension ``d``; ``cropped([(min, extent), ...])`` crops dimensions 0, 1, ... in
        order (x first). The crop shares this Buffer's host memory and, where this Buffer has a
        device allocation, aliases it on the device."""
        if isinstance(dim_or_ranges, (list, tuple)):
            if min is not None or extent is not None:
                raise ArgumentError("min", "give either a list of (min, extent) or dim, min, extent")
            if len(dim_or_ranges) > self.dimensions:
                raise ArgumentError("ranges", f"expected up to {self.dimensions} (min, extent) pairs, "
                                              f"got {dim_or_ranges!r}")
            ranges = [_range(r) for r in dim_or_ranges] + list(self._box[len(dim_or_ranges):])
        else:
            d = self._dimension_index(dim_or_ranges)
            if min is None or extent is None:
                raise ArgumentError("extent", "cropped(dim, min, extent) needs min and extent")
            ranges = list(self._box)
            ranges[d] = (_integer(min, "min"), _integer(extent, "extent"))
        for d, ((lo, n), (have_lo, have_n)) in enumerate(zip(ranges, self._box)):
            if n < 0 or lo < have_lo or lo + n > have_lo + have_n:
                raise ArgumentError("ranges", f"{dimension_label(d, self.dimensions)}: "
                                              f"[{lo}, {lo + n}) is not inside "
                                              f"[{have_lo}, {have_lo + have_n})")
        # The Ellipsis keeps a 0-D result an array (a view), where numpy would give a scalar.
        index = tuple(slice(lo - have_lo, lo - have_lo + n)
                      for (lo, n), (have_lo, _) in zip(reversed(ranges), reversed(self._box)))
        index += (Ellipsis,)
        root_box = list(self._root_box)
        for d, box in zip(self._root_dims, ranges):
            root_box[d] = box
        return self._view(self._array[index], [lo for lo, _ in ranges], tuple(root_box),
                          self._root_dims)

    def sliced(self, dim: int, pos: int) -> Buffer:
        """The (dimensions - 1)-D Buffer at coordinate ``pos`` of dimension ``dim``; shares
        memory like a crop. Slicing a 1-D Buffer gives a 0-D one, a single element."""
        d = self._dimension_index(dim)
        pos = _integer(pos, "pos")
        lo, n = self._box[d]
        if not lo <= pos < lo + n:
            raise ArgumentError("pos", f"{pos} is outside {dimension_label(d, self.dimensions)}: "
                                       f"[{lo}, {lo + n})")
        index = [slice(None)] * self.dimensions + [Ellipsis]  # (Ellipsis: see cropped)
        index[self.dimensions - 1 - d] = pos - lo
        mins = [m for i, (m, _) in enumerate(self._box) if i != d]
        root_box = list(self._root_box)
        root_box[self._root_dims[d]] = (pos, 1)
        root_dims = self._root_dims[:d] + self._root_dims[d + 1:]
        return self._view(self._array[tuple(index)], mins, tuple(root_box), root_dims)

    def _dimension_index(self, dim) -> int:
        d = _integer(dim, "dim")
        if not 0 <= d < self.dimensions:
            raise ArgumentError("dim", f"expected a Halide dimension index in "
                                       f"[0, {self.dimensions}) (0 is x, numpy's last axis), "
                                       f"got {dim!r}")
        return d

    def _view(self, array: np.ndarray, mins, root_box, root_dims) -> Buffer:
        """A Buffer over ``array`` (a view of this one's memory) that joins this Buffer's
        family: it aliases the family's device allocation, or carries the proxy interface
        until there is one (shim/aliasing.py)."""
        view = Buffer.__new__(Buffer)
        # (Memory a DLPack producer owns outlives every view.)
        view._init_from_array(array, "crop", mins=mins, family=self._family,
                              keepalive=self._keepalive)
        view._root_box, view._root_dims = root_box, root_dims
        buffer_operations.adopt(self._raw, self._root_box, view._raw, root_box)
        return view

    def raw_buffer(self) -> int:
        """The address of this Buffer's halide_buffer_t, for native code (like halide.Buffer's
        ``_get_raw_halide_buffer_t``). Valid while the Buffer is alive."""
        return int(ffi.cast("uintptr_t", self._raw))

    # --- host data -----------------------------------------------------------------------

    def numpy(self) -> np.ndarray:
        """The host memory as a numpy array, without copying; device results are copied back
        first, so what it shows is current."""
        if self.device_dirty:
            self.copy_to_host()
        self._exposed = True
        self.mark_read()
        return self._array

    def __array__(self, dtype=None, copy=None):
        array = self.numpy()
        if copy:
            array = array.copy()
        if dtype is not None and np.dtype(dtype) != array.dtype:
            if copy is False:
                raise ValueError("converting the dtype requires a copy")
            array = array.astype(dtype)
        return array

    # --- DLPack (shim/dlpack_export.py; shim.from_dlpack is shim/dlpack.py) -----------------

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of this Buffer's data, as the Python array API standard specifies:
        device memory stays on the device, ordered before ``stream``'s later work."""
        return dlpack_export.export(self, stream=stream, max_version=max_version,
                                    dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple:
        """(DLPack device type, device id) of this Buffer's current data."""
        return dlpack_export.device_of(self)

    # --- dirty bits ----------------------------------------------------------------------

    @property
    def host_dirty(self) -> bool:
        return bool(flags.of(self._raw) & HOST_DIRTY)

    @property
    def device_dirty(self) -> bool:
        return bool(flags.of(self._raw) & DEVICE_DIRTY)

    def set_host_dirty(self, value: bool = True) -> None:
        """Say that the host memory holds changes the device copy lacks (or, False, not)."""
        buffer_operations.mark_dirty(self._raw, HOST_DIRTY, value)

    def set_device_dirty(self, value: bool = True) -> None:
        """Say that the device copy holds changes the host memory lacks (or, False, not).
        Only a Buffer with a device allocation and writable host memory can be device-dirty:
        otherwise every later read would fail, or write into memory that must not change."""
        if value and not self.writeable:
            raise ArgumentError("value", "this Buffer's host memory is read-only: changes on the "
                                         "device could never be copied back to it")
        buffer_operations.mark_dirty(self._raw, DEVICE_DIRTY, value)
        self._unread = value

    # --- device --------------------------------------------------------------------------

    @property
    def has_device_allocation(self) -> bool:
        return has_allocation(self._raw)

    @property
    def device(self) -> Backend | None:
        """The device holding this Buffer's device allocation, if any."""
        if not self.has_device_allocation:
            return None
        return devices.backend_for_interface(self._raw.device_interface)

    def device_malloc(self, device=None) -> None:
        """Allocate device memory (on ``device``: a name such as "opencl", or a device from
        shim.device(); default: shim's default device). Does nothing if already allocated."""
        buffer_operations.malloc_device(self._raw, interface_of(_device(device)))

    def copy_to_device(self, device=None) -> None:
        """Make the device allocation current: allocate it if needed, upload if host-dirty.
        A Buffer on another device moves: its data comes home, that allocation is freed, and
        the data goes up to ``device`` (Halide refuses with error -42 instead)."""
        if device is None and self._raw.device:
            interface = ffi.NULL  # the interface it already has
        else:
            interface = interface_of(_device(device))
        if self.has_device_allocation and interface != ffi.NULL \
                and self._raw.device_interface != interface:
            buffer_operations.move_device(self._raw, interface)
            return
        self._runtime("copy_to_device", lib.halide_copy_to_device, self._raw, interface)

    def copy_to_host(self) -> None:
        """Make the host memory current: download if device-dirty."""
        self._runtime("copy_to_host", lib.halide_copy_to_host, self._raw)
        self.mark_read()

    def device_sync(self) -> None:
        """Wait for the work queued on this Buffer's device to finish."""
        interface = self._raw.device_interface  # one read: another thread may free the buffer
        if interface != ffi.NULL:
            self._runtime("device_sync", lib.halide_device_sync_global, interface)

    def device_free(self) -> None:
        """Free the device allocation, once pipeline calls running on it have finished. Results
        that exist only on the device are copied back to host memory first: freeing never loses
        data, and the next device use uploads it again."""
        if self._raw.device:
            buffer_operations.free_device(self._raw)

    def _runtime(self, what, function, *args) -> None:
        with runtime_call(what) as check:
            check(function(ffi.NULL, *args))

    # --- for the shim's own modules, not the public API ------------------------------------
    # What pipeline calls (shim/binding.py, shim/running.py) and DLPack (shim/dlpack*.py) need
    # of a Buffer, so that they never reach into its attributes. (The C fast paths read and
    # write two slots by name, native_stubs/call_records.c: _record, and _unread, which they
    # set after a run as mark_read / mark_written do. Renaming either means changing the C.)

    @classmethod
    def over_array(cls, array: np.ndarray, argument: str, *, exposed: bool = True, mins=None,
                   keepalive=None) -> Buffer:
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
        """The allocation family this Buffer belongs to (shim/families.py)."""
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

    def copy_on_device(self, backend: Backend) -> Buffer:
        """A new, dense Buffer on ``backend`` holding a copy of this one's data, made on the
        device: DLPack's ``copy=True``, both ways."""
        copy = Buffer.over_array(np.empty(self.shape, self.dtype), "copy", exposed=False,
                                 mins=[lo for lo, _ in self._box])
        with runtime_call("copy for DLPack") as check:
            check(lib.halide_buffer_copy(ffi.NULL, self._raw, interface_of(backend), copy._raw))
        return copy

    # The finalizer (Finalized's, which runs this with Ctrl-C held: a KeyboardInterrupt here
    # would leave the struct registered and its device memory allocated for good).
    def _finalize(self):
        raw = getattr(self, "_raw", None)
        if raw is None:
            return  # construction failed before the struct existed
        if shutdown.shut_down():
            return  # the interpreter is exiting: device memory goes with the process
        if self._family.lock.held_by_current_thread():
            # The collector ran inside this family's own critical section: what keeps the
            # struct and its memory alive goes to the family, which finishes the job once its
            # lock is free.
            state = _Dropped(raw, self._dims, self._array, self._keepalive, self._family,
                             self._exposed, self._unread, repr(self))
            self._family.deferred.append(state.release)
            return
        _Dropped(raw, self._dims, self._array, self._keepalive, self._family, self._exposed,
                 self._unread, repr(self)).release()

    def __repr__(self) -> str:
        return f"<shim.Buffer {self._type} shape={self.shape}>"


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


def _device(device) -> Backend:
    return devices.default_device() if device is None else devices.device(device)


def shape_tuple(shape, argument: str) -> tuple[int, ...]:
    """A shape in numpy order: integers (numpy's too), never floats truncated to one."""
    try:
        dims = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise ArgumentError(argument, f"expected a shape: a sequence of integers (numpy order), "
                                      f"got {shape!r}") from None
    if any(s < 0 for s in dims):
        raise ArgumentError(argument, f"extents must be non-negative, got {dims}")
    return dims


def _integer(value, argument: str) -> int:
    """``value`` as an int: Python's or numpy's integers; floats are refused, not truncated."""
    try:
        return operator.index(value)
    except TypeError:
        raise ArgumentError(argument, f"expected an integer, got {value!r} "
                                      f"({type(value).__name__})") from None


def _range(pair) -> tuple[int, int]:
    """One (min, extent) pair of ``Buffer.cropped``'s list form."""
    try:
        lo, extent = pair
    except (TypeError, ValueError):
        raise ArgumentError("ranges", f"expected (min, extent) pairs, got {pair!r}") from None
    return _integer(lo, "min"), _integer(extent, "extent")


def _element_dtype(dtype) -> np.dtype:
    """Buffer's ``dtype=`` as a numpy dtype that has a Halide element type."""
    try:
        dtype = np.dtype(dtype)
        HalideType.from_dtype(dtype)
    except TypeError as e:
        raise ArgumentError("dtype", str(e)) from None
    return dtype


def check_memory(shape, dtype: np.dtype, argument: str) -> None:
    """Refuse host memory of ``shape`` elements of ``dtype`` that this machine cannot hold,
    before allocating or copying it."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > PHYSICAL_MEMORY:
        raise ArgumentError(argument, f"shape {tuple(shape)} of {dtype} needs {_gib(nbytes)} of "
                                      f"memory; this machine has {_gib(PHYSICAL_MEMORY)}")


def zeroed(shape, dtype: np.dtype, argument: str) -> np.ndarray:
    """Zeroed host memory for a buffer the shim allocates, refused if it cannot be had."""
    check_memory(shape, dtype, argument)
    return np.zeros(shape, dtype)


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.3g} GiB"
