"""Halide's RunGen as the halide package ships it (share/tools/RunGenMain.cpp and RunGen.h,
Halide 21), for ``python -m shim run``: its usage text, its command line as it reads it, the
grammar of its values and the way it writes shapes and types. shim/cli/runner.py runs what
is read here; shim/cli/console.py prints as RunGen prints.

- ``USAGE``: RunGen's usage text, word for word (Halide's, MIT license), printed for no
  arguments, for ``--help``, and before "Unknown flag";
- ``Failure``: RunGen's ``fail()``: its message, after which the run ends as RunGen's does;
- the command line, read in RunGen's two passes and order, so that the first error it would
  report is the one reported: ``filter_name`` (``--help`` before anything, ``--name``), then
  ``read`` (the flags and ``NAME=VALUE``). The shim reads ``--NAME=VALUE`` for a pipeline's
  argument too (RunGen: "Unknown flag");
- numbers as RunGen reads them (C++'s ``istream >> std::setbase(0)``, the whole text or
  nothing): ``0x10`` is 16 and ``010`` is 8, ``-1`` given to an unsigned type is its largest
  value, ``1e39`` is no float32; the shim reads ``inf`` and ``nan`` for floats too;
- extents: ``[W,H,...]``, each an int32 as above; the shim's own too (which RunGen refuses):
  ``MIN+EXTENT`` entries and ``WxH``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from shim.base.errors import ArgumentError
from shim.base.types import INT32_MAX

USAGE = """
Usage: $NAME$ argument=value [argument=value... ] [flags]

