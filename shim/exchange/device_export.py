"""Handing a Buffer's device memory to another library, zero-copy: the steps DLPack's device
export (shim/exchange/dlpack_export.py), ``__cuda_array_interface__`` (shim/exchange/cuda_array_interface.py) and
``shim.to_pyopencl`` (shim/interop/pyopencl_interop.py) share. (This module sits under shim/buffers/buffer.py,
as they do: it uses the Buffer it is given, never the class.)

``share`` takes them in order:

1. make the device copy current: what the host holds newer is uploaded (``copy_to_device``);
2. with ``copy``, export a new dense copy made on the device instead (DLPack's ``copy=True``);
3. mark the Buffer device-dirty, since the consumer may write through what it gets (its next
   host read downloads), unless its memory is read-only: then it is exported read-only and
   no dirty bit changes;
4. pin the allocation (shim/core/buffer_operations.py: it stays allocated, and is never pooled for
   reuse, until the consumer lets go, whatever happens to the Buffer meanwhile);
5. order the consumer's stream or queue after the work that wrote the memory
   (``backend.make_visible``);
6. the memory's native pointer and byte offset, with the Buffer's shape and strides in numpy
   order, go to the caller's ``hold``, which hands them over and keeps the pin for the
   consumer's lifetime, Ctrl-C held until it has (shim/native/interrupts.py).

What differs stays with the callers: which device the Buffer must be on and what a Buffer
elsewhere gets (DLPack: BufferError; the CUDA Array Interface: AttributeError; pyopencl: the
Buffer moves), the consumer's stream, read-only memory (DLPack flags it; the CUDA Array
Interface says so; pyopencl refuses it), and what keeps the pin (a capsule, the Buffer, a
pyopencl memory object).

Another thread may free, move or write the Buffer while it is exported: a free or move before
the mark, or a host write before it, and a free or move before the pin, are a BufferError
naming the export and the Buffer (DLPack's error, which the other two raise as well), with the
Buffer's state what the other thread made it and no pin held. A device operation that fails
is a DeviceError, as anywhere in the shim.
"""

from __future__ import annotations

from typing import NamedTuple

from shim.core import buffer_operations
from shim.native import interrupts
from shim.core.bridge import backend_calls
from shim.base.errors import ArgumentError, DeviceError
from shim.native import lib


class Exported(NamedTuple):
    """What a consumer is given: ``source``'s device memory (``source`` is the Buffer
    exported, or DLPack's copy of it)."""

    source: object  # the shim.Buffer whose memory this is
    handle: int  # its device handle, pinned
    data: int  # the backend's native pointer (a CUdeviceptr, a cl_mem)
    offset: int  # bytes from ``data`` to the Buffer's min element
    shape: tuple  # numpy order
    strides: tuple  # in elements, numpy order
    read_only: bool

    @property
    def byte_strides(self) -> tuple:
        itemsize = self.source.dtype.itemsize
        return tuple(stride * itemsize for stride in self.strides)


def share(buf, backend, consumer, hold, *, what: str, copy: bool = False):
    """Export the device memory of the Buffer ``buf`` (on ``backend``, where it goes first if
    need be) to a consumer that uses it on ``consumer`` (a stream or queue as
    ``backend.make_visible`` takes it); returns ``hold(exported, unpin)``, which must keep
    ``unpin`` and call it once the consumer is done. If ``hold`` raises, the consumer got
    nothing: the pin goes at once (and a later call of ``unpin`` does nothing). ``what``
    names the export in errors.
    (The steps, and what a race with another thread gives: the module's docstring.)"""
    buf.copy_to_device(backend)  # what the host holds newer goes up: the export is current
    source, read_only = buf, False
    if copy:
        source = buf.copy_on_device(backend)  # nobody else has it: no mark
    elif not buf.writeable:
        read_only = True  # no consumer's writes would ever reach it
    else:
        _mark_device_dirty(buf, what)
    with interrupts.deferred():  # (the pin and what releases it exist together)
        unpin, handle, memory = _pin(source, backend, what)
        unpin = _once(unpin)  # (``hold`` may have handed it to a keeper before it failed)
        try:
            with backend_calls(what):
                backend.make_visible(consumer, memory)
            data, offset = backend.dlpack_data(handle)
            strides = tuple(source.dim(i).stride() for i in reversed(range(source.dimensions())))
            return hold(Exported(source, handle, data, offset, source.shape, strides, read_only),
                        unpin)
        except BaseException:
            unpin()
            raise


def _mark_device_dirty(buf, what: str) -> None:
    """The consumer may write through what it gets: from now on the device copy is the truth."""
    try:
        buf.set_device_dirty(True)
    except ArgumentError:
        raise _raced(buf, what) from None  # no allocation: freed meanwhile
    except DeviceError as e:
        if e.code != lib.halide_error_code_host_and_device_dirty:
            raise
        raise _raced(buf, what) from None  # the host memory written meanwhile
    buf.mark_read()


def _pin(buf, backend, what: str):
    try:
        return buffer_operations.pin_device(buf.raw, backend)
    except BufferError:
        raise _raced(buf, what) from None  # no longer on ``backend``: freed or moved meanwhile


def _once(unpin):
    """``unpin``, which does something the first time it is called only."""
    pending = [unpin]

    def release() -> None:
        try:
            first = pending.pop()  # (atomic: two threads cannot both get it)
        except IndexError:
            return
        first()

    return release


def _raced(buf, what: str) -> BufferError:
    return BufferError(f"{what}: another thread freed or moved the device memory of {buf!r}, "
                       "or wrote its host memory, during the export")
