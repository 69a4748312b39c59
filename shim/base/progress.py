"""Progress of long work, shown only where someone watches (stderr is a terminal), so that
logs and pipes stay quiet: a bar over a known count (``Progress``), and a line for work that
turns out slow (``if_slow``: the first compile of a pipeline's GPU code)."""

from __future__ import annotations

import sys
import threading
import time


class Progress:
    """A progress bar on stderr over ``total`` steps."""

    def __init__(self, total: int, label: str, stream=None):
        self.total, self.label = total, label
        self.stream = stream or sys.stderr
        self.visible = total > 1 and _watched(self.stream)

    def update(self, done: int) -> None:
        if self.visible:
            width = 30
            filled = width * done // self.total
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] "
                              f"{done}/{self.total}")
            self.stream.flush()

    def finish(self) -> None:
        if self.visible:
            self.stream.write("\n")
            self.stream.flush()


class if_slow:
    """``with if_slow("compiling ..."):``: where the block takes longer than ``after``
    seconds, says ``message`` on stderr then (from a timer thread) and how long it took at
    its end. Nothing where stderr is not a terminal, nor for a quick block."""

    __slots__ = ("message", "after", "stream", "_timer", "_shown", "_started")

    def __init__(self, message: str, after: float = 1.0, stream=None):
        self.message, self.after, self.stream = message, after, stream or sys.stderr
        self._timer, self._shown, self._started = None, False, 0.0

    def __enter__(self):
        self._started = time.monotonic()
        if _watched(self.stream):
            self._timer = threading.Timer(self.after, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def _show(self) -> None:
        self._shown = True
        self.stream.write(f"halide-shim: {self.message}...\n")
        self.stream.flush()

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()  # (so that _shown is final)
            if self._shown:
                self.stream.write(f"halide-shim: {self.message}: done in "
                                  f"{time.monotonic() - self._started:.1f} s\n")
                self.stream.flush()


def _watched(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # (no isatty, or closed)
        return False
