"""Loading an AOT-compiled Halide pipeline and calling it with Python values.

A Halide AOT .so exports ``NAME_argv(void **args)`` and ``NAME_metadata()``. The metadata
gives each argument's name, kind, type and dimensionality; ``argv`` takes, in that order, a
``halide_buffer_t *`` for each buffer and a pointer to the value for each scalar.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from dataclasses import dataclass, field

import numpy as np

from shim import dlpack, families, interrupts, profiler, runtime, streams
from shim.backends.base import BackendError
from shim.buffer import Buffer, _check_memory, _shape_tuple, _zeros, as_host_array
from shim.devices import backend_class
from shim.elf import NotELF, architecture, pipeline_names
from shim.errors import (DEVICE_ERROR_CODES, ArgumentError, BoundsError, DeviceError,
                         DeviceUnavailable, PipelineError)
from shim.metadata import USER_CONTEXT, Argument, check_extents, dimension_label, read_metadata
from shim.native import CallContext, CallPlan, PreparedRun, _native, ffi, lib
from shim.runtime import take_exception
from shim.scalars import MISSING, ScalarArgument
from shim.types import INT32_MAX, HalideType

# How often a call prepares buffers another thread keeps moving to a device it does not use.
_PREPARATION_ATTEMPTS = 100
# The most buffers a prepared call's C run takes (native_stubs/prepared_call.c, MAX_MEMBERS).
_NATIVE_RUN_BUFFERS = 64
# Target features that make a pipeline run code on a device.
DEVICE_FEATURES = {"opencl", "cuda", "metal", "vulkan", "d3d12compute", "webgpu"}


def load(path, name: str | None = None) -> Pipeline:
    """Load the Halide pipeline in the shared library at ``path``.

    Works for any Halide 21 AOT pipeline, built with its runtime bundled or with the
    ``no_runtime`` feature. ``name`` picks one pipeline when the library holds several.
    """
    return Pipeline(path, name)


@dataclass(eq=False)
class _Call:
    """The native form of one call's arguments, and what must happen around each run."""

    argv: object = None
    keep_alive: list = field(default_factory=list)
    # (index into argv, Argument, Buffer) for each buffer argument.
    buffers: list = field(default_factory=list)
    # Hashable form of the scalar values, for the bounds-query cache.
    scalar_key: list = field(default_factory=list)
    # Buffers the shim made over the caller's input arrays: host-dirty before every run, since
    # the caller may have written to the array.
    array_inputs: list = field(default_factory=list)
    # Buffers the shim made for this call; their device memory is freed when it closes.
    temporaries: list = field(default_factory=list)
    # (output Buffer, the caller's array to copy it into, or None when the Buffer is a view of
    # that array) for outputs given as arrays: their results go back to host memory.
    copy_back: list = field(default_factory=list)
    # Outputs over another library's device memory (DLPack): their results go to that memory.
    device_outputs: list = field(default_factory=list)
    # What the call returns, in metadata order of the outputs.
    results: list = field(default_factory=list)


