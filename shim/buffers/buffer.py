"""shim.Buffer: a halide_buffer_t that Python owns, over host memory numpy can see.

Axis order follows halide.Buffer: Halide's dimension 0 (x, the innermost) is numpy's last
axis, so a numpy array of shape (height, width) is a Halide buffer of extents (width, height).
Its Python API is halide.Buffer's, so that a program written for halide.Buffer runs on it.
"""

from __future__ import annotations

import itertools
import math
import numbers
import operator
import os
import warnings
from typing import NamedTuple

import numpy as np

from shim.core import buffer_operations
from shim.exchange import cuda_array_interface
from shim.backends import devices
from shim.exchange import dlpack_export
from shim.memory import families
from shim.native import flags
from shim.native import interrupts
from shim.base import sections
from shim.core import shutdown
from shim.memory.aliasing import has_allocation
from shim.backends.base import Backend, interface_of
from shim.core.bridge import runtime_call
from shim.exchange.dlpack_capsules import host_array, span_bytes
from shim.base.errors import ArgumentError, CoordinateError, DeviceError, DirtyBufferWarning
from shim.memory.families import Family
from shim.native.flags import DEVICE_DIRTY, HOST_DIRTY
from shim.native.regions import dimension_label
from shim.native import Finalized, ffi, lib
from shim.base.types import INT32_MAX, HalideType

