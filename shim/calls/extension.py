"""A pipeline called as the Python extension Halide generates for it (``-e python_extension``,
Halide's src/PythonExtensionGen.cpp) calls it: ``shim.load(path, convention="extension")``.

People who replace ``from blur import blur`` (a generated extension) with a ``shim.load`` get
the extension's behaviour, not the shim's own conventions:

- **Arguments**: every argument, outputs included, by position or by its name as the extension
  spells it (``.`` and other characters replaced as the generator sanitizes them), all
  required. As CPython's argument parser, every scalar is converted before any buffer is
  looked at: a missing, unknown or unconvertible argument is the extension's
  ``ValueError("Internal error")``. Scalars convert as the parser converts them for the
  extension's C types (integers wrap to the argument's width where the C conversion does).
- **Buffers**, unpacked in argument order as the extension unpacks them: a ``halide.Buffer``
  or ``shim.Buffer`` as its own struct (mins and all); anything else through the buffer
  protocol, contiguous memory only (else the extension's ValueError), writable for an output,
  F-contiguous memory with axis 0 as x and C-contiguous memory with its last axis as x (an
  array that is both, 1-D or with every axis but one of extent 1, counts as F-contiguous), the
  element type read from the buffer's format, strides as the memory has them.
- **Checks**: the pipeline gets the very ``halide_buffer_t`` the extension would give it, and
  its own checks decide: element types, dimensions, the regions it reads and writes, its
  constraints, the scalars' ranges, in the order the generated code makes them, with Halide's
  error code and message. The shim checks nothing of those before the call, except in a
  pipeline built without its checks (``no_asserts``), where nothing else would: there its
  checks refuse what Halide's would have, with the code and a message in Halide's words
  (Halide's dimensions: 0 is x).
- **Result**: None; outputs are written in place.
- **Errors**: a pipeline's error is a RuntimeError whose text is the extension's
  ``"Halide Runtime Error: CODE"``, a shim.PipelineError carrying the code and Halide's message
  (HalideRuntimeError); what the extension refuses itself is a ValueError with its text, a
  shim.ArgumentError naming the argument (ExtensionValueError).

What stays the shim's: the devices the pipeline runs on, the runtime's locks and profiles, and
``__user_context``, which the extension forwards as a pointer to the object given and which
the shim's runtime does not read (any object is accepted and ignored). The extension sends
Halide's ``print`` to Python's stdout; the shim sends it where the shim's runtime does
(stderr), as for its own calls. Extents and strides beyond 32 bits, which the extension
truncates, are refused (ArgumentError).
"""

from __future__ import annotations

import numpy as np

from shim.base.errors import ArgumentError, BoundsError, PipelineError
from shim.base.types import INT32_MAX, FLOAT, HANDLE, INT, UINT, HalideType, is_halide
from shim.buffers.buffer import Buffer
from shim.calls.metadata import USER_CONTEXT
from shim.native import ffi, flags, lib

CONVENTIONS = ("numpy", "extension")


class HalideRuntimeError(PipelineError):
    """A pipeline error as the generated extension raises it: a RuntimeError whose text is
    ``Halide Runtime Error: CODE``; ``code`` and ``message`` (Halide's) as every
    PipelineError's."""

    def __str__(self) -> str:
        return f"Halide Runtime Error: {self.code}"


