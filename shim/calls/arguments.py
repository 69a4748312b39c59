"""What each buffer argument of a call is, decided once, here, and one adapter per kind that
turns its value into the Buffer a run passes to the pipeline (its ``halide_buffer_t``):

- ``shim.Buffer``: itself, checked;
- a shape (a tuple or list, for an output): new zeroed memory of that shape;
- a pyopencl Array: a Buffer over its OpenCL memory (shim/interop/pyopencl_interop.py);
- a DLPack producer whose data is on a device: a Buffer over that device memory
  (shim/interop/dlpack.py);
- host memory: numpy arrays, DLPack producers on the CPU, anything with the buffer protocol
  (a halide.Buffer among them, with its mins), a Buffer over it, or over a copy Halide can
  address.

``kind_of`` is the one place that asks a value what it is (a producer's
``__dlpack_device__`` once), and each adapter calls only modules below this one: an argument
goes down, never back up (tests/test_arguments.py follows one of each kind). The results and
the memory each run needs handled around it are recorded in the call's ``Call``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from shim.base.errors import ArgumentError, DeviceUnavailable, LayoutWarning, warn_caller
from shim.base.types import INT32_MAX, HalideType, is_halide
from shim.exchange.dlpack_capsules import HOST_DEVICES, ImportedTensor, claimed_device
from shim.buffers.buffer import Buffer, as_host_array
from shim.buffers.buffer_arguments import check_memory, shape_tuple, zeroed
from shim.interop import dlpack, pyopencl_interop
from shim.calls.metadata import Argument, check_extents


class Call:
    """The native form of one call's arguments, and what must happen around each run."""

    __slots__ = ("argv", "keep_alive", "buffers", "array_inputs", "temporaries", "copy_back",
                 "device_outputs", "results")

    def __init__(self):
        self.argv = None
        # The scalars' C values, which argv points to.
        self.keep_alive = []
        # (index into argv, Argument, Buffer) for each buffer argument.
        self.buffers = []
        # Buffers the shim made over the caller's input arrays: host-dirty before every run,
        # since the caller may have written to the array.
        self.array_inputs = []
        # Buffers the shim made for this call; their device memory is freed when it closes.
        self.temporaries = []
        # (output Buffer, the caller's array to copy it into, or None when the Buffer is a
        # view of that array) for outputs given as arrays: their results go back to host memory.
        self.copy_back = []
        # Outputs over another library's device memory (DLPack): their results go to that memory.
        self.device_outputs = []
        # What the call returns, in metadata order of the outputs.
        self.results = []


class PipelineFacts(NamedTuple):
    """What the adapters need to know of the pipeline: its name, target string and the
    device kinds it runs on."""

    name: str
    target: str
    device_kinds: frozenset


def buffer_for(arg: Argument, value, call: Call, pipeline: PipelineFacts) -> Buffer:
    """The Buffer the pipeline gets for buffer argument ``arg`` given as ``value`` (never
    MISSING: the caller says what a missing one means)."""
    adapter, claimed = kind_of(arg, value)
    return adapter(arg, value, claimed, call, pipeline)


def kind_of(arg: Argument, value):
    """(The adapter for ``value``, the DLPack device it claims or None.)"""
    if isinstance(value, Buffer):
        return _given_buffer, None
    if arg.is_output and isinstance(value, (tuple, list)):
        return _output_shape, None
    if pyopencl_interop.is_array(value):
        return _pyopencl_array, None
    if not isinstance(value, np.ndarray) and (hasattr(value, "__dlpack__")
                                              or hasattr(value, "__dlpack_device__")):
        claimed = claimed_device(value, arg.name)  # (which needs both)
        return (_host_memory if claimed[0] in HOST_DEVICES else _device_tensor), claimed
    return _host_memory, None


# --- the adapters: (arg, value, claimed, call, pipeline) -> Buffer --------------------------

def _given_buffer(arg, buf: Buffer, _claimed, call: Call, pipeline: PipelineFacts) -> Buffer:
    _check_buffer_type(arg, buf.element_type, buf.dimensions(), buf.shape)
    check_extents(arg, buf.shape, pipeline.target)
    if arg.is_output:
        _check_writable(arg, buf.writeable)
        call.results.append(buf)
    return buf


def _output_shape(arg, value, _claimed, call: Call, pipeline: PipelineFacts) -> Buffer:
    buf = output_of_shape(arg, value, pipeline)
    call.results.append(buf)
    return buf


def output_of_shape(arg: Argument, value, pipeline: PipelineFacts) -> Buffer:
    """The Buffer an output given as a shape (numpy order) gets: zeroed memory the shim
    allocates, which nobody else sees. Also what the fast path asks for one (Signature.output_of_shape)."""
    shape = shape_tuple(value, arg.name)
    check_dimensions(arg, len(shape), shape)
    check_extents(arg, shape, pipeline.target)
    return Buffer.over_array(zeroed(shape, dtype_of(arg), arg.name), arg.name, exposed=False)


def _pyopencl_array(arg, value, _claimed, call: Call, pipeline: PipelineFacts) -> Buffer:
    return _over_device_memory(arg, value, call, pipeline, pyopencl_interop.from_pyopencl)


def _device_tensor(arg, value, claimed, call: Call, pipeline: PipelineFacts) -> Buffer:
    return _over_device_memory(arg, value, call, pipeline,
                               lambda obj, name: dlpack.device_buffer(obj, claimed, name))


