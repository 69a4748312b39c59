"""Loading an AOT-compiled Halide pipeline and calling it with Python values.

A Halide AOT .so exports ``NAME_argv(void **args)`` and ``NAME_metadata()``. The metadata
gives each argument's name, kind, type and dimensionality; ``argv`` takes, in that order, a
``halide_buffer_t *`` for each buffer and a pointer to the value for each scalar.
"""

from __future__ import annotations

import ctypes
import operator
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from shim.buffer import Buffer, _shape_tuple, as_host_array
from shim.elf import NotELF, pipeline_names
from shim.errors import ArgumentError, BoundsError, DeviceError, PipelineError
from shim.metadata import USER_CONTEXT, Argument, read_metadata
from shim.native import CallContext, ffi, lib
from shim.runtime import take_exception
from shim.types import BFLOAT, FLOAT

_BOUNDS_CACHE_SIZE = 64
# Target features that make a pipeline run code on a device.
DEVICE_FEATURES = {"opencl", "cuda", "metal", "vulkan", "d3d12compute", "webgpu"}


def load(path, name: str | None = None) -> Pipeline:
    """Load the Halide pipeline in the shared library at ``path``.

    Works for any Halide 21 AOT pipeline, built with its runtime bundled or with the
    ``no_runtime`` feature. ``name`` picks one pipeline when the library holds several.
    """
    return Pipeline(path, name)


@dataclass
class _Marshalled:
    """The native form of one call's arguments, and what must happen after the call."""

    argv: object = None
    keep_alive: list = field(default_factory=list)
    # (index into argv, Argument, Buffer) for each buffer argument.
    buffers: list = field(default_factory=list)
    # (index into argv, scalar pointer) for each scalar argument.
    scalars: list = field(default_factory=list)
    # Buffers the shim made for this call over the caller's arrays; their device memory is
    # freed when the call ends.
    temporaries: list = field(default_factory=list)
    # (output Buffer, the caller's array to copy it into, or None when the Buffer is a view of
    # that array) for outputs given as arrays: their results go back to host memory.
    copy_back: list = field(default_factory=list)
    # What the call returns, in metadata order of the outputs.
    results: list = field(default_factory=list)


