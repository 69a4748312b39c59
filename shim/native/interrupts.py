"""Signal handlers that never run inside the device layer's bookkeeping.

Python runs a signal's handler in the main thread between any two bytecodes, and a handler may
raise: Python's own SIGINT handler raises KeyboardInterrupt, a program's SIGALRM timeout (a
timeout decorator, pytest-timeout's signal method) raises whatever it likes. Raised between a
family lock's acquire and the ``try`` that releases it, or halfway through updating a family's
regions, it would leave a lock held forever or a Buffer inconsistent; raised inside a callback
from C, it would come back as a device error. So while the main thread is inside the device
layer (``deferred()``), a signal is only noted, and its handler runs when the thread leaves,
with every lock released and every Buffer consistent, raising there whatever it raises. Code
that waits inside the layer (for another thread's pipeline call) is a safe point: it runs the
noted handlers there (``run_pending()``), so that a Ctrl-C or a timeout ends the wait, and an
exception unwinds cleanly.

Which handlers: every one Python runs. ``install()`` (at ``import shim``, or the first time
the main thread enters the layer, when the shim was imported on another thread) wraps the
handlers set then, and replaces ``signal.signal`` so that handlers set later are wrapped too;
``signal.getsignal()`` and what ``signal.signal()`` returns are the program's own handlers, as
if nothing were wrapped. Handlers set through ``_signal`` directly, or by C code, are not.
Exceptions injected with ``PyThreadState_SetAsyncExc`` do not go through a handler and are not
deferred (see README, Threads).

Code that C runs must be held from C, before its first bytecode: the fast paths' calls (the
device callbacks of their runs, and their bookkeeping's Python code), where an exception would
fail the call; the deleters of exported DLPack tensors and the shim's finalizers, where cffi or
Python would swallow it and leave the work undone; and the context managers whose entering and
leaving must not be cut short (shim.native.HeldContext: a profile's start and stop, a stream's
scope). Inside such a hold a handler only notes its signal in C (abi/shim_signals.h), and the
thread's last release delivers it again, for its handler to run at Python's next check
(native_stubs/calls/signals_held.c).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading

from shim.native import lib

_MAIN = threading.main_thread().ident
_depth = 0  # deferred() sections the main thread is inside (only the main thread changes it)
# Signals noted inside one, each once, in the order they arrived; None when there are none.
# (Inside a hold from C they are noted in C instead: native_stubs/calls/signals_held.c.)
_pending: list[int] | None = None
_installed = False

_program_signal = signal.signal
_program_getsignal = signal.getsignal


class _Deferring:
    """A program's signal handler, wrapped: it runs now, or once the main thread is out of the
    device layer (see the module)."""

    __slots__ = ("handler",)

    def __init__(self, handler):
        self.handler = handler

    def __call__(self, signum, frame):
        if lib.shim_signals_held():
            lib.shim_signals_note(signum)  # delivered again as C's hold ends
        elif _depth:
            _note(signum)
        else:
            self.handler(signum, frame)


def _note(signum: int) -> None:
    global _pending
    if _pending is None:
        _pending = [signum]
    elif signum not in _pending:  # (as Python does, a signal arriving twice is handled once)
        _pending.append(signum)


def _wrapped(handler):
    return _Deferring(handler) if callable(handler) and not isinstance(handler, _Deferring) else handler


def _unwrapped(handler):
    return handler.handler if isinstance(handler, _Deferring) else handler


@functools.wraps(_program_signal)
def _signal(signalnum, handler):
    return _unwrapped(_program_signal(signalnum, _wrapped(handler)))


@functools.wraps(_program_getsignal)
def _getsignal(signalnum):
    return _unwrapped(_program_getsignal(signalnum))


def install() -> None:
    """Wrap the program's signal handlers, those set now and (through ``signal.signal``) those
    set later. Handlers can only be set on the main thread: elsewhere only ``signal.signal`` is
    replaced now, and the handlers already set are wrapped when the main thread first enters
    the device layer."""
    global _installed
    signal.signal, signal.getsignal = _signal, _getsignal
    if _installed or threading.get_ident() != _MAIN:
        return
    for signum in signal.valid_signals():
        try:
            handler = _program_getsignal(signum)
            if callable(handler) and not isinstance(handler, _Deferring):
                _program_signal(signum, _Deferring(handler))
        except (OSError, ValueError):
            pass  # (a signal that takes no handler)
    _installed = True


def held() -> bool:
    """Whether the calling thread is the main thread inside a section or a hold from C now
    (signals noted, not handled)."""
    return threading.get_ident() == _MAIN and (_depth > 0 or bool(lib.shim_signals_held()))


def defers(signum: int) -> bool:
    """Whether the handler Python runs for ``signum`` is one the shim holds inside the device
    layer (a Python handler, wrapped)."""
    return isinstance(_program_getsignal(signum), _Deferring)


def _deliver(frame) -> None:
    """Run the handlers of the signals noted, in order, on the main thread outside every
    section (or at a safe point inside). If one raises, the others are delivered again, to run
    at Python's next check for signals, as Python itself does."""
    global _pending
    signals, _pending = _pending, None
    if signals is None:
        # A handler that ran after the caller looked (a signal arriving outside every section
        # runs its handler at once) left a section of its own, and delivered them itself.
        return
    if lib.shim_signals_held():
        for signum in signals:
            lib.shim_signals_note(signum)  # not into the C code holding them: after it returns
        return
    for index, signum in enumerate(signals):
        handler = _unwrapped(_program_getsignal(signum))
        if not callable(handler):
            continue  # (reset to SIG_DFL or SIG_IGN meanwhile: Python, too, ignores it then)
        try:
            handler(signum, frame)
        except BaseException:
            for later in signals[index + 1:]:
                lib.shim_signal_again(later)
            raise


def run_pending() -> None:
    """At a safe point inside the layer (waiting for another thread's pipeline call, no state
    half-updated): run the handlers of the signals noted so far, raising what they raise.
    (Inside a hold from C they wait: an exception there would go to C.)"""
    if _pending is not None and threading.get_ident() == _MAIN and not lib.shim_signals_held():
        _deliver(sys._getframe(1))


class _Deferred:
    """``with deferred():`` -- the main thread's signal handlers wait until the section is
    left."""

    __slots__ = ()

    def __enter__(self):
        global _depth
        if threading.get_ident() == _MAIN:
            if not _installed:
                install()
            _depth += 1

    def __exit__(self, *exc):
        global _depth
        if threading.get_ident() != _MAIN:
            return
        _depth -= 1
        if not _depth and _pending is not None:
            _deliver(sys._getframe(1))  # raises here, outside the layer, what the handler raises


_DEFERRED = _Deferred()


def _after_fork_in_child() -> None:
    """The child's main thread is the thread that forked (Python's threading says so too): its
    sections count from now on. Forked from another thread, the child is inside none of them."""
    global _MAIN, _depth, _pending
    me = threading.get_ident()
    if me != _MAIN:
        _MAIN, _depth, _pending = me, 0, None


os.register_at_fork(after_in_child=_after_fork_in_child)


def deferred() -> _Deferred:
    return _DEFERRED
