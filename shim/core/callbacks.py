"""The Python callbacks the native library calls (abi/shim_callbacks.h), registered from one
table: which C name runs which operation, and the Halide error code a failure of it returns.

Every callback runs its operation through bridge.guarded, so an exception never unwinds into
C: it becomes that error code, with its message reported to the caller's call context.
"""

from __future__ import annotations

from shim.core import allocation_reuse
from shim.core import runtime
from shim.core.bridge import UNREPORTED_FAILURE, E, guarded
from shim.native import ffi

CALLBACKS = (
    ("shim_py_device_malloc", runtime.device_malloc, E.halide_error_code_device_malloc_failed),
    ("shim_py_device_free", runtime.device_free, E.halide_error_code_device_free_failed),
    ("shim_py_device_sync", runtime.device_sync, E.halide_error_code_device_sync_failed),
    ("shim_py_device_release", runtime.device_release, E.halide_error_code_generic_error),
    ("shim_py_copy_to_host", runtime.copy_to_host, E.halide_error_code_copy_to_host_failed),
    ("shim_py_copy_to_device", runtime.copy_to_device, E.halide_error_code_copy_to_device_failed),
    ("shim_py_device_and_host_malloc", runtime.device_and_host_malloc,
     E.halide_error_code_device_malloc_failed),
    ("shim_py_device_and_host_free", runtime.device_and_host_free,
     E.halide_error_code_device_free_failed),
    ("shim_py_buffer_copy", runtime.buffer_copy, E.halide_error_code_device_buffer_copy_failed),
    ("shim_py_device_crop", runtime.device_crop, E.halide_error_code_device_crop_failed),
    ("shim_py_device_slice", runtime.device_slice, E.halide_error_code_device_crop_failed),
    ("shim_py_device_release_crop", runtime.device_release_crop,
     E.halide_error_code_device_crop_failed),
    ("shim_py_wrap_native", runtime.wrap_native, E.halide_error_code_device_malloc_failed),
    ("shim_py_detach_native", runtime.detach_native,
     E.halide_error_code_device_detach_native_failed),
    ("shim_py_compute_capability", runtime.compute_capability, E.halide_error_code_generic_error),
    ("shim_py_initialize_kernels", runtime.initialize_kernels, E.halide_error_code_generic_error),
    ("shim_py_device_start", runtime.device_start, E.halide_error_code_generic_error),
    ("shim_py_release_unused_allocations", allocation_reuse.release_for_native,
     E.halide_error_code_generic_error),
)


def _callback(operation, failure_code: int):
    def callback(user_context, *args):
        return guarded(operation, failure_code, user_context, *args)

    callback.__name__ = operation.__name__
    return callback


for _name, _operation, _failure_code in CALLBACKS:
    ffi.def_extern(name=_name, error=UNREPORTED_FAILURE)(_callback(_operation, _failure_code))