class Pipeline:
    """A loaded pipeline. Call it with arguments by position (metadata order) or by name.

    Inputs are numpy arrays, shim.Buffers or other CPU array-likes; scalars are Python numbers;
    outputs are shim.Buffers, numpy arrays (written in place) or shapes (allocated). Returns the
    output, or a tuple of outputs in metadata order. Releases the GIL while the pipeline runs.
    """

    def __init__(self, path, name: str | None = None):
        self.path = os.fspath(path)
        self.name = _choose_name(self.path, name)
        self._library = _open_library(self.path)
        argv_address = _symbol_address(self._library, self.name + "_argv")
        metadata_address = _symbol_address(self._library, self.name + "_metadata")
        self._argv_fn = ffi.cast("int (*)(void **)", argv_address)
        metadata_fn = ffi.cast("const struct halide_filter_metadata_t *(*)(void)", metadata_address)
        try:
            md_name, self.target, self._all_arguments = read_metadata(metadata_fn())
        except ValueError as e:
            raise ArgumentError("path", f"{self.path}: bad pipeline metadata: {e}") from None
        if md_name != self.name:
            raise ArgumentError("path", f"{self.path}: metadata names the pipeline {md_name!r}, "
                                        f"exported as {self.name!r}")
        self.arguments = [a for a in self._all_arguments if a.name != USER_CONTEXT]
        # The device APIs the pipeline's code uses (none: it computes on the CPU only).
        self.device_kinds = frozenset(f for f in self.target.split("-") if f in DEVICE_FEATURES)
        self._by_name = {a.name: a for a in self.arguments}
        self._bounds_ok = OrderedDict()

    @property
    def inputs(self) -> list[Argument]:
        return [a for a in self.arguments if not a.is_output]

    @property
    def outputs(self) -> list[Argument]:
        return [a for a in self.arguments if a.is_output]

    def __repr__(self) -> str:
        return f"<shim.Pipeline {self.name} target={self.target} from {self.path}>"

    # --- calling ---------------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        values = self._bind(args, kwargs)
        call = self._marshal(values)
        try:
            self._check_bounds(call)
            for _, arg, buf in call.buffers:
                self._prepare_device_state(buf)
            self._run(call.argv)
            if not self.device_kinds:
                # Code compiled for the CPU only writes outputs without marking them
                # host-dirty; a device copy they may have would silently go stale.
                for _, arg, buf in call.buffers:
                    if arg.is_output:
                        buf.set_host_dirty(True)
            for output, target in call.copy_back:
                output.copy_to_host()
                if target is not None:
                    np.copyto(target, output.numpy())
        finally:
            for temporary in call.temporaries:
                temporary.device_free()
        return call.results[0] if len(call.results) == 1 else tuple(call.results)

    def _bind(self, args, kwargs) -> dict:
        if len(args) > len(self.arguments):
            raise ArgumentError("args", f"{self.name} takes {len(self.arguments)} arguments "
                                        f"({self._signature()}), got {len(args)} positional")
        values = dict(zip((a.name for a in self.arguments), args))
        for key, value in kwargs.items():
            if key not in self._by_name:
                raise ArgumentError(key, f"unknown argument; {self.name} takes {self._signature()}")
            if key in values:
                raise ArgumentError(key, "given both by position and by name")
            values[key] = value
        return values

    def _signature(self) -> str:
        return ", ".join(a.name for a in self.arguments)

    def _marshal(self, values: dict) -> _Marshalled:
        call = _Marshalled()
        argv = ffi.new("void *[]", max(len(self._all_arguments), 1))
        call.argv = argv
        for i, arg in enumerate(self._all_arguments):
            if arg.name == USER_CONTEXT:
                argv[i] = ffi.new("void **")  # a pointer to a NULL user_context
                call.keep_alive.append(argv[i])
            elif arg.is_buffer:
                buf = self._buffer_argument(arg, values.get(arg.name, _MISSING), call)
                argv[i] = buf._raw
                call.buffers.append((i, arg, buf))
            else:
                scalar = _scalar_argument(arg, values.get(arg.name, _MISSING))
                argv[i] = scalar
                call.keep_alive.append(scalar)
                call.scalars.append((i, scalar))
        return call

    def _buffer_argument(self, arg: Argument, value, call: _Marshalled) -> Buffer:
        if value is _MISSING:
            if not arg.is_output:
                raise ArgumentError(arg.name, f"missing input; {self.name} takes {self._signature()}")
            value = _estimated_shape(arg)
        if isinstance(value, Buffer):
            _check_buffer_type(arg, value.type, value.dimensions, value.shape)
            if arg.is_output:
                call.results.append(value)
            return value
        if arg.is_output and isinstance(value, (tuple, list)):
            shape = _shape_tuple(value, arg.name)
            _check_dimensions(arg, len(shape), shape)
            buf = Buffer._wrap(np.zeros(shape, dtype=_dtype_of(arg)), arg.name)
            call.results.append(buf)
            return buf
        array = as_host_array(value, arg.name)
        _check_buffer_type(arg, _array_type(array, arg), array.ndim, array.shape)
        if arg.is_output and not array.flags.writeable:
            raise ArgumentError(arg.name, "the output array is read-only")
        if _halide_can_address(array):
            buf = Buffer._wrap(array, arg.name)
            if arg.is_output:
                call.copy_back.append((buf, None))
        elif arg.is_output:
            # Halide wants unit stride in x; compute into a dense array and copy back.
            buf = Buffer._wrap(np.empty(array.shape, array.dtype), arg.name)
            call.copy_back.append((buf, array))
        else:
            buf = Buffer._wrap(np.ascontiguousarray(array), arg.name)
        call.temporaries.append(buf)
        if arg.is_output:
            call.results.append(array)
        else:
            buf.set_host_dirty(True)
        return buf

    def _prepare_device_state(self, buf: Buffer) -> None:
        """Make a Buffer that lives on a device this pipeline does not use acceptable to it:
        its current data goes to host memory (a CPU pipeline fails on device-dirty inputs), and
        a GPU pipeline on another API gets it without a device allocation, which it would
        otherwise refuse as a switch of interfaces."""
        device = buf.device
        if device is None or device.kind in self.device_kinds:
            return
        if buf.device_dirty:
            buf.copy_to_host()
        if self.device_kinds:
            buf.device_free()

    # --- bounds ----------------------------------------------------------------------------

    def _check_bounds(self, call: _Marshalled) -> None:
        """Run the pipeline's bounds query and refuse inputs that are too small and outputs
        whose shape the pipeline constrains otherwise, before the real call can fail halfway."""
        key = self._bounds_key(call)
        if key in self._bounds_ok:
            self._bounds_ok.move_to_end(key)
            return
        query_argv = ffi.new("void *[]", list(call.argv))
        queries = []
        for i, arg, buf in call.buffers:
            raw, dims = _bounds_query_buffer(buf._raw)
            query_argv[i] = raw
            queries.append((arg, buf, raw, dims))
        self._run(query_argv)
        for arg, buf, raw, _dims in queries:
            for d in range(raw.dimensions):
                want = (raw.dim[d].min, raw.dim[d].extent)
                have = (buf._raw.dim[d].min, buf._raw.dim[d].extent)
                _check_region(arg, d, want, have)
        self._bounds_ok[key] = True
        if len(self._bounds_ok) > _BOUNDS_CACHE_SIZE:
            self._bounds_ok.popitem(last=False)

    def _bounds_key(self, call: _Marshalled) -> tuple:
        shapes = tuple(
            tuple((buf._raw.dim[d].min, buf._raw.dim[d].extent) for d in range(buf.dimensions))
            for _, _, buf in call.buffers
        )
        scalars = tuple(bytes(ffi.buffer(pointer)) for _, pointer in call.scalars)
        return shapes, scalars

    # --- running ---------------------------------------------------------------------------

    def _run(self, argv) -> None:
        context = CallContext()
        result = lib.shim_call_argv(context.pointer, self._argv_fn, argv)
        printed = context.prints()
        if printed:
            sys.stderr.write(printed)
        if result != 0:
            message = context.errors().strip()
            cause = take_exception(context.id)
            if cause is not None:  # a device operation failed inside the pipeline
                raise DeviceError(result, message, context=self.name) from cause
            raise PipelineError(result, message, context=self.name)


