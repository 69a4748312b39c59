"""DLPack's C side, below shim.Buffer and knowing nothing of it: device types, the capsules the
shim makes (and the deleters their consumers call), and the capsules producers hand over, read
and checked.

Exporting a Buffer is shim/exchange/dlpack_export.py; making Buffers of what producers hand over is
shim/interop/dlpack.py.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
import math
import operator
import reprlib
import warnings
from typing import NamedTuple, Protocol

import numpy as np

from shim.native import interrupts
from shim.core import shutdown
from shim.base.errors import ArgumentError, ShimError
from shim.native import Finalized, ffi, lib
from shim.base.types import FLOAT, INT, UINT, HalideType


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


class DLPackProducer(Protocol):
    """What the shim takes as a DLPack producer (the Python array API's protocol): a tensor
    with ``__dlpack__`` (called with keywords its version of the protocol has) and
    ``__dlpack_device__``, a (device type, device id) pair."""

    def __dlpack__(self) -> object: ...

    def __dlpack_device__(self) -> tuple[int, int]: ...


READ_ONLY, IS_COPIED = 1, 2
VERSION = (1, 1)
HOST_DEVICES = (DLDeviceType.CPU, DLDeviceType.CUDAHost, DLDeviceType.CUDAManaged)
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


# --- devices and element types -----------------------------------------------------------------

def device_name(device) -> str:
    kind, index = device
    try:
        name = DLDeviceType(kind).name
    except ValueError:  # a device type the shim has no name for, from a capsule
        name = f"device type {kind}"
    return f"{name}:{index}"


def device_pair(value) -> tuple[DLDeviceType, int] | None:
    """``value`` as a DLPack device: a (device type DLPack defines, id >= 0) pair of ints."""
    try:
        kind, index = value
        kind, index = DLDeviceType(operator.index(kind)), operator.index(index)
    except Exception:  # noqa: BLE001 - whatever it is (a producer's, maybe), it is no device
        return None
    return (kind, index) if index >= 0 else None


def version_tuple(version) -> tuple[int, int]:
    try:
        major, minor = version
        return int(major), int(minor)
    except (TypeError, ValueError):
        raise TypeError(f"max_version must be a (major, minor) tuple, got {version!r}") from None


def _to_dl_type(htype: HalideType, out) -> None:
    if htype.code == UINT and htype.bits == 1:
        out.code, out.bits = _DL_BOOL, 8
    else:
        out.code, out.bits = htype.code, htype.bits
    out.lanes = 1


def _from_dl_type(dl, refuse) -> HalideType:
    if dl.lanes != 1:
        refuse(f"elements of {dl.lanes} lanes; only scalar elements can be imported")
    if dl.code == _DL_BOOL and dl.bits == 8:
        return HalideType(UINT, 1)
    htype = HalideType(dl.code, dl.bits) if dl.code in (INT, UINT, FLOAT) else None
    dtype = None if htype is None else htype.dtype
    if dtype is None or dtype.itemsize * 8 != dl.bits:  # (uint1 is packed bits, not numpy's bool)
        refuse(f"elements of DLPack type code {dl.code} with {dl.bits} bits, which have no numpy "
               "equivalent (a shim.Buffer needs one)")
    return htype


# --- capsules the shim makes -------------------------------------------------------------------

# manager_ctx key -> what an exported tensor keeps alive, until its deleter runs.
_exports: dict[int, tuple] = {}
_keys = itertools.count(1)


def make_capsule(owners, data, byte_offset, device, strides, shape, htype: HalideType, flags,
                 versioned, max_version):
    """A capsule whose tensor keeps ``owners`` alive until its deleter runs (a callable among
    them is called then)."""
    n = len(shape)
    shape_c = ffi.new("int64_t[]", list(shape) or [1])
    strides_c = ffi.new("int64_t[]", list(strides) or [1])
    key = next(_keys)
    if versioned:
        managed = ffi.new("DLManagedTensorVersioned *")
        minor = VERSION[1] if version_tuple(max_version)[0] > 1 else min(VERSION[1], max_version[1])
        managed.version.major, managed.version.minor = VERSION[0], minor
        managed.flags = flags
        managed.deleter = lib.shim_dlpack_delete_versioned
    else:
        managed = ffi.new("DLManagedTensor *")
        managed.deleter = lib.shim_dlpack_delete
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
    # Called from C with Ctrl-C deferred around the whole callback (shim_dlpack_delete*, see
    # shim/native/interrupts.py); the section here covers a Python caller of the deleter too.
    with interrupts.deferred():  # (a deleter interrupted halfway would leak its pins)
        _release_owners(managed)


def _release_owners(managed) -> None:
    entry = _exports.pop(int(ffi.cast("uintptr_t", managed.manager_ctx)), None)
    if entry is None or shutdown.shut_down():
        return  # (at exit, device memory goes with the process: see shim/core/shutdown.py)
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


# --- capsules producers hand over --------------------------------------------------------------
#
# Nothing a producer hands over is trusted: what __dlpack_device__ says, the capsule and every
# field of its tensor are checked before the shim uses the memory, and anything wrong is an
# ArgumentError naming the argument (a hostile tensor would otherwise crash the process or read
# the wrong bytes). The memory itself can only be checked on devices (see
# Backend.check_dlpack_memory); host memory is trusted, as numpy trusts it.

_MAX_DIMENSIONS = 64  # numpy's: every Buffer has a numpy array
_INT32_MAX = 2**31 - 1  # Halide's extents and strides are 32-bit


def host_array(obj, argument: str) -> np.ndarray:
    """A numpy array over the host memory an object with ``__dlpack__`` exports, without a
    copy, for the argument named ``argument``."""
    claimed = claimed_device(obj, argument)
    if claimed[0] not in HOST_DEVICES:
        raise ArgumentError(argument, f"its data is on {device_name(claimed)}, not in host memory "
                                      "(shim.from_dlpack imports device memory)")
    return ImportedTensor(obj, None, claimed, argument).host_view()


def claimed_device(obj, argument: str = "obj") -> tuple[DLDeviceType, int]:
    """Where ``obj.__dlpack_device__()`` says its data is, checked."""
    if not hasattr(obj, "__dlpack__") or not hasattr(obj, "__dlpack_device__"):
        raise ArgumentError(argument, f"expected an object with __dlpack__ and __dlpack_device__, "
                                      f"got {type(obj).__name__}")
    returned = _producer_call(obj, "__dlpack_device__", argument, obj.__dlpack_device__)
    device = device_pair(returned)
    if device is None:
        raise ArgumentError(argument, f"{type(obj).__name__}.__dlpack_device__() returned "
                                      f"{reprlib.repr(returned)}; expected a (device type, device "
                                      "id) pair of ints, with a device type DLPack defines")
    return device


def _producer_call(obj, method: str, argument: str, call):
    """``call()``, a call into the producer: what it raises is bad input (but a shim error,
    from a shim Buffer as producer, stays what it is)."""
    try:
        return call()
    except ShimError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of foreign code
        raise ArgumentError(argument, f"{type(obj).__name__}.{method}() raised "
                                      f"{type(e).__name__}: {e}") from e


def _capsule_of(obj, stream, argument: str):
    def export():
        try:
            return obj.__dlpack__(stream=stream, max_version=VERSION)
        except TypeError:  # a producer from before DLPack 1.0 and the max_version argument
            return obj.__dlpack__(stream=stream)

    return _producer_call(obj, "__dlpack__", argument, export)


class _Tensor(NamedTuple):
    """A DLTensor's fields, checked, as Python values."""

    device: tuple[int, int]
    data: int
    byte_offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    htype: HalideType
    read_only: bool

    @property
    def nbytes(self) -> int:
        return span_bytes(self.shape, self.strides, self.htype.bytes)


def span_bytes(shape, strides, itemsize: int) -> int:
    """The bytes from the first element to the end of the last (0 for no elements) of an
    array of ``shape`` laid out by ``strides`` in elements, none negative."""
    if 0 in shape:
        return 0
    return (sum((e - 1) * s for e, s in zip(shape, strides)) + 1) * itemsize


def _read_tensor(managed, versioned: bool, refuse) -> _Tensor:
    if versioned and managed.version.major != VERSION[0]:
        refuse(f"DLPack {managed.version.major}.{managed.version.minor}, whose layout the shim "
               f"does not know (it reads {VERSION[0]}.x)")
    tensor = managed.dl_tensor
    n = tensor.ndim
    if not 0 <= n <= _MAX_DIMENSIONS:
        refuse(f"ndim {n}; expected 0 to {_MAX_DIMENSIONS}")
    if n and tensor.shape == ffi.NULL:
        refuse(f"a NULL shape for {n} dimensions")
    shape = tuple(ffi.unpack(tensor.shape, n)) if n else ()
    if tensor.strides == ffi.NULL:  # compact and row-major, as DLPack 1.0 allows
        strides = tuple(math.prod(shape[i + 1:]) for i in range(n))
    else:
        strides = tuple(ffi.unpack(tensor.strides, n)) if n else ()
    if not all(0 <= e <= _INT32_MAX for e in shape) or any(abs(s) > _INT32_MAX for s in strides):
        refuse(f"shape {shape} with strides {strides}; extents must be >= 0 and both must fit "
               "Halide's 32 bits")
    htype = _from_dl_type(tensor.dtype, refuse)
    data = int(ffi.cast("uintptr_t", tensor.data))
    if data == 0 and 0 not in shape:
        refuse(f"NULL data for {math.prod(shape)} elements")
    byte_offset = int(tensor.byte_offset)
    if tensor.device.device_type in HOST_DEVICES and 0 not in shape:
        # Host memory is trusted, as numpy trusts it; addresses beyond 64 bits are no memory.
        reach = [(e - 1) * s * htype.bytes for e, s in zip(shape, strides)]
        first = data + byte_offset
        if first + sum(r for r in reach if r < 0) < 0 or \
                first + sum(r for r in reach if r > 0) + htype.bytes > 2**64:
            refuse(f"data {data:#x} and byte_offset {byte_offset}, which put its elements "
                   "beyond the 64-bit address space")
    return _Tensor((tensor.device.device_type, tensor.device.device_id), data, byte_offset,
                   shape, strides, htype, versioned and bool(managed.flags & READ_ONLY))


class ImportedTensor(Finalized):
    """A consumed capsule, checked: the managed tensor, whose deleter runs when this is dropped
    (with the Buffer or the array over its memory). ``device``: where the producer said the
    data is, which the tensor must agree with."""

    def __init__(self, obj, stream, device=None, argument: str = "obj"):
        self.producer = obj  # kept alive too, as the standard asks of consumers
        self.argument = argument
        capsule = _capsule_of(obj, stream, argument)
        self.versioned = bool(_capsule_valid(capsule, _name(True)))
        if not self.versioned and not _capsule_valid(capsule, _name(False)):
            self.refuse(f"{reprlib.repr(capsule)}, not an unused DLPack capsule")
        kind = "DLManagedTensorVersioned *" if self.versioned else "DLManagedTensor *"
        managed = ffi.cast(kind, _capsule_pointer(capsule, _name(self.versioned)))
        # Refusals up to here leave the capsule unconsumed: its own destructor frees it.
        self.tensor = _read_tensor(managed, self.versioned, self.refuse)
        if device is not None and self.tensor.device != tuple(device):
            self.refuse(f"a tensor on {device_name(self.tensor.device)}, while its "
                        f"__dlpack_device__() says {device_name(device)}")
        _capsule_rename(capsule, _name(self.versioned, used=True))
        self.managed = managed

    def refuse(self, what: str):
        raise ArgumentError(self.argument,
                            f"{type(self.producer).__name__}.__dlpack__() gave {what}")

    def host_view(self) -> np.ndarray:
        """A numpy array over the tensor's host memory; it keeps this alive."""
        t = self.tensor
        if 0 in t.shape:
            return np.empty(t.shape, t.htype.dtype)  # no memory to share (data may be NULL)
        return np.asarray(self)

    @property
    def __array_interface__(self) -> dict:
        t = self.tensor
        return {"version": 3, "shape": t.shape, "typestr": t.htype.dtype.str,
                "data": (t.data + t.byte_offset, t.read_only),
                "strides": tuple(s * t.htype.bytes for s in t.strides)}

    def _finalize(self):  # (Finalized's finalizer: Ctrl-C cannot leave the producer's tensor held)
        managed = getattr(self, "managed", None)
        if managed is not None and managed.deleter != ffi.NULL:
            managed.deleter(managed)