class Pipeline:
    """A loaded pipeline. Call it with arguments by position (metadata order) or by name.

    Inputs are numpy arrays, shim.Buffers or other CPU array-likes; scalars are Python numbers;
    outputs are shim.Buffers, numpy arrays (written in place) or shapes (allocated). Returns the
    output, or a tuple of outputs in metadata order. Releases the GIL while the pipeline runs.
    """

    def __init__(self, path, name: str | None = None):
        try:
            self.path = os.fsdecode(path)
        except TypeError:
            raise ArgumentError("path", "expected the path of a pipeline's shared library (str, "
                                        f"bytes or os.PathLike), got {type(path).__name__}") from None
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
        backends = [backend_class(kind) for kind in self.device_kinds]
        self._backend_mask = sum(1 << backend.index for backend in backends if backend is not None)
        # Whether its calls may run from C (the fast paths): not on a device the shim has no
        # backend for, nor on one that orders work across streams (CUDA's fences are Python's).
        self._native_calls = all(backend is not None and not backend.orders_streams
                                 for backend in backends)
        self._by_name = {a.name: a for a in self.arguments}
        self._names = [a.name for a in self.arguments]
        self._scalars = {a.name: ScalarArgument(a) for a in self.arguments if not a.is_buffer}
        self._null_user_context = ffi.new("void **")  # what __user_context points to
        # The fast path (calls with Buffers, numbers and, on the CPU, numpy arrays) and the
        # cache of argument shapes that passed the bounds query, in C (native_stubs/fastcall.c).
        self._plan = CallPlan(argv_address, [self._plan_entry(a) for a in self._all_arguments],
                              self._native_calls, not self.device_kinds, self._backend_mask,
                              np.ndarray, Buffer, self._finish_fast, runtime.end_call)

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
        results = self._plan.call(args, kwargs)
        if results is NotImplemented:  # (the fast path declined before running anything)
            with self.prepare(*args, **kwargs) as call:
                return call()
        return results

    def prepare(self, *args, **kwargs) -> PreparedCall:
        """Marshal the arguments once and check them with the pipeline's bounds query; the
        returned PreparedCall runs the pipeline with them as often as it is called, for loops
        where the per-call argument handling would cost more than the pipeline."""
        call = self._marshal(self._bind(args, kwargs))
        try:
            self._check_bounds(call)
        except BaseException:
            _free_temporaries(call)
            raise
        return PreparedCall(self, call)

    def _bind(self, args, kwargs) -> dict:
        if len(args) > len(self.arguments):
            raise ArgumentError("args", f"{self.name} takes {len(self.arguments)} arguments "
                                        f"({self._signature()}), got {len(args)} positional")
        values = dict(zip(self._names, args))
        for key, value in kwargs.items():
            if key not in self._by_name:
                raise ArgumentError(key, f"unknown argument; {self.name} takes {self._signature()}")
            if key in values:
                raise ArgumentError(key, "given both by position and by name")
            values[key] = value
        return values

    def _signature(self) -> str:
        return ", ".join(self._names)

    def _marshal(self, values: dict) -> _Call:
        call = _Call()
        argv = call.argv = ffi.new("void *[]", max(len(self._all_arguments), 1))
        for i, arg in enumerate(self._all_arguments):
            if arg.name == USER_CONTEXT:
                argv[i] = self._null_user_context
            elif arg.is_buffer:
                buf = self._buffer_argument(arg, values.get(arg.name, MISSING), call)
                argv[i] = buf._raw
                call.buffers.append((i, arg, buf))
            else:
                scalar, key = self._scalars[arg.name].convert(values.get(arg.name, MISSING))
                argv[i] = scalar
                call.keep_alive.append(scalar)
                call.scalar_key.append(key)
        return call

    def _buffer_argument(self, arg: Argument, value, call: _Call) -> Buffer:
        if value is MISSING:
            if not arg.is_output:
                raise ArgumentError(arg.name, f"missing input; {self.name} takes {self._signature()}")
            value = _estimated_shape(arg)
        if isinstance(value, Buffer):
            _check_buffer_type(arg, value._type, len(value._box), value.shape)
            check_extents(arg, value.shape, self.target)
            if arg.is_output:
                _check_writable(arg, value.writeable)
                call.results.append(value)
            return value
        if arg.is_output and isinstance(value, (tuple, list)):
            shape = _shape_tuple(value, arg.name)
            _check_dimensions(arg, len(shape), shape)
            check_extents(arg, shape, self.target)
            buf = Buffer._wrap(_zeros(shape, _dtype_of(arg), arg.name), arg.name, exposed=False)
            call.results.append(buf)
            return buf
        if _dlpack_device_type(value, arg.name) not in dlpack.HOST_DEVICES:
            return self._device_argument(arg, value, call)
        array = as_host_array(value, arg.name)
        _check_buffer_type(arg, _array_type(array, arg), array.ndim, array.shape)
        check_extents(arg, array.shape, self.target)  # before any copy of it is made
        if arg.is_output:
            _check_writable(arg, array.flags.writeable)
        if _halide_can_address(array):
            buf = Buffer._wrap(array, arg.name)
            if arg.is_output:
                call.copy_back.append((buf, None))
        elif arg.is_output:
            # Compute into memory Halide can address, then copy into the caller's array.
            buf = Buffer._wrap(_zeros(array.shape, _dtype_of(arg), arg.name), arg.name,
                               exposed=False)
            call.copy_back.append((buf, array))
        else:
            # A copy made once: later runs of a PreparedCall see the copy, not the array.
            buf = Buffer._wrap(_addressable_copy(arg, array), arg.name)
        call.temporaries.append(buf)
        if arg.is_output:
            # The caller's own object back (a torch tensor stays one); numpy for the rest.
            call.results.append(value if hasattr(value, "__dlpack__") else array)
        elif buf._array is array:
            call.array_inputs.append(buf)
        buf.set_host_dirty(not arg.is_output)
        return buf

    def _device_argument(self, arg: Argument, value, call: _Call) -> Buffer:
        """A Buffer over another library's device memory (a CUDA tensor, an OpenCL buffer),
        through DLPack and without copying: outputs are written where the caller's tensor is."""
        try:
            buf = dlpack.to_buffer(value, arg.name)
        except (BufferError, DeviceUnavailable) as e:
            raise ArgumentError(arg.name, f"cannot use {type(value).__name__}'s device memory: "
                                          f"{e}") from None
        _check_buffer_type(arg, buf._type, buf.dimensions, buf.shape)
        if arg.is_output:
            if self.device_kinds and buf.device.kind not in self.device_kinds:
                raise ArgumentError(arg.name, f"{self.name} runs on {'/'.join(sorted(self.device_kinds))}"
                                              f" and cannot write into {buf.device.kind} memory")
            call.results.append(value)
            call.device_outputs.append(buf)
        call.temporaries.append(buf)
        return buf

    def _prepare_device_state(self, buf: Buffer) -> None:
        """Make a Buffer that lives on a device this pipeline does not use acceptable to it:
        its current data goes to host memory (a CPU pipeline fails on device-dirty inputs), and
        a GPU pipeline on another API gets it without a device allocation, which it would
        otherwise refuse as a switch of interfaces."""
        backend = lib.shim_backend_of(buf._raw.device_interface)
        if backend < 0 or self._backend_mask & (1 << backend):
            return  # on a device the pipeline uses, or one the shim does not own
        if buf.device_dirty:
            buf.copy_to_host()
        if self.device_kinds and backend != lib.SHIM_BACKEND_PROXY:
            buf.device_free()

    # --- bounds ----------------------------------------------------------------------------

    def _check_bounds(self, call: _Call) -> None:
        """Run the pipeline's bounds query and refuse inputs that are too small and outputs
        whose shape the pipeline constrains otherwise, before the real call can fail halfway.
        Shapes and scalars that passed once are remembered (the plan's cache, which the fast
        path reads too)."""
        argv_address = int(ffi.cast("uintptr_t", call.argv))
        if self._plan.known(argv_address):
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
                _check_region(arg, d, (raw.dim[d].min, raw.dim[d].extent), buf._box[d])
        self._plan.remember(argv_address)

    # --- running ---------------------------------------------------------------------------

    def _run(self, argv) -> None:
        """One call of the pipeline outside a PreparedCall: the bounds query."""
        with interrupts.deferred():
            context = CallContext.begin()
            try:
                lib.shim_call_set_stream(context.pointer, ffi.cast("void *", streams.current()))
                profiled = profiler.begin_pipeline(f"{self.name} (bounds query)", context.id)
                result = -1
                try:
                    result = lib.shim_call_argv(context.pointer, self._argv_fn, argv)
                    self._finish(context, result)
                finally:
                    profiler.end(profiled, result)
            finally:
                context.end()

    def _finish(self, context: CallContext, result: int) -> None:
        """Hand on what the call printed; raise for a failed call."""
        self._report(result, context.errors(), context.prints() if context.printed() else "",
                     context.id)

    def _finish_fast(self, result: int, errors: bytes, prints: bytes, call_id: int) -> None:
        """_finish for the fast path, which passes the context's text."""
        self._report(result, errors.decode("utf-8", "replace"), prints.decode("utf-8", "replace"),
                     call_id)

    def _report(self, result: int, errors: str, prints: str, call_id: int) -> None:
        if prints:
            sys.stderr.write(prints)
        if result != 0:
            message = errors.strip()
            cause = take_exception(call_id)
            if cause is not None or result in DEVICE_ERROR_CODES:  # a device call failed
                runtime.raise_failure(result, message, cause, self.name)
            raise PipelineError(result, message, context=self.name)

    def _plan_entry(self, arg: Argument) -> tuple:
        """What the call plan knows of an argument (see native_stubs/fastcall.c, plan_init)."""
        if arg.name == USER_CONTEXT:
            role, default = 3, None
        elif arg.is_buffer:
            role, default = (2 if arg.is_output else 1), None
        else:
            role, default = 0, self._scalars[arg.name].default_bytes()
        bounds = [None, None] if arg.is_buffer else [arg.min, arg.max]
        return (arg.name, role, arg.type.code, arg.type.bits, arg.dimensions, *bounds, default)


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
    """The name of the pipeline to use in the library at ``path``, which must be a Halide
    pipeline for the machine this process runs on."""
    if not os.path.isfile(path):
        raise ArgumentError("path", f"no such file: {path}")
    try:
        _check_architecture(path)
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


