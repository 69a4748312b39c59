"""A shim.Buffer's data as DLPack: ``Buffer.__dlpack__`` and ``__dlpack_device__``, to numpy,
PyTorch, CuPy or any array-API library, on the CPU and on the device, without copies, in
stream order. (This module sits under shim/buffers/buffer.py, which calls it: it uses the Buffer it is
given, never the class.)

Export follows the Python array API standard (2024.12) for ``__dlpack__``: a versioned
capsule (DLPack 1.x) when the consumer's ``max_version`` allows, else a legacy one; READ_ONLY
and IS_COPIED flags; ``dl_device`` and ``copy``; BufferError where the export is impossible.
Shapes and strides are Halide's dimensions reversed, so crops export as strided views; a
capsule keeps the Buffer (and its memory) alive until the consumer's deleter runs, once.

Where a Buffer's data is: the standard says

    __dlpack_device__: "Returns device type and device ID in DLPack format. Meant for use
    within from_dlpack()."

    __dlpack__(dl_device=): "the DLPack device type. Default is None, meaning the exported
    capsule should be on the same device as self is. [...] If the device type cannot be
    handled by the producer, this function must raise BufferError. The v2023.12 standard
    only mandates that a compliant library should offer a way for __dlpack__ to return a
    capsule referencing an array whose underlying memory is accessible to the Python
    interpreter (represented by the kDLCPU enumerator in DLPack). If a copy must be made to
    enable this support but copy is set to False, the function must raise BufferError."

    __dlpack__(copy=): "If True, the function must always copy [...]. If False, the function
    must never copy, and raise a BufferError in case a copy is deemed necessary (e.g. if a
    cross-device data movement is requested, and it is not possible without a copy). If
    None, the function must reuse the existing memory buffer if possible and copy
    otherwise. [...] When a copy happens, the DLPACK_FLAG_BITMASK_IS_COPIED flag must be
    set."

A shim.Buffer always has host memory, and may have a device allocation mirroring it. Which
of the two "self is" on, the shim's rule (``device_of``):

- a Buffer without a device allocation, or on the simulated host device: (kDLCPU, 0);
- on OpenCL, clean, host-dirty or device-dirty alike: (kDLCPU, 0). No mainstream consumer
  (numpy, PyTorch, CuPy, JAX) reads kDLOpenCL, and a consumer that calls ``__dlpack__()``
  without ``dl_device`` gets what ``__dlpack_device__`` announced: here the Buffer's own host
  memory, device results downloaded into it first. ``dl_device=(kDLOpenCL, 0)`` still gives
  the device memory, zero-copy, to a consumer that asks for it;
- on CUDA: (kDLCUDA, ordinal), the device memory, zero-copy and stream-ordered, unless the
  host holds changes the device lacks (host-dirty): then (kDLCPU, 0).

Exporting the Buffer's own memory is no copy, on either side: the host export downloads
device results into the Buffer's host memory (its own mirror, as ``numpy()`` does) and shares
that, so ``copy=False`` is fine; the device export of a host-dirty Buffer uploads first. Only
``copy=True`` copies (flagged IS_COPIED). A device export asked of a Buffer with no allocation
on that device raises BufferError (``copy_to_device`` it first).

Since a consumer may write through what it was given, the side exported becomes the truth:
after a writable host export a Buffer with a device allocation is host-dirty (its next device
use uploads), after a writable device export it is device-dirty (its next host read
downloads). Writes the consumer makes after that, once the Buffer has been used on the other
side again, need ``set_host_dirty()`` / ``set_device_dirty()``, as writes through ``numpy()``
do. Read-only memory is exported read-only (READ_ONLY, which needs a versioned capsule) and
changes no dirty bit.

Streams: on CUDA the consumer passes its stream and the shim makes its pending work visible
there (event record, stream wait): None or 1 is the legacy default stream, 2 the per-thread
default, -1 asks for no synchronization, 0 is refused as ambiguous. The standard defines no
value for OpenCL; here it is the cl_command_queue handle of a queue this process holds through
pyopencl, as an int (None: the shim's queue is finished first; any other int is refused, since a
handle cannot be checked without dereferencing it). A host export takes no stream (the
standard: "when kDLCPU is in use, stream must be None").
"""

from __future__ import annotations

import numpy as np

