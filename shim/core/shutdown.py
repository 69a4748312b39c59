"""Leaving the interpreter with pipelines, buffers and device memory still alive.

When Python exits it tears down its modules, and only then do the C libraries' destructors
run (the thread pool's, the runtime bundled in a pipeline's .so). A pipeline still running
on another thread by then would call back into a half-destroyed interpreter, and a driver
call left waiting on a daemon thread would be cut off mid-way. So first thing at exit, while
everything still works: new calls into Halide code are refused, the calls still running are
waited for, device work is finished and each backend released; from then on dropped Buffers
leave their device memory to the end of the process.
"""

from __future__ import annotations

import atexit
import sys

from shim.backends import devices
from shim.native import close_calls, closing

# How long exit waits for pipeline calls still running on other threads.
CALLS_TIMEOUT = 30.0

_shut_down = False


def shut_down() -> bool:
    """Whether the interpreter is exiting: calls into Halide code are refused, and soon the
    backends are released."""
    return _shut_down or closing()


@atexit.register
def _at_exit() -> None:
    global _shut_down
    if not close_calls(CALLS_TIMEOUT):
        print("halide-shim: pipeline calls still running at exit; not waiting for them",
              file=sys.stderr)
    _shut_down = True
    for backend in devices.created():
        try:
            backend.sync()
            backend.release()
        except Exception:  # noqa: BLE001 - exiting anyway; a driver may already be gone
            pass