Arguments:

    Specify the Generator's input and output values by name, in any order.

    Scalar inputs are specified in the obvious syntax, e.g.

        some_int=42 some_float=3.1415

    You can also use the text `default` or `estimate` to use the default or
    estimate value of the given input, respectively. (You can join these by
    commas to give default-then-estimate or estimate-then-default behaviors.)

    Buffer inputs and outputs are specified by pathname:

        some_input_buffer=/path/to/existing/file.png
        some_output_buffer=/path/to/create/output/file.png

    We currently support JPG, PGM, PNG, PPM format. If the type or dimensions
    of the input or output file type can't support the data (e.g., your filter
    uses float32 input and output, and you load/save to PNG), we'll use the most
    robust approximation within the format and issue a warning to stdout.

    (We anticipate adding other image formats in the future, in particular,
    TIFF and TMP.)

    For inputs, there are also "pseudo-file" specifiers you can use; currently
    supported are

        zero:[NUM,NUM,...]

        This input should be an image with the given extents, and all elements
        set to zero of the appropriate type. (This is useful for benchmarking
        filters that don't have performance variances with different data.)

        constant:VALUE:[NUM,NUM,...]

        Like zero, but allows an arbitrary value of the input's type.

        identity:[NUM,NUM,...]

        This input should be an image with the given extents, where diagonal
        elements are set to one of the appropriate type, and the rest are zero.
        Diagonal elements are those whose first two coordinates are equal.

        random:SEED:[NUM,NUM,...]

        This input should be an image with the given extents, and all elements
        set to a random value of the appropriate type. The random values will
        be constructed using the mt19937_64 engine, using the given seed;
        all floating point values will be in a uniform distribution between
        0.0 and 1.0, while integral values will be uniform across the entire
        range of the type.

        (We anticipate adding other pseudo-file inputs in the future, e.g.
        various random distributions, gradients, rainbows, etc.)

        In place of [NUM,NUM,...] for boundary, you may specify 'auto'; this
        will run a bounds-query to choose a legal input size given the output
        size constraints. (In general, this is useful only when also using
        the --output_extents flag.)

        In place of [NUM,NUM,...] for boundary, you may specify 'estimate';
        this will use the estimated bounds specified in the code.

Flags:

    --help:
        print this message and exit.

    --describe:
        print names and types of all arguments to stdout and exit.

    --output_extents=[NUM,NUM,...]
        By default, we attempt to calculate a reasonable size for the output
        buffers, based on the size of the input buffers and bounds query; if we
        guess wrong, or you want to explicitly specify the desired output size,
        you can specify the extent of each dimension with this flag:

        --output_extents=[1000,100]   # 2 dimensions: w=1000 h = 100
        --output_extents=[100,200,3]  # 3 dimensions: w=100 h=200 c=3

        Note that if there are multiple outputs, all will be constrained
        to this shape.

    --verbose:
        emit extra diagnostic output.

    --quiet:
        Don't log calls to halide_print() to stdout.

    --benchmarks=all:
        Run the filter with the given arguments many times to
        produce an estimate of average execution time; this currently
        runs "samples" sets of "iterations" each, and chooses the fastest
        sample set.

    --benchmark_min_time=DURATION_SECONDS [default = 0.1]:
        Override the default minimum desired benchmarking time; ignored if
        --benchmarks is not also specified.

    --track_memory:
        Override Halide memory allocator to track high-water mark of memory
        allocation during run; note that this may slow down execution, so
        benchmarks may be inaccurate if you combine --benchmark with this.

    --default_input_buffers=VALUE:
        Specify the value for all otherwise-unspecified buffer inputs, in the
        same syntax in use above. If you omit =VALUE, "zero:auto" will be used.

    --default_input_scalars=VALUE:
        Specify the value for all otherwise-unspecified scalar inputs, in the
        same syntax in use above. If you omit =VALUE, "estimate,default"
        will be used.

    --parsable_output:
        Final output is emitted in an easy-to-parse output (one value per line),
        rather than easy-for-humans.

    --estimate_all:
        Request that all inputs and outputs are based on estimate,
        and fill buffers with random values. This is exactly equivalent to
        specifying

            --default_input_buffers=estimate_then_auto
            --default_input_scalars=estimate
            --output_extents=estimate

        and is a convenience for automated benchmarking.

    --success:
        Print "Success!" to stdout if we exit with a result code of zero.
        (This is mainly useful for use with Halide's testing infrastructure,
        which relies on this for successful tests.)

    --skip_bad_environement:
        If the Generator is built for a runtime environment we don't have available
        (e.g. Cuda on a system without Cuda installed), emit a [SKIP] warning to
        stdout and return an exit code of zero; this allows for quiet "failures"
        when used with CTest.

Known Issues:

    * Filters running on GPU (vs CPU) have not been tested.
    * Filters using buffer layouts other than planar (e.g. interleaved/chunky)
      may be buggy.

"""


def usage(name: str) -> str:
    """RunGen's usage text, naming the program ``name``."""
    return USAGE.replace("$NAME$", name)


class Failure(Exception):
    """RunGen's ``fail()``: ``message`` is what it prints on stderr (a newline added where it
    has none, as RunGen adds one) before the run ends as RunGen's does (console.py).
    ``usage_first``: RunGen prints its usage on stdout first ("Unknown flag")."""

    def __init__(self, message: str, usage_first: bool = False):
        super().__init__(message)
        self.message = message if message.endswith("\n") else message + "\n"
        self.usage_first = usage_first


class Help(Exception):
    """``--help`` was given: RunGen prints its usage and exits with status 0."""


# --- the command line -----------------------------------------------------------------------

@dataclass
class Flags:
    """RunGen's flags, as RunGenMain.cpp keeps them."""

    verbose: bool = False
    quiet: bool = False
    parsable_output: bool = False
    describe: bool = False
    track_memory: bool = False
    benchmarks: bool = False
    # --benchmarks' value ("" for none: "all"; RunGen checks it only after the inputs are
    # loaded)
    benchmarks_value: str = ""
    benchmark_min_time: float = 0.1  # (halide_benchmark.h's BenchmarkConfig default)
    default_input_buffers: str = ""
    default_input_scalars: str = ""
    output_extents: str = ""
    success: bool = False
    skip_bad_environment: bool = False


@dataclass
class CommandLine:
    flags: Flags = field(default_factory=Flags)
    # The pipeline's arguments given, {name: text}, in the order given.
    values: dict = field(default_factory=dict)
    # Every NAME given as NAME=VALUE, the pipeline's or not (RunGen reports the others only
    # after the flags: "Unknown argument name").
    seen: set = field(default_factory=set)


# Flags that are true or false: alone, true; else =true or =false, exactly.
_SWITCHES = ("verbose", "quiet", "parsable_output", "describe", "track_memory", "success",
             "skip_bad_environment")


def _flag(token: str) -> list[str]:
    """A flag's name and value split at each "=" (one or two dashes before its name)."""
    text = token[1:]
    return (text[1:] if text.startswith("-") else text).split("=")


def filter_name(tokens: list[str]) -> str:
    """RunGen's first pass over its arguments: Help for ``--help`` (before any error), else
    the ``--name`` given ("" for none)."""
    name = ""
    for token in tokens:
        if not token.startswith("-"):
            continue
        parts = _flag(token)
        if parts[0] == "help":
            raise Help
        if len(parts) > 2:
            raise Failure(f"Invalid argument: {token}")
        if parts[0] != "name":
            continue
        if name:
            raise Failure("--name cannot be specified twice.")
        name = parts[1] if len(parts) > 1 else ""
        if not name:
            raise Failure("--name cannot be empty.")
    return name


def read(tokens: list[str], names) -> CommandLine:
    """RunGen's second pass: its flags, and ``NAME=VALUE`` for the pipeline's arguments
    (``names``), in order; the first error RunGen reports raises its Failure."""
    line = CommandLine()
    flags = line.flags
    for token in tokens:
        if not token.startswith("-"):
            parts = token.split("=")
            if len(parts) != 2 or not parts[0] or not parts[1]:
                raise Failure(f"Invalid argument: {token}")
            _value(line, names, *parts)
            continue
        parts = _flag(token)
        if len(parts) > 2:
            raise Failure(f"Invalid argument: {token}")
        flag, value = parts[0], parts[1] if len(parts) > 1 else ""
        if flag == "name":
            continue
        if flag in _SWITCHES:
            setting = parse_bool(value or "true")
            if setting is None:
                raise Failure(f"Invalid value for flag: {flag}")
            setattr(flags, flag, setting)
        elif flag == "benchmarks":
            flags.benchmarks, flags.benchmarks_value = True, value
        elif flag == "benchmark_min_time":
            seconds = parse_float(value, 64, words=False)
            if seconds is None:
                raise Failure(f"Invalid value for flag: {flag}")
            flags.benchmark_min_time = seconds
        elif flag == "default_input_buffers":
            flags.default_input_buffers = value or "zero:auto"
        elif flag == "default_input_scalars":
            flags.default_input_scalars = value or "estimate,default"
        elif flag == "output_extents":
            flags.output_extents = value
        elif flag == "estimate_all":
            flags.default_input_buffers = "random:0:estimate_then_auto"
            flags.default_input_scalars = "estimate"
            flags.output_extents = "estimate"
        elif flag in names and len(parts) == 2:
            _value(line, names, flag, value)  # (the shim's --NAME=VALUE)
        else:
            raise Failure(f"Unknown flag: {flag}", usage_first=True)
    return line


def _value(line: CommandLine, names, name: str, text: str) -> None:
    """RunGen's parse_one: a NAME=VALUE."""
    if not text:
        raise Failure(f"Argument value is empty for: {name}")
    line.seen.add(name)
    if name not in names:
        return  # (reported with the missing ones)
    if name in line.values:
        raise Failure(f"Argument value specified multiple times for: {name}")
    line.values[name] = text


# --- numbers --------------------------------------------------------------------------------

_SPACE = " \t\n\v\f\r"  # (what istream >> skips first)
_INTEGER = re.compile(r"([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_FLOAT_WORDS = re.compile(r"[+-]?(?:inf|infinity|nan)", re.IGNORECASE)


def parse_int(text: str, bits: int = 32, signed: bool = True) -> int | None:
    """An integer of ``bits`` bits as ``istream >> std::setbase(0)`` reads all of ``text``
    (after leading white space): ``0x`` hexadecimal, a leading ``0`` octal; a signed value
    beyond the type is no value, an unsigned one may be negative (taken modulo 2^bits, as
    libstdc++ takes it). None where RunGen refuses the text."""
    match = _INTEGER.fullmatch(text.lstrip(_SPACE))
    if match is None:
        return None
    sign, digits = match.groups()
    base = 16 if digits[1:2] in ("x", "X") else 8 if digits.startswith("0") else 10
    magnitude = int(digits, base)
    if signed:
        value = -magnitude if sign == "-" else magnitude
        return value if -2 ** (bits - 1) <= value < 2 ** (bits - 1) else None
    if magnitude >= 2 ** bits:
        return None
    return -magnitude % 2 ** bits if sign == "-" else magnitude


def parse_float(text: str, bits: int, words: bool = True) -> float | None:
    """A float (``bits``: 32 or 64) as ``istream >>`` reads all of ``text``: decimal, finite
    in the type (``1e39`` is no float32). ``words``: ``inf``, ``infinity`` and ``nan`` too
    (the shim's)."""
    body = text.lstrip(_SPACE)
    if words and _FLOAT_WORDS.fullmatch(body):
        return float(body)
    if not _FLOAT.fullmatch(body):
        return None
    value = float(body)
    if bits == 32:
        with np.errstate(over="ignore"):
            value = float(np.float32(value))
    return value if math.isfinite(value) else None


def parse_bool(text: str) -> bool | None:
    return {"true": True, "false": False}.get(text)


def parse_scalar(htype, text: str):
    """A value of Halide type ``htype`` from ``text`` as RunGen's ScalarParser reads it (for
    a handle, only ``nullptr``: None), or ``NOT_A_VALUE``. float16 and bfloat16, which
    RunGen cannot read, are read as float32 is (the shim's)."""
    if htype.is_handle:
        return None if text == "nullptr" else NOT_A_VALUE
    dtype = htype.dtype
    if dtype is None or dtype.kind == "f":
        value = parse_float(text, 64 if htype.bits == 64 else 32)
    elif dtype.kind == "b":
        value = parse_bool(text)
    else:
        value = parse_int(text, htype.bits, dtype.kind == "i")
    return NOT_A_VALUE if value is None else value


class _NotAValue:
    def __repr__(self) -> str:
        return "NOT_A_VALUE"


NOT_A_VALUE = _NotAValue()


# --- extents and shapes ---------------------------------------------------------------------

# Halide coordinates of a buffer: (min, extent) per dimension, x first.
Box = tuple

_MIN_PLUS_EXTENT = re.compile(r"([+-]?[0-9]+)\+([0-9]+)")
_W_X_H = re.compile(r"[0-9]+(?:[xX][0-9]+)+")


def parse_extents(text: str, argument: str) -> Box:
    """A Box from RunGen's ``[W,H,...]`` (each an int32 as parse_int reads it), or the
    shim's ``WxH...`` and ``MIN+EXTENT`` entries; Failure where RunGen reports the text, an
    ArgumentError naming ``argument`` where only the shim refuses it (an extent below 1, a
    box beyond Halide's 32-bit coordinates: RunGen would go on with it)."""
    if _W_X_H.fullmatch(text):
        entries = re.split("[xX]", text)
    elif text.startswith("[") and text.endswith("]"):
        entries = text[1:-1].split(",") if text != "[]" else []
    else:
        raise Failure(f"Invalid format for extents: {text}")
    box = []
    for entry in entries:
        extent, lo = parse_int(entry), 0
        if extent is None:
            match = _MIN_PLUS_EXTENT.fullmatch(entry)
            if match is None:
                raise Failure(f"Invalid value for extents: {entry} ({text})")
            lo, extent = int(match.group(1)), int(match.group(2))
        if extent < 1:
            raise ArgumentError(argument, f"extent {extent} in {text!r}: each must be at least 1")
        if extent > INT32_MAX or not -INT32_MAX - 1 <= lo <= INT32_MAX - extent + 1:
            raise ArgumentError(argument, f"min {lo} with extent {extent} is beyond Halide's "
                                          f"32-bit coordinates, in {text!r}")
        box.append((lo, extent))
    return tuple(box)


def dense_shape(box: Box) -> tuple:
    """(min, extent, stride) per dimension of a dense buffer over ``box``, x first."""
    shape, stride = [], 1
    for lo, extent in box:
        shape.append((lo, extent, stride))
        stride *= extent
    return tuple(shape)


def shape_text(shape) -> str:
    """A shape ((min, extent, stride) per dimension) as RunGen writes one:
    ``[[0,640,1],[0,480,640]]``."""
    return "[" + ",".join(f"[{lo},{extent},{stride}]" for lo, extent, stride in shape) + "]"


def type_name(htype) -> str:
    """A Halide type as RunGen writes one: ``float32``, ``uint8``, ``bool``, ``handle64``."""
    return f"handle{htype.bits}" if htype.is_handle else str(htype)


def scalar_text(htype, value) -> str:
    """A scalar as RunGen's scalar_to_string writes it (C++'s default ostream format: six
    significant digits for floats)."""
    if htype.is_handle:
        return str(value or 0)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return c_general(value)
    return str(value)


def c_general(value: float, precision: int = 6) -> str:
    """A double as C++'s ostream writes one at this precision (printf's %g): ``2``,
    ``0.1``, ``1e-07``, ``inf``, ``nan``."""
    if math.isnan(value):
        return "-nan" if math.copysign(1, value) < 0 else "nan"
    return f"{value:.{precision}g}"