def _host_memory(arg, value, claimed, call: Call, pipeline: PipelineFacts) -> Buffer:
    mins = None
    if claimed is not None:  # a DLPack producer on the CPU: its claim is checked once
        array = ImportedTensor(value, None, claimed, arg.name).host_view()
    elif is_halide(value, "Buffer"):
        array, mins = _halide_buffer_memory(value, arg)
    else:
        array = as_host_array(value, arg.name)
        if array.ndim > 1 and array.flags.f_contiguous and not array.flags.c_contiguous:
            warn_caller(f"{arg.name}: a Fortran-ordered array: its last axis (extent "
                        f"{array.shape[-1]}) is x, as halide.Buffer(array) takes it; a Python "
                        f"extension Halide generates would take its first (load with "
                        f"convention='extension' for that)", LayoutWarning)
    _check_buffer_type(arg, _array_type(array, arg), array.ndim, array.shape)
    check_extents(arg, array.shape, pipeline.target)  # before any copy of it is made
    if arg.is_output:
        _check_writable(arg, array.flags.writeable)
    if _halide_can_address(array):
        buf = Buffer.over_array(array, arg.name, mins=mins)
        if arg.is_output:
            call.copy_back.append((buf, None))
    elif arg.is_output:
        # Compute into memory Halide can address, then copy into the caller's array.
        buf = Buffer.over_array(zeroed(array.shape, dtype_of(arg), arg.name), arg.name,
                                exposed=False, mins=mins)
        call.copy_back.append((buf, array))
    else:
        # A copy made once: later runs of a PreparedCall see the copy, not the array.
        buf = Buffer.over_array(_addressable_copy(arg, array), arg.name, mins=mins)
    call.temporaries.append(buf)
    if arg.is_output:
        # The caller's own object back (a torch tensor, a halide.Buffer stay one); numpy for
        # the rest.
        own = hasattr(value, "__dlpack__") or is_halide(value, "Buffer")
        call.results.append(value if own else array)
    elif buf.is_over(array):
        call.array_inputs.append(buf)
    buf.set_host_dirty(not arg.is_output)
    return buf


def _halide_buffer_memory(value, arg: Argument) -> tuple[np.ndarray, list]:
    """A halide.Buffer's host memory (its buffer protocol: numpy's axis order) and its mins.
    Its device memory belongs to Halide's own runtime, which the shim cannot hand to its own:
    where the device holds the newer data, Halide's runtime brings it home first. An output's
    device copy is marked stale (the pipeline writes the host)."""
    if value.device_dirty():
        value.copy_to_host()
    if arg.is_output:
        value.set_host_dirty(True)
    mins = [value.dim(d).min() for d in range(value.dimensions())]
    return as_host_array(value, arg.name), mins


def _over_device_memory(arg, value, call: Call, pipeline: PipelineFacts, to_buffer) -> Buffer:
    """A Buffer over another library's device memory (a CUDA tensor, an OpenCL buffer,
    through DLPack; a pyopencl Array), made by ``to_buffer`` without copying: outputs are
    written where the caller's tensor is."""
    try:
        buf = to_buffer(value, arg.name)
    except (BufferError, DeviceUnavailable) as e:
        raise ArgumentError(arg.name, f"cannot use {type(value).__name__}'s device memory: "
                                      f"{e}") from None
    _check_buffer_type(arg, buf.element_type, buf.dimensions(), buf.shape)
    if arg.is_output:
        if pipeline.device_kinds and (buf.device.api or buf.device.kind) not in pipeline.device_kinds:
            raise ArgumentError(arg.name, f"{pipeline.name} runs on "
                                          f"{'/'.join(sorted(pipeline.device_kinds))} and "
                                          f"cannot write into {buf.device.kind} memory")
        call.results.append(value)
        call.device_outputs.append(buf)
    # Not a temporary: freeing its device memory would download what it holds into the
    # shim's staging memory, which nobody reads. Dropped with the call, it copies nothing.
    return buf


# --- checks ---------------------------------------------------------------------------------

def dtype_of(arg: Argument) -> np.dtype:
    """The numpy dtype of ``arg``'s elements, for memory the shim allocates for it."""
    dtype = arg.type.dtype
    if dtype is None:
        raise ArgumentError(arg.name, f"element type {arg.type} has no numpy equivalent")
    return dtype


def check_dimensions(arg: Argument, dimensions: int, shape) -> None:
    """As many dimensions as the pipeline declares, and at least one element: Halide has no
    use for an empty buffer (numpy gives empty arrays zero strides, which Halide refuses)."""
    if dimensions != arg.dimensions:
        raise ArgumentError(arg.name, f"expected a {arg.dimensions}-D buffer, got {dimensions}-D "
                                      f"with shape {tuple(shape)}")
    if 0 in shape:
        raise ArgumentError(arg.name, f"the array is empty (shape {tuple(shape)}); pipelines take "
                                      "buffers with at least one element along every axis")


def _array_type(array: np.ndarray, arg: Argument):
    try:
        # In native byte order: arrays in the other are converted (see _halide_can_address).
        return HalideType.from_dtype(array.dtype.newbyteorder("="))
    except TypeError:
        raise ArgumentError(arg.name, f"expected {arg.type} elements, got numpy dtype "
                                      f"{array.dtype}") from None


def _check_writable(arg: Argument, writeable: bool) -> None:
    if not writeable:
        raise ArgumentError(arg.name, "the output's memory is read-only (a numpy array with "
                                      "writeable=False, bytes, a read-only mmap, ...): pass "
                                      "writable memory, or a shape to have the output allocated")


def _check_buffer_type(arg: Argument, htype, dimensions: int, shape) -> None:
    if htype != arg.type:
        raise ArgumentError(arg.name, f"expected {arg.type} elements, got {htype}")
    check_dimensions(arg, dimensions, shape)


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
    dtype = dtype_of(arg)
    check_memory(core.shape, dtype, arg.name)
    return np.broadcast_to(np.array(core, dtype, order="C"), array.shape)
