"""shim.Buffer: halide.Buffer's Python API over the Buffer the device layer manages
(shim/buffers/managed.py: the struct, its family, its dirty bits and device memory).

Axis order follows halide.Buffer: Halide's dimension 0 (x, the innermost) is numpy's last
axis, so a numpy array of shape (height, width) is a Halide buffer of extents (width, height).
Its Python API is halide.Buffer's, so that a program written for halide.Buffer runs on it.
"""

from __future__ import annotations

import inspect
import itertools
import sys
import math
from typing import TYPE_CHECKING, Any, SupportsIndex, overload

import numpy as np

from shim.base.errors import ArgumentError, ArgumentTypeError, CoordinateError
from shim.base.types import HalideType, Type
from shim.native import ffi
from shim.native.regions import dimension_label
from shim.exchange import cuda_array_interface, dlpack_export
from shim.exchange.dlpack_capsules import host_array, span_bytes
from shim.buffers.buffer_arguments import (
    allocate,
    buffer_name,
    check_form,
    check_memory,
    constructor_arguments,
    element_type,
    element_value,
    integer,
    integer_list,
    shape_tuple,
    with_mins,
    zeroed,
)
from shim.buffers.managed import ManagedBuffer

if TYPE_CHECKING:  # (for type checkers only: an import of numpy.typing costs every import of shim)
    from collections.abc import Callable, Iterable, Sequence

    from numpy.typing import DTypeLike
    from typing_extensions import Buffer as BufferProtocol, CapsuleType, TypeAlias

    from shim.exchange.dlpack_capsules import DLPackProducer

    # What the methods take (buffer_arguments.py checks the values themselves): integers x
    # first (mins, sizes, coordinates, offsets, orders: lists or tuples); (min, extent) pairs;
    # an element type (buffer_arguments.is_element_type's; a halide.Type too: halide has no
    # types, so any of its values passes); an element's value; memory to wrap (a CPU
    # array-like).
    Ints: TypeAlias = Sequence[SupportsIndex]
    Rect: TypeAlias = Sequence[Sequence[SupportsIndex]]
    ElementType: TypeAlias = HalideType | Type | np.dtype | type[np.generic]
    Element: TypeAlias = float | np.number | np.bool_
    HostArray: TypeAlias = "np.ndarray | Buffer | DLPackProducer | BufferProtocol"


