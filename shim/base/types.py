"""Halide element types (halide_type_t) and their numpy equivalents."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

INT, UINT, FLOAT, HANDLE, BFLOAT = 0, 1, 2, 3, 4
_CODE_NAMES = {INT: "int", UINT: "uint", FLOAT: "float", HANDLE: "handle", BFLOAT: "bfloat"}
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
        if isinstance(other, HalideType):
            return (self.code, self.bits, self.lanes) == (other.code, other.bits, other.lanes)
        if type(other).__name__ == "Type" and type(other).__module__.startswith("halide"):
            # halide.Type (hl.UInt(8)), so that Buffer.type() == hl.UInt(8) holds as it does
            # for halide.Buffer. (halide's own == refuses anything but its Type.)
            return (self.code, self.bits, self.lanes) == (int(other.code()), other.bits(),
                                                          other.lanes())
        return NotImplemented

    def __str__(self) -> str:
        if self.code == UINT and self.bits == 1:
            name = "bool"
        elif self.code == HANDLE:
            name = "handle"
        else:
            name = f"{_CODE_NAMES.get(self.code, f'code{self.code}')}{self.bits}"
        return name if self.lanes == 1 else f"{name}x{self.lanes}"

    @classmethod
    def from_dtype(cls, dtype) -> HalideType:
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
        return cls(ctype.code, ctype.bits, ctype.lanes)

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
