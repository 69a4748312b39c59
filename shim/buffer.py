"""shim.Buffer: a halide_buffer_t that Python owns, over host memory numpy can see.

Axis order follows halide.Buffer: Halide's dimension 0 (x, the innermost) is numpy's last
axis, so a numpy array of shape (height, width) is a Halide buffer of extents (width, height).
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from shim import aliasing, devices, families, runtime, shutdown
from shim.backends.base import Backend, interface_of
from shim.errors import ArgumentError, DirtyBufferWarning
from shim.families import Family
from shim.native import ffi, lib
from shim.runtime import runtime_call
from shim.types import HalideType

HOST_DIRTY = lib.halide_buffer_flag_host_dirty
DEVICE_DIRTY = lib.halide_buffer_flag_device_dirty
INT32_MAX = 2**31 - 1


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
        try:
            return np.from_dlpack(value)
        except (BufferError, TypeError, RuntimeError, ValueError) as e:
            raise ArgumentError(argument, f"cannot view {type(value).__name__} as host memory "
                                          f"through DLPack: {e}") from None
    try:
        return np.asarray(memoryview(value))
    except TypeError:
        raise ArgumentError(argument, "expected a numpy array, a shim.Buffer, or an object with "
                                      f"the buffer protocol or __dlpack__; got {type(value).__name__}"
                            ) from None


class Buffer:
    """A Halide buffer over host memory, with an optional device allocation.

    ``Buffer(array)`` wraps a numpy array (or any object ``as_host_array`` accepts) without
    copying; ``Buffer(shape=..., dtype=...)`` allocates zeroed memory. Shapes are in numpy order.
    A new Buffer is host-dirty: its host memory is the only copy of its data.

    Device methods follow halide.Buffer. Reading the host data through this class
    (``numpy()``, ``np.asarray``) copies device results back first, and dropping a Buffer frees
    its device memory, copying unread device results back to host memory (with a warning).
    """

    __slots__ = ("_raw", "_dims", "_array", "_type", "_family", "_box", "_exposed", "_unread",
                 "_root_box", "_root_dims", "_keepalive", "__weakref__")

    def __init__(self, data=None, *, shape=None, dtype=None):
        if data is None:
            if shape is None or dtype is None:
                raise ArgumentError("shape", "Buffer() needs an array, or both shape= and dtype=")
            data = np.zeros(_shape_tuple(shape, "shape"), dtype=dtype)
        elif shape is not None or dtype is not None:
            raise ArgumentError("data", "pass either an array or shape= and dtype=, not both")
        self._init_from_array(as_host_array(data, "data"), "data")
        self.set_host_dirty(True)

    @classmethod
    def _wrap(cls, array: np.ndarray, argument: str, *, exposed: bool = True,
              mins=None) -> Buffer:
        """A Buffer over ``array`` with clean flags, for arrays the shim passes to pipelines;
        ``exposed=False`` when the shim allocated the array and nobody else holds it yet."""
        buf = cls.__new__(cls)
        buf._init_from_array(array, argument, mins=mins)
        buf._exposed = exposed
        return buf

    def _init_from_array(self, array: np.ndarray, argument: str, mins=None,
                         family: Family | None = None) -> None:
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
        # Where this Buffer lies in its family's root (itself, unless it is a crop or slice):
        # its box in the root's coordinates, and which root dimension each of its is.
        self._root_box, self._root_dims = self._box, tuple(range(n))
        # Whether anyone outside the shim can see the host memory (then device results must
        # reach it before the device memory goes), and whether results a pipeline wrote here
        # have not been read by anyone yet (then dropping the Buffer is worth a warning).
        self._exposed = True
        self._unread = False
        # What the memory belongs to, if not the shim (a DLPack producer's tensor).
        self._keepalive = None

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

    def dim(self, i: int) -> Dimension:
        """Halide's dimension ``i`` (0 is x, the innermost)."""
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
            ranges = [tuple(r) for r in dim_or_ranges]
            if len(ranges) > self.dimensions or any(len(r) != 2 for r in ranges):
                raise ArgumentError("ranges", f"expected up to {self.dimensions} (min, extent) pairs, "
                                              f"got {dim_or_ranges!r}")
            ranges += list(self._box[len(ranges):])
        else:
            d = self._dimension_index(dim_or_ranges)
            if min is None or extent is None:
                raise ArgumentError("extent", "cropped(dim, min, extent) needs min and extent")
            ranges = list(self._box)
            ranges[d] = (min, extent)
        for d, ((lo, n), (have_lo, have_n)) in enumerate(zip(ranges, self._box)):
            if n < 0 or lo < have_lo or lo + n > have_lo + have_n:
                raise ArgumentError("ranges", f"dimension {d}: [{lo}, {lo + n}) is not inside "
                                              f"[{have_lo}, {have_lo + have_n})")
        index = tuple(slice(lo - have_lo, lo - have_lo + n)
                      for (lo, n), (have_lo, _) in zip(reversed(ranges), reversed(self._box)))
        root_box = list(self._root_box)
        for d, box in zip(self._root_dims, ranges):
            root_box[d] = box
        return self._view(self._array[index], [lo for lo, _ in ranges], tuple(root_box),
                          self._root_dims)

    def sliced(self, dim: int, pos: int) -> Buffer:
        """The (dimensions - 1)-D Buffer at coordinate ``pos`` of dimension ``dim``; shares
        memory like a crop."""
        d = self._dimension_index(dim)
        lo, n = self._box[d]
        if not lo <= pos < lo + n:
            raise ArgumentError("pos", f"{pos} is outside dimension {d}'s [{lo}, {lo + n})")
        index = [slice(None)] * self.dimensions
        index[self.dimensions - 1 - d] = pos - lo
        mins = [m for i, (m, _) in enumerate(self._box) if i != d]
        root_box = list(self._root_box)
        root_box[self._root_dims[d]] = (pos, 1)
        root_dims = self._root_dims[:d] + self._root_dims[d + 1:]
        return self._view(self._array[tuple(index)], mins, tuple(root_box), root_dims)

    def _dimension_index(self, dim) -> int:
        if not isinstance(dim, int) or not 0 <= dim < self.dimensions:
            raise ArgumentError("dim", f"expected a dimension index in [0, {self.dimensions}), got {dim!r}")
        return dim

    def _view(self, array: np.ndarray, mins, root_box, root_dims) -> Buffer:
        """A Buffer over ``array`` (a view of this one's memory) that joins this Buffer's
        family: it aliases the family's device allocation, or carries the proxy interface
        until there is one (shim/aliasing.py)."""
        view = Buffer.__new__(Buffer)
        view._init_from_array(array, "crop", mins=mins, family=self._family)
        view._root_box, view._root_dims = root_box, root_dims
        view._keepalive = self._keepalive  # memory a DLPack producer owns outlives every view
        runtime.adopt(self._raw, self._root_box, view._raw, root_box)
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
        self._unread = False
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

    # --- DLPack (shim/dlpack.py) ----------------------------------------------------------

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of this Buffer's data, as the Python array API standard specifies:
        device memory stays on the device, ordered before ``stream``'s later work."""
        from shim import dlpack

        return dlpack.export(self, stream=stream, max_version=max_version, dl_device=dl_device,
                             copy=copy)

    def __dlpack_device__(self) -> tuple:
        """(DLPack device type, device id) of this Buffer's current data."""
        from shim import dlpack

        return dlpack.device_of(self)

    # --- dirty bits ----------------------------------------------------------------------

    @property
    def host_dirty(self) -> bool:
        return bool(lib.shim_flags_get(self._raw) & HOST_DIRTY)

    @property
    def device_dirty(self) -> bool:
        return bool(lib.shim_flags_get(self._raw) & DEVICE_DIRTY)

    def set_host_dirty(self, value: bool = True) -> None:
        """Say that the host memory holds changes the device copy lacks (or, False, not)."""
        if self._family.shared:
            runtime.mark_dirty(self._raw, HOST_DIRTY, value)
        else:
            lib.shim_flags_assign(self._raw, HOST_DIRTY, value)

    def set_device_dirty(self, value: bool = True) -> None:
        """Say that the device copy holds changes the host memory lacks (or, False, not)."""
        if self._family.shared:
            runtime.mark_dirty(self._raw, DEVICE_DIRTY, value)
        else:
            lib.shim_flags_assign(self._raw, DEVICE_DIRTY, value)
        self._unread = value

    # --- device --------------------------------------------------------------------------

    @property
    def has_device_allocation(self) -> bool:
        return self._raw.device != 0 and not aliasing.is_proxy(self._raw.device_interface)

    @property
    def device(self) -> Backend | None:
        """The device holding this Buffer's device allocation, if any."""
        if not self.has_device_allocation:
            return None
        return devices.backend_for_interface(self._raw.device_interface)

    def device_malloc(self, device=None) -> None:
        """Allocate device memory (on ``device``: a name such as "opencl", or a device from
        shim.device(); default: shim's default device). Does nothing if already allocated."""
        self._runtime("device_malloc", lib.halide_device_malloc, self._raw,
                      interface_of(_device(device)))

    def copy_to_device(self, device=None) -> None:
        """Make the device allocation current: allocate it if needed, upload if host-dirty."""
        if device is None and self._raw.device:
            interface = ffi.NULL  # the interface it already has
        else:
            interface = interface_of(_device(device))
        self._runtime("copy_to_device", lib.halide_copy_to_device, self._raw, interface)

    def copy_to_host(self) -> None:
        """Make the host memory current: download if device-dirty."""
        self._runtime("copy_to_host", lib.halide_copy_to_host, self._raw)
        self._unread = False

    def device_sync(self) -> None:
        """Wait for the work queued on this Buffer's device to finish."""
        interface = self._raw.device_interface  # one read: another thread may free the buffer
        if interface != ffi.NULL:
            self._runtime("device_sync", lib.halide_device_sync_global, interface)

    def device_free(self) -> None:
        """Free the device allocation. Results that exist only on the device are copied back to
        host memory first: freeing never loses data."""
        self._release_device(dropping=False)

    def _runtime(self, what, function, *args) -> None:
        with runtime_call(what) as check:
            check(function(ffi.NULL, *args))

    def _release_device(self, *, dropping: bool) -> None:
        if self._family.shared:
            # A crop's or parent's changes stay with the family (the last handle out brings
            # the device's home), and the others may still read them: nothing to copy here.
            if self.has_device_allocation:
                self._runtime("device_free", lib.halide_device_free, self._raw)
            return
        if not self._raw.device:
            lib.shim_flags_assign(self._raw, DEVICE_DIRTY, False)
            return
        if self.device_dirty:
            # (Results in a DLPack producer's memory outlive this Buffer: nothing to say.)
            if dropping and self._unread and self._keepalive is None:
                warnings.warn(f"{self!r} was dropped holding pipeline results nobody read",
                              DirtyBufferWarning, stacklevel=3)
            if self._exposed and self._raw.host != ffi.NULL:
                self.copy_to_host()  # someone can still see this memory: nothing is lost
        self._runtime("device_free", lib.halide_device_free, self._raw)

    def __del__(self):
        raw = getattr(self, "_raw", None)
        if raw is None:
            return  # construction failed before the struct existed
        if shutdown.shut_down():
            return  # the interpreter is exiting: device memory goes with the process
        if raw.device and self._family.lock.held_by_current_thread():
            # The collector ran inside this family's own critical section: a stand-in that
            # keeps the struct and its memory alive finishes the job once the lock is free.
            orphan = Buffer.__new__(Buffer)
            for name in Buffer.__slots__[:-1]:
                setattr(orphan, name, getattr(self, name))
            self._family.deferred.append(lambda: orphan._release_device(dropping=True))
            return
        try:
            if raw.device:
                self._release_device(dropping=True)
        except Exception as e:  # noqa: BLE001 - a finalizer must not raise
            warnings.warn(f"releasing the device memory of a dropped Buffer failed: {e}",
                          RuntimeWarning, stacklevel=2)
        finally:
            families.unregister_owned(raw)

    def __repr__(self) -> str:
        return f"<shim.Buffer {self._type} shape={self.shape}>"


def _device(device) -> Backend:
    return devices.default_device() if device is None else devices.device(device)


def _shape_tuple(shape, argument: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(s) for s in shape)
    except TypeError:
        raise ArgumentError(argument, f"expected a sequence of ints, got {shape!r}") from None
    if any(s < 0 for s in dims):
        raise ArgumentError(argument, f"extents must be non-negative, got {dims}")
    return dims