class ExtensionValueError(ArgumentError):
    """An argument the generated extension refuses before the pipeline runs, as it refuses it:
    a ValueError whose text is the extension's (``Invalid argument input: Expected 2
    dimensions, got 3``, ``Internal error``...); an ArgumentError whose ``argument`` names the
    argument."""

    def __init__(self, argument: str, text: str):
        super().__init__(argument, text)
        self.text = text

    def __str__(self) -> str:
        return self.text


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
        # (argv index, Argument, keyword) of the scalars the caller gives, and of the buffers.
        described = list(zip(range(len(self._arguments)), self._arguments, self._keywords))
        self._scalars = [d for d in described if not d[1].is_buffer and d[1].name != USER_CONTEXT]
        self._buffers = [d for d in described if d[1].is_buffer]
        # Where __user_context is in argv (None: the pipeline takes none).
        self._user_context = next((i for i, arg, _ in described if arg.name == USER_CONTEXT),
                                  None)
        # Whether the generated code checks its arguments (every sub-target of a multitarget
        # library): if not, the shim's checks are all that stands between a bad call and
        # memory outside the buffers.
        self._checked = not any("no_asserts" in target.split("-")
                                for target in pipeline.target.split(","))
        self._null_user_context = ffi.new("void **")

    def __repr__(self) -> str:
        return f"<shim.ExtensionFunction {self.__name__}({', '.join(self._keywords)})>"

    def __call__(self, *args, **kwargs) -> None:
        values = self._parse(args, kwargs)
        # CPython's argument parser converts every scalar before the extension unpacks a buffer.
        for i, arg, keyword in self._scalars:
            try:
                values[i] = _c_scalar(arg.type, values[i])
            except _Unconvertible:
                raise ExtensionValueError(keyword, "Internal error") from None
        buffers = [(i, arg, _unpack(arg, values[i], keyword)) for i, arg, keyword in self._buffers]
        try:
            if not self._checked:
                self._run_prechecked(values, buffers)
            elif not self._ran_as_numpy(values, buffers):
                self._run_as_built(values, buffers)
        except PipelineError as e:  # (a BoundsError among them: see _run_prechecked)
            raise HalideRuntimeError(e.code, e.message) from None
        return None

    def _parse(self, args: tuple, kwargs: dict) -> list:
        n = len(self._arguments)
        if len(args) > n:
            raise ExtensionValueError("args", "Internal error")
        values = list(args) + [_MISSING] * (n - len(args))
        for key, value in kwargs.items():
            i = self._index.get(key)
            if i is None or values[i] is not _MISSING:
                raise ExtensionValueError(key, "Internal error")
            values[i] = value
        if len(args) + len(kwargs) < n:  # (every argument is required)
            missing = next(i for i, value in enumerate(values) if value is _MISSING)
            raise ExtensionValueError(self._keywords[missing], "Internal error")
        return values

    def _numpy_arguments(self, values: list, buffers: list) -> list:
        """The call's arguments as the shim's numpy convention takes them, in its order (the
        extension's, without ``__user_context``)."""
        given = values[:]
        for i, _, unpacked in buffers:
            given[i] = unpacked.value
        if self._user_context is not None:
            del given[self._user_context]
        return given

    def _ran_as_numpy(self, values: list, buffers: list) -> bool:
        """Run the call in the shim's numpy convention (from C, on its fast path) where that
        gives the pipeline the structs the extension would: arrays whose every dimension has
        an extent above 1 (the strides of the others are numpy's to choose, which it chooses
        otherwise once x is last). False, having run nothing, where it would not, or where the
        shim's own checks refuse the call: then the pipeline's checks decide
        (_run_as_built)."""
        if not all(unpacked.plain for _, _, unpacked in buffers):
            return False
        try:
            self.pipeline(*self._numpy_arguments(values, buffers))
        except ArgumentError:  # (a BoundsError among them)
            return False
        return True

    def _run_as_built(self, values: list, buffers: list) -> None:
        """The run the generated extension makes: its structs and C values in the pipeline's
        argv, the pipeline's own checks deciding."""
        keep = []
        pointers = [self._null_user_context] * len(values)
        for i, arg, _ in self._scalars:
            pointers[i] = _c_value(arg.type, values[i], keep)
        structs, outputs = [], []
        for i, arg, unpacked in buffers:
            pointers[i] = raw = unpacked.struct(keep, host_dirty=not arg.is_output)
            structs.append(raw)
            if arg.is_output:
                outputs.append(raw)
        self.pipeline.run_structs(ffi.new("void *[]", pointers or 1), structs, outputs)
        for _, arg, unpacked in buffers:
            if arg.is_output:
                unpacked.written()

    def _run_prechecked(self, values: list, buffers: list) -> None:
        """A pipeline without its own checks: the shim's refuse what Halide's would have, in
        Halide's words (element types, the scalars' ranges, then the regions each buffer covers,
        which the shim's bounds check finds), before the pipeline runs as the shim's numpy
        convention runs it (on arrays as the extension takes them)."""
        for _, arg, unpacked in sorted(buffers, key=lambda b: b[1].name):
            if unpacked.type != arg.type:
                raise HalideRuntimeError(
                    lib.halide_error_code_bad_type,
                    f"{_role(arg)} buffer {arg.name} has type {_spelled(arg.type)} but type of "
                    f"the buffer passed in is {_spelled(unpacked.type)}")
        for i, arg, _ in sorted(self._scalars, key=lambda s: s[1].name):
            shown = _printed(arg.type, values[i])
            if arg.min is not None and values[i] < arg.min:
                raise HalideRuntimeError(lib.halide_error_code_param_too_small,
                                         f"Parameter {arg.name} is {shown} but must be at "
                                         f"least {_printed(arg.type, arg.min)}")
            if arg.max is not None and values[i] > arg.max:
                raise HalideRuntimeError(lib.halide_error_code_param_too_large,
                                         f"Parameter {arg.name} is {shown} but must be at "
                                         f"most {_printed(arg.type, arg.max)}")
        try:
            self.pipeline(*self._numpy_arguments(values, buffers))
        except BoundsError as e:
            arg = next(a for a in self._arguments if a.name == e.argument)
            raise _in_halide_words(e, arg) from None


