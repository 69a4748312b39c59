"""A pipeline's halide_filter_metadata_t, read into Python objects."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from shim.base.errors import ArgumentError
from shim.native import ffi
from shim.native.regions import DIMENSION_NAMES, dimension_label
from shim.base.types import BFLOAT, FLOAT, INT32_MAX, TYPE_BITS, HalideType

USER_CONTEXT = "__user_context"


class ArgumentKind(enum.IntEnum):
    INPUT_SCALAR = 0
    INPUT_BUFFER = 1
    OUTPUT_BUFFER = 2


@dataclass(frozen=True)
class Argument:
    """One argument of a pipeline, as its metadata describes it."""

    name: str
    kind: ArgumentKind
    dimensions: int
    type: HalideType
    default: object = None
    min: object = None
    max: object = None
    estimate: object = None
    # Per dimension, (min, extent) estimates; either may be None.
    buffer_estimates: tuple | None = None
    # What the third field of halide_type_t holds in the pipeline's buffers (`lanes`, 1, before
    # Halide 22; `reserved`, 0, from it): generated code compares a buffer argument's whole type
    # with its own, so every buffer handed to the pipeline carries this value there.
    type_lanes: int = 1

    def type_to_c(self, ctype) -> None:
        """Write the argument's type into a halide_type_t as the pipeline checks it."""
        self.type.to_c(ctype)
        ctype.lanes = self.type_lanes

    @property
    def is_buffer(self) -> bool:
        return self.kind != ArgumentKind.INPUT_SCALAR

    @property
    def is_output(self) -> bool:
        return self.kind == ArgumentKind.OUTPUT_BUFFER

    def describe(self) -> str:
        """One line for `python -m shim info` and error messages."""
        if not self.is_buffer:
            text = f"{self.name}: {self.type} scalar"
            for label, value in (("default", self.default), ("min", self.min),
                                 ("max", self.max), ("estimate", self.estimate)):
                if value is not None:
                    text += f", {label} {_shown(self.type, value)}"
            return text
        role = "output" if self.is_output else "input"
        text = f"{self.name}: {role} buffer of {self.type}, {self.dimensions}-D"
        if self.buffer_estimates and any(e != (None, None) for e in self.buffer_estimates):
            ranges = " ".join(
                f"{DIMENSION_NAMES[d] if d < len(DIMENSION_NAMES) else f'dim{d}'}="
                + ("?" if mn is None else str(mn)) + "+" + ("?" if extent is None else str(extent))
                for d, (mn, extent) in enumerate(self.buffer_estimates)
            )
            text += f", estimated min+extent {ranges}"
        return text


def _shown(htype: HalideType, value) -> str:
    """A scalar as the value of its type it is: the shortest decimal that reads back as that
    float16 / float32 / bfloat16 (0.1, not the double 0.10000000149011612)."""
    if htype.code == BFLOAT and math.isfinite(value):
        bits = int(np.array(value, np.float32).view(np.uint32)) >> 16
        return next(text for text in (f"{value:.{digits}g}" for digits in range(1, 18))
                    if int(np.array(float(text), np.float32).view(np.uint32)) >> 16 == bits)
    if htype.code == FLOAT and htype.bits < 64:
        return str(htype.dtype.type(value))
    return str(value)


def scalar_from_c(htype: HalideType, value):
    """A Python number from a halide_scalar_value_t of type ``htype``."""
    raw = getattr(value.u, htype.scalar_field)
    if htype.is_handle:
        return int(ffi.cast("uintptr_t", raw))
    if htype.code == FLOAT and htype.bits == 16:
        return float(np.array(raw, np.uint16).view(np.float16))
    if htype.code == BFLOAT:
        return float(np.array(raw << 16, np.uint32).view(np.float32))
    if htype.dtype == np.bool_:
        return bool(raw)
    return raw


def _optional_scalar(htype, pointer):
    return None if pointer == ffi.NULL else scalar_from_c(htype, pointer)


