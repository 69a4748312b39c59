"""The thread pool's size: the pool (native_stubs/calls/thread_pool.c) every pipeline in the
process shares."""

from __future__ import annotations

from shim.base.errors import ArgumentError
from shim.native import lib


def set_num_threads(n: int) -> int:
    """Use ``n`` threads for pipelines' parallel loops and async stages (Halide's
    halide_set_num_threads; HL_NUM_THREADS sets the initial value). Returns the previous count.
    Takes effect for work started afterwards; workers already started stay."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ArgumentError("n", f"expected a positive number of threads, got {n!r}")
    previous = num_threads()
    lib.halide_set_num_threads(n)
    return previous


def num_threads() -> int:
    """The number of threads the pool uses (its workers plus the calling thread)."""
    n = lib.halide_get_num_threads()
    if n == 0:
        # The pool starts on first use; 0 asks for the count it would start with
        # (HL_NUM_THREADS, else the number of CPUs).
        lib.halide_set_num_threads(0)
        n = lib.halide_get_num_threads()
    return n