def _check_architecture(path: str) -> None:
    """dlopen skips a library built for another machine as if it were not there ("No such
    file or directory"): say what is wrong instead. This process runs the code the shim's own
    native library holds."""
    theirs, ours = architecture(path), _host_architecture()
    if theirs != ours:
        raise ArgumentError("path", f"{path} holds {theirs} code; this process runs {ours} code: "
                                    "build the pipeline for this machine")


@functools.cache
def _host_architecture() -> str:
    return architecture(_native.__file__)


def _address(pointer) -> int:
    return int(ffi.cast("uintptr_t", pointer))


def _symbol_address(library, symbol: str) -> int:
    return ctypes.cast(getattr(library, symbol), ctypes.c_void_p).value


def _dlpack_device_type(value, argument: str) -> int:
    """The DLPack device type of an object that has one, else kDLCPU (host memory)."""
    if isinstance(value, (Buffer, np.ndarray)) or not hasattr(value, "__dlpack_device__"):
        return dlpack.DLDeviceType.CPU
    return dlpack.claimed_device(value, argument)[0]


def _dtype_of(arg: Argument) -> np.dtype:
    dtype = arg.type.dtype
    if dtype is None:
        raise ArgumentError(arg.name, f"element type {arg.type} has no numpy equivalent")
    return dtype


