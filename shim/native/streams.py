"""The device stream a thread's pipeline calls run on.

    with shim.stream(torch.cuda.current_stream()):
        p(x, output=y)        # kernels and copies on that CUDA stream

A stream is a CUDA CUstream: an int, a cuda-python CUstream, or any object that exposes its
handle as ``cuda_stream`` (PyTorch, CuPy), ``handle`` (cuda.core) or ``ptr``. The choice is
per thread and nests; outside any block, pipelines use the legacy default stream (0; 1 names
it too). Halide's worker threads inherit the stream of the call they work for, which is why
the per-thread default stream (2), a different stream on every thread, is refused.
"""

from __future__ import annotations

from shim.base.errors import ArgumentError
from shim.native import HeldContext, ffi, lib

# CUDA's names for its default streams: CU_STREAM_LEGACY is 0x1, but 0 means the same stream
# to every driver call, and is what the shim keeps; CU_STREAM_PER_THREAD is 0x2.
LEGACY_DEFAULT = 0
PER_THREAD = 2


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
        handle = int(stream)
    except (TypeError, ValueError):
        raise ArgumentError("stream", f"expected a CUDA stream handle or an object exposing one, "
                                      f"got {type(stream).__name__}") from None
    if handle == PER_THREAD:
        raise ArgumentError("stream", "2 is CUDA's per-thread default stream, which is a "
                                      "different stream on each of Halide's worker threads: "
                                      "create a stream (cuStreamCreate, torch.cuda.Stream()) "
                                      "and pass that")
    if not 0 <= handle < 1 << 64:  # a pointer: more bits would be cut off to another stream
        raise ArgumentError("stream", f"expected a CUDA stream handle, got {handle}")
    return LEGACY_DEFAULT if handle == 1 else handle


class stream(HeldContext):
    """``with stream(handle):`` runs the pipelines this thread calls inside the block on
    ``handle``. Setting the stream and putting the previous one back run with signal handlers
    held (HeldContext): a Ctrl-C between the two halves must not leave the thread on the
    block's stream."""

    __slots__ = ("handle", "previous")

    def __init__(self, handle: object):
        self.handle = ffi.cast("void *", as_handle(handle))
        self.previous = None

    def _enter(self) -> None:
        self.previous = lib.shim_thread_stream()  # (kept in C, where the fast paths read it)
        lib.shim_thread_stream_set(self.handle)

    def _exit(self, *exc) -> None:
        lib.shim_thread_stream_set(self.previous)


def current() -> int:
    """The calling thread's stream (0: the backend's default)."""
    return int(ffi.cast("uintptr_t", lib.shim_thread_stream()))