def _buffer_estimates(arg, name: str):
    """Per dimension, (min, extent) estimates; ValueError for one a halide_dimension_t cannot
    hold (Halide's are int32 constants)."""
    if arg.buffer_estimates == ffi.NULL:
        return None
    estimates = []
    for d in range(arg.dimensions):
        pair = []
        for j in (2 * d, 2 * d + 1):
            pointer = arg.buffer_estimates[j]
            pair.append(None if pointer == ffi.NULL else int(pointer[0]))
        if any(value is not None and not -INT32_MAX - 1 <= value <= INT32_MAX
               for value in pair):
            raise ValueError(f"argument {name!r} has the estimates min {pair[0]}, extent "
                             f"{pair[1]} for dimension {d}, which no 32-bit "
                             "halide_dimension_t holds")
        estimates.append(tuple(pair))
    return tuple(estimates)


class Metadata(NamedTuple):
    """A pipeline's halide_filter_metadata_t: its ``name``, ``target`` and ``arguments`` (in
    argv order), and ``scalar_lanes``, the values the third field of its argument types holds
    (halide_type_t's ``lanes`` or ``reserved``: which Halide release wrote them,
    shim/calls/library_release.py). Argument types are scalar whatever that field holds."""

    name: str
    target: str
    arguments: list
    scalar_lanes: frozenset


def read_metadata(pointer) -> Metadata:
    """The metadata a ``halide_filter_metadata_t *`` points to."""
    if pointer == ffi.NULL:
        raise ValueError("the metadata function returned NULL")
    if pointer.version != 1:
        raise ValueError(f"unsupported metadata version {pointer.version} (expected 1)")
    if pointer.num_arguments > 0 and pointer.arguments == ffi.NULL:
        raise ValueError(f"{pointer.num_arguments} arguments at a NULL address")
    arguments = []
    lanes = set()
    for i in range(pointer.num_arguments):
        arg = pointer.arguments[i]
        name = _text(arg.name, f"argument {i}'s name")
        if arg.type.bits not in TYPE_BITS.get(arg.type.code, ()):
            raise ValueError(f"argument {name!r} has type code {arg.type.code} with "
                             f"{arg.type.bits} bits, which is no Halide type")
        lanes.add(arg.type.lanes)
        htype = HalideType(arg.type.code, arg.type.bits)
        arguments.append(Argument(
            name=name,
            kind=ArgumentKind(arg.kind),
            dimensions=arg.dimensions,
            type=htype,
            default=_optional_scalar(htype, arg.scalar_def),
            min=_optional_scalar(htype, arg.scalar_min),
            max=_optional_scalar(htype, arg.scalar_max),
            estimate=_optional_scalar(htype, arg.scalar_estimate),
            buffer_estimates=_buffer_estimates(arg, name),
            type_lanes=arg.type.lanes,
        ))
    return Metadata(_text(pointer.name, "the pipeline's name"),
                    _text(pointer.target, "the target"), arguments, frozenset(lanes))


def _text(pointer, what: str) -> str:
    """A string of the metadata (ValueError for a NULL one, or one that is not UTF-8)."""
    if pointer == ffi.NULL:
        raise ValueError(f"{what} is NULL")
    return ffi.string(pointer).decode()


def check_extents(arg: Argument, shape, target: str) -> None:
    """Refuse a shape (numpy order) that no buffer for ``arg`` can have in a pipeline built for
    ``target``, before anyone allocates or copies that much: halide_dimension_t holds 32-bit
    extents, and Halide's generated code refuses buffers of more elements than its limit
    (buffer_extents_too_large): 2^31 - 1, unless built with the large_buffers feature."""
    for axis, extent in enumerate(shape):
        if extent > INT32_MAX:
            raise ArgumentError(arg.name, f"{dimension_label(len(shape) - 1 - axis, len(shape))} "
                                          f"has extent {extent}; Halide's extents are 32-bit, at "
                                          f"most {INT32_MAX}")
    large = "large_buffers" in target.split("-")
    limit = 2**63 - 1 if large else INT32_MAX
    elements = math.prod(shape)
    if elements > limit:
        raise ArgumentError(arg.name, f"shape {tuple(shape)} has {elements} elements; Halide "
                                      f"pipelines take at most {limit} per buffer"
                                      + ("" if large else " (2^31 - 1: more only when built with "
                                                          "the large_buffers target feature)"))