from shim.exchange import device_export
from shim.native import interrupts
from shim.core.bridge import backend_calls
from shim.exchange.dlpack_capsules import (
    IS_COPIED,
    READ_ONLY,
    DLDeviceType,
    device_name,
    device_pair,
    make_capsule,
    version_tuple,
)
from shim.base.errors import DeviceError
from shim.native import lib
from shim.base.types import HalideType

# How often a host export downloads a buffer that other threads keep writing on the device.
_HOST_EXPORT_ATTEMPTS = 100


def device_of(buf) -> tuple[DLDeviceType, int]:
    """``__dlpack_device__``: where the Buffer ``buf``'s data is exported by default (the
    module's rule): its device allocation, unless the host holds changes the device lacks, the
    device has no DLPack type, or consumers rarely read it (the backend's
    ``dlpack_on_request_only``: OpenCL's, Vulkan's)."""
    backend = buf.device
    if backend is None or backend.dlpack_device_type is None or buf.host_dirty() \
            or backend.dlpack_on_request_only:
        return DLDeviceType.CPU, 0
    return DLDeviceType(backend.dlpack_device_type), backend.dlpack_device_id()


def export(buf, *, stream=None, max_version=None, dl_device=None, copy=None):
    """``__dlpack__``: a capsule for the Buffer ``buf``'s data. (Ctrl-C waits until the capsule
    and the pin on the device memory that it owns exist together: see shim/native/interrupts.py.)"""
    with interrupts.deferred():
        return _export(buf, stream, max_version, dl_device, copy)


def _export(buf, stream, max_version, dl_device, copy):
    target = device_of(buf) if dl_device is None else _requested_device(dl_device)
    versioned = max_version is not None and version_tuple(max_version)[0] >= 1
    if target[0] == DLDeviceType.CPU:
        return _export_host(buf, stream, copy, versioned, max_version)
    return _export_device(buf, target, stream, copy, versioned, max_version)


def _export_host(buf, stream, copy, versioned, max_version):
    if stream is not None:
        raise ValueError("stream must be None when exporting to the CPU")
    if copy:
        array = buf.numpy().copy()  # (device results come home first)
    else:
        array = _current_host_memory(buf)
    flags = (IS_COPIED if copy else 0) | (0 if array.flags.writeable else READ_ONLY)
    if flags & READ_ONLY and not versioned:
        raise BufferError("this buffer's memory is read-only, which only a versioned capsule "
                          "(max_version >= (1, 0)) can say")
    return make_capsule((array,) if copy else (buf, array), array.ctypes.data, 0,
                        (DLDeviceType.CPU, 0), _element_strides(array), array.shape,
                        HalideType.from_dtype(array.dtype), flags, versioned, max_version)


def _current_host_memory(buf) -> np.ndarray:
    """The Buffer's host memory, device results downloaded into it first, and, where it is
    writable, the host made the truth (host-dirty): the consumer may write through it. Another
    thread may write an overlapping region on the device between the download and the mark,
    which then conflict: the download is made again, as often as it takes, up to a point."""
    for _ in range(_HOST_EXPORT_ATTEMPTS):
        array = buf.numpy()
        if not array.flags.writeable:
            return array
        try:
            buf.set_host_dirty(True)
            return array
        except DeviceError as e:
            if e.code != lib.halide_error_code_host_and_device_dirty:
                raise
    raise BufferError(f"other threads kept writing this buffer on the device during the export "
                      f"({_HOST_EXPORT_ATTEMPTS} downloads were overtaken)")


def _export_device(buf, target, stream, copy, versioned, max_version):
    backend = buf.device
    if backend is None or (backend.dlpack_device_type, backend.dlpack_device_id()) != target:
        where = "no device allocation" if backend is None else f"its allocation on {backend.kind}"
        raise BufferError(f"cannot export this buffer to {device_name(target)}: it has {where}; "
                          "copy_to_device() it there first")
    consumer = _consumer_stream(backend, stream)
    copy = copy is True
    if not copy and not buf.writeable and not versioned:
        # Memory the program cannot write (a read-only array's Buffer) is exported read-only.
        raise BufferError("this buffer's memory is read-only, which only a versioned "
                          "capsule (max_version >= (1, 0)) can say")

    def capsule(exported, unpin):
        flags = (IS_COPIED if copy else 0) | (READ_ONLY if exported.read_only else 0)
        return make_capsule((exported.source, unpin), exported.data, exported.offset, target,
                            exported.strides, exported.shape, exported.source.element_type, flags,
                            versioned, max_version)

    return device_export.share(buf, backend, consumer, capsule, what="DLPack export",
                               copy=copy)


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
