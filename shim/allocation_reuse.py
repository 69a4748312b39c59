"""Reusing device allocations, as Halide's runtime does: the switch and the release of what
the backends' pools hold (shim/backends/pool.py has the rules).

``shim.reuse_device_allocations(False)`` is ``halide_reuse_device_allocations(NULL, false)``:
the same switch native code and pipelines see, served by native_stubs/allocation_reuse.c.
"""

from __future__ import annotations

from shim.native import ffi, lib


def reuse_device_allocations(flag: bool) -> None:
    """Halide's halide_reuse_device_allocations: whether freed device memory is kept for later
    allocations (True, the default, as in Halide 21) or given back to the driver at once.
    Switching it off gives back what the pools hold."""
    from shim.runtime import runtime_call

    with runtime_call("reuse_device_allocations") as check:
        check(lib.halide_reuse_device_allocations(ffi.NULL, bool(flag)))


def can_reuse_device_allocations() -> bool:
    """Halide's halide_can_reuse_device_allocations: the switch as it is now."""
    return bool(lib.halide_can_reuse_device_allocations(ffi.NULL))


def release_unused_device_allocations(device=None) -> int:
    """Give the device memory kept for reuse back to the driver (Halide's
    halide_cuda_release_unused_device_allocations, for any backend): that of ``device`` (a
    kind or a backend), or of every device made so far. Returns how many allocations went."""
    from shim.devices import created
    from shim.devices import device as device_of

    backends = created() if device is None else [device_of(device)]
    return sum(backend.release_unused() for backend in backends)


def _release(uc, backend_index: int) -> None:
    from shim.devices import created

    for backend in created():
        if backend_index in (lib.SHIM_BACKEND_COUNT, backend.index):
            backend.release_unused()


def _register():
    from shim.runtime import E, guarded

    @ffi.def_extern(error=E.halide_error_code_generic_error)
    def shim_py_release_unused_allocations(uc, backend_index):
        return guarded(_release, E.halide_error_code_generic_error, uc, backend_index)


_register()