def as_host_array(value: HostArray, argument: str) -> np.ndarray:
    """A zero-copy numpy view of a CPU array-like: numpy arrays, objects with ``__dlpack__``
    on the CPU, or anything with the buffer protocol."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, Buffer):
        return value.numpy()
    if hasattr(value, "__dlpack__"):
        return host_array(value, argument)  # checked: numpy trusts hostile tensors
    try:
        view = memoryview(value)
    except TypeError:
        raise ArgumentTypeError(argument, "expected a numpy array, a shim.Buffer, or an object "
                                          "with "
                                      f"the buffer protocol or __dlpack__; got {type(value).__name__}"
                            ) from None
    try:
        return np.asarray(view)
    except (ValueError, TypeError, NotImplementedError) as e:  # (numpy's words for a format)
        raise ArgumentError(argument, f"{type(value).__name__}'s buffer (format {view.format!r}, "
                                      f"shape {view.shape}) is no array numpy reads: {e}") from None


class Dimension(tuple):
    """One halide_dimension_t, as halide.Buffer's ``dim(i)`` gives it: ``min()``,
    ``extent()``, ``stride()`` (in elements) and ``max()``. It is also the tuple
    (min, extent, stride)."""

    __slots__ = ()

    def __new__(cls, min: int, extent: int, stride: int) -> Dimension:
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


class Buffer(ManagedBuffer):
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

    __slots__ = ()  # (ManagedBuffer's)

    # The forms __init__ takes, for type checkers.
    @overload
    def __init__(self) -> None: ...
    @overload
    def __init__(self, buffer: HostArray, name: str = "", reverse_axes: bool | np.bool_ = True,
                 *, mins: Ints | None = None) -> None: ...
    @overload
    def __init__(self, type: ElementType, sizes: Ints, name: str, *,
                 mins: Ints | None = None) -> None: ...
    @overload
    def __init__(self, type: ElementType, sizes: Ints, storage_order: Ints | None = None,
                 name: str = "", *, mins: Ints | None = None) -> None: ...
    @overload
    def __init__(self, *, shape: Iterable[SupportsIndex], dtype: ElementType | DTypeLike,
                 name: str = "", mins: Ints | None = None) -> None: ...

    def __init__(self, *args: Any, **kwargs: Any) -> None:
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
        if not args and not kwargs:
            self.__class__ = UndefinedBuffer  # (no slot set: nothing to release)
            return
        given = constructor_arguments(args, kwargs)
        name = buffer_name(given.get("name", ""))
        dirty = True
        if given.keys() & {"type", "sizes", "storage_order"}:
            check_form(given, "type", ("type", "sizes", "storage_order", "name", "mins"))
            htype = element_type(given.get("type"), "type")
            if "sizes" not in given:
                raise ArgumentTypeError("sizes", "Buffer(type, sizes) needs the extents, x first")
            array = allocate(htype.dtype, given["sizes"], given.get("storage_order"))
            argument, dirty = "sizes", False
        elif "buffer" in given:
            check_form(given, "buffer", ("buffer", "name", "reverse_axes", "mins"))
            source, argument = given["buffer"], "buffer"
            reverse = given.get("reverse_axes", True)
            if not isinstance(reverse, (bool, np.bool_)):
                raise ArgumentTypeError("reverse_axes", f"expected True or False, got {reverse!r}")
            if isinstance(source, Buffer):
                array = source._array if reverse else source._array.T
                root_dims = source._root_dims if reverse else source._root_dims[::-1]
                mins = with_mins([0] * array.ndim, given.get("mins"), "mins")
                self._init_as_view(source, array, mins, source._root_box, root_dims)
                self._name = name
                return
            array = as_host_array(source, argument)
            if not reverse:
                array = array.T
        elif given.keys() & {"shape", "dtype"}:
            check_form(given, "shape", ("shape", "dtype", "name", "mins"))
            if "shape" not in given or "dtype" not in given:
                raise ArgumentTypeError("shape", "Buffer(shape=..., dtype=...) needs both")
            array = zeroed(shape_tuple(given["shape"], "shape"),
                           element_type(given["dtype"], "dtype").dtype, "shape")
            argument = "shape"
        else:
            raise ArgumentTypeError("buffer", "Buffer() needs an array, an element type and "
                                              "sizes (Buffer(hl.UInt(8), [width, height])), or "
                                              "shape= and dtype=")
        mins = with_mins([0] * array.ndim, given.get("mins"), "mins")
        self._init_from_array(array, argument, mins=mins)
        self._name = name
        if dirty:
            self.set_host_dirty(True)

    @classmethod
    def make_scalar(cls, type: ElementType, name: str = "") -> Buffer:
        """A 0-D Buffer of one element of ``type`` (halide.Buffer.make_scalar)."""
        return cls(type=type, sizes=[], name=name)

    @classmethod
    def make_interleaved(cls, type: ElementType, width: int, height: int, channels: int,
                         name: str = "") -> Buffer:
        """A width x height x channels Buffer whose channels are innermost in memory
        (halide.Buffer.make_interleaved)."""
        return cls(type=type, sizes=[width, height, channels], storage_order=[2, 0, 1],
                   name=name)

    @classmethod
    def make_with_shape_of(cls, src: Buffer, name: str = "") -> Buffer:
        """A new Buffer with ``src``'s mins, extents, type and order of dimensions in memory,
        dense (halide.Buffer.make_with_shape_of). Zeroed, and not host-dirty."""
        if not isinstance(src, Buffer):
            raise ArgumentTypeError("src", f"expected a shim.Buffer, got {type(src).__name__}")
        made = cls.over_array(src._dense_like(), "src", mins=[lo for lo, _ in src._box])
        made._name = buffer_name(name)
        return made


    # --- shape ---------------------------------------------------------------------------

    def type(self) -> Type | Any:  # (halide's Type, where halide is imported)
        """The element type, as halide.Buffer.type() gives it: halide's own Type where halide
        is imported (so that ``buf.type() == hl.UInt(8)`` holds both ways), else a shim.Type,
        which answers the same queries with the same spelling (``bits()``, ``is_float()``,
        ``with_lanes()``, ...). ``element_type`` is the shim's HalideType."""
        halide = sys.modules.get("halide")
        if halide is not None and hasattr(halide, "Type"):
            t = self._type
            return halide.Type(halide.TypeCode(t.code), t.bits, t.lanes)
        return Type.of(self._type)

    @property
    def element_type(self) -> HalideType:
        """The element type as the shim's HalideType (code, bits and lanes as attributes)."""
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

    def dim(self, dimension: SupportsIndex) -> Dimension:
        """Halide's dimension ``dimension`` (0 is x, the innermost; numpy's last axis)."""
        d = integer(dimension, "dimension")
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

    def contains(self, coords: Ints) -> bool:
        """Whether ``coords`` (x first; the dimensions it leaves out are not checked) lie in
        this Buffer."""
        coords = integer_list(coords, "coords")
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
        self._name = buffer_name(name)

    def defined(self) -> bool:
        """Whether the Buffer has a type, dimensions and memory: False only for ``Buffer()``
        (halide.Buffer's undefined Buffer)."""
        return True

    def same_as(self, other: object) -> bool:
        """Whether ``other`` is this Buffer (a crop or a copy is another)."""
        return other is self

    # --- crops, slices and other views ---------------------------------------------------------
    # Each makes a Buffer over the same memory, as halide.Buffer's; the in-place forms (crop,
    # slice, translate, set_min, transpose, embed, add_dimension) change this one.

    def cropped(self, dimension: SupportsIndex | Rect | None = None,
                min: SupportsIndex | None = None, extent: SupportsIndex | None = None, *,
                rect: Rect | None = None) -> Buffer:
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
                raise ArgumentTypeError("rect", "give either rect, a list of (min, extent), or "
                                                "dimension, min and extent")
            if not isinstance(rect, (list, tuple)):
                raise ArgumentTypeError("rect", f"expected a list of (min, extent) pairs, got "
                                                f"{rect!r}")
            if len(rect) > self.dimensions():
                raise ArgumentError("rect", f"expected up to {self.dimensions()} (min, extent) "
                                            f"pairs, got {rect!r}")
            ranges = [_range(r) for r in rect] + list(self._box[len(rect):])
            argument = "rect"
        else:
            d = self._dimension_index(dimension)
            if min is None or extent is None:
                raise ArgumentTypeError("extent", "cropped(dimension, min, extent) needs min "
                                                  "and extent")
            ranges = list(self._box)
            ranges[d] = (integer(min, "min"), integer(extent, "extent"))
            argument = "min"
        for d, ((lo, n), (have_lo, have_n)) in enumerate(zip(ranges, self._box)):
            if n < 0 or lo < have_lo or lo + n > have_lo + have_n:
                raise ArgumentError(argument, f"{dimension_label(d, self.dimensions())}: "
                                              f"[{lo}, {lo + n}) is not inside "
                                              f"[{have_lo}, {have_lo + have_n})")
        return ranges

    def sliced(self, dimension: SupportsIndex, pos: SupportsIndex | None = None) -> Buffer:
        """The (dimensions - 1)-D Buffer at coordinate ``pos`` (default: the dimension's min)
        of dimension ``dimension``; shares memory like a crop. Slicing a 1-D Buffer gives a
        0-D one, a single element."""
        d = self._dimension_index(dimension)
        lo, n = self._box[d]
        pos = lo if pos is None else integer(pos, "pos")
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

    def translated(self, dimension: SupportsIndex | Ints | None = None,
                   dx: SupportsIndex | None = None, *, delta: Ints | None = None) -> Buffer:
        """A Buffer over the same elements at other coordinates: ``translated(d, dx)`` adds
        ``dx`` to dimension ``d``'s min, ``translated(delta)`` adds ``delta[i]`` to dimension
        ``i``'s (x first; dimensions it leaves out keep theirs)."""
        return self._view(self._array, self._translation(dimension, dx, delta), self._root_box,
                          self._root_dims, "delta" if dx is None else "dx")

    def transposed(self, d1: SupportsIndex | Ints | None = None, d2: SupportsIndex | None = None, *,
                   order: Ints | None = None) -> Buffer:
        """A Buffer over the same elements with its dimensions reordered, as halide.Buffer's:
        ``transposed(d1, d2)`` swaps two; ``transposed(order)`` makes dimension ``i`` of this
        Buffer dimension ``order[i]`` of the result."""
        array, mins, root_dims = self._transposition(d1, d2, order)
        return self._view(array, mins, self._root_box, root_dims)

    def reverse_axes(self) -> Buffer:
        """transposed() with the dimensions in reverse order: numpy's axis order."""
        return self.transposed(order=list(reversed(range(self.dimensions()))))

    def embedded(self, dimension: SupportsIndex, pos: SupportsIndex = 0) -> Buffer:
        """A Buffer with one more dimension, of extent 1 at coordinate ``pos``, inserted as
        dimension ``dimension`` (0 to dimensions()), over the same elements."""
        array, mins, root_dims = self._embedding(dimension, pos)
        return self._view(array, mins, self._root_box, root_dims, "pos")

    def crop(self, dimension: SupportsIndex | Rect | None = None,
             min: SupportsIndex | None = None, extent: SupportsIndex | None = None, *,
             rect: Rect | None = None) -> None:
        """cropped(), in place: this Buffer becomes the crop."""
        self._replace(self.cropped(dimension, min, extent, rect=rect))

    def slice(self, dimension: SupportsIndex, pos: SupportsIndex | None = None) -> None:
        """sliced(), in place."""
        self._replace(self.sliced(dimension, pos))

    def translate(self, dimension: SupportsIndex | Ints | None = None,
                  dx: SupportsIndex | None = None, *, delta: Ints | None = None) -> None:
        """translated(), in place."""
        self._reshape(self._array, self._translation(dimension, dx, delta), self._root_dims,
                      "delta" if dx is None else "dx")

    def set_min(self, mins: Ints) -> None:
        """Place this Buffer's first element at ``mins`` (x first; dimensions it leaves out
        keep their min), as halide.Buffer's set_min."""
        self._reshape(self._array, with_mins([lo for lo, _ in self._box], mins, "mins"),
                      self._root_dims, "mins")

    def transpose(self, d1: SupportsIndex | Ints | None = None, d2: SupportsIndex | None = None, *,
                  order: Ints | None = None) -> None:
        """transposed(), in place."""
        self._reshape(*self._transposition(d1, d2, order), "order")

    def embed(self, dimension: SupportsIndex, pos: SupportsIndex = 0) -> None:
        """embedded(), in place."""
        self._reshape(*self._embedding(dimension, pos), "dimension")

    def add_dimension(self) -> None:
        """Add a dimension of extent 1 at coordinate 0 after the others, in place."""
        self.embed(self.dimensions())

    def _dimension_index(self, dim) -> int:
        d = integer(dim, "dimension")
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
                raise ArgumentTypeError("delta", "give either delta, a list of offsets, or "
                                                 "dimension and dx")
            offsets = integer_list(delta, "delta")
            if len(offsets) > len(mins):
                raise ArgumentError("delta", f"expected at most {len(mins)} offsets (x first), "
                                             f"got {len(offsets)}")
            return [lo + (offsets[d] if d < len(offsets) else 0) for d, lo in enumerate(mins)]
        d = self._dimension_index(dimension)
        if dx is None:
            raise ArgumentTypeError("dx", "translated(dimension, dx) needs dx")
        mins[d] += integer(dx, "dx")
        return mins

    def _transposition(self, d1, d2, order) -> tuple:
        """transposed()'s arguments as the array, mins and root dimensions of the result."""
        n = self.dimensions()
        if isinstance(d1, (list, tuple)):
            d1, order = None, d1  # transposed(order), by position
        if order is not None:
            if d1 is not None or d2 is not None:
                raise ArgumentTypeError("order", "give either order, a permutation of the "
                                                 "dimensions, or d1 and d2")
            order = integer_list(order, "order")
            if sorted(order) != list(range(n)):
                raise ArgumentError("order", f"expected a permutation of 0..{n - 1}, got {order}")
            # Dimension i goes to order[i] (what halide.Buffer does): result dimension j is
            # dimension source[j] of this one.
            source = [0] * n
            for i, j in enumerate(order):
                source[j] = i
        else:
            if d1 is None or d2 is None:
                raise ArgumentTypeError("d2", "transposed(d1, d2) needs both dimensions")
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
        d = integer(dimension, "dimension")
        if not 0 <= d <= n:
            raise ArgumentError("dimension", f"expected where the new dimension goes, in "
                                             f"[0, {n}], got {dimension!r}")
        pos = integer(pos, "pos")
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
        array = self._current_host()
        self._exposed = True
        self.mark_read()
        return array

    # Python's buffer protocol (memoryview(buf), halide.Buffer(buf)): HostExporter's, in C
    # (native_stubs/calls/host_export.c), exports this.
    _host_export = numpy

    def __array__(self, dtype: DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        array = self.numpy()
        if copy:
            array = array.copy()
        if dtype is not None and np.dtype(dtype) != array.dtype:
            if copy is False:
                raise ValueError("converting the dtype requires a copy")
            array = array.astype(dtype)
        return array

    def __getitem__(self, pos: SupportsIndex | Ints) -> int | float:
        """The element at ``pos``, Halide coordinates with x first (``buf[x, y]``; ``buf[()]``
        for a 0-D Buffer), as a Python number. Device results are copied back first (unlike
        halide.Buffer's, which reads stale host memory, and marks it host-dirty)."""
        return self.numpy()[self._element_index(pos)].item()

    def __setitem__(self, pos: SupportsIndex | Ints, value: Element) -> None:
        """Write the element at ``pos`` (see __getitem__) and mark the Buffer host-dirty.
        ``value`` must fit the element type: floats are refused for integers, not truncated."""
        index = self._element_index(pos)
        self._host_for_writing("value")[index] = element_value(value, self.dtype, "value")
        self.set_host_dirty(True)

    def fill(self, value: Element) -> None:
        """Set every element to ``value`` (which must fit the element type) and mark the Buffer
        host-dirty."""
        element = element_value(value, self.dtype, "value")
        self._host_for_writing("value")[...] = element
        self.set_host_dirty(True)

    def all_equal(self, value: Element) -> bool:
        """Whether every element equals ``value`` (True for an empty Buffer)."""
        return bool(np.all(self.numpy() == element_value(value, self.dtype, "value")))

    def for_each_element(self, f: Callable[[list[int]], object]) -> None:
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
            raise ArgumentTypeError("other", f"expected a shim.Buffer, got "
                                             f"{type(other).__name__}")
        if other.element_type != self._type or other.dimensions() != self.dimensions():
            raise ArgumentError("other", f"expected a {self.dimensions()}-D buffer of "
                                         f"{self._type}, got a {other.dimensions()}-D one of "
                                         f"{other.element_type}")
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
        coords = integer_list(pos if isinstance(pos, (tuple, list)) else (pos,), "pos")
        if len(coords) != self.dimensions():
            raise ArgumentError("pos", f"expected {self.dimensions()} coordinates (x first) for "
                                       f"a {self.dimensions()}-D buffer, got {len(coords)}")
        for d, (c, (lo, n)) in enumerate(zip(coords, self._box)):
            if not lo <= c < lo + n:
                # (halide.Buffer's words first: its axis is the Halide dimension.)
                raise CoordinateError("pos", f"index {c} is out of bounds for axis {d} with "
                                             f"min={lo}, extent={n} "
                                             f"({dimension_label(d, self.dimensions())}: "
                                             f"[{lo}, {lo + n}))")
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

    def __dlpack__(self, *, stream: object = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None,
                   copy: bool | None = None) -> CapsuleType:
        """A DLPack capsule of this Buffer's data, as the Python array API standard specifies:
        CUDA memory stays on the device, ordered before ``stream``'s later work; OpenCL
        results are downloaded into host memory unless ``dl_device`` asks for the device."""
        return dlpack_export.export(self, stream=stream, max_version=max_version,
                                    dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        """(DLPack device type, device id) that ``__dlpack__()`` exports to by default (the
        rule: shim/exchange/dlpack_export.py)."""
        return dlpack_export.device_of(self)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA Array Interface (version 3) of this Buffer's CUDA memory, for Numba and
        CuPy; AttributeError on a Buffer without a CUDA allocation."""
        return cuda_array_interface.describe(self)

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
        name = buffer_name(name)
        mins = with_mins([0] * array.ndim, mins, "mins")
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

    def __repr__(self) -> str:
        return f"<shim.Buffer {self._type} shape={self.shape}>"

    def __str__(self) -> str:
        # halide.Buffer's text, (min, extent, stride) per dimension, x first: programs and
        # tests written for halide.Buffer print and compare it.
        dims = ",".join(f"[{lo},{n},{stride}]" for lo, n, stride in
                        (self.dim(d) for d in range(self.dimensions())))
        return f"<halide.Buffer of type {self._type} shape:[{dims}]>"


def _range(pair) -> tuple[int, int]:
    """One (min, extent) pair of ``Buffer.cropped``'s list form."""
    try:
        lo, extent = pair
    except (TypeError, ValueError):
        raise ArgumentTypeError("rect", f"expected (min, extent) pairs, got {pair!r}") from None
    return integer(lo, "min"), integer(extent, "extent")


def _index_of(ranges, box) -> tuple:
    """The numpy index of the part ``ranges`` ((low, high) per Halide dimension) of a Buffer
    whose box is ``box``. The Ellipsis keeps a 0-D part an array (a view), where numpy would
    give a scalar."""
    return tuple(slice(lo - have, hi - have)
                 for (lo, hi), (have, _) in zip(reversed(ranges), reversed(box))) + (Ellipsis,)


# Where the made-up names of unnamed Buffers (Buffer.name) come from.
_UNNAMED = itertools.count()


class UndefinedBuffer(Buffer):
    """What ``Buffer()`` makes, as ``halide.Buffer()`` does: a Buffer with no type, dimensions
    or memory. ``defined()`` is False; everything else a Buffer offers is refused with an
    ArgumentError (halide's raises, or crashes the process)."""

    __slots__ = ()

    def defined(self) -> bool:
        return False

    def __str__(self) -> str:
        return "<undefined halide.Buffer>"

    def __repr__(self) -> str:
        return "<undefined shim.Buffer>"


def _refused(name: str):
    def refuse(self, *args, **kwargs):
        raise ArgumentError("buffer", f"{name}: the Buffer is undefined (Buffer() with no "
                                      f"arguments): it has no type, dimensions or memory")
    return refuse


# Every method and property of a Buffer, on an undefined one, refuses (the classmethods that
# make new Buffers are the class's, not the Buffer's, and stay).
for _name in sorted({n for cls in Buffer.__mro__[:-1] for n in vars(cls)}):
    _value = inspect.getattr_static(Buffer, _name)
    if _name in vars(UndefinedBuffer) or isinstance(_value, (classmethod, staticmethod)) or \
            (_name.startswith("__") and _name not in ("__getitem__", "__setitem__", "__array__",
                                                       "__dlpack__", "__dlpack_device__",
                                                       "__reduce__", "__cuda_array_interface__")):
        continue
    if isinstance(_value, property):
        setattr(UndefinedBuffer, _name, property(_refused(_name)))
    elif callable(_value) and not _name.startswith("_") or _name.startswith("__"):
        setattr(UndefinedBuffer, _name, _refused(_name))
UndefinedBuffer._host_export = _refused("its buffer protocol")
del _name, _value
