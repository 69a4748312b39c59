"""pyopencl interop, zero-copy both ways: ``shim.to_pyopencl(buf)``, a ``pyopencl.array.Array``
over a Buffer's OpenCL memory on the shim's context and queue, and ``shim.from_pyopencl(array)``,
a Buffer over an Array's memory (pipelines take Arrays as arguments the same way, inputs and
outputs).

The two sides share one OpenCL context (``shim.device("opencl").context``): OpenCL memory
means nothing in another. On the shim's own in-order queue (``shim.device("opencl").queue``,
the queue of the Arrays ``to_pyopencl`` makes) pyopencl's work and the pipelines' are ordered
as they are enqueued. An imported Array on another queue of the shim's context: the shim's
queue waits for the work enqueued on it so far; after a pipeline wrote into it, that queue
must wait for the shim's before reading (``shim.device("opencl").queue.finish()``, or a
marker), since the shim cannot know when the Array's queue will next use it.

Dirty bits follow DLPack's device export (shim/exchange/device_export.py): the Array may be written,
so the Buffer is device-dirty after ``to_pyopencl`` (its next host read downloads); a Buffer
made by ``from_pyopencl`` is device-dirty, its data living in the Array's memory.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from shim.exchange import device_export
from shim.core import shutdown
from shim.buffers.buffer import Buffer
from shim.backends.devices import device as get_device
from shim.interop.dlpack import over_device_memory
from shim.exchange.dlpack_capsules import span_bytes
from shim.base.errors import ArgumentError
from shim.native import Finalized
from shim.base.types import HalideType

if TYPE_CHECKING:
    import pyopencl.array


def is_array(value) -> bool:
    """Whether ``value`` is a pyopencl Array (never imports pyopencl: if pyopencl.array has not
    been imported, nothing can be one). Another thread may be importing it right now: the
    module is in sys.modules from the start of its import, and until its class statement for
    Array has run, nothing can be an Array either."""
    array_type = getattr(sys.modules.get("pyopencl.array"), "Array", None)
    return isinstance(array_type, type) and isinstance(value, array_type)


def to_pyopencl(buf: Buffer) -> pyopencl.array.Array:
    """A ``pyopencl.array.Array`` over the Buffer ``buf``'s OpenCL memory, without copying, on
    the shim's queue: the Buffer goes to the OpenCL device first if needed (what the host
    holds newer is uploaded; a Buffer on another device moves). A crop is a view at its offset
    into its family's allocation (``array.base_data``, a ``pyopencl.Buffer``: the ``cl_mem`` is
    its ``int_ptr``; ``array.offset``: bytes), strided where the crop is not contiguous
    (pyopencl's own operations refuse those; kernels can take them). The memory stays
    allocated, and is never reused for anything else, as long as any Array over it lives, even
    if the Buffer is dropped or its device memory freed first. (BufferError if another thread
    frees or moves the Buffer's device memory, or writes its host memory, meanwhile: the steps
    and the races are shim/exchange/device_export.py's.)"""
    if not isinstance(buf, Buffer):
        raise ArgumentError("buf", f"expected a shim.Buffer, got {type(buf).__name__}")
    if not buf.writeable:
        raise ArgumentError("buf", "its host memory is read-only, and a pyopencl Array cannot be: "
                                   "writes through it would never reach the host (wrap a "
                                   "writable copy of the array instead)")
    backend = get_device("opencl")
    cl = _pyopencl()

    def array(exported, unpin):
        # The Array's own reference to the cl_mem (OpenCL's reference count keeps it alive),
        # holding the pin until the last Array or view over it goes. (pyopencl's memory
        # objects take attributes but no weak references.)
        memory = cl.Buffer.from_int_ptr(exported.data, retain=True)
        memory.shim_export = _Export(buf, unpin)
        return cl.array.Array(backend.queue, exported.shape, buf.dtype, data=memory,
                              offset=exported.offset, strides=exported.byte_strides)

    # The Array's queue is the shim's own, in order: it follows the shim's work as enqueued.
    return device_export.share(buf, backend, backend.queue, array, what="to_pyopencl(buf)")


def from_pyopencl(array: pyopencl.array.Array, argument: str = "array") -> Buffer:
    """A Buffer over a ``pyopencl.array.Array``'s memory, without copying: its device
    allocation is the Array's (which the Buffer and its crops keep alive; the shim never frees
    it). The Array must be in the shim's OpenCL context; ``argument`` names it in errors."""
    if not is_array(array):
        raise ArgumentError(argument, f"expected a pyopencl.array.Array, got {type(array).__name__}")
    backend = get_device("opencl")
    cl = _pyopencl()
    if array.context.int_ptr != backend.context.int_ptr:
        raise ArgumentError(argument, "a pyopencl Array of another OpenCL context; make it in "
                                      "the shim's (shim.device('opencl').context, or its queue "
                                      "shim.device('opencl').queue)")
    try:
        htype = HalideType.from_dtype(array.dtype)
    except TypeError as e:
        raise ArgumentError(argument, str(e)) from None
    itemsize = array.dtype.itemsize
    if any(s < 0 or s % itemsize for s in array.strides):
        raise ArgumentError(argument, f"strides {array.strides} (bytes); a device allocation "
                                      f"needs non-negative multiples of the element size "
                                      f"({itemsize})")
    memory = array.base_data
    if memory is None:
        raise ArgumentError(argument, f"an empty Array (shape {array.shape}) has no memory to wrap")
    strides = tuple(s // itemsize for s in array.strides)
    end = array.offset + span_bytes(array.shape, strides, itemsize)
    if end > memory.size:
        raise ArgumentError(argument, f"the Array spans bytes [{array.offset}, {end}) of a "
                                      f"pyopencl buffer of {memory.size} bytes")
    queue = array.queue
    if queue is not None and queue.int_ptr != backend.queue.int_ptr:
        # The shim's queue starts the Array's next use after what its own queue holds so far.
        cl.enqueue_barrier(backend.queue, wait_for=[cl.enqueue_marker(queue)])
        queue.flush()
    return over_device_memory(backend, memory.int_ptr, array.offset, array.shape, strides,
                              htype, argument, array)


class _Export(Finalized):
    """What an Array from ``to_pyopencl`` keeps: the Buffer (and the memory it owns, a DLPack
    producer's say) and the pin on its allocation, given up when the Array goes."""

    def __init__(self, buf: Buffer, unpin):
        self.buf, self.unpin = buf, unpin

    def _finalize(self):  # (Finalized's finalizer: Ctrl-C cannot leave the pin held)
        unpin = getattr(self, "unpin", None)
        if unpin is not None and not shutdown.shut_down():  # (at exit, see shim/core/shutdown.py)
            unpin()


def _pyopencl():
    import pyopencl
    import pyopencl.array  # (a submodule of its own: pyopencl.array.Array needs it)

    return pyopencl