_MISSING = object()


class _Unpacked:
    """A buffer argument as the generated extension unpacks it: its halide_buffer_t's element
    type, dimensions ((min, extent, stride) each, x first) and host memory (a cffi pointer,
    which holds the memory's export), and ``value``, what the shim's numpy convention takes
    for the same memory (an array with x last; a Buffer as itself)."""

    __slots__ = ("type", "dims", "_view", "_buffer")

    def __init__(self, htype: HalideType, dims: list, *, view=None, buffer=None):
        self.type, self.dims = htype, dims
        self._view = view  # the memory's memoryview
        self._buffer = buffer  # or the halide.Buffer or shim.Buffer whose struct this is

    @property
    def plain(self) -> bool:
        """Whether the shim's numpy convention makes the same struct of ``value``."""
        return self._buffer is None and all(extent > 1 for _, extent, _ in self.dims)

    @property
    def host(self):
        """The host memory's address, as a cffi pointer that holds the memory's export."""
        if self._buffer is not None:
            return ffi.cast("halide_buffer_t *", self._buffer._get_raw_halide_buffer_t()).host
        view = self._view
        # (cffi takes C-contiguous memory: F-contiguous memory as its transpose, which starts
        # at the same byte.)
        return ffi.from_buffer(view if view.c_contiguous else np.asarray(view).T)

    @property
    def value(self):
        if self._buffer is not None:
            return self._buffer
        array = np.asarray(self._view)
        if not array.dtype.isnative:
            # The extension reads the bytes in the machine's order whatever the format says.
            array = array.view(array.dtype.newbyteorder("="))
        return array.T if self._view.f_contiguous else array

    def struct(self, keep: list, *, host_dirty: bool):
        """A new halide_buffer_t of this geometry over the host memory, no device memory;
        ``keep`` holds what must live as long as it."""
        dims = ffi.new("halide_dimension_t[]", self.dims or 1)
        host = self.host
        raw = ffi.new("halide_buffer_t *", {
            "host": ffi.cast("uint8_t *", host), "dimensions": len(self.dims), "dim": dims,
            "type": (self.type.code, self.type.bits, self.type.lanes),
            # (A struct nobody else sees yet: the extension marks every input so.)
            "flags": flags.HOST_DIRTY if host_dirty else 0})
        keep += (raw, dims, host, self._buffer)
        return raw

    def written(self) -> None:
        """The run wrote this output: a Buffer's host memory now holds what its device copy
        does not."""
        if self._buffer is not None:
            self._buffer.set_host_dirty(True)


def _unpack(arg, value, name: str) -> _Unpacked:
    """``value`` as the extension unpacks it for ``arg`` (PyHalideBuffer::unpack)."""
    if is_halide(value, "Buffer") or isinstance(value, Buffer):
        address = value._get_raw_halide_buffer_t()
        if address:
            return _of_struct(value, address)
    return _of_memory(value, name, arg.dimensions, arg.is_output)


def _of_struct(value, address: int) -> _Unpacked:
    """A halide.Buffer or shim.Buffer, which the extension passes as its own struct: its
    geometry, type and host memory, mins and all."""
    if value.device_dirty():
        value.copy_to_host()  # (before the struct's host memory is read)
    raw = ffi.cast("halide_buffer_t *", address)
    dims = [(raw.dim[d].min, raw.dim[d].extent, raw.dim[d].stride) for d in range(raw.dimensions)]
    return _Unpacked(HalideType(raw.type.code, raw.type.bits), dims, buffer=value)


def _unpack_error(name: str, dimensions: int, got: int) -> ExtensionValueError:
    return ExtensionValueError(name, f"Invalid argument {name}: Expected {dimensions} dimensions, "
                                     f"got {got}")


