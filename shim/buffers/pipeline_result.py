"""The Buffer a CPU pipeline's output given as a shape returns from the fast path
(native_stubs/fast/fastcall.c): the pipeline wrote a new numpy array, and the call returns a
PipelineResult over it, which is the general path's Buffer in everything anyone can observe,
but whose struct, geometry and family (most of a Buffer's cost) are made only when something
first asks for one of them. A result that is only read through numpy() never costs them.

Until then it is of this class, whose __getattr__ (reached only for what its slots do not
hold yet) makes them; from then on it is a plain shim.Buffer, and pays nothing for having been
one of these."""

from __future__ import annotations

import os
import threading

import numpy as np

from shim.native import finalized_skip_when_alone, interrupts
from shim.native.flags import HOST_DIRTY
from shim.native import flags
from shim.memory import families
from shim.buffers.buffer import Buffer
from shim.buffers.managed import Released

# The slots made on first use. The others (the host array, name, flags of the shim's own) are
# set at once.
_DEFERRED = ("_raw", "_dims", "_type", "_family", "_box", "_root_box", "_root_dims", "_record")

# Taken while a result's slots are set from a struct made for it (never while making one: a
# signal handler, or a finalizer the collector runs meanwhile, may make another result's).
_publishing_lock = threading.Lock()
# The result whose slots are being set, while they are (see _after_fork_in_child).
_publishing = None


def _after_fork_in_child() -> None:
    # A fork while another thread set a result's slots would leave the lock held for good in
    # the child, and the result half set: it goes back to none set (it makes them again when
    # next asked), or, if it had them all, on to being a Buffer.
    global _publishing_lock, _publishing
    _publishing_lock = threading.Lock()
    result, _publishing = _publishing, None
    if result is not None:
        if result._pending is not None:
            for slot in _DEFERRED:
                try:
                    delattr(result, slot)
                except AttributeError:
                    pass
        else:
            result.__class__ = Buffer


os.register_at_fork(after_in_child=_after_fork_in_child)


class PipelineResult(Buffer):
    __slots__ = ()

    # What a result's other slots start as, with ``_array`` the array the pipeline wrote and
    # ``_pending`` the output's name: the fast path makes results in C from this (fastcall.c).
    FRESH = (("_name", ""), ("_superseded", None), ("_exposed", False), ("_unread", False),
             ("_keepalive", None))

    def __getattr__(self, name: str):
        # Anything the slots do not hold yet (a deferred slot, or an attribute that raised
        # AttributeError, such as __cuda_array_interface__): the struct is made, this becomes
        # a Buffer, and Buffer's own lookup answers (and words its own errors). (Python may
        # call this after another thread, or the attribute's own code, made it a Buffer.)
        _make_deferred(self)
        return getattr(self, name)


# Its finalizer only marks a result whose struct was never made (``_pending`` not None), for a
# later finalizer of its own dying cycle (ManagedBuffer._finalize): one dropped by its last
# reference has none. A whole one (made by a constructor given its class, type(result)(array),
# or a view or copy made with type(self)) is finalized as every Buffer is.
finalized_skip_when_alone(PipelineResult, "_pending")


def _make_deferred(result: PipelineResult) -> None:
    global _publishing
    pending = result._pending
    if pending is not None:
        # Made outside the lock, so that what runs meanwhile (a signal handler, a finalizer)
        # may use other results; a thread that loses the race drops its own.
        made = Buffer.__new__(Buffer)
        made._init_from_array(result._array, str(pending))
        # Host-dirty, as every output of a CPU pipeline's call is left (the general path's
        # PreparedCall, and the fast path's shim_members_ran): the pipeline wrote there.
        flags.assign(made._raw, HOST_DIRTY, True)
        if isinstance(pending, Released):
            # Its finalizer has run already (the collector finalizes a dying cycle's objects in
            # any order, and another's __del__ used it): as a dropped Buffer is, out of the
            # registry, since nothing will release it again.
            families.unregister_owned(made._raw)
    # Every slot is set once, to its final value, signal handlers held: a thread that reads one
    # meanwhile either finds it or comes here and waits.
    with interrupts.deferred(), _publishing_lock:
        if result._pending is not None:
            _publishing = result
            for slot in _DEFERRED:
                setattr(result, slot, getattr(made, slot))
            result._pending = None
            made._raw = None  # its struct is the result's now: nothing for it to release
        # (A PipelineResult can also be made whole, by a constructor given its class:
        # type(result)(array). It becomes a Buffer all the same.)
        result.__class__ = Buffer
        _publishing = None