def _array_type(array: np.ndarray, arg: Argument):
    try:
        # In native byte order: arrays in the other are converted (see _halide_can_address).
        return HalideType.from_dtype(array.dtype.newbyteorder("="))
    except TypeError:
        raise ArgumentError(arg.name, f"expected {arg.type} elements, got numpy dtype "
                                      f"{array.dtype}") from None


def _check_dimensions(arg: Argument, dimensions: int, shape) -> None:
    """As many dimensions as the pipeline declares, and at least one element: Halide has no
    use for an empty buffer (numpy gives empty arrays zero strides, which Halide refuses)."""
    if dimensions != arg.dimensions:
        raise ArgumentError(arg.name, f"expected a {arg.dimensions}-D buffer, got {dimensions}-D "
                                      f"with shape {tuple(shape)}")
    if 0 in shape:
        raise ArgumentError(arg.name, f"the array is empty (shape {tuple(shape)}); pipelines take "
                                      "buffers with at least one element along every axis")


def _check_writable(arg: Argument, writeable: bool) -> None:
    if not writeable:
        raise ArgumentError(arg.name, "the output's memory is read-only (a numpy array with "
                                      "writeable=False, bytes, a read-only mmap, ...): pass "
                                      "writable memory, or a shape to have the output allocated")


def _check_buffer_type(arg: Argument, htype, dimensions: int, shape) -> None:
    if htype != arg.type:
        raise ArgumentError(arg.name, f"expected {arg.type} elements, got {htype}")
    _check_dimensions(arg, dimensions, shape)


