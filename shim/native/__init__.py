"""The native layer. This module is the one import of the native runtime library
(shim._native), loaded before any pipeline can be; the package's other modules are Python over
one piece of the library's state each: a buffer's flag bits (flags), buffer geometry and copy
plans (regions), streams, signals held inside the layer (interrupts), the thread pool's size
(threads). The package may import shim.base only.

Its halide_* definitions must be first in the process's global symbol scope, so that every
pipeline .so loaded afterwards, with or without its own bundled runtime, binds to them. That
takes RTLD_GLOBAL (visible to later libraries) and RTLD_NOW (bound before any pipeline runs).
This module is imported by shim/__init__.py first thing.

``$HALIDE_SHIM_NATIVE``, the path of a compiled ``_native`` module, is loaded instead of the
one in the shim package: how a GPU check kit brings a prebuilt library to a machine where the
package is not built (benchmarks/gpu_kit.py).

Either way the module's stamp is checked first (shim/native/stamp.py): one built for another
version of the package, or from another ABI than the checkout's, raises ImportError saying so.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING

from shim.native import stamp as native_stamp  # (the stamp imports nothing of shim)
from shim._version import __version__


def _load_native_from(path: str):
    """The extension module at ``path``, imported as shim._native."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("shim._native", path)
    if spec is None or not os.path.isfile(path):
        raise ImportError(f"$HALIDE_SHIM_NATIVE={path} is not a compiled module", path=path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["shim._native"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["shim._native"]
        raise
    sys.modules["shim"]._native = module  # as an import of the submodule would
    return module


_saved_flags = sys.getdlopenflags()
sys.setdlopenflags(os.RTLD_GLOBAL | os.RTLD_NOW)
try:
    if os.environ.get("HALIDE_SHIM_NATIVE"):
        _native = _load_native_from(os.environ["HALIDE_SHIM_NATIVE"])
    else:
        from shim import _native
finally:
    sys.setdlopenflags(_saved_flags)


def _check_stamp(module, from_environment: bool) -> None:
    """Refuse a module built for another version of the package or, in a checkout, from another
    ABI than the checkout's: Python and C would disagree on functions and types, and fail far
    from the cause."""
    root = native_stamp.source_root(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    stamp = getattr(module.lib, native_stamp.SYMBOL, None)
    try:
        built = None if stamp is None else native_stamp.parse(module.ffi.string(stamp).decode())
    except ValueError as e:  # a stamp of another form: from an older build of the package
        problems = [f"its build stamp is of a form this package does not read ({e})"]
    else:
        problems = native_stamp.problems(built, __version__, root)
    if not problems:
        return
    if from_environment:
        remedy = ("It is the module $HALIDE_SHIM_NATIVE names: prepare the GPU kit again "
                  "(python benchmarks/gpu_kit.py prepare), or unset HALIDE_SHIM_NATIVE to use "
                  "the package's own (rebuilt with pip install -e .)")
    elif root is not None:
        remedy = f"Rebuild it: pip install -e . (in {root})"
    else:
        remedy = "Reinstall halide-shim"
    raise ImportError(f"shim._native ({module.__file__}) is stale: {'; '.join(problems)}. {remedy}",
                      name="shim._native", path=module.__file__)


_check_stamp(_native, from_environment=bool(os.environ.get("HALIDE_SHIM_NATIVE")))

ffi = _native.ffi
lib = _native.lib
# Where the library lives: its machine code is the code this process runs (shim/calls/library.py).
LIBRARY_PATH: str = _native.__file__

from shim.base.errors import ShimError  # noqa: E402  (it reads the module loaded above)


def _native_type(function: str):
    """A type the native library makes with Python's C API (the fast paths: fastcall.c,
    prepared_call.c, family_state.c, shared_records.c, signals_held.c). A cffi call cannot return it (cffi releases the GIL and knows no
    PyObject), so it is fetched through ctypes, which keeps the GIL and takes a reference."""
    import ctypes

    made = ctypes.PYFUNCTYPE(ctypes.py_object)(_address_of(function))()
    if not isinstance(made, type):
        raise ImportError(f"shim._native: {function}() could not make its type")
    return made


def _python_api(function: str, *arguments):
    """A function of the native library that takes PyObject *s (fetched as _native_type's)."""
    import ctypes

    signature = ctypes.PYFUNCTYPE(ctypes.c_int, *[ctypes.py_object] * len(arguments))
    return signature(_address_of(function))(*arguments)


def _address_of(function: str) -> int:
    return int(ffi.cast("uintptr_t", ffi.addressof(lib, function)))


def watch_buffer_families(owned: dict, family_type: type, lock_type: type) -> None:
    """Show the native layer where shim.Buffers' families live (shim/memory/families.py), so
    that it can serve their allocations where a family is idle
    (native_stubs/fast/buffer_families.c)."""
    if not _python_api("shim_buffer_families_watch", owned, family_type, lock_type):
        raise ImportError("shim._native: the native layer could not take the Buffers' families")


def finalized_skip_when_alone(cls: type, slot: str) -> None:
    """Tell Finalized that instances of exactly ``cls`` have nothing to finalize when nothing
    else references them and their slot ``slot`` holds anything but None
    (native_stubs/calls/signals_held.c): no Python call when the last reference goes."""
    if not _python_api("shim_finalized_skip_when_alone", cls, slot):
        raise ImportError("shim._native: Finalized could not take the class")


if TYPE_CHECKING:  # (their members, for type checkers: what the C code defines)
    from shim.native.native_types import (CallPlan, FamilyState, Finalized, HeldContext,
                                          HostExporter, LockState, MemberPlans, PreparedRun)
else:
    CallPlan = _native_type("shim_fastcall_plan_type")
    PreparedRun = _native_type("shim_prepared_run_type")
    FamilyState = _native_type("shim_family_state_type")
    LockState = _native_type("shim_lock_state_type")
    MemberPlans = _native_type("shim_member_plans_type")
    Finalized = _native_type("shim_finalized_type")
    HostExporter = _native_type("shim_host_exporter_type")
    HeldContext = _native_type("shim_held_context_type")

_per_thread = threading.local()
# Every context ever made (a few per thread), to see at exit which calls are still running.
_contexts: weakref.WeakSet = weakref.WeakSet()
_closing = False


class CallContext:
    """What one call into Halide code reports: error text and print output from any thread
    that worked for it. ``begin()`` one per call and ``end()`` it when the call has returned;
    each thread reuses its own, since allocating one costs more than a small pipeline call."""

    __slots__ = ("id", "pointer", "busy", "thread", "__weakref__")

    def __init__(self):
        self.id = lib.shim_next_call_id()
        pointer = lib.shim_call_new(self.id)
        if pointer == ffi.NULL:
            raise MemoryError("cannot allocate a call context")
        self.pointer = ffi.gc(pointer, lib.shim_call_free)
        self.busy = False
        self.thread = None  # the thread whose call it is, while busy
        _contexts.add(self)

    @classmethod
    def begin(cls, *, reset: bool = True) -> CallContext:
        """A context for a new call: the calling thread's own, or a new one while that one is
        busy (a call made from inside another, such as a finalizer during a callback). It has
        a fresh id; ``reset=False`` leaves clearing it to the C function that runs the call."""
        context = getattr(_per_thread, "context", None)
        if context is None:
            context = _per_thread.context = cls()
        elif context.busy:
            context = cls()
        else:
            context.id = lib.shim_next_call_id()
            if reset:
                lib.shim_call_reset(context.pointer, context.id)
        context.thread = threading.get_ident()
        context.busy = True  # before looking at _closing: see close_calls
        if _closing:
            context.busy = False
            raise ShimError("the interpreter is exiting: no new calls into Halide code")
        return context

    def end(self) -> None:
        self.busy = False

    def errors(self) -> str:
        return ffi.string(lib.shim_call_errors(self.pointer)).decode("utf-8", "replace")

    def printed(self) -> bool:
        return lib.shim_call_prints(self.pointer)[0] != b"\0"

    def prints(self) -> str:
        return print_text(ffi.string(lib.shim_call_prints(self.pointer)),
                          lib.shim_call_prints_dropped(self.pointer))


def print_text(printed: bytes, dropped: int) -> str:
    """What a call printed, as a context holds it (``printed``; ``dropped``: the bytes past
    its cap), for the caller to see."""
    text = printed.decode("utf-8", "replace")
    if dropped:
        text += f"\n[halide-shim: {dropped} more bytes of print output were dropped]\n"
    return text


def closing() -> bool:
    """Whether calls into Halide code are being refused (the interpreter is exiting)."""
    return _closing


def _after_fork_in_child() -> None:
    """The child has only the thread that forked: the calls other threads were running never
    end here, and exit must not wait for them."""
    me = threading.get_ident()
    for context in list(_contexts):
        if context.busy and context.thread != me:
            context.busy = False


os.register_at_fork(after_in_child=_after_fork_in_child)


def close_calls(timeout: float) -> bool:
    """Refuse new calls into Halide code and wait, up to ``timeout`` seconds, for those still
    running on other threads; whether they all finished. A call either sees the refusal or is
    seen running: it marks itself busy before it checks."""
    global _closing
    _closing = True
    lib.shim_calls_close()  # the fast path's calls (native_stubs/fast/fastcall.c)
    deadline = time.monotonic() + timeout
    while lib.shim_calls_running() or any(context.busy for context in list(_contexts)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)  # lets the running calls, and the callbacks they make, take the GIL
    return True
