"""RunGen's ``--track_memory``: the high-water mark of the host memory pipelines allocate
through halide_malloc, while a ``track()`` block runs.

halide_malloc and halide_free are Halide's standalone runtime's, inside the shim's native
library (every pipeline's calls bind to them); halide_set_custom_malloc / _free route them
through Python here, as RunGen's HalideMemoryTracker routes them through its own functions.
Each allocation then takes the GIL: timings taken meanwhile are slower.
"""

from __future__ import annotations

import contextlib
import ctypes

from shim.base import sections
from shim.native import LIBRARY_PATH

_MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


class MemoryTracker:
    """Bytes allocated now, and the most allocated at once, through halide_malloc."""

    def __init__(self):
        self._lock = sections.Lock()
        self._sizes: dict[int, int] = {}
        self.allocated = 0
        self.highwater = 0

    def allocated_block(self, pointer: int | None, size: int) -> None:
        if pointer is None:
            return
        with self._lock:
            self._sizes[pointer] = size
            self.allocated += size
            self.highwater = max(self.highwater, self.allocated)

    def freed_block(self, pointer: int | None) -> None:
        with self._lock:
            # (Blocks allocated before tracking began were never counted.)
            self.allocated -= self._sizes.pop(pointer, 0)


@contextlib.contextmanager
def track():
    """Count halide_malloc's allocations while the block runs; yields the MemoryTracker."""
    library = ctypes.CDLL(LIBRARY_PATH)
    default_malloc = _MALLOC(("halide_default_malloc", library))
    default_free = _FREE(("halide_default_free", library))
    set_malloc, set_free = library.halide_set_custom_malloc, library.halide_set_custom_free
    set_malloc.restype, set_malloc.argtypes = _MALLOC, [_MALLOC]
    set_free.restype, set_free.argtypes = _FREE, [_FREE]
    tracker = MemoryTracker()

    def tracked_malloc(user_context, size):
        pointer = default_malloc(user_context, size)
        tracker.allocated_block(pointer, size)
        return pointer

    def tracked_free(user_context, pointer):
        tracker.freed_block(pointer)
        default_free(user_context, pointer)

    # The callbacks must outlive their installation: ctypes frees them with these names.
    malloc_callback, free_callback = _MALLOC(tracked_malloc), _FREE(tracked_free)
    previous_malloc, previous_free = set_malloc(malloc_callback), set_free(free_callback)
    try:
        yield tracker
    finally:
        set_malloc(previous_malloc)
        set_free(previous_free)
