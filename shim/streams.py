"""The device stream a thread's pipeline calls run on.

    with shim.stream(torch.cuda.current_stream()):
        p(x, output=y)        # kernels and copies on that CUDA stream

A stream is a CUDA CUstream: an int, a cuda-python CUstream, or any object that exposes its
handle as ``cuda_stream`` (PyTorch, CuPy), ``handle`` (cuda.core) or ``ptr``. The choice is
per thread and nests; outside any block, pipelines use the backend's default stream. Halide's
worker threads inherit the stream of the call they work for.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from shim.errors import ArgumentError

_local = threading.local()


def as_handle(stream) -> int:
    """The integer handle of a stream object (0 for the default stream)."""
    if stream is None:
        return 0
    for attribute in ("cuda_stream", "handle", "ptr"):
        value = getattr(stream, attribute, None)
        if value is not None:
            stream = value
            break
    try:
        return int(stream)
    except (TypeError, ValueError):
        raise ArgumentError("stream", f"expected a CUDA stream handle or an object exposing one, "
                                      f"got {type(stream).__name__}") from None


@contextmanager
def stream(handle):
    """Run the pipelines this thread calls inside the block on ``handle``."""
    previous = current()
    _local.stream = as_handle(handle)
    try:
        yield
    finally:
        _local.stream = previous


def current() -> int:
    """The calling thread's stream (0: the backend's default)."""
    return getattr(_local, "stream", 0)
