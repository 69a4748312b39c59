"""DLPack exchange: Buffers to and from numpy, PyTorch, CuPy or any array-API library, on the
CPU and on the device, without copies, in stream order.

Export follows the Python array API standard (2024.12) for ``__dlpack__``: a versioned
capsule (DLPack 1.x) when the consumer's ``max_version`` allows, else a legacy one; READ_ONLY
and IS_COPIED flags; ``dl_device`` and ``copy``; BufferError where the export is impossible.
Shapes and strides are Halide's dimensions reversed, so crops export as strided views; a
capsule keeps the Buffer (and its memory) alive until the consumer's deleter runs, once.

Streams: on CUDA the consumer passes its stream and the shim makes its pending work visible
there (event record, stream wait): None or 1 is the legacy default stream, 2 the per-thread
default, -1 asks for no synchronization, 0 is refused as ambiguous. The standard defines no
value for OpenCL; here it is a cl_command_queue handle as an int (None: the shim's queue is
finished first). As a consumer, the shim passes the stream its own pipelines run on.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
import warnings

import numpy as np

from shim import runtime, shutdown
from shim.buffer import Buffer
from shim.devices import device as get_device
from shim.errors import ArgumentError
from shim.native import ffi, lib
from shim.types import BFLOAT, FLOAT, INT, UINT, HalideType


class DLDeviceType(enum.IntEnum):
    CPU = 1
    CUDA = 2
    CUDAHost = 3
    OpenCL = 4
    Vulkan = 7
    Metal = 8
    VPI = 9
    ROCM = 10
    ROCMHost = 11
    ExtDev = 12
    CUDAManaged = 13
    OneAPI = 14


READ_ONLY, IS_COPIED = 1, 2
VERSION = (1, 1)
HOST_DEVICES = (DLDeviceType.CPU, DLDeviceType.CUDAHost, DLDeviceType.CUDAManaged)
_DEVICE_KINDS = {DLDeviceType.CUDA: "cuda", DLDeviceType.OpenCL: "opencl"}
_DL_BOOL = 6

# Prototypes of our own: ctypes.pythonapi's function objects are shared with every user.
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_void_p)(("PyCapsule_New", ctypes.pythonapi))
_capsule_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_void_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_void_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_capsule_rename = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_void_p)(
    ("PyCapsule_SetName", ctypes.pythonapi))


def _name(versioned: bool, used: bool = False) -> int:
    return int(ffi.cast("uintptr_t", lib.shim_dlpack_capsule_name(versioned, used)))


# --- export ------------------------------------------------------------------------------------

# manager_ctx key -> what an exported tensor keeps alive, until its deleter runs.
_exports: dict[int, tuple] = {}
_keys = itertools.count(1)


def device_of(buf: Buffer) -> tuple[DLDeviceType, int]:
    """``__dlpack_device__``: where ``buf``'s current data is: its device allocation, unless
    host memory holds changes the device lacks (or the device has no DLPack type)."""
    backend = buf.device
    if backend is None or backend.dlpack_device_type is None or buf.host_dirty:
        return DLDeviceType.CPU, 0
    return DLDeviceType(backend.dlpack_device_type), backend.dlpack_device_id()


def export(buf: Buffer, *, stream=None, max_version=None, dl_device=None, copy=None):
    """``__dlpack__``: a capsule for ``buf``'s data."""
    here = device_of(buf)
    target = here if dl_device is None else _device_tuple(dl_device)
    versioned = max_version is not None and _version_tuple(max_version)[0] >= 1
    if target[0] == DLDeviceType.CPU:
        return _export_host(buf, here, stream, copy, versioned, max_version)
    if target != here:
        raise BufferError(f"cannot export a buffer whose data is on {here[0].name}:{here[1]} to "
                          f"{_device_name(target)}")
    return _export_device(buf, target, stream, copy, versioned, max_version)


def _export_host(buf: Buffer, here, stream, copy, versioned, max_version):
    if stream is not None:
        raise ValueError("stream must be None when exporting to the CPU")
    copied = copy is True or here[0] != DLDeviceType.CPU
    if copied and copy is False:
        raise BufferError(f"exporting this buffer to the CPU needs a copy (its data is on "
                          f"{here[0].name}), and copy=False forbids one")
    array = buf.numpy()  # device results come home first
    if copied:
        array = array.copy()
    flags = (IS_COPIED if copied else 0) | (0 if array.flags.writeable else READ_ONLY)
    if flags & READ_ONLY and not versioned:
        raise BufferError("this buffer's memory is read-only, which only a versioned capsule "
                          "(max_version >= (1, 0)) can say")
    return _capsule((array,) if copied else (buf, array), array.ctypes.data, 0, (DLDeviceType.CPU, 0),
                    _element_strides(array), array.shape, HalideType.from_dtype(array.dtype), flags,
                    versioned, max_version)


