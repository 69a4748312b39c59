"""Reusing device allocations, as Halide's runtime does: the switch and the release of what
the backends' pools hold (shim/backends/pool.py has the rules).

``shim.reuse_device_allocations(False)`` is ``halide_reuse_device_allocations(NULL, false)``:
the same switch native code and pipelines see, served by native_stubs/devices/allocation_reuse.c.
"""

from __future__ import annotations

from shim.backends import devices
from shim.backends.base import Backend
from shim.core import runtime
from shim.core.bridge import runtime_call
from shim.native import ffi, lib


def reuse_device_allocations(flag: bool) -> None:
    """Halide's halide_reuse_device_allocations: whether freed device memory is kept for later
    allocations (True, the default, as in Halide 21) or given back to the driver at once.
    Switching it off gives back what the pools hold."""
    with runtime_call("reuse_device_allocations") as check:
        check(lib.halide_reuse_device_allocations(ffi.NULL, bool(flag)))


def can_reuse_device_allocations() -> bool:
    """Halide's halide_can_reuse_device_allocations: the switch as it is now."""
    return bool(lib.halide_can_reuse_device_allocations(ffi.NULL))


def release_unused_device_allocations(device: str | Backend | None = None) -> int:
    """Give the device memory kept for reuse back to the driver (Halide's
    halide_cuda_release_unused_device_allocations, for any backend): that of ``device`` (a
    kind or a backend), or of every device made so far. Returns how many allocations went."""
    backends = devices.created() if device is None else [devices.device(device)]
    return sum(runtime.release_unused(backend) for backend in backends)


def release_for_native(uc, backend_index: int) -> None:
    """halide_*_release_unused_device_allocations and halide_reuse_device_allocations(false):
    the pools of the backend of ``backend_index``, or of all (SHIM_BACKEND_COUNT)."""
    for backend in devices.created():
        if backend_index in (lib.SHIM_BACKEND_COUNT, backend.index):
            runtime.release_unused(backend)
