"""A pipeline called as the Python extension Halide generates for it (``-e python_extension``,
Halide's src/PythonExtensionGen.cpp) calls it: ``shim.load(path, convention="extension")``.

People who replace ``from blur import blur`` (a generated extension) with a ``shim.load`` get
the extension's behaviour, not the shim's own conventions:

- **Axes**: an F-contiguous array's axis 0 is x (Halide's dimension 0); a C-contiguous one is
  taken with its axes reversed (its last axis is x). An array that is both (1-D, or with every
  axis but one of extent 1) counts as F-contiguous, as in the extension. Any other array
  (a strided view) is refused with the extension's ValueError: it takes contiguous memory only.
- **Arguments**: every argument, outputs included, by position or by its name as the extension
  spells it (``.`` and other characters replaced as the generator sanitizes them), all
  required; a missing, unknown or unconvertible one is the extension's
  ``ValueError("Internal error")``. Scalars convert as CPython's argument parser converts them
  for the extension's C types (integers wrap to the argument's width where the C conversion
  does).
- **Result**: None; outputs are written in place.
- **Errors**: a pipeline's error is a RuntimeError whose text is the extension's
  ``"Halide Runtime Error: CODE"`` (it is a shim.PipelineError too, carrying Halide's message);
  a buffer of the wrong element type is Halide's ``bad_type`` error, as the extension's
  pipeline reports it.
- A ``halide.Buffer`` is taken with its mins, as the extension passes its struct.

What stays the shim's: the devices the pipeline runs on, the runtime's locks and profiles, and
``__user_context``, which the extension forwards as a pointer to the object given and which
the shim's runtime does not read (any object is accepted and ignored). The extension sends
Halide's ``print`` to Python's stdout; the shim sends it where the shim's runtime does
(stderr), as for its own calls.
"""

from __future__ import annotations

import numpy as np

from shim.base.errors import PipelineError
from shim.base.types import HalideType, is_halide
from shim.calls.metadata import USER_CONTEXT
from shim.native import lib

CONVENTIONS = ("numpy", "extension")


class HalideRuntimeError(PipelineError):
    """A pipeline error as the generated extension raises it: a RuntimeError whose text is
    ``Halide Runtime Error: CODE``; ``code`` and ``message`` as every PipelineError's."""

    def __str__(self) -> str:
        return f"Halide Runtime Error: {self.code}"


def sanitized(name: str) -> str:
    """An argument's name as the generated extension's keywords spell it."""
    return "".join("_" if c in "._" else c if c.isascii() and c.isalnum() else f"_{ord(c)}"
                   for c in name)


class _Unconvertible(Exception):
    """What CPython's argument parser would refuse (the extension: ValueError("Internal error"))."""


class ExtensionFunction:
    """``pipeline`` called as its generated Python extension's function is (see the module)."""

    def __init__(self, pipeline):
        self.pipeline = pipeline
        self.__name__ = pipeline.name
        self._arguments = list(pipeline.argv_arguments)
        self._keywords = [sanitized(a.name) for a in self._arguments]
        self._index = {k: i for i, k in enumerate(self._keywords)}

    def __repr__(self) -> str:
        return f"<shim.ExtensionFunction {self.__name__}({', '.join(self._keywords)})>"

    def __call__(self, *args, **kwargs) -> None:
        values = self._parse(args, kwargs)
        given = {}
        for arg, value in zip(self._arguments, values):
            if arg.name == USER_CONTEXT:
                continue  # (see the module: the shim's runtime does not read it)
            given[arg.name] = self._buffer(arg, value) if arg.is_buffer else self._scalar(arg, value)
        try:
            self.pipeline(**given)
        except PipelineError as e:  # (a BoundsError among them: the code the pipeline would give)
            raise HalideRuntimeError(e.code, e.message) from None
        return None

    def _parse(self, args: tuple, kwargs: dict) -> list:
        n = len(self._arguments)
        if len(args) > n:
            raise ValueError("Internal error")
        values = list(args) + [_MISSING] * (n - len(args))
        for key, value in kwargs.items():
            i = self._index.get(key)
            if i is None or values[i] is not _MISSING:
                raise ValueError("Internal error")
            values[i] = value
        if any(value is _MISSING for value in values):
            raise ValueError("Internal error")
        return values

    def _scalar(self, arg, value):
        try:
            number = _c_scalar(arg.type, value)
        except _Unconvertible:
            raise ValueError("Internal error") from None
        # The generated code checks an argument's declared range itself.
        if arg.min is not None and number < arg.min:
            raise HalideRuntimeError(lib.halide_error_code_param_too_small,
                                     f"{arg.name} is {number}, below its minimum {arg.min}")
        if arg.max is not None and number > arg.max:
            raise HalideRuntimeError(lib.halide_error_code_param_too_large,
                                     f"{arg.name} is {number}, above its maximum {arg.max}")
        return number

    def _buffer(self, arg, value):
        name = sanitized(arg.name)
        if is_halide(value, "Buffer"):
            # Its own struct in the extension: mins and all. The shim's numpy convention takes
            # a halide.Buffer the same way.
            array = None
        else:
            array = _contiguous_view(value, name, arg.dimensions, arg.is_output)
            value = array
        htype = _element_type(value if array is None else array, name)
        if htype != arg.type:
            raise HalideRuntimeError(lib.halide_error_code_bad_type,
                                     f"{arg.name} has type {htype}, but the pipeline takes "
                                     f"{arg.type}")
        return value