def _export_device(buf: Buffer, target, stream, copy, versioned, max_version):
    backend = buf.device
    _check_stream(backend, stream)
    source, flags = buf, 0
    if copy is True:
        source, flags = _device_copy(buf, backend), IS_COPIED
    else:
        # The consumer may write through the tensor: from now on the device copy is the truth.
        source.set_device_dirty(True)
        source._unread = False
    unpin = runtime.pin_device(source._raw)
    try:
        backend.make_visible(stream, source._family.stream)
        data, offset = backend.dlpack_data(source._raw.device)
    except BaseException:
        unpin()
        raise
    strides = tuple(source.dim(i).stride for i in reversed(range(source.dimensions)))
    return _capsule((source, unpin), data, offset, target, strides, source.shape, source.type,
                    flags, versioned, max_version)


def _capsule(owners, data, byte_offset, device, strides, shape, htype: HalideType, flags,
             versioned, max_version):
    """A capsule whose tensor keeps ``owners`` alive until its deleter runs (a callable among
    them is called then)."""
    n = len(shape)
    shape_c = ffi.new("int64_t[]", list(shape) or [1])
    strides_c = ffi.new("int64_t[]", list(strides) or [1])
    key = next(_keys)
    if versioned:
        managed = ffi.new("DLManagedTensorVersioned *")
        minor = VERSION[1] if _version_tuple(max_version)[0] > 1 else min(VERSION[1], max_version[1])
        managed.version.major, managed.version.minor = VERSION[0], minor
        managed.flags = flags
        managed.deleter = lib.shim_py_dlpack_delete_versioned
    else:
        managed = ffi.new("DLManagedTensor *")
        managed.deleter = lib.shim_py_dlpack_delete
    managed.manager_ctx = ffi.cast("void *", key)
    tensor = managed.dl_tensor
    tensor.data = ffi.cast("void *", data)
    tensor.device.device_type, tensor.device.device_id = int(device[0]), int(device[1])
    tensor.ndim = n
    _to_dl_type(htype, tensor.dtype)
    tensor.shape, tensor.strides, tensor.byte_offset = shape_c, strides_c, byte_offset
    _exports[key] = (owners, managed, shape_c, strides_c)
    destructor = int(ffi.cast("uintptr_t", ffi.addressof(lib, "shim_dlpack_capsule_destructor")))
    return _capsule_new(int(ffi.cast("uintptr_t", managed)), _name(versioned), destructor)


def _release(managed) -> None:
    entry = _exports.pop(int(ffi.cast("uintptr_t", managed.manager_ctx)), None)
    if entry is None or shutdown.shut_down():
        return  # (at exit, device memory goes with the process: see shim/shutdown.py)
    for owner in entry[0]:
        if callable(owner):
            try:
                owner()
            except Exception as e:  # noqa: BLE001 - a deleter returns into C
                warnings.warn(f"releasing an exported DLPack tensor failed: {e}", RuntimeWarning)


@ffi.def_extern()
def shim_py_dlpack_delete(managed):
    _release(managed)


@ffi.def_extern()
def shim_py_dlpack_delete_versioned(managed):
    _release(managed)


def _device_copy(buf: Buffer, backend) -> Buffer:
    """A new, dense Buffer on ``backend`` holding a copy of ``buf``'s data, made on the device."""
    from shim.backends.base import interface_of

    copy = Buffer._wrap(np.empty(buf.shape, buf.dtype), "copy", exposed=False,
                        mins=[lo for lo, _ in buf._box])
    with runtime.runtime_call("copy for DLPack") as check:
        check(lib.halide_buffer_copy(ffi.NULL, buf._raw, interface_of(backend), copy._raw))
    return copy


def _check_stream(backend, stream) -> None:
    if stream is None:
        return
    if not isinstance(stream, int) or isinstance(stream, bool):
        raise TypeError(f"stream must be an int or None, got {type(stream).__name__}")
    if backend.kind == "cuda" and (stream == 0 or stream < -1):
        raise ValueError(f"stream {stream} is not a valid CUDA stream for DLPack (0 is ambiguous: "
                         "pass 1 for the legacy default stream, 2 for the per-thread one)")


def _device_name(device) -> str:
    kind, index = device
    return f"{DLDeviceType(kind).name}:{index}"


def _device_tuple(dl_device) -> tuple[int, int]:
    try:
        kind, index = dl_device
        return DLDeviceType(int(kind)), int(index)
    except (TypeError, ValueError):
        raise BufferError(f"dl_device must be a (device type, device id) pair DLPack knows, "
                          f"got {dl_device!r}") from None