# Host memory the shim will allocate or copy at most at once: more than the machine has can
# never be computed with (numpy fails, or the kernel kills the process once the pages fill).
PHYSICAL_MEMORY = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class Dimension(tuple):
    """One halide_dimension_t, as halide.Buffer's ``dim(i)`` gives it: ``min()``,
    ``extent()``, ``stride()`` (in elements) and ``max()``. It is also the tuple
    (min, extent, stride)."""

    __slots__ = ()

    def __new__(cls, min: int, extent: int, stride: int):
        return super().__new__(cls, (min, extent, stride))

    def min(self) -> int:
        return self[0]

    def extent(self) -> int:
        return self[1]

    def stride(self) -> int:
        return self[2]

    def max(self) -> int:
        """The last coordinate: min + extent - 1."""
        return self[0] + self[1] - 1

    def __repr__(self) -> str:
        return f"Dimension(min={self[0]}, extent={self[1]}, stride={self[2]})"


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

    Its Python API is halide.Buffer's (Halide's Python bindings): the same constructors (see
    ``__init__``) and methods of the same names and meanings (``dim(i).extent()``,
    ``dimensions()``, ``type()``, ``host_dirty()``, ``buf[x, y]`` with x first, crops and
    slices, ``translated``, ``transposed``, ``embedded``, ``copy()``, ``fill()``, the device
    methods, and the in-place forms), so a program written for halide.Buffer runs on it. numpy
    sees the host memory with the axes reversed (``np.asarray(buf)``, ``numpy()``: shape
    (height, width)), as halide.Buffer's buffer protocol gives it; ``shape`` and ``dtype`` are
    numpy's.

    Reading the host data through this class (``numpy()``, ``np.asarray``, ``buf[x, y]``)
    copies device results back first, and dropping a Buffer frees its device memory, copying
    unread device results back to host memory (with a warning).
    """

    # The struct and what describes it: what an in-place crop or slice takes from the new view
    # (see _replace).
    _STRUCT = ("_raw", "_dims", "_array", "_type", "_family", "_box", "_exposed", "_unread",
               "_root_box", "_root_dims", "_keepalive", "_record")
    __slots__ = _STRUCT + ("_name", "_superseded", "__weakref__")

    def __init__(self, *args, **kwargs):
        """halide.Buffer's constructors, by position or by name:

        - ``Buffer(buffer, name="", reverse_axes=True)``: over an array (numpy's, or anything
          with the buffer protocol or ``__dlpack__`` on the CPU), without copying; numpy's last
          axis is x, or its first with ``reverse_axes=False``. Host-dirty, as halide.Buffer
          makes it. Over another shim.Buffer: a view of all of it, sharing its memory and its
          device state, with mins 0 (halide.Buffer's goes through the buffer protocol, which
          has no mins).
        - ``Buffer(type, sizes, name="")``, ``Buffer(type, sizes, storage_order, name="")``:
          new memory of extents ``sizes`` (x first), its dimensions laid out from the innermost
          to the outermost in ``storage_order``'s order (default: as listed). ``type``: a
          halide.Type (``hl.UInt(8)``), a numpy dtype or a shim HalideType. Zeroed, and not
          host-dirty, as halide.Buffer's (whose contents are undefined).

        and the shim's ``Buffer(shape=..., dtype=...)``: new zeroed memory, shape in numpy
        order, host-dirty (its zeros are its data). ``mins=``, in any form: the coordinates of
        the first element, x first; dimensions it leaves out start at 0 (as ``set_min``).
        """
        given = _constructor_arguments(args, kwargs)
        name = _name(given.get("name", ""))
        dirty = True
        if given.keys() & {"type", "sizes", "storage_order"}:
            _check_form(given, "type", ("type", "sizes", "storage_order", "name", "mins"))
            htype = _element_type(given.get("type"), "type")
            if "sizes" not in given:
                raise ArgumentError("sizes", "Buffer(type, sizes) needs the extents, x first")
            array = _allocate(htype.dtype, given["sizes"], given.get("storage_order"))
            argument, dirty = "sizes", False
        elif "buffer" in given:
            _check_form(given, "buffer", ("buffer", "name", "reverse_axes", "mins"))
            source, argument = given["buffer"], "buffer"
            reverse = given.get("reverse_axes", True)
            if not isinstance(reverse, (bool, np.bool_)):
                raise ArgumentError("reverse_axes", f"expected True or False, got {reverse!r}")
            if isinstance(source, Buffer):
                array = source._array if reverse else source._array.T
                root_dims = source._root_dims if reverse else source._root_dims[::-1]
                mins = _with_mins([0] * array.ndim, given.get("mins"), "mins")
                self._init_as_view(source, array, mins, source._root_box, root_dims)
                self._name = name
                return
            array = as_host_array(source, argument)
            if not reverse:
                array = array.T
        elif given.keys() & {"shape", "dtype"}:
            _check_form(given, "shape", ("shape", "dtype", "name", "mins"))
            if "shape" not in given or "dtype" not in given:
                raise ArgumentError("shape", "Buffer(shape=..., dtype=...) needs both")
            array = zeroed(shape_tuple(given["shape"], "shape"),
                           _element_type(given["dtype"], "dtype").dtype, "shape")
            argument = "shape"
        else:
            raise ArgumentError("buffer", "Buffer() needs an array, an element type and sizes "
                                          "(Buffer(hl.UInt(8), [width, height])), or shape= and "
                                          "dtype=")
        mins = _with_mins([0] * array.ndim, given.get("mins"), "mins")
        self._init_from_array(array, argument, mins=mins)
        self._name = name
        if dirty:
            self.set_host_dirty(True)

    @classmethod
    def make_scalar(cls, type, name: str = "") -> Buffer:
        """A 0-D Buffer of one element of ``type`` (halide.Buffer.make_scalar)."""
        return cls(type, [], name=name)

    @classmethod
    def make_interleaved(cls, type, width: int, height: int, channels: int,
                         name: str = "") -> Buffer:
        """A width x height x channels Buffer whose channels are innermost in memory
        (halide.Buffer.make_interleaved)."""
        return cls(type, [width, height, channels], [2, 0, 1], name=name)

    @classmethod
    def make_with_shape_of(cls, src: Buffer, name: str = "") -> Buffer:
        """A new Buffer with ``src``'s mins, extents, type and order of dimensions in memory,
        dense (halide.Buffer.make_with_shape_of). Zeroed, and not host-dirty."""
        if not isinstance(src, Buffer):
            raise ArgumentError("src", f"expected a shim.Buffer, got {type(src).__name__}")
        made = cls.over_array(src._dense_like(), "src", mins=[lo for lo, _ in src._box])
        made._name = _name(name)
        return made

    def _init_from_array(self, array: np.ndarray, argument: str, mins=None,
                         family: Family | None = None, keepalive=None,
                         mins_argument: str = "mins") -> None:
        try:
            htype = HalideType.from_dtype(array.dtype)
        except TypeError as e:
            raise ArgumentError(argument, str(e)) from None
        dims = _dimensions_of(array, mins, argument, mins_argument)
        self._name, self._superseded = "", None
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

    # --- shape ---------------------------------------------------------------------------

    def type(self) -> HalideType:
        """The element type; it compares equal to halide's (``buf.type() == hl.UInt(8)``)."""
        return self._type

    @property
    def dtype(self) -> np.dtype:
        return self._array.dtype

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

    def dim(self, dimension: int) -> Dimension:
        """Halide's dimension ``dimension`` (0 is x, the innermost; numpy's last axis)."""
        d = _integer(dimension, "dimension")
        if not 0 <= d < self.dimensions():
            raise ArgumentError("dimension", f"dimension {d} out of range for a "
                                             f"{self.dimensions()}-D buffer")
        dim = self._dims[d]
        return Dimension(dim.min, dim.extent, dim.stride)

    def width(self) -> int:
        """The extent of dimension 0, 1 for a Buffer without one (as halide.Buffer's);
        ``height()`` and ``channels()`` are dimensions 1 and 2."""
        return self._extent_or_one(0)

    def height(self) -> int:
        return self._extent_or_one(1)

    def channels(self) -> int:
        return self._extent_or_one(2)

    def _extent_or_one(self, d: int) -> int:
        return self._box[d][1] if d < len(self._box) else 1

    def left(self) -> int:
        """dim(0).min(); ``right()`` is dim(0).max(), ``top()`` and ``bottom()`` dimension 1's."""
        return self.dim(0).min()

    def right(self) -> int:
        return self.dim(0).max()

    def top(self) -> int:
        return self.dim(1).min()

    def bottom(self) -> int:
        return self.dim(1).max()

    def number_of_elements(self) -> int:
        return math.prod(n for _, n in self._box)

    def size_in_bytes(self) -> int:
        """The bytes from the lowest-addressed element to just past the highest (0 when
        empty), as halide.Buffer's."""
        return span_bytes([n for _, n in self._box],
                          [abs(self._dims[d].stride) for d in range(len(self._box))],
                          self.dtype.itemsize)

    def contains(self, coords) -> bool:
        """Whether ``coords`` (x first; the dimensions it leaves out are not checked) lie in
        this Buffer."""
        coords = _integer_list(coords, "coords")
        if len(coords) > self.dimensions():
            raise ArgumentError("coords", f"expected at most {self.dimensions()} coordinates, "
                                          f"got {len(coords)}")
        return all(lo <= c < lo + n for c, (lo, n) in zip(coords, self._box))

    def name(self) -> str:
        """The Buffer's name: the one given, else a unique one made up (b0, b1, ...), as
        halide.Buffer's."""
        if not self._name:
            self._name = f"b{next(_UNNAMED)}"
        return self._name

    def set_name(self, name: str) -> None:
        self._name = _name(name)

    def defined(self) -> bool:
        """True: there is no undefined shim.Buffer (halide.Buffer() makes one; Buffer() here
        is an error)."""
        return True

    def same_as(self, other) -> bool:
        """Whether ``other`` is this Buffer (a crop or a copy is another)."""
        return other is self

    # --- crops, slices and other views ---------------------------------------------------------
    # Each makes a Buffer over the same memory, as halide.Buffer's; the in-place forms (crop,
    # slice, translate, set_min, transpose, embed, add_dimension) change this one.

    def cropped(self, dimension=None, min=None, extent=None, *, rect=None) -> Buffer:
        """A Buffer over part of this one, in this one's coordinates: ``cropped(d, min,
        extent)`` crops dimension ``d``; ``cropped(rect)``, a list of (min, extent), crops
        dimensions 0, 1, ... in order (x first). The crop shares this Buffer's host memory
        and, where this Buffer has a device allocation, aliases it on the device."""
        ranges = self._crop_ranges(dimension, min, extent, rect)
        index = _index_of([(lo, lo + n) for lo, n in ranges], self._box)
        return self._view(self._array[index], [lo for lo, _ in ranges],
                          self._root_box_of(ranges), self._root_dims)

    def _crop_ranges(self, dimension, min, extent, rect) -> list:
        """cropped()'s arguments as (min, extent) per dimension, checked."""
        if isinstance(dimension, (list, tuple)):
            dimension, rect = None, dimension  # cropped(rect), by position
        if rect is not None:
            if dimension is not None or min is not None or extent is not None:
                raise ArgumentError("rect", "give either rect, a list of (min, extent), or "
                                            "dimension, min and extent")
            if not isinstance(rect, (list, tuple)) or len(rect) > self.dimensions():
                raise ArgumentError("rect", f"expected up to {self.dimensions()} (min, extent) "
                                            f"pairs, got {rect!r}")
            ranges = [_range(r) for r in rect] + list(self._box[len(rect):])
            argument = "rect"
        else:
            d = self._dimension_index(dimension)
            if min is None or extent is None:
                raise ArgumentError("extent", "cropped(dimension, min, extent) needs min and "
                                              "extent")
            ranges = list(self._box)
            ranges[d] = (_integer(min, "min"), _integer(extent, "extent"))
            argument = "min"
        for d, ((lo, n), (have_lo, have_n)) in enumerate(zip(ranges, self._box)):
            if n < 0 or lo < have_lo or lo + n > have_lo + have_n:
                raise ArgumentError(argument, f"{dimension_label(d, self.dimensions())}: "
                                              f"[{lo}, {lo + n}) is not inside "
                                              f"[{have_lo}, {have_lo + have_n})")
        return ranges

    def sliced(self, dimension, pos=None) -> Buffer:
        """The (dimensions - 1)-D Buffer at coordinate ``pos`` (default: the dimension's min)
        of dimension ``dimension``; shares memory like a crop. Slicing a 1-D Buffer gives a
        0-D one, a single element."""
        d = self._dimension_index(dimension)
        lo, n = self._box[d]
        pos = lo if pos is None else _integer(pos, "pos")
        if not lo <= pos < lo + n:
            raise ArgumentError("pos", f"{pos} is outside "
                                       f"{dimension_label(d, self.dimensions())}: "
                                       f"[{lo}, {lo + n})")
        index = [slice(None)] * self.dimensions() + [Ellipsis]  # (Ellipsis: see _index_of)
        index[self.dimensions() - 1 - d] = pos - lo
        mins = [m for i, (m, _) in enumerate(self._box) if i != d]
        root_box = self._root_box_of([(pos, 1) if i == d else box
                                      for i, box in enumerate(self._box)])
        root_dims = self._root_dims[:d] + self._root_dims[d + 1:]
        return self._view(self._array[tuple(index)], mins, root_box, root_dims)

    def translated(self, dimension=None, dx=None, *, delta=None) -> Buffer:
        """A Buffer over the same elements at other coordinates: ``translated(d, dx)`` adds
        ``dx`` to dimension ``d``'s min, ``translated(delta)`` adds ``delta[i]`` to dimension
        ``i``'s (x first; dimensions it leaves out keep theirs)."""
        return self._view(self._array, self._translation(dimension, dx, delta), self._root_box,
                          self._root_dims, "delta" if dx is None else "dx")

    def transposed(self, d1=None, d2=None, *, order=None) -> Buffer:
        """A Buffer over the same elements with its dimensions reordered, as halide.Buffer's:
        ``transposed(d1, d2)`` swaps two; ``transposed(order)`` makes dimension ``i`` of this
        Buffer dimension ``order[i]`` of the result."""
        array, mins, root_dims = self._transposition(d1, d2, order)
        return self._view(array, mins, self._root_box, root_dims)

    def reverse_axes(self) -> Buffer:
        """transposed() with the dimensions in reverse order: numpy's axis order."""
        return self.transposed(order=list(reversed(range(self.dimensions()))))

    def embedded(self, dimension, pos: int = 0) -> Buffer:
        """A Buffer with one more dimension, of extent 1 at coordinate ``pos``, inserted as
        dimension ``dimension`` (0 to dimensions()), over the same elements."""
        array, mins, root_dims = self._embedding(dimension, pos)
        return self._view(array, mins, self._root_box, root_dims, "pos")

    def crop(self, dimension=None, min=None, extent=None, *, rect=None) -> None:
        """cropped(), in place: this Buffer becomes the crop."""
        self._replace(self.cropped(dimension, min, extent, rect=rect))

    def slice(self, dimension, pos=None) -> None:
        """sliced(), in place."""
        self._replace(self.sliced(dimension, pos))

    def translate(self, dimension=None, dx=None, *, delta=None) -> None:
        """translated(), in place."""
        self._reshape(self._array, self._translation(dimension, dx, delta), self._root_dims,
                      "delta" if dx is None else "dx")

    def set_min(self, mins) -> None:
        """Place this Buffer's first element at ``mins`` (x first; dimensions it leaves out
        keep their min), as halide.Buffer's set_min."""
        self._reshape(self._array, _with_mins([lo for lo, _ in self._box], mins, "mins"),
                      self._root_dims, "mins")

    def transpose(self, d1=None, d2=None, *, order=None) -> None:
        """transposed(), in place."""
        self._reshape(*self._transposition(d1, d2, order), "order")

    def embed(self, dimension, pos: int = 0) -> None:
        """embedded(), in place."""
        self._reshape(*self._embedding(dimension, pos), "dimension")

    def add_dimension(self) -> None:
        """Add a dimension of extent 1 at coordinate 0 after the others, in place."""
        self.embed(self.dimensions())

    def _dimension_index(self, dim) -> int:
        d = _integer(dim, "dimension")
        if not 0 <= d < self.dimensions():
            raise ArgumentError("dimension", f"expected a Halide dimension index in "
                                             f"[0, {self.dimensions()}) (0 is x, numpy's last "
                                             f"axis), got {dim!r}")
        return d

    def _root_box_of(self, ranges) -> tuple:
        """The box, in the family root's coordinates, of the part of this Buffer that
        ``ranges`` ((min, extent) per dimension, in this Buffer's coordinates) covers."""
        root_box = list(self._root_box)
        for (lo, n), (own_lo, _), r in zip(ranges, self._box, self._root_dims):
            if r is not None:
                root_box[r] = (self._root_box[r][0] + lo - own_lo, n)
            elif n == 0:
                # An empty crop of a dimension embedded() added, which the root lacks: the
                # part is empty all the same.
                if not root_box:
                    raise ArgumentError("extent", "an empty crop of a dimension added to a 0-D "
                                                  "Buffer covers no box of it")
                root_box[0] = (root_box[0][0], 0)
        return tuple(root_box)

    def _translation(self, dimension, dx, delta) -> list:
        """translated()'s arguments as the new mins, checked."""
        mins = [lo for lo, _ in self._box]
        if isinstance(dimension, (list, tuple)):
            dimension, delta = None, dimension  # translated(delta), by position
        if delta is not None:
            if dimension is not None or dx is not None:
                raise ArgumentError("delta", "give either delta, a list of offsets, or "
                                             "dimension and dx")
            offsets = _integer_list(delta, "delta")
            if len(offsets) > len(mins):
                raise ArgumentError("delta", f"expected at most {len(mins)} offsets (x first), "
                                             f"got {len(offsets)}")
            return [lo + (offsets[d] if d < len(offsets) else 0) for d, lo in enumerate(mins)]
        d = self._dimension_index(dimension)
        if dx is None:
            raise ArgumentError("dx", "translated(dimension, dx) needs dx")
        mins[d] += _integer(dx, "dx")
        return mins

    def _transposition(self, d1, d2, order) -> tuple:
        """transposed()'s arguments as the array, mins and root dimensions of the result."""
        n = self.dimensions()
        if isinstance(d1, (list, tuple)):
            d1, order = None, d1  # transposed(order), by position
        if order is not None:
            if d1 is not None or d2 is not None:
                raise ArgumentError("order", "give either order, a permutation of the "
                                             "dimensions, or d1 and d2")
            order = _integer_list(order, "order")
            if sorted(order) != list(range(n)):
                raise ArgumentError("order", f"expected a permutation of 0..{n - 1}, got {order}")
            # Dimension i goes to order[i] (what halide.Buffer does): result dimension j is
            # dimension source[j] of this one.
            source = [0] * n
            for i, j in enumerate(order):
                source[j] = i
        else:
            if d1 is None or d2 is None:
                raise ArgumentError("d2", "transposed(d1, d2) needs both dimensions")
            first, second = self._dimension_index(d1), self._dimension_index(d2)
            source = list(range(n))
            source[first], source[second] = second, first
        # numpy axis a is Halide dimension n - 1 - a.
        array = self._array.transpose([n - 1 - source[n - 1 - a] for a in range(n)])
        return (array, [self._box[s][0] for s in source],
                tuple(self._root_dims[s] for s in source))

    def _embedding(self, dimension, pos) -> tuple:
        """embedded()'s arguments as the array, mins and root dimensions of the result."""
        n = self.dimensions()
        d = _integer(dimension, "dimension")
        if not 0 <= d <= n:
            raise ArgumentError("dimension", f"expected where the new dimension goes, in "
                                             f"[0, {n}], got {dimension!r}")
        pos = _integer(pos, "pos")
        # Its stride, as halide.Buffer's add_dimension gives it: the outermost dimension's
        # extent times its stride (1 for a 0-D Buffer). It never moves from the element.
        stride = self._box[-1][1] * self._dims[n - 1].stride if n else 1
        array = self._array
        axis = n - d  # its numpy axis in the result
        array = np.lib.stride_tricks.as_strided(
            array, array.shape[:axis] + (1,) + array.shape[axis:],
            array.strides[:axis] + (stride * array.itemsize,) + array.strides[axis:])
        mins = [lo for lo, _ in self._box]
        mins.insert(d, pos)
        return array, mins, self._root_dims[:d] + (None,) + self._root_dims[d:]

    def _view(self, array: np.ndarray, mins, root_box, root_dims,
              mins_argument: str = "mins") -> Buffer:
        """A Buffer over ``array`` (a view of this one's memory) that joins this Buffer's
        family: it aliases the family's device allocation, or carries the proxy interface
        until there is one (shim/memory/aliasing.py). ``mins_argument`` names what gave ``mins``,
        for errors."""
        view = Buffer.__new__(Buffer)
        view._init_as_view(self, array, mins, root_box, root_dims, mins_argument)
        return view

    def _init_as_view(self, parent: Buffer, array: np.ndarray, mins, root_box, root_dims,
                      mins_argument: str = "mins") -> None:
        # In one piece (signal handlers held): a view registered in its family but never
        # adopted as its member would be one the family does not know.
        with interrupts.deferred():
            # (Memory a DLPack producer owns outlives every view.)
            self._init_from_array(array, "crop", mins=mins, family=parent._family,
                                  keepalive=parent._keepalive, mins_argument=mins_argument)
            self._root_box, self._root_dims = root_box, root_dims
            buffer_operations.adopt(parent._raw, parent._root_box, self._raw, root_box)

    def _reshape(self, array: np.ndarray, mins, root_dims, argument: str) -> None:
        """Give this Buffer's own struct another geometry over the same elements, as
        halide.Buffer's in-place methods do: ``array`` is a view of its memory starting at the
        same element, ``mins`` its coordinates, ``root_dims`` which root dimension each
        dimension is. Pipeline calls using the Buffer finish first."""
        dims = _dimensions_of(array, mins, argument, mins_argument=argument)

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

    def _replace(self, view: Buffer) -> None:
        """Make this Buffer ``view`` (a crop or slice of it), as halide.Buffer's in-place crop
        and slice do. A struct covers the same elements for its whole life (its box in the
        family, shim/memory/families.py), so this Buffer takes the view's struct, and keeps its
        previous one, still in the family, until it goes itself: a PreparedCall made with it
        still runs on it."""
        def swap(family: Family) -> None:
            for slot in Buffer._STRUCT:
                mine = getattr(self, slot)
                setattr(self, slot, getattr(view, slot))
                setattr(view, slot, mine)
            view._superseded, self._superseded = self._superseded, view

        buffer_operations.reshape(self._raw, swap)

    def raw_buffer(self) -> int:
        """The address of this Buffer's halide_buffer_t, for native code (halide.Buffer's
        ``_get_raw_halide_buffer_t``, which is here too). Valid while the Buffer is alive."""
        return int(ffi.cast("uintptr_t", self._raw))

    def _get_raw_halide_buffer_t(self) -> int:
        return self.raw_buffer()

    # --- host data -----------------------------------------------------------------------

    def numpy(self) -> np.ndarray:
        """The host memory as a numpy array, without copying; device results are copied back
        first, so what it shows is current."""
        if self.device_dirty():
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

    def __getitem__(self, pos):
        """The element at ``pos``, Halide coordinates with x first (``buf[x, y]``; ``buf[()]``
        for a 0-D Buffer), as a Python number. Device results are copied back first (unlike
        halide.Buffer's, which reads stale host memory, and marks it host-dirty)."""
        return self.numpy()[self._element_index(pos)].item()

    def __setitem__(self, pos, value) -> None:
        """Write the element at ``pos`` (see __getitem__) and mark the Buffer host-dirty.
        ``value`` must fit the element type: floats are refused for integers, not truncated."""
        index = self._element_index(pos)
        self._host_for_writing("value")[index] = _element_value(value, self.dtype, "value")
        self.set_host_dirty(True)

    def fill(self, value) -> None:
        """Set every element to ``value`` (which must fit the element type) and mark the Buffer
        host-dirty."""
        element = _element_value(value, self.dtype, "value")
        self._host_for_writing("value")[...] = element
        self.set_host_dirty(True)

    def all_equal(self, value) -> bool:
        """Whether every element equals ``value`` (True for an empty Buffer)."""
        return bool(np.all(self.numpy() == _element_value(value, self.dtype, "value")))

    def for_each_element(self, f) -> None:
        """Call ``f(pos)`` for the coordinates of every element, ``pos`` a list, x first and
        varying fastest, as halide.Buffer's."""
        for coords in itertools.product(*(range(lo, lo + n) for lo, n in reversed(self._box))):
            f(list(reversed(coords)))

    def copy(self) -> Buffer:
        """A new Buffer holding a copy of this one's elements, at the same coordinates, dense,
        with its dimensions in the same order in memory (halide.Buffer's copy). Host-dirty;
        device results are copied back first (halide.Buffer's copies stale host memory)."""
        array = self._dense_like()
        np.copyto(array, self.numpy())
        made = Buffer.over_array(array, "copy", mins=[lo for lo, _ in self._box])
        made.set_host_dirty(True)
        return made

    def copy_from(self, other: Buffer) -> None:
        """Copy the elements of ``other`` at the coordinates both Buffers have into this one,
        and mark it host-dirty. ``other`` has the same element type and dimensions."""
        if not isinstance(other, Buffer):
            raise ArgumentError("other", f"expected a shim.Buffer, got {type(other).__name__}")
        if other.type() != self._type or other.dimensions() != self.dimensions():
            raise ArgumentError("other", f"expected a {self.dimensions()}-D buffer of "
                                         f"{self._type}, got a {other.dimensions()}-D one of "
                                         f"{other.type()}")
        common = [(max(a, b), min(a + m, b + n))
                  for (a, m), (b, n) in zip(self._box, other._box)]
        if any(lo >= hi for lo, hi in common):
            return
        target = self._host_for_writing("other")
        np.copyto(target[_index_of(common, self._box)],
                  other.numpy()[_index_of(common, other._box)])
        self.set_host_dirty(True)

    def _element_index(self, pos) -> tuple:
        """The numpy index of the element at Halide coordinates ``pos``."""
        coords = _integer_list(pos if isinstance(pos, (tuple, list)) else (pos,), "pos")
        if len(coords) != self.dimensions():
            raise ArgumentError("pos", f"expected {self.dimensions()} coordinates (x first) for "
                                       f"a {self.dimensions()}-D buffer, got {len(coords)}")
        for d, (c, (lo, n)) in enumerate(zip(coords, self._box)):
            if not lo <= c < lo + n:
                raise CoordinateError("pos", f"{c} is outside "
                                             f"{dimension_label(d, self.dimensions())}: "
                                             f"[{lo}, {lo + n})")
        return tuple(c - lo for c, (lo, _) in zip(reversed(coords), reversed(self._box)))

    def _host_for_writing(self, argument: str) -> np.ndarray:
        """The host memory, current, for a write through this class of ``argument``."""
        if not self.writeable:
            raise ArgumentError(argument, "this Buffer's host memory is read-only")
        return self.numpy()

    def _dense_like(self) -> np.ndarray:
        """New zeroed memory of this Buffer's shape and type, dense, its dimensions in the same
        order in memory (halide.Buffer's make_with_shape_of)."""
        check_memory(self.shape, self.dtype, "copy")
        return np.zeros_like(self._array, order="K")

    # --- DLPack (shim/exchange/dlpack_export.py; shim.from_dlpack is shim/interop/dlpack.py) and the CUDA
    # Array Interface (shim/exchange/cuda_array_interface.py) ----------------------------------------

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of this Buffer's data, as the Python array API standard specifies:
        CUDA memory stays on the device, ordered before ``stream``'s later work; OpenCL
        results are downloaded into host memory unless ``dl_device`` asks for the device."""
        return dlpack_export.export(self, stream=stream, max_version=max_version,
                                    dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple:
        """(DLPack device type, device id) that ``__dlpack__()`` exports to by default (the
        rule: shim/exchange/dlpack_export.py)."""
        return dlpack_export.device_of(self)

    @property
    def __cuda_array_interface__(self) -> dict:
        """The CUDA Array Interface (version 3) of this Buffer's CUDA memory, for Numba and
        CuPy; AttributeError on a Buffer without a CUDA allocation."""
        return cuda_array_interface.describe(self)

    # --- dirty bits ----------------------------------------------------------------------

    def host_dirty(self) -> bool:
        """Whether the host memory holds changes the device copy lacks."""
        return bool(flags.of(self._raw) & HOST_DIRTY)

    def device_dirty(self) -> bool:
        """Whether the device copy holds changes the host memory lacks."""
        return bool(flags.of(self._raw) & DEVICE_DIRTY)

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

    def device_malloc(self, device=None, target=None) -> int:
        """Allocate device memory (default: on the shim's default device). Does nothing if
        already allocated. Unlike halide.Buffer's, it makes the host memory the newer copy:
        the next copy_to_device uploads it (new device memory holds nothing)."""
        buffer_operations.malloc_device(self._raw, interface_of(_device(device, target)))
        return 0

    def copy_to_device(self, device=None, target=None) -> int:
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
        self._runtime("copy_to_host", lib.halide_copy_to_host, self._raw)
        self.mark_read()
        return 0

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

    # --- pickling --------------------------------------------------------------------------

    def __reduce__(self):
        """A Buffer pickles as its host data (device results copied back first) and its mins,
        name and writeability; it unpickles as a new host Buffer over memory of its own (dense:
        numpy pickles elements, not strides), with no device allocation, host-dirty as a
        ``copy()`` is. A crop or slice carries its own elements only, not its parent's."""
        return Buffer._from_pickle, (self.numpy(), [lo for lo, _ in self._box], self._name,
                                     self.writeable)

    @classmethod
    def _from_pickle(cls, array: np.ndarray, mins, name: str, writeable: bool) -> Buffer:
        # A pickle the shim never made (or another version's) is checked as the constructor's
        # arguments are: mins padded with zeros, at most one per dimension, all integers.
        if not isinstance(array, np.ndarray):
            raise ArgumentError("buffer", f"a pickled Buffer holds a numpy array, got "
                                          f"{type(array).__name__}")
        name = _name(name)
        mins = _with_mins([0] * array.ndim, mins, "mins")
        # numpy's own rule differs by protocol and transport (protocol 5 over bytes, or Dask's
        # out-of-band frames, gives read-only arrays): the Buffer's writeability decides.
        if writeable and not array.flags.writeable:
            array = array.copy()
        elif not writeable:
            array.flags.writeable = False
        made = cls.over_array(array, "buffer", mins=mins)
        made._name = name
        made.set_host_dirty(True)
        return made

    # --- for the shim's own modules, not the public API ------------------------------------
    # What pipeline calls (shim/calls/binding.py, shim/calls/running.py) and DLPack (shim/dlpack*.py) need
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
        if raw is None or getattr(self, "_family", None) is None:
            return  # construction failed before the struct joined a family: nothing to release
        if shutdown.shut_down():
            return  # the interpreter is exiting: device memory goes with the process
        if families.forking() or families.abandoned(self._family):
            return  # a forked child: another thread's Buffer, as it left it (see families)
        dropped = _Dropped(raw, self._dims, self._array, self._keepalive, self._family,
                           self._exposed, self._unread, repr(self))
        if sections.inside():
            # The collector ran this inside one of the layer's critical sections on this
            # thread: the release waits until the thread is out of them (shim/base/sections.py).
            sections.later(dropped.release)
        else:
            dropped.release()  # (its warnings name the line that dropped the Buffer)

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
    if _is_halide(device, "DeviceAPI"):
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
    if _is_halide(device, "Target"):
        features = set(device.to_string().split("-"))
        return next((devices.device(kind) for kind in _TARGET_APIS if kind in features), None)
    return None if device is None else devices.device(device)


def _is_halide(value, class_name: str) -> bool:
    """Whether ``value`` is an instance of halide's class ``class_name``."""
    cls = type(value)
    return cls.__name__ == class_name and cls.__module__.split(".")[0] == "halide"


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


def _integer_list(values, argument: str) -> list[int]:
    """A list or tuple of integers (``_integer``'s), as halide.Buffer's methods take them."""
    if not isinstance(values, (list, tuple)):
        raise ArgumentError(argument, f"expected a list of integers, got {values!r} "
                                      f"({type(values).__name__})")
    return [_integer(value, argument) for value in values]


def _range(pair) -> tuple[int, int]:
    """One (min, extent) pair of ``Buffer.cropped``'s list form."""
    try:
        lo, extent = pair
    except (TypeError, ValueError):
        raise ArgumentError("rect", f"expected (min, extent) pairs, got {pair!r}") from None
    return _integer(lo, "min"), _integer(extent, "extent")


def _index_of(ranges, box) -> tuple:
    """The numpy index of the part ``ranges`` ((low, high) per Halide dimension) of a Buffer
    whose box is ``box``. The Ellipsis keeps a 0-D part an array (a view), where numpy would
    give a scalar."""
    return tuple(slice(lo - have, hi - have)
                 for (lo, hi), (have, _) in zip(reversed(ranges), reversed(box))) + (Ellipsis,)


def _with_mins(current: list, mins, argument: str) -> list:
    """``current`` with its first entries replaced by ``mins`` (x first), as halide.Buffer's
    set_min takes them; None leaves it as it is."""
    if mins is None:
        return current
    given = _integer_list(mins, argument)
    if len(given) > len(current):
        raise ArgumentError(argument, f"expected at most {len(current)} mins (x first), got "
                                      f"{len(given)}")
    return given + current[len(given):]


def _dimensions_of(array: np.ndarray, mins, argument: str,
                   mins_argument: str = "mins") -> list[tuple[int, int, int]]:
    """(min, extent, stride in elements) of each Halide dimension of ``array`` (x first:
    numpy's last axis) at ``mins`` (zeros by default), refused where halide_dimension_t's
    32-bit fields cannot hold them."""
    n, itemsize = array.ndim, array.dtype.itemsize
    mins = mins or (0,) * n
    dims = []
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
        if not (-INT32_MAX - 1 <= mins[i] and mins[i] + max(extent, 1) - 1 <= INT32_MAX):
            raise ArgumentError(mins_argument, f"{dimension_label(i, n)}: min {mins[i]} with "
                                               f"extent {extent} is beyond Halide's 32-bit "
                                               f"coordinates")
        dims.append((mins[i], extent, stride))
    return dims


# The constructor's arguments by position: halide.Buffer's forms.
_BY_POSITION = {"buffer": ("buffer", "name", "reverse_axes"),
                "type": ("type", "sizes", "storage_order", "name")}
_KEYWORDS = frozenset({"buffer", "name", "reverse_axes", "type", "sizes", "storage_order",
                       "mins", "shape", "dtype"})


def _constructor_arguments(args: tuple, kwargs: dict) -> dict:
    """Buffer()'s arguments by name, those given by position named as halide.Buffer's
    overloads take them (an element type first: Buffer(type, sizes, ...))."""
    typed = "type" in kwargs or bool(args and _is_element_type(args[0]))
    names = _BY_POSITION["type" if typed else "buffer"]
    if typed and len(args) == 3 and isinstance(args[2], str):
        names = ("type", "sizes", "name")  # Buffer(type, sizes, name)
    if len(args) > len(names):
        raise ArgumentError("args", f"expected at most {len(names)} positional arguments "
                                    f"({', '.join(names)}), got {len(args)}")
    given = dict(zip(names, args))
    for key, value in kwargs.items():
        if key not in _KEYWORDS:
            raise ArgumentError(key, f"unknown argument; Buffer takes "
                                     f"{', '.join(sorted(_KEYWORDS))}")
        if key in given:
            raise ArgumentError(key, "given both by position and by name")
        given[key] = value
    return given


def _check_form(given: dict, form: str, allowed: tuple) -> None:
    """Refuse arguments of another constructor form than the one ``form`` chose."""
    extra = sorted(given.keys() - set(allowed))
    if extra:
        raise ArgumentError(extra[0], f"does not go with {form}=: Buffer({', '.join(allowed)})")


def _name(name) -> str:
    if not isinstance(name, str):
        raise ArgumentError("name", f"expected a str, got {type(name).__name__}")
    return name


# Where the made-up names of unnamed Buffers (Buffer.name) come from.
_UNNAMED = itertools.count()


def _is_element_type(value) -> bool:
    """Whether ``value`` names an element type (Buffer(type, sizes)), not an array: a
    halide.Type, a numpy dtype or scalar type, a HalideType."""
    return (isinstance(value, (HalideType, np.dtype)) or _is_halide(value, "Type")
            or (isinstance(value, type) and issubclass(value, np.generic)))


def _element_type(value, argument: str) -> HalideType:
    """An element type given as halide.Buffer takes it (a halide.Type), as numpy does, or as a
    HalideType; one that has a numpy dtype."""
    if value is None:
        raise ArgumentError(argument, "expected an element type: a halide.Type such as "
                                      "hl.UInt(8), or a numpy dtype")
    if _is_halide(value, "Type"):
        htype = HalideType(int(value.code()), value.bits(), value.lanes())
    elif isinstance(value, HalideType):
        htype = value
    else:
        try:
            htype = HalideType.from_dtype(value)
        except TypeError as e:
            raise ArgumentError(argument, str(e)) from None
    if htype.dtype is None:
        raise ArgumentError(argument, f"{htype} elements have no numpy equivalent")
    return htype


def _allocate(dtype: np.dtype, sizes, storage_order) -> np.ndarray:
    """Zeroed memory of extents ``sizes`` (x first) whose dimensions lie in memory from the
    innermost to the outermost in ``storage_order``'s order (default: as listed), as numpy
    sees it: the axes reversed."""
    extents = _integer_list(sizes, "sizes")
    if any(extent < 0 for extent in extents):
        raise ArgumentError("sizes", f"extents must be non-negative, got {extents}")
    n = len(extents)
    order = list(range(n)) if storage_order is None else _integer_list(storage_order,
                                                                       "storage_order")
    if sorted(order) != list(range(n)):
        raise ArgumentError("storage_order", f"expected a permutation of 0..{n - 1} (the "
                                             f"dimensions, innermost first), got {order}")
    # Allocated outermost first: axis j holds dimension order[n - 1 - j]. numpy axis a of the
    # result is dimension n - 1 - a.
    memory = zeroed([extents[d] for d in reversed(order)], dtype, "sizes")
    return memory.transpose([n - 1 - order.index(n - 1 - a) for a in range(n)])


def _element_value(value, dtype: np.dtype, argument: str):
    """``value`` as an element of ``dtype``, where it fits as halide.Buffer requires: numbers
    of the element's kind in its range (an integer element takes no float, never
    truncated)."""
    if dtype.kind == "f":
        if isinstance(value, numbers.Real):
            return dtype.type(value)
    elif dtype.kind == "b":
        if isinstance(value, (bool, np.bool_)) or (isinstance(value, numbers.Integral)
                                                   and value in (0, 1)):
            return bool(value)
    elif isinstance(value, numbers.Integral):
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise ArgumentError(argument, f"{value} is out of range for {dtype} elements "
                                          f"[{info.min}, {info.max}]")
        return dtype.type(value)
    raise ArgumentError(argument, f"expected a {HalideType.from_dtype(dtype)} value, got "
                                  f"{value!r} ({type(value).__name__})")


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
