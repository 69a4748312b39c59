"""A shim.Buffer's data as DLPack: ``Buffer.__dlpack__`` and ``__dlpack_device__``, to numpy,
PyTorch, CuPy or any array-API library, on the CPU and on the device, without copies, in
stream order. (This module sits under shim/buffer.py, which calls it: it uses the Buffer it is
given, never the class.)

Export follows the Python array API standard (2024.12) for ``__dlpack__``: a versioned
capsule (DLPack 1.x) when the consumer's ``max_version`` allows, else a legacy one; READ_ONLY
and IS_COPIED flags; ``dl_device`` and ``copy``; BufferError where the export is impossible.
Shapes and strides are Halide's dimensions reversed, so crops export as strided views; a
capsule keeps the Buffer (and its memory) alive until the consumer's deleter runs, once.

Streams: on CUDA the consumer passes its stream and the shim makes its pending work visible
there (event record, stream wait): None or 1 is the legacy default stream, 2 the per-thread
default, -1 asks for no synchronization, 0 is refused as ambiguous. The standard defines no
value for OpenCL; here it is the cl_command_queue handle of a queue this process holds through
pyopencl, as an int (None: the shim's queue is finished first; any other int is refused, since a
handle cannot be checked without dereferencing it).
"""

from __future__ import annotations

import numpy as np

from shim import buffer_operations, interrupts
from shim.bridge import backend_calls
from shim.dlpack_capsules import (
    IS_COPIED,
    READ_ONLY,
    DLDeviceType,
    device_name,
    device_pair,
    make_capsule,
    version_tuple,
)
from shim.errors import ArgumentError
from shim.types import HalideType


def device_of(buf) -> tuple[DLDeviceType, int]:
    """``__dlpack_device__``: where the Buffer ``buf``'s current data is: its device
    allocation, unless host memory holds changes the device lacks (or the device has no DLPack
    type)."""
    backend = buf.device
    if backend is None or backend.dlpack_device_type is None or buf.host_dirty():
        return DLDeviceType.CPU, 0
    return DLDeviceType(backend.dlpack_device_type), backend.dlpack_device_id()


def export(buf, *, stream=None, max_version=None, dl_device=None, copy=None):
    """``__dlpack__``: a capsule for the Buffer ``buf``'s data. (Ctrl-C waits until the capsule
    and the pin on the device memory that it owns exist together: see shim/interrupts.py.)"""
    with interrupts.deferred():
        return _export(buf, stream, max_version, dl_device, copy)


def _export(buf, stream, max_version, dl_device, copy):
    here = device_of(buf)
    target = here if dl_device is None else _requested_device(dl_device)
    versioned = max_version is not None and version_tuple(max_version)[0] >= 1
    if target[0] == DLDeviceType.CPU:
        return _export_host(buf, here, stream, copy, versioned, max_version)
    if target != here:
        raise BufferError(f"cannot export a buffer whose data is on {here[0].name}:{here[1]} to "
                          f"{device_name(target)}")
    return _export_device(buf, target, stream, copy, versioned, max_version)


def _export_host(buf, here, stream, copy, versioned, max_version):
    if stream is not None:
        raise ValueError("stream must be None when exporting to the CPU")
    copied = copy is True or here[0] != DLDeviceType.CPU
    if copied and copy is False:
        raise BufferError(f"exporting this buffer to the CPU needs a copy (its data is on "
                          f"{here[0].name}), and copy=False forbids one")
    array = buf.numpy()  # device results come home first
    if copied:
        array = array.copy()
    flags = (IS_COPIED if copied else 0) | (0 if array.flags.writeable else READ_ONLY)
    if flags & READ_ONLY and not versioned:
        raise BufferError("this buffer's memory is read-only, which only a versioned capsule "
                          "(max_version >= (1, 0)) can say")
    return make_capsule((array,) if copied else (buf, array), array.ctypes.data, 0,
                        (DLDeviceType.CPU, 0), _element_strides(array), array.shape,
                        HalideType.from_dtype(array.dtype), flags, versioned, max_version)


def _export_device(buf, target, stream, copy, versioned, max_version):
    backend = buf.device
    if backend is None:
        raise BufferError("the buffer's device memory was freed by another thread during the "
                          "export")
    consumer = _consumer_stream(backend, stream)
    source, flags = buf, 0
    if copy is True:
        source, flags = buf.copy_on_device(backend), IS_COPIED
    elif not buf.writeable:
        # Memory the program cannot write (a read-only array's Buffer) is exported read-only:
        # no consumer's writes would ever reach it.
        if not versioned:
            raise BufferError("this buffer's memory is read-only, which only a versioned "
                              "capsule (max_version >= (1, 0)) can say")
        flags = READ_ONLY
    else:
        # The consumer may write through the tensor: from now on the device copy is the truth.
        try:
            source.set_device_dirty(True)
        except ArgumentError:
            raise BufferError("the buffer's device memory was freed by another thread during "
                              "the export") from None
        source.mark_read()
    unpin, handle, memory = buffer_operations.pin_device(source.raw, backend)
    try:
        with backend_calls("DLPack export"):
            backend.make_visible(consumer, memory)
        data, offset = backend.dlpack_data(handle)
    except BaseException:
        unpin()
        raise
    strides = tuple(source.dim(i).stride() for i in reversed(range(source.dimensions())))
    return make_capsule((source, unpin), data, offset, target, strides, source.shape,
                        source.type(), flags, versioned, max_version)


def _consumer_stream(backend, stream):
    """The consumer's ``stream`` as ``backend.make_visible`` takes it, checked by the backend."""
    if stream is not None and (not isinstance(stream, int) or isinstance(stream, bool)):
        raise TypeError(f"stream must be an int or None, got {type(stream).__name__}")
    with backend_calls("DLPack export"):
        return backend.dlpack_consumer_stream(stream)


def _requested_device(dl_device) -> tuple[DLDeviceType, int]:
    device = device_pair(dl_device)
    if device is None:
        raise BufferError(f"dl_device must be a (device type, device id) pair DLPack knows, "
                          f"got {dl_device!r}")
    return device


def _element_strides(array: np.ndarray) -> tuple:
    return tuple(s // array.itemsize for s in array.strides)
