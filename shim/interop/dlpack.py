"""DLPack import: ``shim.from_dlpack``, a Buffer over the data of numpy, PyTorch, CuPy or any
array-API library's tensor, on the CPU and on the device, without copies. As a consumer, the
shim passes the producer the stream its own pipelines run on.

The capsules themselves, read and checked, are shim/exchange/dlpack_capsules.py; a Buffer's own export
(``__dlpack__``) is shim/exchange/dlpack_export.py. A Buffer over device memory another library owns
(``over_device_memory``) serves pyopencl's Arrays too (shim/interop/pyopencl_interop.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from shim.core import buffer_operations
from shim.native import flags
from shim.core.bridge import backend_calls
from shim.buffers.buffer import Buffer
from shim.backends.devices import device as get_device
from shim.backends.devices import kind_for_dlpack
from shim.exchange.dlpack_capsules import (
    HOST_DEVICES,
    ImportedTensor,
    claimed_device,
    device_name,
    span_bytes,
)
from shim.base.errors import ArgumentError

if TYPE_CHECKING:
    from shim.exchange.dlpack_capsules import DLPackProducer


def from_dlpack(obj: DLPackProducer, *, copy: bool | None = None) -> Buffer:
    """A Buffer over the data of any object with ``__dlpack__``: CPU memory zero-copy, CUDA
    and OpenCL memory wrapped as the Buffer's device allocation (zero-copy, the producer kept
    alive). ``copy=True`` copies, ``copy=False`` refuses to. Anything wrong with what the
    producer says or hands over raises ArgumentError."""
    claimed = claimed_device(obj, "obj")
    if claimed[0] in HOST_DEVICES:
        array = ImportedTensor(obj, None, claimed, "obj").host_view()
        return Buffer(array.copy() if copy else array)
    buf = device_buffer(obj, claimed, "obj")
    return buf.copy_on_device(buf.device) if copy else buf


def device_buffer(obj, claimed, argument: str) -> Buffer:
    """A Buffer over the device memory of ``obj``, whose ``__dlpack_device__`` said
    ``claimed`` (a device, not the host), without copying."""
    backend = _backend_for(claimed, argument)
    with backend_calls("DLPack import"):
        stream = backend.dlpack_stream()
    return _on_device(ImportedTensor(obj, stream, claimed, argument), backend)


def _backend_for(device, argument: str):
    kind = kind_for_dlpack(device[0])
    if kind is None:
        raise ArgumentError(argument, f"its data is on {device_name(device)}, which no backend "
                                      "of the shim holds")
    backend = get_device(kind)
    if device[1] != backend.dlpack_device_id():
        raise ArgumentError(argument, f"its data is on {device_name(device)}; the shim's {kind} "
                                      f"backend uses device {backend.dlpack_device_id()}")
    return backend


def _on_device(imported: ImportedTensor, backend) -> Buffer:
    """A Buffer whose device allocation on ``backend`` is the imported tensor's memory."""
    t = imported.tensor
    if t.data == 0:
        imported.refuse("NULL device memory, which cannot be wrapped")
    if any(s < 0 for s in t.strides):
        imported.refuse("negative strides, which a device allocation cannot have")
    try:
        with backend_calls("DLPack import"):
            backend.check_dlpack_memory(t.data, t.byte_offset, t.nbytes)
    except BufferError as e:
        imported.refuse(f"memory the shim cannot use: {e}")
    return over_device_memory(backend, t.data, t.byte_offset, t.shape, t.strides, t.htype,
                              imported.argument, imported)


def over_device_memory(backend, native: int, byte_offset: int, shape, strides, htype,
                       argument: str, owner) -> Buffer:
    """A Buffer whose device allocation on ``backend`` is memory someone else allocated
    (``native``: a cl_mem, a CUdeviceptr), its first element ``byte_offset`` bytes in, laid
    out by ``strides`` (in elements, none negative); ``owner`` (what keeps that memory alive)
    lives as long as the Buffer and its crops. Checking the memory is the caller's job.

    The Buffer is device-dirty: the data lives there. Its host memory is a staging area of
    the shim's, which nobody else sees: dropping the Buffer copies nothing into it."""
    itemsize = htype.bytes
    nbytes = span_bytes(shape, strides, itemsize)
    host = np.lib.stride_tricks.as_strided(
        np.empty(max(nbytes, itemsize), np.uint8).view(htype.dtype), shape,
        tuple(s * itemsize for s in strides))
    buf = Buffer.over_array(host, argument, exposed=False, keepalive=owner)
    buffer_operations.wrap_device(buf.raw, backend, native, byte_offset)
    flags.assign(buf.raw, flags.DEVICE_DIRTY, True)  # it lives there
    return buf