def _halide_can_address(array: np.ndarray) -> bool:
    """Whether Halide's default constraints accept the array as it is: native byte order,
    strides of whole elements that fit in 32 bits, none negative, and unit stride in x (the
    last numpy axis). Zero strides elsewhere (a broadcast) are fine."""
    itemsize = array.dtype.itemsize
    if not array.dtype.isnative or any(s < 0 or s % itemsize or s // itemsize > INT32_MAX
                                       for s in array.strides):
        return False
    return array.ndim == 0 or array.shape[-1] == 1 or array.strides[-1] == itemsize


def _addressable_copy(arg: Argument, array: np.ndarray) -> np.ndarray:
    """A copy of an input that Halide can address, no larger than it must be: axes the array
    is broadcast along (stride 0), other than x, stay broadcast, so that a broadcast input
    costs one row, not its full size. Refused before copying if this machine cannot hold it."""
    x = array.ndim - 1
    core = array[tuple(slice(0, 1) if stride == 0 and axis != x else slice(None)
                       for axis, stride in enumerate(array.strides))]
    dtype = _dtype_of(arg)
    _check_memory(core.shape, dtype, arg.name)
    return np.broadcast_to(np.array(core, dtype, order="C"), array.shape)


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
                              f"the pipeline writes {dimension_label(d, arg.dimensions)} over "
                              f"{wanted} but the output covers {covered}")
    elif want_extent > 0 and (want_min < have_min or want_min + want_extent > have_min + have_extent):
        raise BoundsError(arg.name, lib.halide_error_code_access_out_of_bounds,
                          f"too small: the pipeline reads {dimension_label(d, arg.dimensions)} "
                          f"over {wanted} but the input covers {covered}")


