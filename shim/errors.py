"""The exceptions the shim raises. Every one is a ShimError."""

from __future__ import annotations


# Halide error codes that mean a device operation failed (allocation, copy, launch, handles).
DEVICE_ERROR_CODES = frozenset({-14, -15, -16, -17, -18, -23, -29, -32, -33, -39, -40, -41, -42})


class ShimError(Exception):
    """Base class of every error the shim raises."""


class ArgumentError(ShimError, ValueError):
    """Bad input from the caller: the message names the argument and what was expected."""

    def __init__(self, argument: str, message: str):
        super().__init__(f"{argument}: {message}")
        self.argument = argument


class HalideCodeError(ShimError, RuntimeError):
    """An error that carries one of Halide's error codes (halide_error_code_t) and its text."""

    def __init__(self, code: int, message: str, *, context: str = ""):
        from shim.native import error_name

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
    PipelineError (it carries the Halide error code the pipeline would have returned)."""

    def __init__(self, argument: str, code: int, message: str):
        PipelineError.__init__(self, code, f"{argument}: {message}")
        self.argument = argument


class DeviceError(HalideCodeError):
    """A device operation failed: a backend call, or Python code running inside one."""


class DeviceUnavailable(ShimError):
    """The requested device does not exist on this machine, or its driver cannot be loaded."""


class DirtyBufferWarning(UserWarning):
    """A Buffer was dropped while its device held results that nobody read, on the host or
    as the input of another pipeline. (If its host memory is visible to anyone, the shim
    copied the results there first: no data is lost either way.)"""