def _version_tuple(version) -> tuple[int, int]:
    try:
        major, minor = version
        return int(major), int(minor)
    except (TypeError, ValueError):
        raise TypeError(f"max_version must be a (major, minor) tuple, got {version!r}") from None


def _element_strides(array: np.ndarray) -> tuple:
    return tuple(s // array.itemsize for s in array.strides)


def _to_dl_type(htype: HalideType, out) -> None:
    if htype.code == UINT and htype.bits == 1:
        out.code, out.bits = _DL_BOOL, 8
    else:
        out.code, out.bits = htype.code, htype.bits
    out.lanes = 1


def _from_dl_type(dl) -> HalideType:
    if dl.lanes != 1:
        raise BufferError("vector element types cannot be imported")
    if dl.code == _DL_BOOL:
        return HalideType(UINT, 1)
    if dl.code not in (INT, UINT, FLOAT, BFLOAT):
        raise BufferError(f"DLPack type code {dl.code} has no Halide equivalent")
    return HalideType(dl.code, dl.bits)


# --- import ------------------------------------------------------------------------------------

def from_dlpack(obj, *, copy=None) -> Buffer:
    """A Buffer over the data of any object with ``__dlpack__``: CPU memory through numpy
    (zero-copy), CUDA and OpenCL memory wrapped as the Buffer's device allocation (zero-copy,
    the producer kept alive). ``copy=True`` copies, ``copy=False`` refuses to."""
    if not hasattr(obj, "__dlpack__") or not hasattr(obj, "__dlpack_device__"):
        raise ArgumentError("obj", f"expected an object with __dlpack__ and __dlpack_device__, "
                                   f"got {type(obj).__name__}")
    kind, index = obj.__dlpack_device__()
    if int(kind) in HOST_DEVICES:
        return Buffer(np.from_dlpack(obj, copy=copy))
    if int(kind) not in _DEVICE_KINDS:
        raise BufferError(f"cannot import DLPack data from device type {kind}")
    backend = get_device(_DEVICE_KINDS[int(kind)])
    if index != backend.dlpack_device_id():
        raise BufferError(f"the data is on {DLDeviceType(int(kind)).name}:{index}, the shim's "
                          f"{backend.kind} backend uses device {backend.dlpack_device_id()}")
    imported = _Imported(obj, backend.dlpack_stream())
    buf = imported.wrap(backend)
    if copy:
        return _device_copy(buf, backend)
    return buf


class _Imported:
    """A consumed capsule: the managed tensor, whose deleter runs when this is dropped (with
    the Buffer that holds it)."""

    def __init__(self, obj, stream):
        try:
            capsule = obj.__dlpack__(stream=stream, max_version=VERSION)
        except TypeError:  # a producer from before DLPack 1.0 and the max_version argument
            capsule = obj.__dlpack__(stream=stream)
        self.versioned = bool(_capsule_valid(capsule, _name(True)))
        if not self.versioned and not _capsule_valid(capsule, _name(False)):
            raise BufferError("__dlpack__ returned something that is not an unused DLPack capsule")
        pointer = _capsule_pointer(capsule, _name(self.versioned))
        kind = "DLManagedTensorVersioned *" if self.versioned else "DLManagedTensor *"
        self.managed = ffi.cast(kind, pointer)
        _capsule_rename(capsule, _name(self.versioned, used=True))
        self.producer = obj  # kept alive too, as the standard asks of consumers

    def wrap(self, backend) -> Buffer:
        tensor = self.managed.dl_tensor
        htype = _from_dl_type(tensor.dtype)
        n = tensor.ndim
        shape = tuple(tensor.shape[i] for i in range(n))
        if tensor.strides == ffi.NULL:
            strides = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(n))
        else:
            strides = tuple(tensor.strides[i] for i in range(n))
        if any(s < 0 for s in strides):
            raise BufferError("negative strides cannot be a device allocation")
        itemsize = htype.bytes
        span = (sum((e - 1) * s for e, s in zip(shape, strides)) + 1) * itemsize if all(shape) else itemsize
        host = np.lib.stride_tricks.as_strided(np.empty(span, np.uint8).view(htype.dtype), shape,
                                               tuple(s * itemsize for s in strides))
        buf = Buffer._wrap(host, "obj", exposed=False)
        buf._keepalive = self
        runtime.wrap_device(buf._raw, backend, int(ffi.cast("uintptr_t", tensor.data)),
                            int(tensor.byte_offset))
        lib.shim_flags_assign(buf._raw, lib.halide_buffer_flag_device_dirty, True)  # it lives there
        return buf

    def __del__(self):
        managed = getattr(self, "managed", None)
        if managed is not None and managed.deleter != ffi.NULL:
            managed.deleter(managed)
