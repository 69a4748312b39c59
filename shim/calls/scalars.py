"""Python values as Halide scalar arguments (halide_scalar_value_t), checked against the
argument's type and its declared range."""

from __future__ import annotations

import math
import operator

import numpy as np

from shim.base.errors import ArgumentError
from shim.calls.metadata import Argument
from shim.native import ffi
from shim.base.types import BFLOAT, FLOAT

MISSING = object()


class ScalarArgument:
    """Converts values for one scalar argument; the default's C value is made once."""

    __slots__ = ("arg", "_default")

    def __init__(self, arg: Argument):
        self.arg = arg
        self._default = None if arg.default is None else self._new(arg.default)

    def default_bytes(self) -> bytes | None:
        """The default's C value (a halide_scalar_value_t), or None if there is none."""
        return None if self._default is None else bytes(ffi.buffer(self._default))

    def convert(self, value):
        """The value as a halide_scalar_value_t * for the pipeline."""
        if value is MISSING:
            if self._default is None:
                raise ArgumentError(self.arg.name, f"missing {self.arg.type} scalar (it has no default)")
            return self._default
        return self._new(value)

    def _new(self, value):
        htype = self.arg.type
        scalar = ffi.new("struct halide_scalar_value_t *")
        if htype.is_handle:
            scalar.u.handle = _handle(self.arg, value)
            return scalar
        number = _checked_number(self.arg, value)
        if htype.code == FLOAT and htype.bits == 16:
            scalar.u.u16 = int(np.array(number, np.float16).view(np.uint16))
        elif htype.code == BFLOAT:
            scalar.u.u16 = int(np.array(number, np.float32).view(np.uint32)) >> 16
        else:
            setattr(scalar.u, htype.scalar_field, number)
        return scalar


def _handle(arg: Argument, value):
    if value is None:
        return ffi.NULL
    if isinstance(value, ffi.CData):
        return ffi.cast("void *", value)
    try:
        return ffi.cast("void *", operator.index(value))
    except TypeError:
        raise ArgumentError(arg.name, f"expected a pointer (int address, cffi pointer or None), "
                                      f"got {type(value).__name__}") from None


def _checked_number(arg: Argument, value):
    """``value`` as a Python number of the argument's type, within the type's range and the
    argument's declared min and max."""
    htype = arg.type
    dtype = htype.dtype
    if dtype is not None and dtype.kind == "b":
        if not isinstance(value, (bool, np.bool_)):
            raise ArgumentError(arg.name, f"expected a bool, got {value!r}")
        return bool(value)
    if htype.code in (FLOAT, BFLOAT):
        number = _checked_float(arg, value)
    else:
        if isinstance(value, (bool, np.bool_)):
            raise ArgumentError(arg.name, f"expected an integer for {htype}, got {value!r}")
        try:
            number = operator.index(value)
        except TypeError:
            raise ArgumentError(arg.name, f"expected an integer for {htype}, got {value!r}") from None
        info = np.iinfo(dtype)
        if not info.min <= number <= info.max:
            raise ArgumentError(arg.name, f"{_shown(number)} does not fit in {htype} "
                                          f"[{info.min}, {info.max}]")
    if arg.min is not None and number < arg.min:
        raise ArgumentError(arg.name, f"{number} is below the minimum {arg.min}")
    if arg.max is not None and number > arg.max:
        raise ArgumentError(arg.name, f"{number} is above the maximum {arg.max}")
    return number


def _checked_float(arg: Argument, value) -> float:
    """A real number (not complex, whose imaginary part would be dropped) within the finite
    range of the float type: beyond it the conversion would silently give infinity."""
    htype = arg.type
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                     np.floating)):
        raise ArgumentError(arg.name, f"expected a number for {htype} (an int or a float, not "
                                      f"complex), got {value!r} ({type(value).__name__})")
    # bfloat16 (no numpy dtype) has float32's exponent range, and is made from it by truncation.
    largest = float(np.finfo(np.float32 if htype.dtype is None else htype.dtype).max)
    try:
        number = float(value)
    except OverflowError:  # an int larger than any float
        number = None
    if number is None or math.isfinite(number) and abs(number) > largest:
        raise ArgumentError(arg.name, f"{_shown(value)} does not fit in {htype} (finite values "
                                      f"up to {largest:g} in magnitude; inf and nan are accepted)")
    return number


def _shown(number) -> str:
    """``number`` for a message; an int too long for Python to print (over 4300 digits) or to
    read comfortably by its order of magnitude."""
    if isinstance(number, int) and abs(number) > 10**20:
        return f"{'-' if number < 0 else ''}about 10**{math.log10(abs(number)):.0f}"
    return repr(number)
