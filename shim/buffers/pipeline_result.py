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

from shim.native import interrupts
from shim.native.flags import HOST_DIRTY
from shim.native import flags
from shim.buffers.buffer import Buffer

# The slots made on first use. The others (the host array, name, flags of the shim's own) are
# set at once.
_DEFERRED = ("_raw", "_dims", "_type", "_family", "_box", "_root_box", "_root_dims", "_record")

# Taken while a result makes its deferred slots.
_making = threading.Lock()


def _after_fork_in_child() -> None:
    # A fork while another thread made a result's slots would leave the lock held for good in
    # the child; that result makes all of them again there when next asked.
    global _making
    _making = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class PipelineResult(Buffer):
    __slots__ = ()

    @classmethod
    def over(cls, array: np.ndarray, argument: str) -> Buffer:
        """The result for the output ``argument`` over ``array``, memory nobody else sees."""
        buf = cls.__new__(cls)
        buf._array = array
        buf._name, buf._superseded = "", None
        buf._exposed, buf._unread, buf._keepalive = False, False, None
        buf._pending = argument
        return buf

    def __getattr__(self, name: str):
        # Anything the slots do not hold yet (a deferred slot, or an attribute that raised
        # AttributeError, such as __cuda_array_interface__): the struct is made, this becomes
        # a Buffer, and Buffer's own lookup answers (and words its own errors). (Python may
        # call this after another thread, or the attribute's own code, made it a Buffer.)
        _make_deferred(self)
        return getattr(self, name)


def _make_deferred(result: PipelineResult) -> None:
    # Every slot is set once, to its final value: a thread that reads one while another makes
    # them either finds it or comes here and waits.
    with _making:
        if result._pending is None:
            return  # made already (by another thread, while this one waited)
        made = Buffer.__new__(Buffer)
        made._init_from_array(result._array, result._pending)
        # Host-dirty, as every output of a CPU pipeline's call is left (the general path's
        # PreparedCall, and the fast path's shim_members_ran): the pipeline wrote there.
        flags.assign(made._raw, HOST_DIRTY, True)
        # Signal handlers held: the struct is registered in its family, and the result
        # releases it only once it holds every slot.
        with interrupts.deferred():
            for slot in _DEFERRED:
                setattr(result, slot, getattr(made, slot))
            result._pending = None
            made._raw = None  # its struct is the result's now: nothing for it to release
            result.__class__ = Buffer
