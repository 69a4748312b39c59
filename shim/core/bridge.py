"""The bridge between C callers and Python work, both ways.

C -> Python: the native library calls Python for real device work (the callbacks in
shim/core/callbacks.py). Nothing may unwind into C, so ``guarded`` runs the operation, reports a
failure through halide_error (the message reaches the calling thread's call context) and
returns Halide's error code; the Python exception behind it is kept for the caller.

Python -> C: ``runtime_call`` gives the calling thread a fresh call context to report into and
raises shim.DeviceError, chained from that kept exception, when a runtime call fails.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

from shim.native import interrupts
from shim.profiling import profiler
from shim.base import sections
from shim.native import streams
from shim.backends.base import BackendError
from shim.base.errors import DeviceError
from shim.native import CallContext, ffi, lib

E = lib  # Halide's error codes are enum constants of the native library

# What a callback returns if even reporting its failure fails: still a failure, never success.
UNREPORTED_FAILURE = E.halide_error_code_generic_error


class Failure(Exception):
    """An operation refused or failed with a specific Halide error code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


# Exceptions behind failures, by call context id, for the caller to chain from.
_exceptions: dict[int, BaseException] = {}
_exceptions_guard = sections.Lock()  # only for this dict, never held across work


def _after_fork_in_child() -> None:
    # Another thread may have held the guard at the fork; its entries are left (no call of the
    # child has their ids).
    global _exceptions_guard
    _exceptions_guard = sections.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _report(user_context, code: int, message: str, exception: BaseException) -> int:
    lib.halide_error(user_context, (message.rstrip() + "\n").encode("utf-8", "replace"))
    call = lib.shim_current_call()
    if call != ffi.NULL:
        with _exceptions_guard:
            _exceptions.setdefault(lib.shim_call_id(call), exception)
    return code


def take_exception(call_id: int) -> BaseException | None:
    """The exception behind the first failure reported in a call context, if any."""
    with _exceptions_guard:
        return _exceptions.pop(call_id, None)


def guarded(operation, failure_code: int, user_context, *args) -> int:
    """Run one operation for a C caller: its result, or a reported error code."""
    profiled = profiler.begin_call(operation, args)
    result = _run_guarded(operation, failure_code, user_context, args)
    profiler.end(profiled, result)
    return result


def _run_guarded(operation, failure_code: int, user_context, args) -> int:
    name = operation.__name__
    try:
        operation(user_context, *args)
        return E.halide_error_code_success
    except Failure as e:
        return _report(user_context, e.code, f"{name}: {e}", e)
    except BackendError as e:
        return _report(user_context, failure_code, f"{name} failed: {e}", e)
    except BaseException as e:  # noqa: BLE001 - nothing may unwind into C
        return _report(user_context, failure_code,
                       f"{name} failed: {type(e).__name__}: {e}", e)


def raise_failure(result: int, message: str, cause: BaseException | None, what: str):
    """Raise what a failed runtime call stands for: DeviceError, unless it failed because the
    program is being interrupted or is exiting (KeyboardInterrupt, SystemExit), which must
    reach the program as they are, never as an error a ``except ShimError`` would swallow."""
    if cause is not None and not isinstance(cause, Exception):
        raise cause
    raise DeviceError(result, message, context=what) from cause


# The section runtime_call holds the main thread's signal handlers in (interrupts.deferred()).
_SIGNALS_WAIT = interrupts.deferred()


class runtime_call:
    """``with runtime_call(what) as check:`` -- make the calling thread's runtime calls report
    into a fresh call context, and raise DeviceError for a failing one: ``check(result)``.
    (A class, not a generator: every device operation Python makes passes through here.)"""

    __slots__ = ("_what", "_context", "_previous")

    def __init__(self, what: str):
        self._what = what

    def __enter__(self):
        _SIGNALS_WAIT.__enter__()
        try:
            context = CallContext.begin()
            try:
                lib.shim_call_set_stream(context.pointer, ffi.cast("void *", streams.current()))
                self._previous = lib.shim_call_enter(context.pointer)
            except BaseException:
                context.end()
                raise
        except BaseException:
            _SIGNALS_WAIT.__exit__(*sys.exc_info())
            raise
        self._context = context
        return self.check

    def check(self, result: int) -> None:
        if result != 0:
            context = self._context
            raise_failure(result, context.errors().strip(), take_exception(context.id), self._what)

    def __exit__(self, *exc) -> None:
        try:
            lib.shim_call_leave(self._previous)
        finally:
            try:
                self._context.end()
            finally:
                _SIGNALS_WAIT.__exit__(*exc)  # (raises what a signal handler raised meanwhile)


@contextmanager
def backend_calls(what: str):
    """Backend calls Python makes outside any runtime call (ordering a pipeline call's work
    across streams, DLPack's synchronization): a failure is a DeviceError, as inside one."""
    try:
        yield
    except BackendError as e:
        raise DeviceError(E.halide_error_code_gpu_device_error, str(e), context=what) from e


def run_for_python(what: str, operation, failure_code: int, *args) -> None:
    """Run a device-layer operation for a Python caller (a Buffer method) as the C callbacks
    run them for Halide: reported into a fresh call context, profiled, and raised as
    DeviceError (or KeyboardInterrupt) if it fails."""
    with runtime_call(what) as check:
        check(guarded(operation, failure_code, ffi.NULL, *args))
