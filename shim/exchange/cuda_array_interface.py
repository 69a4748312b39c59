"""``Buffer.__cuda_array_interface__``: a CUDA Buffer's device memory for Numba, CuPy and
the other consumers of the CUDA Array Interface, version 3
(https://numba.readthedocs.io/en/stable/cuda/cuda_array_interface.html). (This module sits
under shim/buffers/buffer.py, which calls it: it uses the Buffer it is given, never the class.)

Only a Buffer with a CUDA allocation has the attribute: on any other, reading it raises
AttributeError, so that ``hasattr(buf, "__cuda_array_interface__")``, which is how Numba and
CuPy tell a CUDA array, is False. Reading it makes the device copy current (what the host
holds newer goes up) and, since the consumer may write through the pointer, makes the Buffer
device-dirty (its next host read downloads), as DLPack's device export does; a read-only
Buffer's memory is exported read-only and stays as it is.

``stream``: the spec asks the producer to name a stream whose synchronization covers all
pending work on the data, and to keep that stream alive as long as the object. The shim's
work on an allocation may be on several streams (see shim/backends/cuda.py's fences), some
the application's, which it may destroy; so the shim makes the legacy default stream, which
never goes away, wait for all of them, and says ``1``.

Lifetime: the spec's interface "has no slot for the owner of the data"; the consumer keeps
the Buffer alive. The memory it was given stays allocated as long as the Buffer lives, even
if the Buffer's device memory is freed or moves meanwhile (it is pinned, and never pooled for
reuse): a consumer never reads memory the shim gave to someone else.
"""

from __future__ import annotations

import weakref

from shim.exchange import device_export
from shim.base import sections
from shim.core import shutdown
from shim.exchange.dlpack_capsules import DLDeviceType

VERSION = 3
LEGACY_DEFAULT_STREAM = 1  # the spec's (and DLPack's) number for it

# Buffer -> the handles pinned for its CUDA Array Interface consumers (one pin per handle).
_pinned: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_pinned_lock = sections.Lock()  # for the dictionary only


def describe(buf) -> dict:
    """The ``__cuda_array_interface__`` dict of the Buffer ``buf``; AttributeError unless it
    has a CUDA allocation (BufferError if another thread frees or moves it, or writes its host
    memory, meanwhile: the steps and the races are shim/exchange/device_export.py's)."""
    backend = buf.device
    if backend is None or backend.dlpack_device_type != DLDeviceType.CUDA:
        where = "has no device allocation" if backend is None else f"is on {backend.kind}"
        raise AttributeError(f"__cuda_array_interface__: this Buffer {where}, not in CUDA "
                             "memory (copy_to_device(shim.device('cuda')) first, or use DLPack)")

    def keep(exported, unpin):
        _keep_pinned(buf, exported.handle, unpin)
        return exported

    exported = device_export.share(buf, backend, LEGACY_DEFAULT_STREAM, keep,
                                   what="__cuda_array_interface__")
    return {
        "version": VERSION,
        "shape": exported.shape,
        "typestr": buf.dtype.str,
        "data": (exported.data + exported.offset if 0 not in exported.shape else 0,
                 exported.read_only),
        "strides": exported.byte_strides,
        "stream": LEGACY_DEFAULT_STREAM,
    }


def _keep_pinned(buf, handle: int, unpin) -> None:
    """Hold the pin on ``handle`` until ``buf`` is gone; one pin per handle is enough."""
    with _pinned_lock:
        held = _pinned.setdefault(buf, set())
        duplicate = handle in held
        held.add(handle)
    if duplicate:
        unpin()
        return
    weakref.finalize(buf, _release, unpin).atexit = False


def _release(unpin) -> None:
    if not shutdown.shut_down():  # (at exit, device memory goes with the process: shim/core/shutdown.py)
        unpin()
