"""RunGen's syntax for a pipeline's argument values on the command line, and the input
buffers it names (tools/RunGen.h's meaning and words; ``python -m shim run``). Numbers and
extents are read as RunGen reads them (shim/cli/rungen.py), with its messages where it
refuses them.

- scalars: a value (``true``/``false`` for bools, ``nullptr`` for handles, integers as C++
  reads them: ``0x10``, ``010`` octal), or ``default``, ``estimate``, ``default,estimate``,
  ``estimate,default`` for the pipeline's own values, the first that exists;
- input buffers: a file (shim/cli/images.py: ``.npy``, PNG, JPEG, ...), or ``zero:EXTENTS``,
  ``constant:VALUE:EXTENTS``, ``identity:EXTENTS`` (1 where x == y), ``random:SEED:EXTENTS``
  (uniform: floats in [0, 1), integers over the whole type; SEED a 32-bit int, as RunGen's);
  the shim's ``random:EXTENTS`` takes seed 0.
  In place of EXTENTS, ``estimate`` (the pipeline's estimates), ``auto`` (what the bounds
  query asks of the input for the outputs' sizes) or ``estimate_then_auto``;
- outputs: ``FILE``, or the shim's ``FILE:EXTENTS``, ``:EXTENTS`` or ``:`` (sized, not saved).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from shim.cli import images
from shim.cli import rungen
from shim.buffers.buffer_arguments import check_memory
from shim.base.errors import ArgumentError
from shim.calls.metadata import Argument, check_extents
from shim.calls.scalars import ScalarArgument
from shim.cli.rungen import Box, Failure

SCALAR_KEYWORDS = {"default": ("default",), "estimate": ("estimate",),
                   "default,estimate": ("default", "estimate"),
                   "estimate,default": ("estimate", "default")}
# Extents an input may take from elsewhere than its text.
DERIVED_EXTENTS = ("auto", "estimate", "estimate_then_auto")
_PSEUDO_FILES = ("zero", "constant", "identity", "random")


# --- extents ------------------------------------------------------------------------------

def estimated_box(arg: Argument) -> Box | None:
    """The pipeline's estimated (min, extent) of every dimension, or None if any is missing."""
    estimates = arg.buffer_estimates or ()
    if arg.dimensions and (len(estimates) != arg.dimensions
                           or any(None in pair for pair in estimates)):
        return None
    return tuple(estimates)


def describe_box(box: Box) -> str:
    """A Box as this syntax writes it: ``[640,480]``, ``[3+1530,3+2554]``."""
    return "[" + ",".join(f"{lo}+{n}" if lo else f"{n}" for lo, n in box) + "]"


def numpy_shape(box: Box) -> tuple:
    return tuple(n for _, n in reversed(box))


def check_dimensions(arg: Argument, box: Box, source: str) -> Box:
    if len(box) != arg.dimensions:
        raise ArgumentError(arg.name, f"{source} gives {len(box)} extents; {arg.name} is "
                                      f"{arg.dimensions}-D")
    return box


# --- scalars ------------------------------------------------------------------------------

def scalar_value(arg: Argument, text: str) -> tuple:
    """(value, where from) of a scalar argument's text: "default" or "estimate" where a
    keyword took the pipeline's (see the module's docstring), else None; RunGen's Failure
    where it refuses the text. The range is checked where the value is converted for the
    call."""
    keywords = SCALAR_KEYWORDS.get(text)
    if keywords is None:
        value = rungen.parse_scalar(arg.type, text)
        if value is rungen.NOT_A_VALUE:
            raise Failure(f"Argument value for: {arg.name} could not be parsed as type "
                          f"{rungen.type_name(arg.type)}: {text}")
        return value, None
    for keyword in keywords:
        value = arg.default if keyword == "default" else arg.estimate
        if value is not None:
            return value, keyword
    raise Failure(f"Argument value for: {arg.name} was specified as '{text}', but no default "
                  f"and/or estimate was found in the metadata.")


# --- input buffers ------------------------------------------------------------------------

@dataclass(frozen=True)
class InputSpec:
    """What an input buffer's text asks for: a file (``path``), or a pseudo-file ``kind``
    with its ``value`` (constant) or ``seed`` (random), and its extents: a Box, or one of
    DERIVED_EXTENTS."""

    text: str
    path: str | None = None
    kind: str | None = None
    extents: object = None
    value: object = None
    seed: int = 0


def parse_input(arg: Argument, text: str) -> InputSpec:
    """What an input's text asks for, checked in RunGen's order with its words."""
    kind, *parts = text.split(":")
    if kind not in _PSEUDO_FILES:
        return InputSpec(text, path=text)
    if len(parts) != (2 if kind in ("constant", "random") else 1) \
            and not (kind == "random" and len(parts) == 1):  # (the shim's random:EXTENTS)
        raise Failure(f"Invalid syntax: {text}")
    value, seed = None, 0
    if kind == "constant":
        value = rungen.parse_scalar(arg.type, parts[0])
        if value is rungen.NOT_A_VALUE:
            raise Failure("Invalid value for constant value")
        ScalarArgument(arg).convert(value)  # (within a float16, which RunGen cannot read)
    if kind == "random" and len(parts) == 2:
        # (RunGen's seed is an int, whose 32 bits seed its std::mt19937)
        seed = rungen.parse_int(parts[0])
        if seed is None:
            raise Failure("Invalid value for seed")
    extents = parts[-1] if parts[-1] in DERIVED_EXTENTS else check_dimensions(
        arg, rungen.parse_extents(parts[-1], arg.name), repr(text))
    return InputSpec(text, kind=kind, extents=extents, value=value, seed=seed % 2**32)


