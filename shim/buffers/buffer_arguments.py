"""What callers give a Buffer, checked: arrays and other host memory (``as_host_array``),
shapes, mins, integers, element types (numpy dtypes, halide.Type, shim.HalideType), names and
element values, halide.Buffer's constructor forms, and whether the machine can hold new memory.
Each refusal is an ArgumentError naming the argument."""

from __future__ import annotations

import math
import numbers
import operator
import os

import numpy as np

from shim.base.errors import ArgumentError, ArgumentTypeError, ElementValueError
from shim.base.types import INT32_MAX, HalideType, Type, is_halide
from shim.native.regions import dimension_label


# Host memory the shim will allocate or copy at most at once: more than the machine has can
# never be computed with (numpy fails, or the kernel kills the process once the pages fill).
PHYSICAL_MEMORY = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def shape_tuple(shape, argument: str) -> tuple[int, ...]:
    """A shape in numpy order: integers (numpy's too), never floats truncated to one."""
    try:
        dims = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise ArgumentTypeError(argument, f"expected a shape: a sequence of integers (numpy "
                                          f"order), got {shape!r}") from None
    if any(s < 0 for s in dims):
        raise ArgumentError(argument, f"extents must be non-negative, got {dims}")
    return dims


def integer(value, argument: str) -> int:
    """``value`` as an int: Python's or numpy's integers; floats are refused, not truncated."""
    try:
        return operator.index(value)
    except TypeError:
        raise ArgumentTypeError(argument, f"expected an integer, got {value!r} "
                                          f"({type(value).__name__})") from None


def integer_list(values, argument: str) -> list[int]:
    """A list or tuple of integers (``integer``'s), as halide.Buffer's methods take them."""
    if not isinstance(values, (list, tuple)):
        raise ArgumentTypeError(argument, f"expected a list of integers, got {values!r} "
                                          f"({type(values).__name__})")
    return [integer(value, argument) for value in values]


def with_mins(current: list, mins, argument: str) -> list:
    """``current`` with its first entries replaced by ``mins`` (x first), as halide.Buffer's
    set_min takes them; None leaves it as it is."""
    if mins is None:
        return current
    given = integer_list(mins, argument)
    if len(given) > len(current):
        raise ArgumentError(argument, f"expected at most {len(current)} mins (x first), got "
                                      f"{len(given)}")
    return given + current[len(given):]


def dimensions_of(array: np.ndarray, mins, argument: str,
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
            raise ArgumentError(argument, f"Out of range dimensions in buffer conversion (as "
                                          f"halide.Buffer says it): axis {axis} is too large "
                                          f"for Halide's 32-bit extents and strides")
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


def constructor_arguments(args: tuple, kwargs: dict) -> dict:
    """Buffer()'s arguments by name, those given by position named as halide.Buffer's
    overloads take them (an element type first: Buffer(type, sizes, ...))."""
    typed = "type" in kwargs or bool(args and is_element_type(args[0]))
    names = _BY_POSITION["type" if typed else "buffer"]
    if typed and len(args) == 3 and isinstance(args[2], str):
        names = ("type", "sizes", "name")  # Buffer(type, sizes, name)
    if len(args) > len(names):
        raise ArgumentTypeError("args", f"expected at most {len(names)} positional arguments "
                                    f"({', '.join(names)}), got {len(args)}")
    given = dict(zip(names, args))
    for key, value in kwargs.items():
        if key not in _KEYWORDS:
            raise ArgumentTypeError(key, f"unknown argument; Buffer takes "
                                     f"{', '.join(sorted(_KEYWORDS))}")
        if key in given:
            raise ArgumentTypeError(key, "given both by position and by name")
        given[key] = value
    return given


def check_form(given: dict, form: str, allowed: tuple) -> None:
    """Refuse arguments of another constructor form than the one ``form`` chose."""
    extra = sorted(given.keys() - set(allowed))
    if extra:
        raise ArgumentTypeError(extra[0], f"does not go with {form}=: "
                                          f"Buffer({', '.join(allowed)})")


def buffer_name(name) -> str:
    if not isinstance(name, str):
        raise ArgumentTypeError("name", f"expected a str, got {type(name).__name__}")
    return name


def is_element_type(value) -> bool:
    """Whether ``value`` names an element type (Buffer(type, sizes)), not an array: a
    halide.Type, a numpy dtype or scalar type, a HalideType."""
    return (isinstance(value, (HalideType, Type, np.dtype)) or is_halide(value, "Type")
            or (isinstance(value, type) and issubclass(value, np.generic)))


def element_type(value, argument: str) -> HalideType:
    """An element type given as halide.Buffer takes it (a halide.Type, or the shim's Type), as
    numpy does, or as a HalideType; one that has a numpy dtype."""
    if value is None:
        raise ArgumentTypeError(argument, "expected an element type: a halide.Type such as "
                                          "hl.UInt(8), or a numpy dtype")
    if is_halide(value, "Type"):
        htype = HalideType(int(value.code()), value.bits(), value.lanes())
    elif isinstance(value, HalideType):
        htype = value
    elif isinstance(value, Type):
        htype = value.halide_type
    else:
        try:
            htype = HalideType.from_dtype(value)
        except TypeError as e:
            raise ArgumentError(argument, str(e)) from None
    if htype.dtype is None:
        raise ArgumentError(argument, f"{htype} elements have no numpy equivalent")
    return htype


def allocate(dtype: np.dtype, sizes, storage_order) -> np.ndarray:
    """Zeroed memory of extents ``sizes`` (x first) whose dimensions lie in memory from the
    innermost to the outermost in ``storage_order``'s order (default: as listed), as numpy
    sees it: the axes reversed."""
    extents = integer_list(sizes, "sizes")
    if any(extent < 0 for extent in extents):
        raise ArgumentError("sizes", f"extents must be non-negative, got {extents}")
    n = len(extents)
    order = list(range(n)) if storage_order is None else integer_list(storage_order,
                                                                       "storage_order")
    if sorted(order) != list(range(n)):
        raise ArgumentError("storage_order", f"expected a permutation of 0..{n - 1} (the "
                                             f"dimensions, innermost first), got {order}")
    # Allocated outermost first: axis j holds dimension order[n - 1 - j]. numpy axis a of the
    # result is dimension n - 1 - a.
    memory = zeroed([extents[d] for d in reversed(order)], dtype, "sizes")
    return memory.transpose([n - 1 - order.index(n - 1 - a) for a in range(n)])


def element_value(value, dtype: np.dtype, argument: str):
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
            raise ElementValueError(argument, f"{value} is out of range for {dtype} elements "
                                              f"[{info.min}, {info.max}]")
        return dtype.type(value)
    raise ElementValueError(argument, f"expected a {HalideType.from_dtype(dtype)} value, got "
                                      f"{value!r} ({type(value).__name__})")


def check_memory(shape, dtype: np.dtype, argument: str) -> None:
    """Refuse host memory of ``shape`` elements of ``dtype`` that this machine cannot hold,
    before allocating or copying it, and a shape with a negative extent (sized from a
    pipeline's estimates, say, which its metadata may give as anything)."""
    if any(extent < 0 for extent in shape):
        raise ArgumentError(argument, f"shape {tuple(shape)} has a negative extent")
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
