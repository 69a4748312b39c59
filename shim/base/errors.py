"""The exceptions the shim raises. Every one is a ShimError.

Below every other module but the native library itself: it reads Halide's error codes from
the cffi module that shim/native/__init__.py loaded (the package imports that first), not from
shim/native/__init__.py, which raises these errors."""

from __future__ import annotations

import os
import sys
import warnings

from shim._native import ffi, lib
from shim.base.private_files import UnsafeCacheWarning  # noqa: F401 (defined there: see that module)

# Halide's error codes: Halide 21's enum, and those a later release added (abi/halide22_runtime.h).
_ERROR_NAMES = {**ffi.typeof("enum halide_error_code_t").elements,
                **ffi.typeof("enum halide22_error_code_t").elements}

# Halide error codes that mean a device operation failed (allocation, copy, launch, handles).
DEVICE_ERROR_CODES = frozenset({
    lib.halide_error_code_copy_to_host_failed, lib.halide_error_code_copy_to_device_failed,
    lib.halide_error_code_device_malloc_failed, lib.halide_error_code_device_sync_failed,
    lib.halide_error_code_device_free_failed, lib.halide_error_code_device_run_failed,
    lib.halide_error_code_gpu_device_error, lib.halide_error_code_device_wrap_native_failed,
    lib.halide_error_code_device_detach_native_failed,
    lib.halide_error_code_device_buffer_copy_failed,
    lib.halide_error_code_device_crop_unsupported, lib.halide_error_code_device_crop_failed,
    lib.halide_error_code_incompatible_device_interface,
})


def error_name(code: int) -> str:
    """Halide's name for an error code, without the common prefix."""
    name = _ERROR_NAMES.get(code)
    if name is None:
        return "unknown_error"
    return name.removeprefix("halide_error_code_")


class ShimError(Exception):
    """Base class of every error the shim raises."""


class ArgumentError(ShimError, ValueError):
    """Bad input from the caller: the message names the argument and what was expected."""

    def __init__(self, argument: str, message: str):
        super().__init__(f"{argument}: {message}")
        self.argument = argument


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong kind, or one missing (a float where an integer goes, an int
    for a list, an unknown keyword): an ArgumentError, and the TypeError Python functions, and
    halide.Buffer's bindings, raise there."""


class CoordinateError(ArgumentError, IndexError):
    """Coordinates outside a Buffer (``buf[x, y]``): an ArgumentError, and the IndexError
    halide.Buffer and numpy raise there."""


class ElementValueError(ArgumentError, RuntimeError):
    """A value a Buffer's element cannot hold (``buf[x, y] = v``, ``fill``, ``all_equal``):
    an ArgumentError, and the RuntimeError halide.Buffer raises there."""


class HalideCodeError(ShimError, RuntimeError):
    """An error that carries one of Halide's error codes (halide_error_code_t) and its text."""

    def __init__(self, code: int, message: str, *, context: str = ""):
        self.code = code
        self.code_name = error_name(code)
        self.message = message or self.code_name
        prefix = f"{context}: " if context else ""
        super().__init__(f"{prefix}{self.message} [Halide error {code}: {self.code_name}]")


class PipelineError(HalideCodeError):
    """A pipeline returned a Halide error code (constraint violated, access out of bounds, ...)."""


class BoundsError(ArgumentError, PipelineError):
    """A buffer does not cover what the pipeline's bounds query asks for: an input too small
    for what the pipeline reads, or an output whose shape the pipeline constrains otherwise.
    Caught before the pipeline runs; it is both an ArgumentError (it names the argument) and a
    PipelineError (it carries the Halide error code the pipeline would have returned).
    ``region``: (Halide dimension, (min, extent) the pipeline reads or writes, (min, extent)
    the buffer covers) where one dimension's region was refused, else None."""

    def __init__(self, argument: str, code: int, message: str, *, region: tuple | None = None):
        PipelineError.__init__(self, code, f"{argument}: {message}")
        self.argument = argument
        self.region = region


class DeviceError(HalideCodeError):
    """A device operation failed: a backend call, or Python code running inside one."""


class DeviceUnavailable(ShimError):
    """The requested device does not exist on this machine, or its driver cannot be loaded."""


class BuildError(ShimError):
    """A pipeline's library could not be built (``python -m shim build``): what it needs is
    missing (halide, for a Python generator; a C compiler), or the generator or the linker
    failed; the message says which, with what they printed."""


class LayoutWarning(UserWarning):
    """An array whose memory order makes the shim's axes differ from those of the Python
    extension Halide generates for a pipeline: an F-contiguous array (numpy's ``order="F"``)
    that is not C-contiguous. The shim takes its last axis as x, as halide.Buffer(array) does;
    the generated extension takes its first (``shim.load(path, convention="extension")``
    calls the pipeline as the extension does)."""


class RuntimeOverrideWarning(UserWarning):
    """A pipeline's library defines a Halide runtime function itself (its own
    halide_acquire_cl_context, say), which under Halide's runtime would replace Halide's: the
    shim's runtime, loaded first, is the one its pipelines call."""


class SizeWarning(UserWarning):
    """An output the caller left out was sized from the pipeline's estimates, not from its
    inputs: no output like the first input fits what the inputs hold (shim/calls/output_sizes.py).
    Passing the output's shape chooses it."""


def warn_caller(message: str, category: type[Warning]) -> None:
    """Warn with the location of the first frame outside the shim package: the user's line,
    however deep in the shim (or in its native fast path's fallback) the warning was found."""
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class DirtyBufferWarning(UserWarning):
    """A Buffer was dropped while its device held results that nobody read, on the host or
    as the input of another pipeline. (If its host memory is visible to anyone, the shim
    copied the results there first: no data is lost either way.)"""