def read_input(arg: Argument, spec: InputSpec, console, npy_order: str = "numpy") -> np.ndarray:
    """A file input's array, conformed to the argument as RunGen does (shim/cli/images.py),
    saying so as RunGen does through ``console``."""
    console.info(f"Loading input {arg.name} from {spec.path} ...")
    array = images.read(spec.path, arg.name, npy_order)
    return images.conform(array, arg.dimensions, buffer_dtype(arg), arg.name, console)


def make_input(arg: Argument, spec: InputSpec, box: Box, target: str) -> np.ndarray:
    """A pseudo-file input's array over ``box``."""
    dtype = buffer_dtype(arg)
    shape = numpy_shape(box)
    # Refused before making it: the pipeline could not take it, or the machine hold it.
    check_extents(arg, shape, target)
    check_memory(shape, dtype, arg.name)
    if spec.kind == "zero":
        return np.zeros(shape, dtype)
    if spec.kind == "constant":
        return np.full(shape, spec.value, dtype)
    if spec.kind == "identity":
        return images.convert(_diagonal(box), dtype)
    return _random(shape, dtype, spec.seed)


def buffer_dtype(arg: Argument) -> np.dtype:
    if arg.type.dtype is None:
        raise ArgumentError(arg.name, f"the command line cannot make {arg.type} buffers")
    return arg.type.dtype


def _diagonal(box: Box) -> np.ndarray:
    """True where the first two coordinates are equal (x == 0 in one dimension)."""
    if not box:
        return np.ones((), np.bool_)
    coordinates = np.ogrid[tuple(slice(lo, lo + n) for lo, n in reversed(box))]
    y = coordinates[-2] if len(box) > 1 else 0
    return np.ascontiguousarray(np.broadcast_to(coordinates[-1] == y, numpy_shape(box)))


# What one draw of RunGen's generator gives each element type, from its 32 raw bits ``r``: with
# libstdc++ (GCC 11 and later), uniform_int_distribution over a power-of-two range takes the
# high bits of r * range (Lemire's method, never rejecting); RunGen's int8, uint8 and bool
# distributions are over int (-128..127, 0..255, 0..1), its others over the type's
# [0, max]. (name: right shift of r, offset)
_DRAWN_BITS = {"bool": (31, 0), "int8": (24, -128), "uint8": (24, 0), "int16": (17, 0),
               "uint16": (16, 0), "int32": (1, 0), "uint32": (0, 0)}


def _random(shape: tuple, dtype: np.dtype, seed: int) -> np.ndarray:
    """RunGen's ``random:SEED:EXTENTS``, bit for bit (tools/RunGen.h, FillWithRandom): a
    std::mt19937 seeded with SEED's 32 bits, one draw per element in memory order (x
    fastest), two for 64-bit types; integers uniform over [0, the type's max] (int8 over
    [-128, 127]), floats uniform_real_distribution(0, 1) as libstdc++'s generate_canonical
    makes them. (numpy's legacy RandomState seeds its MT19937 as std::mt19937 does.) float16,
    which RunGen refuses, takes float32's values rounded: the shim's own."""
    count = math.prod(shape)
    draws = np.random.RandomState(seed).randint(0, 2**32, size=count * (2 if dtype.itemsize == 8
                                                                        else 1), dtype=np.uint32)
    if dtype.kind == "f":
        if dtype.itemsize == 8:
            # generate_canonical<double>: two draws, the first the low part, over 2^64.
            values = draws[0::2].astype(np.float64)
            values += draws[1::2].astype(np.float64) * 2.0**32
            values /= 2.0**64
            below_one = np.nextafter(1.0, 0.0)
        else:
            values = draws.astype(np.float32) / np.float32(2.0**32)
            below_one = np.nextafter(np.float32(1), np.float32(0))
        values[values >= 1] = below_one  # (what libstdc++ gives where rounding reached 1)
        return values.astype(dtype, copy=False).reshape(shape)
    if dtype.itemsize == 8:
        # Two draws: the first the high 32 bits (uniform over [0, 2^31) for int64), the
        # second the low.
        high = draws[0::2].astype(np.uint64)
        if dtype.kind == "i":
            high >>= np.uint64(1)
        values = (high << np.uint64(32)) | draws[1::2].astype(np.uint64)
        return values.view(np.int64 if dtype.kind == "i" else np.uint64).astype(
            dtype, copy=False).reshape(shape)
    shift, offset = _DRAWN_BITS["bool" if dtype.kind == "b" else dtype.name]
    values = draws >> np.uint32(shift)
    if offset:
        values = values.astype(np.int32) + offset
    return values.astype(dtype).reshape(shape)


# --- outputs ------------------------------------------------------------------------------

@dataclass(frozen=True)
class OutputSpec:
    """Where an output goes (None: nowhere), the Box its text gives if any, and whether it
    was given without a file (the shim's ``:`` or ``:EXTENTS``: sized, not saved, its values
    summed up)."""

    path: str | None
    box: Box | None
    summed_up: bool = False


def parse_output(arg: Argument, text: str) -> OutputSpec:
    path, separator, extents = text.rpartition(":")
    if not separator or not re.fullmatch(r"|\[.*\]|[0-9]+[xX][0-9xX]*", extents):
        path, extents = text, ""
    if path and not images.is_supported(path):
        raise images.unsupported(arg.name, path)
    box = check_dimensions(arg, rungen.parse_extents(extents, arg.name), repr(text)) \
        if extents else None
    return OutputSpec(path or None, box, summed_up=not path)
