"""What ``python -m shim run`` prints, where RunGen prints it and as it prints it (tools/RunGen.h's
Logger, RunGenMain.cpp's): its results on stdout; warnings ("Warning: ..."), and with
``--verbose`` its info lines, on stderr; what the pipeline prints (halide_print) on stdout as
``halide_print: ...`` lines; a failure's message on stderr, after which the process ends as
RunGen's does, by SIGABRT (``abort``). Every message ends with a newline, as RunGen adds one.

RunGen writes through std::cout and std::cerr, and cerr is tied to cout: what went to stdout
is flushed before anything goes to stderr. So here too: the two keep the order they were
written in, and a failure loses nothing printed before it.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import signal
import sys
from typing import NoReturn

# <sys/prctl.h>
_PR_SET_DUMPABLE = 4


class Console:
    """Where a run's lines go (see the module's docstring); ``verbose``: RunGen's info lines
    are printed."""

    def __init__(self, verbose: bool = False):
        self.verbose = verbose

    def out(self, text: str) -> None:
        """A result, on stdout (RunGen's ``out()``)."""
        try:
            sys.stdout.write(_ended(text))
        except BrokenPipeError:
            # The reader left (| head): the rest goes nowhere, and the run goes on to save its
            # outputs (as RunGen's buffered stdout lets it).
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

    def info(self, text: str) -> None:
        """RunGen's ``info()``: printed with ``--verbose`` only."""
        if self.verbose:
            self.error(text)

    def warn(self, text: str) -> None:
        self.error(f"Warning: {text}")

    def halide_print(self, text: str) -> None:
        """What the pipeline printed, as RunGen prints it: each line after ``halide_print: ``
        (RunGen prefixes each halide_print call's text, and Halide's print() prints a line per
        call; the shim holds the call's text as a whole)."""
        for line in text.splitlines():
            self.out(f"halide_print: {line}")

    def error(self, text: str) -> None:
        """A line on stderr, after whatever went to stdout."""
        with contextlib.suppress(BrokenPipeError):
            sys.stdout.flush()
        sys.stderr.write(_ended(text))
        sys.stderr.flush()

    def fail(self, message: str) -> NoReturn:
        """RunGen's ``fail()``: the message on stderr, then SIGABRT."""
        self.error(message)
        abort()


def _ended(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def abort() -> NoReturn:
    """End the process as RunGen's ``fail()`` ends it: SIGABRT, which a shell reports as
    status 134 (and subprocess as -6). Without a core file: a dump of the Python interpreter
    helps nobody find a wrong argument, and crash reporters (apport, systemd-coredump) would
    file the interpreter as crashed. Python's exit handlers do not run, as RunGen's static
    destructors do not: nothing of the run's needs them (the device drivers' resources go with
    the process)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    faulthandler.disable()  # (its handler would print Python's stack first)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    with contextlib.suppress(ValueError):  # (not the main thread: the default already)
        signal.signal(signal.SIGABRT, signal.SIG_DFL)
    os.abort()
