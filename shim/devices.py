"""Choosing devices: ``shim.device(kind)``, ``shim.devices()``, and the map from Halide's
device interfaces to the backends behind them."""

from __future__ import annotations

import os
import threading

from shim.backends.base import Backend
from shim.errors import ArgumentError, DeviceUnavailable
from shim.native import ffi, lib

_backends: dict[int, Backend] = {}
# Serializes creating a backend (a driver's context is made once), never device operations.
_creation_lock = threading.Lock()


def _factories():
    from shim.backends.cuda import CUDABackend
    from shim.backends.host import HostBackend
    from shim.backends.opencl import OpenCLBackend

    return {"host": HostBackend, "opencl": OpenCLBackend, "cuda": CUDABackend}


def backend_class(kind: str) -> type[Backend] | None:
    """The class of the backends of a device kind, None for a kind the shim has none of."""
    return _factories().get(kind)


def device(kind: str = "host", **options) -> Backend:
    """The device of a backend kind: "opencl", "cuda" or "host" (the simulated device),
    created on first use with ``options`` (see each backend). A backend keeps its device for
    the life of the process: Halide's handles do not say which device they belong to."""
    if isinstance(kind, Backend):
        return kind
    factories = _factories()
    if kind not in factories:
        raise ArgumentError("kind", f"unknown device kind {kind!r}; expected one of "
                                    f"{', '.join(sorted(factories))}")
    factory = factories[kind]
    backend = _backends.get(factory.index)
    if backend is None:
        with _creation_lock:
            backend = _backends.get(factory.index)
            if backend is None:
                backend = factory(**options)
                _backends[factory.index] = backend
    elif options and not backend.matches(**options):
        raise ArgumentError("options", f"the {kind} backend already uses {backend.name}; a "
                                       "process has one device per backend")
    return backend


# The order in which default_device() tries the GPU backends: CUDA before OpenCL, since an
# OpenCL device may be a CPU (PoCL, which the test extra installs), while a CUDA device is
# always a GPU. (OpenCL itself prefers a GPU platform: see shim/backends/opencl.py.)
_DEFAULT_ORDER = ("cuda", "opencl")
# The kinds default_device() found unavailable: machines do not grow devices, and trying a
# driver that is not there costs far more than a call.
_unavailable: set[str] = set()


def default_device() -> Backend:
    """The device used when none is named: $HALIDE_SHIM_DEVICE if set, else the first of the
    GPU backends that works on this machine (CUDA, then OpenCL), else the simulated host
    device."""
    configured = os.environ.get("HALIDE_SHIM_DEVICE")
    if configured:
        return device(configured)
    for kind in _DEFAULT_ORDER:
        if kind in _unavailable:
            continue
        try:
            return device(kind)
        except DeviceUnavailable:
            _unavailable.add(kind)
    return device("host")


def devices() -> list[tuple[str, str]]:
    """(kind, description) of every device the shim can use on this machine, without
    creating any context."""
    from shim.backends import cuda, opencl

    found = [("opencl", f"{d} ({p})") for p, d in opencl.available()]
    found += [("cuda", name) for name in cuda.available()]
    return found + [("host", "simulated device in host memory")]


def created() -> list[Backend]:
    """The backends made so far in this process."""
    return list(_backends.values())


def kind_for_dlpack(device_type: int) -> str | None:
    """The backend kind whose memory has DLPack device type ``device_type``, if any."""
    for kind, factory in _factories().items():
        if factory.dlpack_device_type == device_type:
            return kind
    return None


def backend_for_interface(interface) -> Backend:
    """The backend behind one of the shim's interfaces, created with its defaults if no one
    asked for it yet (a pipeline may use a device before Python does)."""
    index = lib.shim_backend_of(interface)
    backend = _backends.get(index)
    if backend is not None:
        return backend
    for kind, factory in _factories().items():
        if factory.index == index:
            return device(kind)
    raise LookupError(f"no backend for interface {ffi.cast('uintptr_t', interface)}")

