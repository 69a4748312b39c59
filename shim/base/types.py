"""Halide element types (halide_type_t) and their numpy equivalents."""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

INT, UINT, FLOAT, HANDLE, BFLOAT = 0, 1, 2, 3, 4
_CODE_NAMES = {INT: "int", UINT: "uint", FLOAT: "float", HANDLE: "handle", BFLOAT: "bfloat"}
# The sizes (bits) each type code comes in: every type Halide's metadata and buffers carry.
TYPE_BITS = {INT: (8, 16, 32, 64), UINT: (1, 8, 16, 32, 64), FLOAT: (16, 32, 64), HANDLE: (64,),
             BFLOAT: (16,)}
# The largest extent or stride a halide_dimension_t (int32_t fields) holds.
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class HalideType:
    """A halide_type_t: type code, bits per scalar, vector lanes."""

    code: int
    bits: int
    lanes: int = 1

    @property
    def bytes(self) -> int:
        return (self.bits + 7) // 8

    @property
    def dtype(self) -> np.dtype | None:
        """The numpy dtype with the same storage, or None where numpy has none (bfloat16,
        handles, vectors)."""
        return _numpy_dtype(self.code, self.bits, self.lanes)

    @property
    def is_handle(self) -> bool:
        return self.code == HANDLE

    def __eq__(self, other) -> bool:
        if isinstance(other, (HalideType, Type)) or is_halide(other, "Type"):
            # (halide.Type too, hl.UInt(8). halide's own == refuses anything but its Type.)
            return (self.code, self.bits, self.lanes) == _triple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.code, self.bits, self.lanes))

    def __str__(self) -> str:
        if self.code == UINT and self.bits == 1:
            name = "bool"
        elif self.code == HANDLE:
            name = "handle"
        else:
            name = f"{_CODE_NAMES.get(self.code, f'code{self.code}')}{self.bits}"
        return name if self.lanes == 1 else f"{name}x{self.lanes}"

    @classmethod
    def from_dtype(cls, dtype: DTypeLike) -> HalideType:
        """The Halide type stored like numpy's ``dtype``; raises TypeError for the others,
        among them dtypes in the other byte order, whose elements Halide would misread."""
        known = _BY_DTYPE.get(dtype) if isinstance(dtype, np.dtype) else None
        if known is not None:
            return known  # (every Buffer asks: working it out costs more than the rest of one)
        dtype = np.dtype(dtype)
        if not dtype.isnative:
            raise TypeError(f"numpy dtype {dtype.str} is not in this machine's byte order, which "
                            "Halide reads; convert it with "
                            "arr.astype(arr.dtype.newbyteorder('='))")
        if dtype == np.bool_:
            htype = cls(UINT, 1)
        else:
            code = {"i": INT, "u": UINT, "f": FLOAT}.get(dtype.kind)
            if code is None or dtype.itemsize not in (1, 2, 4, 8) or (code == FLOAT and dtype.itemsize == 1):
                raise TypeError(f"numpy dtype {dtype} has no Halide equivalent")
            htype = cls(code, dtype.itemsize * 8)
        if cls is HalideType:
            _BY_DTYPE[dtype] = htype
        return htype

    @classmethod
    def from_c(cls, ctype) -> HalideType:
        """The type a halide_type_t holds. Its third field is a scalar element's 1 lanes until
        Halide 22, which made it ``reserved`` and 0 (shim/base/releases.py): 0 is one lane."""
        return cls(ctype.code, ctype.bits, ctype.lanes or 1)

    def to_c(self, ctype) -> None:
        ctype.code, ctype.bits, ctype.lanes = self.code, self.bits, self.lanes

    # The member of halide_scalar_value_t.u that holds a scalar of this type.
    @property
    def scalar_field(self) -> str:
        if self.code == UINT and self.bits == 1:
            return "b"
        if self.code == HANDLE:
            return "handle"
        if self.code == BFLOAT:
            return "u16"
        prefix = {INT: "i", UINT: "u", FLOAT: "f"}[self.code]
        if prefix == "f" and self.bits == 16:
            return "u16"  # float16 travels as its bits
        return f"{prefix}{self.bits}"


# The Halide type of each numpy dtype met so far (HalideType.from_dtype). (A few dozen at most:
# only dtypes with a Halide equivalent join.)
_BY_DTYPE: dict = {}


# Not a functools.cached_property: Python 3.11's holds one lock, for every instance, while it
# computes, and a child forked meanwhile found it held for good (its first call of a pipeline
# then waited forever). functools.cache takes no lock.
@functools.cache
def _numpy_dtype(code: int, bits: int, lanes: int) -> np.dtype | None:
    if lanes != 1:
        return None
    if code == UINT and bits == 1:
        return np.dtype(np.bool_)
    kind = {INT: "i", UINT: "u", FLOAT: "f"}.get(code)
    if kind is None or bits not in (8, 16, 32, 64) or (kind == "f" and bits == 8):
        return None
    return np.dtype(f"{kind}{bits // 8}")


class TypeCode(int, enum.Enum):
    """halide.TypeCode: a type's kind, as halide.Type.code() answers it."""

    Int = INT
    UInt = UINT
    Float = FLOAT
    Handle = HANDLE
    BFloat = BFLOAT

    def __str__(self) -> str:
        return f"TypeCode.{self.name}"

    __repr__ = __str__

    def __eq__(self, other) -> bool:
        if is_halide(other, "TypeCode"):
            return int(self) == int(other)
        return int.__eq__(self, other)

    __hash__ = int.__hash__