_MISSING = object()


def _open_library(path: str):
    try:
        # RTLD_NOW binds every halide_* reference now, to the shim's native library, which
        # shim.native loaded first into the global scope.
        return ctypes.CDLL(os.path.abspath(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as e:
        hint = ""
        if "undefined symbol" in str(e):
            hint = (" (a no_runtime pipeline needs every runtime function it calls; this one "
                    "calls a function the shim does not provide)")
        raise ArgumentError("path", f"cannot load {path}: {e}{hint}") from None


def _choose_name(path: str, name: str | None) -> str:
    if not os.path.isfile(path):
        raise ArgumentError("path", f"no such file: {path}")
    try:
        names = pipeline_names(path)
    except NotELF as e:
        raise ArgumentError("path", f"{path} is not a Halide pipeline: {e}") from None
    except OSError as e:
        raise ArgumentError("path", f"cannot read {path}: {e}") from None
    if not names:
        raise ArgumentError("path", f"{path} is not a Halide pipeline: it exports no "
                                    "NAME_argv / NAME_metadata pair")
    if name is None:
        if len(names) > 1:
            raise ArgumentError("name", f"{path} holds several pipelines ({', '.join(names)}); "
                                        "choose one with name=")
        return names[0]
    if name not in names:
        raise ArgumentError("name", f"{path} has no pipeline {name!r}; it has {', '.join(names)}")
    return name


def _symbol_address(library, symbol: str) -> int:
    return ctypes.cast(getattr(library, symbol), ctypes.c_void_p).value


def _dtype_of(arg: Argument) -> np.dtype:
    dtype = arg.type.dtype
    if dtype is None:
        raise ArgumentError(arg.name, f"element type {arg.type} has no numpy equivalent")
    return dtype


def _array_type(array: np.ndarray, arg: Argument):
    from shim.types import HalideType

    try:
        return HalideType.from_dtype(array.dtype)
    except TypeError:
        raise ArgumentError(arg.name, f"expected {arg.type} elements, got numpy dtype "
                                      f"{array.dtype}") from None


def _check_dimensions(arg: Argument, dimensions: int, shape) -> None:
    if dimensions != arg.dimensions:
        raise ArgumentError(arg.name, f"expected a {arg.dimensions}-D buffer, got {dimensions}-D "
                                      f"with shape {tuple(shape)}")


def _check_buffer_type(arg: Argument, htype, dimensions: int, shape) -> None:
    if htype != arg.type:
        raise ArgumentError(arg.name, f"expected {arg.type} elements, got {htype}")
    _check_dimensions(arg, dimensions, shape)


def _halide_can_address(array: np.ndarray) -> bool:
    """Whether Halide's default constraints accept the array as it is: unit stride in x (the
    last numpy axis) and no negative strides."""
    if array.ndim == 0:
        return True
    if array.shape[-1] > 1 and array.strides[-1] != array.dtype.itemsize:
        return False
    return all(s >= 0 for s in array.strides)


def _estimated_shape(arg: Argument) -> tuple[int, ...]:
    estimates = arg.buffer_estimates
    if not estimates or any(extent is None for _, extent in estimates):
        raise ArgumentError(arg.name, "missing output: pass a shim.Buffer, a numpy array, or its "
                                      "shape (numpy order); the pipeline has no size estimates")
    return tuple(extent for _, extent in reversed(estimates))


def _bounds_query_buffer(raw):
    """A copy of ``raw``'s shape with no memory: Halide's bounds-query form."""
    query = ffi.new("halide_buffer_t *")
    dims = ffi.new("halide_dimension_t[]", max(raw.dimensions, 1))
    for d in range(raw.dimensions):
        dims[d] = raw.dim[d]
    query.type = raw.type
    query.dimensions = raw.dimensions
    query.dim = dims
    return query, dims


def _check_region(arg: Argument, d: int, want: tuple, have: tuple) -> None:
    (want_min, want_extent), (have_min, have_extent) = want, have
    wanted = f"[{want_min}, {want_min + want_extent})"
    covered = f"[{have_min}, {have_min + have_extent})"
    if arg.is_output:
        if want != have:
            raise BoundsError(arg.name, lib.halide_error_code_constraint_violated,
                              f"the pipeline writes dimension {d} over {wanted} but the output "
                              f"covers {covered}")
    elif want_extent > 0 and (want_min < have_min or want_min + want_extent > have_min + have_extent):
        raise BoundsError(arg.name, lib.halide_error_code_access_out_of_bounds,
                          f"too small: the pipeline reads dimension {d} over {wanted} but the "
                          f"input covers {covered}")


def _scalar_argument(arg: Argument, value):
    """A new halide_scalar_value_t holding ``value`` as the argument's type."""
    htype = arg.type
    if value is _MISSING:
        if arg.default is None:
            raise ArgumentError(arg.name, f"missing {htype} scalar (it has no default)")
        value = arg.default
    scalar = ffi.new("struct halide_scalar_value_t *")
    if htype.is_handle:
        scalar.u.handle = _handle_value(arg, value)
        return scalar
    number = _checked_number(arg, value)
    if htype.code == FLOAT and htype.bits == 16:
        scalar.u.u16 = int(np.array(number, np.float16).view(np.uint16))
    elif htype.code == BFLOAT:
        scalar.u.u16 = int(np.array(number, np.float32).view(np.uint32)) >> 16
    else:
        setattr(scalar.u, htype.scalar_field, number)
    return scalar


def _handle_value(arg: Argument, value):
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
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
            raise ArgumentError(arg.name, f"expected a number for {htype}, got {value!r}")
        number = float(value)
    else:
        if isinstance(value, (bool, np.bool_)):
            raise ArgumentError(arg.name, f"expected an integer for {htype}, got {value!r}")
        try:
            number = operator.index(value)
        except TypeError:
            raise ArgumentError(arg.name, f"expected an integer for {htype}, got {value!r}") from None
        info = np.iinfo(dtype)
        if not info.min <= number <= info.max:
            raise ArgumentError(arg.name, f"{number} does not fit in {htype} "
                                          f"[{info.min}, {info.max}]")
    if arg.min is not None and number < arg.min:
        raise ArgumentError(arg.name, f"{number} is below the minimum {arg.min}")
    if arg.max is not None and number > arg.max:
        raise ArgumentError(arg.name, f"{number} is above the maximum {arg.max}")
    return number
