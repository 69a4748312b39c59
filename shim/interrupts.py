"""Ctrl-C that never lands inside the device layer's bookkeeping.

Python runs signal handlers in the main thread, between any two bytecodes. A KeyboardInterrupt
raised between a family lock's acquire and the ``try`` that releases it, or halfway through
updating a family's regions, would leave a lock held forever or a Buffer inconsistent; one
raised inside a callback from C would come back as a device error. So while the main thread is
inside the device layer (``deferred()``), SIGINT is only noted, and KeyboardInterrupt is raised
when it leaves, with every lock released and every Buffer consistent. Code that waits inside
the layer (for another thread's pipeline call) asks ``take_pending()`` and gives up cleanly.

The deleters of exported DLPack tensors are Python called from C (by a consumer, or by the
destructor of a capsule being dropped), where a KeyboardInterrupt raised anywhere, even before
a ``deferred()`` inside could be entered, is swallowed by cffi and leaves the tensor's pin for
good. Their C side (native_stubs/dlpack.c) defers Ctrl-C around the whole callback: inside
one, SIGINT is only noted (in C), and the deleter raises it again on its way out, once the
tensor is released.

This applies while SIGINT has Python's default handler, which the shim wraps when it is
imported in the main thread; a program that installs its own handler keeps full control.
"""

from __future__ import annotations

import signal
import threading

from shim.native import lib

_MAIN = threading.main_thread().ident
_depth = 0  # deferred() sections the main thread is inside (only the main thread changes it)
_pending = None  # (signum, frame) of a SIGINT that arrived inside one
_default = signal.default_int_handler


def _handler(signum, frame):
    global _pending
    if _depth:
        _pending = (signum, frame)
        return
    if lib.shim_interrupts_in_deleter():
        lib.shim_interrupts_note()  # raised again when the deleter returns into C
        return
    _default(signum, frame)


def install() -> None:
    """Wrap Python's default SIGINT handler (nothing else: a program's own handler stays)."""
    if threading.get_ident() == _MAIN and signal.getsignal(signal.SIGINT) is _default:
        signal.signal(signal.SIGINT, _handler)


def take_pending() -> bool:
    """Whether a Ctrl-C arrived inside the current deferred section (and forget it: the
    caller raises KeyboardInterrupt itself)."""
    global _pending
    if threading.get_ident() != _MAIN or _pending is None or lib.shim_interrupts_in_deleter():
        return False  # (a deleter finishes its work: the Ctrl-C waits until it returns)
    _pending = None
    return True


class _Deferred:
    """``with deferred():`` -- the main thread's SIGINT waits until the section is left."""

    __slots__ = ()

    def __enter__(self):
        global _depth
        if threading.get_ident() == _MAIN:
            _depth += 1

    def __exit__(self, *exc):
        global _depth, _pending
        if threading.get_ident() != _MAIN:
            return
        _depth -= 1
        if not _depth and _pending is not None:
            signum, frame = _pending
            _pending = None
            if lib.shim_interrupts_in_deleter():
                lib.shim_interrupts_note()  # not into a deleter's C caller: after it returns
                return
            _default(signum, frame)  # raises KeyboardInterrupt here, outside the layer


_DEFERRED = _Deferred()


def deferred() -> _Deferred:
    return _DEFERRED