class PreparedCall(PreparedRun):
    """A pipeline call whose arguments are marshalled and bounds-checked once (see
    Pipeline.prepare). Calling it runs the pipeline and returns the outputs, as calling the
    Pipeline would; ``close()`` (or leaving its ``with`` block) frees the device memory of the
    buffers the shim made for the caller's arrays."""

    def __init__(self, pipeline: Pipeline, call: _Call):
        self._pipeline = pipeline
        self._call = call
        buffers = [buf for _, _, buf in call.buffers]
        self._raw_buffers = ffi.new("halide_buffer_t *[]", [buf._raw for buf in buffers] or 1)
        self._outputs = [buf for _, arg, buf in call.buffers if arg.is_output]
        self._inputs = [buf for _, arg, buf in call.buffers if not arg.is_output]
        # (struct, family, is_output) of every buffer argument, for the families' records of
        # the call.
        self._arguments = [(buf._raw, buf._family, arg.is_output) for _, arg, buf in call.buffers]
        native = self._native_run()
        if native is not None:
            super().__init__(*native)

    # Calling a PreparedCall (PreparedRun's __call__) runs it in C where it can, else here.
    def _run_in_python(self):
        # Ctrl-C lands once the call is over and its bookkeeping done (shim/interrupts.py).
        with interrupts.deferred():
            self._run_once()
        return self._results()

    def _native_run(self) -> tuple | None:
        """PreparedRun's arguments, where this call can run in C (native_stubs/prepared_call.c):
        its pipeline's calls may, and its results need no copying into the caller's arrays or
        tensors."""
        pipeline, call = self._pipeline, self._call
        if (not pipeline._native_calls or call.device_outputs
                or any(target is not None for _, target in call.copy_back)
                or len(call.buffers) > _NATIVE_RUN_BUFFERS):
            return None
        inputs = [families.address_of(buf._raw) for _, arg, buf in call.buffers if not arg.is_output]
        array_inputs = {id(buf) for buf in call.array_inputs}
        to_host = {id(buf) for buf, _ in call.copy_back}
        members = [(buf, buf._record, arg.is_output,
                    arg.is_output and families.address_of(buf._raw) not in inputs,
                    id(buf) in array_inputs, id(buf) in to_host)
                   for _, arg, buf in call.buffers]
        results = call.results[0] if len(call.results) == 1 else tuple(call.results)
        return (_address(pipeline._argv_fn), _address(call.argv), _address(self._raw_buffers),
                pipeline._backend_mask, not pipeline.device_kinds, members, results,
                pipeline._finish_fast, runtime.end_call)

    def _run_once(self) -> None:
        pipeline, call = self._pipeline, self._call
        for buf in call.array_inputs:
            buf.set_host_dirty(True)  # the caller may have written to the array since
        context = CallContext.begin(reset=False)
        try:
            profiled = profiler.begin_pipeline(pipeline.name, context.id)
            result = -1
            try:
                for _ in range(_PREPARATION_ATTEMPTS):
                    result = self._run_with_uses(context)
                    if result != lib.SHIM_CALL_NEEDS_PREPARATION:
                        break
                    # Outside the call's uses: preparing waits for other threads' calls on
                    # those buffers like any operation, and they never wait for this one.
                    for _, _, buf in call.buffers:
                        pipeline._prepare_device_state(buf)
                else:
                    raise DeviceError(lib.halide_error_code_incompatible_device_interface,
                                      "other threads kept moving this call's buffers to a "
                                      "device the pipeline does not use", context=pipeline.name)
                pipeline._finish(context, result)
            finally:
                profiler.end(profiled, result)
        finally:
            context.end()

    def _run_with_uses(self, context: CallContext) -> int:
        """One run, with the call's uses recorded in its buffers' families (shim/runtime.py)
        from before it starts until its results are taken in. NEEDS_PREPARATION: it did not
        run."""
        pipeline = self._pipeline
        uses = runtime.begin_call(context.id, self._arguments, host_write=not pipeline.device_kinds)
        result = lib.SHIM_CALL_NEEDS_PREPARATION
        stream = streams.current()
        try:
            try:
                if pipeline.device_kinds:
                    for backend, memory in self._device_memories():
                        backend.order_before(memory, stream)
                result = self._run(context)
            finally:
                if result != lib.SHIM_CALL_NEEDS_PREPARATION:
                    if pipeline.device_kinds:
                        for backend, memory in self._device_memories():
                            backend.ran_on(memory, stream)
                    else:
                        for buf in self._outputs:
                            # Code compiled for the CPU only writes outputs without marking
                            # them host-dirty; a device copy they may have would go stale.
                            lib.shim_flags_assign(buf._raw, lib.halide_buffer_flag_host_dirty,
                                                  True)
        except BackendError as e:  # ordering the call's work across streams: a driver call
            raise DeviceError(lib.halide_error_code_gpu_device_error, str(e),
                              context=pipeline.name) from e
        finally:
            # Even when ordering failed: uses left recorded would make every later operation
            # on these buffers wait for this call forever.
            runtime.end_call(context.id, uses)  # a crop's results reach its parent
        return result

    def _device_memories(self):
        """(backend, allocation) of each of the call's Buffers that has one, for the backends'
        ordering of work across streams."""
        for _, family, _ in self._arguments:
            backend, memory = family.backend, family.memory
            if backend is not None and memory is not None:
                yield backend, memory

    def _results(self):
        call = self._call
        for buf in self._inputs:
            buf._unread = False
        for buf in self._outputs:
            buf._unread = True
        for output in call.device_outputs:
            output.copy_to_device()  # a CPU pipeline's results are still in host memory
        for output, target in call.copy_back:
            output.copy_to_host()
            if target is not None:
                np.copyto(target, output.numpy())
        return call.results[0] if len(call.results) == 1 else tuple(call.results)

    def _run(self, context: CallContext) -> int:
        call, pipeline = self._call, self._pipeline
        return lib.shim_call_run(context.pointer, context.id, ffi.cast("void *", streams.current()),
                                 pipeline._argv_fn, call.argv, self._raw_buffers,
                                 len(call.buffers), pipeline._backend_mask)

    def close(self) -> None:
        _free_temporaries(self._call)

    def __enter__(self) -> PreparedCall:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _free_temporaries(call: _Call) -> None:
    for temporary in call.temporaries:
        temporary.device_free()
    call.temporaries.clear()