class Type:
    """halide.Type's Python API (what ``shim.Buffer.type()`` gives where halide is not
    imported; with halide imported it gives halide's own Type): ``code()``, ``bits()``,
    ``lanes()``, ``bytes()``, the ``is_*()`` queries, ``with_*()``, ``element_of()``,
    ``can_represent()``, and ``max()``/``min()`` as Python numbers (halide's are Exprs: the
    shim has no Halide compiler). Equal to a halide.Type, a HalideType or another Type of the
    same code, bits and lanes; printed as halide prints it (``uint8``, ``bool``, ``int32x4``)."""

    __slots__ = ("_t",)

    def __init__(self, code: int, bits: int, lanes: int = 1):
        object.__setattr__(self, "_t", HalideType(int(code), int(bits), int(lanes)))

    @classmethod
    def of(cls, htype: HalideType) -> Type:
        made = cls.__new__(cls)
        object.__setattr__(made, "_t", htype)
        return made

    def __setattr__(self, name, value):
        raise AttributeError("a Type cannot be changed: with_bits(), with_lanes() and "
                             "with_code() make another")

    @property
    def halide_type(self) -> HalideType:
        """The shim's HalideType of the same code, bits and lanes."""
        return self._t

    def code(self) -> TypeCode:
        return TypeCode(self._t.code)

    def bits(self) -> int:
        return self._t.bits

    def lanes(self) -> int:
        return self._t.lanes

    def bytes(self) -> int:
        return self._t.bytes

    def is_bool(self) -> bool:
        return self._t.code == UINT and self._t.bits == 1

    def is_int(self) -> bool:
        return self._t.code == INT

    def is_uint(self) -> bool:
        return self._t.code == UINT  # (bool too, as in halide)

    def is_float(self) -> bool:
        return self._t.code in (FLOAT, BFLOAT)  # (halide: bfloat is a float)

    def is_bfloat(self) -> bool:
        return self._t.code == BFLOAT

    def is_handle(self) -> bool:
        return self._t.code == HANDLE

    def is_vector(self) -> bool:
        return self._t.lanes != 1

    def is_scalar(self) -> bool:
        return self._t.lanes == 1

    def with_bits(self, bits: int) -> Type:
        return Type(self._t.code, bits, self._t.lanes)

    def with_lanes(self, lanes: int) -> Type:
        return Type(self._t.code, self._t.bits, lanes)

    def with_code(self, code: int) -> Type:
        return Type(int(code), self._t.bits, self._t.lanes)

    def element_of(self) -> Type:
        return self.with_lanes(1)

    def max(self) -> int | float:
        """The largest value of the type: an int (True for bool), or inf for floats (as
        halide's Float(32).max())."""
        return self._limit(True)

    def min(self) -> int | float:
        """The smallest value: an int (False for bool), or -inf for floats."""
        return self._limit(False)

    def is_max(self, value: float) -> bool:
        return value == self.max()

    def is_min(self, value: float) -> bool:
        return value == self.min()

    def _limit(self, largest: bool) -> int | float:
        code, bits = self._t.code, self._t.bits
        if code in (FLOAT, BFLOAT):
            return math.inf if largest else -math.inf
        if code == UINT and bits == 1:
            return largest
        if code == UINT:
            return (1 << bits) - 1 if largest else 0
        if code == INT:
            return (1 << (bits - 1)) - 1 if largest else -(1 << (bits - 1))
        raise ValueError(f"{self} has no {'max' if largest else 'min'}")

    def can_represent(self, other: Type | HalideType | float) -> bool:
        """Whether every value of the Type ``other`` (or the number ``other``) is one of this
        type's, as halide.Type.can_represent answers it."""
        if isinstance(other, (Type, HalideType)) or is_halide(other, "Type"):
            return self._represents_type(_triple(other))
        if isinstance(other, bool) or not isinstance(other, (int, float)):
            raise TypeError(f"can_represent() takes a Type or a number, got "
                            f"{type(other).__name__}")
        if self.is_float():
            dtype = self._t.dtype if not self.is_bfloat() else np.dtype(np.float32)
            return math.isnan(other) or float(dtype.type(other)) == other
        if self._t.code in (INT, UINT) and self.is_scalar():
            return float(other).is_integer() and self.min() <= other <= self.max()
        return False

    def _represents_type(self, other: tuple) -> bool:
        code, bits, lanes = other
        if lanes != self._t.lanes:
            return False
        mine = self._t.bits
        if self._t.code == INT:
            return (code == INT and bits <= mine) or (code == UINT and bits < mine)
        if self._t.code == UINT:
            return code == UINT and bits <= mine
        if self._t.code == BFLOAT:
            return code == BFLOAT and bits <= mine
        if self._t.code == FLOAT:
            if code == BFLOAT:
                return mine > bits
            return ((code == FLOAT and bits <= mine) or (mine == 64 and bits <= 32) or
                    (mine == 32 and bits <= 16))
        return False

    def __eq__(self, other) -> bool:
        if isinstance(other, (Type, HalideType)) or is_halide(other, "Type"):
            return _triple(self) == _triple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(_triple(self))

    def __str__(self) -> str:
        return "handle64" if self.is_handle() and self.is_scalar() else str(self._t)

    def __repr__(self) -> str:
        return f"<shim.Type {self}>"


def is_halide(value, class_name: str) -> bool:
    """Whether ``value`` is an instance of halide's class ``class_name`` (halide itself is
    never imported for the question)."""
    cls = type(value)
    return cls.__name__ == class_name and cls.__module__.split(".")[0] == "halide"


def _triple(t) -> tuple:
    """(code, bits, lanes) of a Type, HalideType or halide.Type."""
    if isinstance(t, Type):
        t = t.halide_type
    if isinstance(t, HalideType):
        return t.code, t.bits, t.lanes
    return int(t.code()), t.bits(), t.lanes()
