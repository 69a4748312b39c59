"""Choosing devices: ``shim.device(kind)``, ``shim.devices()``, and the map from Halide's
device interfaces to the backends behind them."""

from __future__ import annotations

import os
from typing import Any, Literal, TypeVar, overload

from shim.base import sections
from shim.backends.base import Backend
from shim.backends.cuda import CUDABackend
from shim.backends.host import HostBackend
from shim.backends.opencl import OpenCLBackend
from shim.backends.opencl_image import OpenCLImageBackend
from shim.backends.vulkan import VulkanBackend
from shim.base.errors import ArgumentError, DeviceUnavailable
from shim.native import ffi, lib

# Every backend the shim has. Each class holds its own facts (kind, native index, DLPack
# device type, default_rank); everything else derives them from here.
BACKEND_CLASSES: tuple[type[Backend], ...] = (HostBackend, OpenCLBackend, CUDABackend,
                                               OpenCLImageBackend, VulkanBackend)
_BY_KIND = {cls.kind: cls for cls in BACKEND_CLASSES}
_BY_INDEX = {cls.index: cls for cls in BACKEND_CLASSES}

_backends: dict[int, Backend] = {}
# Serializes creating a backend (a driver's context is made once), never device operations.
_creation_lock = sections.Lock()


def _after_fork_in_child() -> None:
    # Another thread may have been creating a backend at the fork: the child creates its own
    # (a backend is listed only once it is made).
    global _creation_lock
    _creation_lock = sections.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def kinds() -> list[str]:
    """The device kinds the shim has backends for, as shim.device() takes them."""
    return list(_BY_KIND)


def backend_class(kind: str) -> type[Backend] | None:
    """The class of the backends of a device kind, None for a kind the shim has none of."""
    return _BY_KIND.get(kind)


def classes_for_apis(apis) -> list[type[Backend]]:
    """The backends whose memory a pipeline built for the device APIs ``apis`` (Halide target
    features: "opencl", "cuda") takes: each API's own, and other kinds of memory of the same
    API (OpenCL images)."""
    return [cls for cls in BACKEND_CLASSES if (cls.api or cls.kind) in apis]


def kind_of_index(index: int) -> str | None:
    """The kind of the backend whose native index (enum shim_backend) is ``index``."""
    cls = _BY_INDEX.get(index)
    return cls.kind if cls is not None else None


_B = TypeVar("_B", bound=Backend)


# Each kind's own class, for type checkers (a kind's members: set_faults, queue, ...).
@overload
def device(kind: Literal["host"] = ..., **options: Any) -> HostBackend: ...
@overload
def device(kind: Literal["opencl"], **options: Any) -> OpenCLBackend: ...
@overload
def device(kind: Literal["cuda"], **options: Any) -> CUDABackend: ...
@overload
def device(kind: Literal["vulkan"], **options: Any) -> VulkanBackend: ...
@overload
def device(kind: Literal["opencl_image"], **options: Any) -> OpenCLImageBackend: ...
@overload
def device(kind: _B, **options: Any) -> _B: ...
@overload
def device(kind: str, **options: Any) -> Backend: ...


def device(kind: str | Backend = HostBackend.kind, **options: Any) -> Backend:
    """The device of a backend kind: "opencl", "cuda", "vulkan" or "host" (the simulated
    device), created on first use with ``options`` (see each backend). A backend keeps its device for
    the life of the process: Halide's handles do not say which device they belong to."""
    if isinstance(kind, Backend):
        return kind
    factory = _BY_KIND.get(kind)
    if factory is None:
        raise ArgumentError("kind", f"unknown device kind {kind!r}; expected one of "
                                    f"{', '.join(sorted(_BY_KIND))}")
    backend = _backends.get(factory.index)
    if backend is None:
        # Another kind of memory of an API's device (OpenCL images) is made on that device,
        # made first (the lock is not reentrant).
        on = () if factory.api is None else (device(factory.api, **options),)
        with _creation_lock:
            backend = _backends.get(factory.index)
            if backend is None:
                backend = factory(*on) if on else factory(**options)
                _backends[factory.index] = backend
    elif options and not backend.matches(**options):
        raise ArgumentError("options", f"the {kind} backend already uses {backend.name}; a "
                                       "process has one device per backend")
    return backend


# The order in which default_device() tries the GPU backends (Backend.default_rank).
_DEFAULT_ORDER = tuple(cls.kind for cls in sorted(
    (cls for cls in BACKEND_CLASSES if cls.default_rank is not None),
    key=lambda cls: cls.default_rank))


def preferred_kind(candidates) -> str | None:
    """Of the device kinds ``candidates`` (a pipeline's GPU APIs, say), the one
    default_device() would try first; None if the shim has a backend for none of them."""
    return next((kind for kind in _DEFAULT_ORDER if kind in candidates), None)


# The kinds default_device() found unavailable: machines do not grow devices, and trying a
# driver that is not there costs far more than a call.
_unavailable: set[str] = set()


def default_device() -> Backend:
    """The device used when none is named: $HALIDE_SHIM_DEVICE if set, else the first of the
    GPU backends that works on this machine (CUDA, then OpenCL, then Vulkan), else the simulated
    host device."""
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
    return device(HostBackend.kind)


def devices() -> list[tuple[str, str]]:
    """(kind, description) of every device the shim can use on this machine, without
    creating any context: the GPUs, in the order default_device() tries them, then the
    simulated host device."""
    order = [*_DEFAULT_ORDER, *(cls.kind for cls in BACKEND_CLASSES if cls.kind not in _DEFAULT_ORDER)]
    return [(kind, description) for kind in order for description in _BY_KIND[kind].available()]


def created() -> list[Backend]:
    """The backends made so far in this process."""
    return list(_backends.values())


def kind_for_dlpack(device_type: int) -> str | None:
    """The backend kind whose memory has DLPack device type ``device_type``, if any."""
    return next((cls.kind for cls in BACKEND_CLASSES if cls.dlpack_device_type == device_type), None)


def backend_for_interface(interface) -> Backend:
    """The backend behind one of the shim's interfaces, created with its defaults if no one
    asked for it yet (a pipeline may use a device before Python does)."""
    index = lib.shim_backend_of(interface)
    backend = _backends.get(index)
    if backend is not None:
        return backend
    kind = kind_of_index(index)
    if kind is None:
        raise LookupError(f"no backend for interface {ffi.cast('uintptr_t', interface)}")
    return device(kind)