def _of_memory(value, name: str, dimensions: int, writable: bool) -> _Unpacked:
    """Any other object, through the buffer protocol, as Halide::PythonRuntime::unpack_buffer
    takes it."""
    try:
        view = memoryview(value)
    except TypeError:
        raise _unpack_error(name, dimensions, 0) from None
    f_contiguous = view.f_contiguous
    if (not (f_contiguous or view.c_contiguous)) or (writable and view.readonly):
        # (Python's buffer request fails, and the extension reports the ndim it never got.)
        raise _unpack_error(name, dimensions, 0)
    ndim, shape, strides, itemsize = view.ndim, view.shape, view.strides, view.itemsize
    if dimensions and ndim != dimensions:
        raise _unpack_error(name, dimensions, ndim)
    # F first, as the extension checks it: x is axis 0. Strides in elements, divided as C
    # divides (toward zero).
    axes = range(ndim) if f_contiguous else range(ndim - 1, -1, -1)
    dims = [(0, shape[a], strides[a] // itemsize if strides[a] >= 0 else
             -(-strides[a] // itemsize)) for a in axes]
    if dims:
        _, extent, stride = dims[-1]
        if extent * stride * itemsize != view.nbytes:
            raise ExtensionValueError(name, f"Invalid buffer: length {view.nbytes}, but computed "
                                            f"length {shape[0] * strides[0]}")
    htype = _format_type(view.format, itemsize, name)
    for d, (_, extent, stride) in enumerate(dims):
        if extent > INT32_MAX or abs(stride) > INT32_MAX:
            # (The extension truncates them to C ints: its struct would describe other memory.)
            raise ArgumentError(name, f"dimension {d} has extent {extent} and stride {stride}; "
                                      f"Halide's are 32-bit, at most {INT32_MAX}")
    return _Unpacked(htype, dims, view=view)


def _format_type(fmt: str, itemsize: int, name: str) -> HalideType:
    """The element type the extension reads from a buffer's struct-module format: byte order
    and alignment ignored, ``?`` bool, ``e``/``f``/``d`` floats, lower case signed integers,
    upper case unsigned, of the item's size."""
    htype = _FORMAT_TYPES.get((fmt, itemsize))
    if htype is None:
        code = fmt.lstrip("@<>!=")[:1]
        if code == "?":
            htype = HalideType(UINT, 1)
        elif code and code in "bBhHiIlLqQfde":
            htype = HalideType(FLOAT if code in "fde" else INT if code.islower() else UINT,
                               itemsize * 8)
        else:
            raise ExtensionValueError(name, f"Invalid data type for {name}: {fmt}")
        _FORMAT_TYPES[fmt, itemsize] = htype
    return htype


# The types of the formats met so far: (format, item size) -> HalideType.
_FORMAT_TYPES: dict = {}


def _role(arg) -> str:
    return "Output" if arg.is_output else "Input"


def _spelled(htype: HalideType) -> str:
    """A type as Halide's runtime spells it in messages (halide_type_to_string)."""
    name = f"handle{htype.bits}" if htype.code == HANDLE else \
        "uint1" if (htype.code, htype.bits) == (UINT, 1) else str(HalideType(htype.code, htype.bits))
    return name if htype.lanes == 1 else f"{name}x{htype.lanes}"


def _printed(htype: HalideType, number) -> str:
    """A scalar as Halide's runtime prints it in messages: a float in C's %e form."""
    return f"{number:e}" if htype.code == FLOAT else str(int(number))


def _in_halide_words(error: BoundsError, arg) -> HalideRuntimeError:
    """A region the shim's check refused, as Halide's check of it reports it: a region read or
    written outside the buffer is access_out_of_bounds (halide_error_access_out_of_bounds's
    text); an output the pipeline writes less of than it covers keeps the check's code."""
    if error.region is None:
        return HalideRuntimeError(error.code, error.message)
    d, (want_min, want_extent), (have_min, have_extent) = error.region
    want_max, have_max = want_min + want_extent - 1, have_min + have_extent - 1
    if want_min < have_min:
        where = f"is accessed at {want_min}, which is before the min ({have_min})"
    elif want_max > have_max:
        where = f"is accessed at {want_max}, which is beyond the max ({have_max})"
    else:
        return HalideRuntimeError(error.code, f"{_role(arg)} buffer {arg.name} covers "
                                              f"[{have_min}, {have_max}] in dimension {d}, where "
                                              f"the pipeline writes [{want_min}, {want_max}]")
    return HalideRuntimeError(lib.halide_error_code_access_out_of_bounds,
                              f"{_role(arg)} buffer {arg.name} {where} in dimension {d}")


def _c_value(htype: HalideType, number, keep: list):
    """A scalar's C value (halide_scalar_value_t) for the pipeline's argv."""
    scalar = ffi.new("struct halide_scalar_value_t *")
    setattr(scalar.u, htype.scalar_field, number)
    keep.append(scalar)
    return scalar


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