_MISSING = object()


def _unpack_error(name: str, dimensions: int, got: int) -> ValueError:
    return ValueError(f"Invalid argument {name}: Expected {dimensions} dimensions, got {got}")


def _contiguous_view(value, name: str, dimensions: int, writable: bool) -> np.ndarray:
    """The array the extension sees in ``value``, in the shim's numpy convention: its axes
    reversed where the extension takes axis 0 as x (F-contiguous memory)."""
    try:
        view = memoryview(value)
    except TypeError:
        raise _unpack_error(name, dimensions, 0) from None
    if (not (view.c_contiguous or view.f_contiguous)) or (writable and view.readonly):
        # (Python's buffer request fails, and the extension reports the ndim it never got.)
        raise _unpack_error(name, dimensions, 0)
    if dimensions and view.ndim != dimensions:
        raise _unpack_error(name, dimensions, view.ndim)
    array = np.asarray(view)
    if not array.dtype.isnative:
        # The extension reads the bytes in the machine's order whatever the format says.
        array = array.view(array.dtype.newbyteorder("="))
    # F first, as the extension checks it: x is axis 0, which the shim takes as the last.
    return array.T if view.f_contiguous else array


def _element_type(value, name: str) -> HalideType:
    if not isinstance(value, np.ndarray):  # a halide.Buffer
        t = value.type()
        return HalideType(int(t.code()), t.bits(), t.lanes())
    try:
        return HalideType.from_dtype(value.dtype)
    except TypeError:
        raise ValueError(f"Invalid data type for {name}: {memoryview(value).format}") from None


def _c_scalar(htype: HalideType, value):
    """``value`` as the extension's C argument gets it: the argument parser's format for the
    type ("f"/"d": any real number; "b" for bool, "i", "I", "L", "K" for integers, by
    __index__), then C's conversion to the argument's own type."""
    if isinstance(value, (str, bytes, bytearray)):
        raise _Unconvertible
    dtype = htype.dtype
    if dtype is None:
        raise _Unconvertible
    if dtype.kind == "f":
        if htype.bits == 16:
            raise _Unconvertible  # (the generator has no format for it: "E" fails the parser)
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise _Unconvertible from None
        if htype.bits == 32:
            with np.errstate(over="ignore"):  # C's double -> float: infinity beyond its range
                number = float(np.float32(number))
        return number
    try:
        number = value.__index__()
    except (AttributeError, TypeError):
        raise _Unconvertible from None
    if dtype.kind == "b":  # "b": an unsigned char, 0..255
        if not 0 <= number <= 255:
            raise _Unconvertible
        return bool(number)
    if dtype.kind == "i":  # "i" (int) or "L" (long long): range-checked by the parser
        limit = 63 if htype.bits == 64 else 31
        if not -(1 << limit) <= number < (1 << limit):
            raise _Unconvertible
    else:  # "I" and "K": masked, never checked
        number &= (1 << (64 if htype.bits == 64 else 32)) - 1
    # C's conversion to the argument's width (two's complement).
    number &= (1 << htype.bits) - 1
    if dtype.kind == "i" and number >= 1 << (htype.bits - 1):
        number -= 1 << htype.bits
    return number

