"""shim.Buffer: a halide_buffer_t that Python owns, over host memory numpy can see.

Axis order follows halide.Buffer: Halide's dimension 0 (x, the innermost) is numpy's last
axis, so a numpy array of shape (height, width) is a Halide buffer of extents (width, height).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from shim.errors import ArgumentError
from shim.native import ffi, lib
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
    """A Halide buffer over host memory.

    ``Buffer(array)`` wraps a numpy array (or any object ``as_host_array`` accepts) without
    copying; ``Buffer(shape=..., dtype=...)`` allocates zeroed memory. Shapes are in numpy order.
    A new Buffer is host-dirty: its host memory is the only copy of its data.
    """

    __slots__ = ("_raw", "_dims", "_array", "_type", "__weakref__")

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
    def _wrap(cls, array: np.ndarray, argument: str) -> Buffer:
        """A Buffer over ``array`` with clean flags, for arrays the shim passes to pipelines."""
        buf = cls.__new__(cls)
        buf._init_from_array(array, argument)
        return buf

    def _init_from_array(self, array: np.ndarray, argument: str) -> None:
        try:
            htype = HalideType.from_dtype(array.dtype)
        except TypeError as e:
            raise ArgumentError(argument, str(e)) from None
        itemsize = array.dtype.itemsize
        n = array.ndim
        self._raw = ffi.new("halide_buffer_t *")
        self._dims = ffi.new("halide_dimension_t[]", max(n, 1))
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
            self._dims[i].min, self._dims[i].extent, self._dims[i].stride = 0, extent, stride
        raw = self._raw
        raw.host = ffi.cast("uint8_t *", array.ctypes.data)
        htype.to_c(raw.type)
        raw.dimensions = n
        raw.dim = self._dims
        self._array = array
        self._type = htype

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

    def raw_buffer(self) -> int:
        """The address of this Buffer's halide_buffer_t, for native code (like halide.Buffer's
        ``_get_raw_halide_buffer_t``). Valid while the Buffer is alive."""
        return int(ffi.cast("uintptr_t", self._raw))

    # --- host data -----------------------------------------------------------------------

    def numpy(self) -> np.ndarray:
        """The host memory as a numpy array, without copying."""
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

    # --- dirty bits ----------------------------------------------------------------------

    @property
    def host_dirty(self) -> bool:
        return bool(lib.shim_flags_get(self._raw) & HOST_DIRTY)

    @property
    def device_dirty(self) -> bool:
        return bool(lib.shim_flags_get(self._raw) & DEVICE_DIRTY)

    def set_host_dirty(self, value: bool = True) -> None:
        lib.shim_flags_assign(self._raw, HOST_DIRTY, value)

    def set_device_dirty(self, value: bool = True) -> None:
        lib.shim_flags_assign(self._raw, DEVICE_DIRTY, value)

    def __repr__(self) -> str:
        return f"<shim.Buffer {self._type} shape={self.shape}>"


def _shape_tuple(shape, argument: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(s) for s in shape)
    except TypeError:
        raise ArgumentError(argument, f"expected a sequence of ints, got {shape!r}") from None
    if any(s < 0 for s in dims):
        raise ArgumentError(argument, f"extents must be non-negative, got {dims}")
    return dims
