"""What the Vulkan tests (test_vulkan.py, test_vulkan_halide22.py) share: child processes (for
what only a fresh process shows: device selection, Khronos's validation layer), kernel modules
initialized as code of the default release, and forged DLPack capsules."""

from __future__ import annotations

import ctypes
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import shim
from shim.native import ffi, lib

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def run_python(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``script`` in a child Python with ``args``, in the repository, its environment with
    ``env`` added."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args],
                          capture_output=True, text=True, env={**os.environ, **(env or {})},
                          cwd=ROOT)


# Which device a fresh process makes (or why none).
SELECTION = """
import shim
from shim.native import ffi, lib
try:
    device = shim.device("vulkan")
except shim.DeviceUnavailable as e:
    print("unavailable:", e)
else:
    print("device:", device.name, "|", ffi.string(lib.halide_vulkan_get_device_type(ffi.NULL)).decode())
"""


def validation_layer() -> dict:
    """The environment that runs a child process's Vulkan work under Khronos's validation layer
    (which writes what it finds to stdout); skips where the layer is not installed."""
    layer = {"HL_VK_LAYERS": "VK_LAYER_KHRONOS_validation"}
    if "VK_ERROR_LAYER_NOT_PRESENT" in run_python(SELECTION, env=layer).stdout:
        pytest.skip("Khronos's validation layer is not installed (Debian: vulkan-validationlayers)")
    return layer


def initialize_kernels(source: bytes):
    """halide_vulkan_initialize_kernels for ``source``, called from no library the shim
    registered (so as code of the default release): the state, in a void **."""
    state = ffi.new("void **")
    with shim.core.bridge.runtime_call("initialize") as check:
        check(lib.halide_vulkan_initialize_kernels(ffi.NULL, state, source, len(source)))
    return state


def tensor_of(capsule):
    """The DLManagedTensor inside a DLPack capsule, for a test to forge."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return ffi.cast("DLManagedTensor *", get(capsule, b"dltensor"))


class VulkanCapsule:
    """A DLPack producer that hands over ``capsule`` as Vulkan memory (kDLVulkan)."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack_device__(self):
        return (7, 0)

    def __dlpack__(self, **kwargs):
        return self.capsule
