"""atheris target: DLPack both ways: what producers hand the shim (``__dlpack_device__``'s
answer, ``__dlpack__``'s, the capsule and every field of its tensor), and what consumers ask of
a Buffer's ``__dlpack__`` (stream, max_version, dl_device, copy).

The input's first byte chooses the direction; the rest is read by a Reader.

Import: a producer, built with ctypes from dlpack.h's layout (independently of the shim), is
given to shim.from_dlpack (copy None, True or False), shim.Buffer or a pipeline (brighten, as
its input or its output). Its tensor's data is host memory of the harness's (4 KiB), NULL, an
OpenCL or Vulkan buffer the shim made (1 KiB, from a Buffer's own export), or any number.
Checked:
- a refusal is one of the shim's errors;
- a Buffer made has the tensor's shape, strides and element type; on a device, its memory
  lies within the buffer the tensor named (the shim checks device memory: host memory it
  trusts, as numpy does), and reading it gives the bytes there;
- host memory is read (a copy, a pipeline's input) or written (its output) only where the
  tensor lies within the harness's 4 KiB, where the values read are those there;
- the producer's deleter runs once if the shim consumed the capsule, and never otherwise.

Export: a Buffer (host memory, or on OpenCL or Vulkan; read-only or not; a crop or not) asked
for a capsule with the input's keywords. Checked: a refusal is one of the shim's errors or one
the array API standard has ``__dlpack__`` raise (BufferError, and the TypeError or ValueError
of a bad argument), raised by the shim itself; a capsule made holds the Buffer's values (read
back through numpy or the shim), or is dropped unconsumed (its destructor is the shim's C).
"""

import ctypes
import os
import gc
import sys

import numpy as np

from common import ROOT, PropertyViolated, Reader, check_error, fuzz, quiet, sample_library

import shim

sys.path.insert(0, os.path.join(ROOT, "tests"))
from support.dlpack_structs import (DELETER, KDL_CPU, KDL_CUDA, KDL_OPENCL,  # noqa: E402
                                    KDL_VULKAN, DLManagedTensor, DLManagedTensorVersioned,
                                    capsule_new, capsule_pointer, capsule_valid)
HOST_TYPES = (KDL_CPU, 3, 13)  # CPU, CUDAHost, CUDAManaged: host memory, as DLPack has it


HOST = np.arange(4096, dtype=np.uint8) * np.uint8(7)  # the harness's host memory
DEVICE_BYTES = np.arange(1024, dtype=np.uint8) * np.uint8(13)  # what device memory holds
BRIGHTEN = shim.load(sample_library("brighten"))

_SMALL = (0, 1, 2, 3, 4, 7, 8, 16, 64, 1024, -1, -2, -3, 2**31 - 1, 2**31, -2**31, 2**40)
_DTYPES = ((2, 32, 1), (1, 8, 1), (0, 16, 1), (2, 64, 1), (6, 8, 1), (1, 1, 1), (2, 16, 1),
           (4, 16, 1), (3, 64, 1), (2, 32, 4), (2, 32, 0), (5, 64, 1), (0, 7, 1))


def _device_memory():
    """({device type: data}, {device type: (its Buffer, capsule)}): a 1 KiB buffer the shim
    made on each device this machine has, as a Buffer's export names it (the capsules stay
    unconsumed: the memory stays pinned for the process's life)."""
    memory, capsules = {}, {}
    for kind, dl_type in (("opencl", KDL_OPENCL), ("vulkan", KDL_VULKAN)):
        try:
            device = shim.device(kind)
            buf = shim.Buffer(DEVICE_BYTES.copy())
            buf.copy_to_device(device)
            capsule = buf.__dlpack__(dl_device=(dl_type, 0), max_version=(1, 0))
        except shim.ShimError:
            continue
        managed = DLManagedTensorVersioned.from_address(
            capsule_pointer(capsule, b"dltensor_versioned"))
        assert managed.dl_tensor.byte_offset == 0
        memory[dl_type] = managed.dl_tensor.data
        capsules[dl_type] = (buf, capsule)
    return memory, capsules


DEVICE_MEMORY, _KEPT = _device_memory()


def _restore_device_memory(dl_type) -> None:
    """Put DEVICE_BYTES back into the device buffer, which a pipeline's output given as a
    tensor over it has just written."""
    buf = _KEPT[dl_type][0]
    np.asarray(buf)[...] = DEVICE_BYTES
    buf.set_host_dirty(True)
    buf.copy_to_device(buf.device)


def _int(r: Reader, options=_SMALL) -> int:
    """A value from ``options``, or (one time in eight) any 64-bit one."""
    pick = r.u8()
    return r.i64() if pick % 8 == 7 else options[pick % len(options)]


class Producer:
    """A DLPack producer whose every answer the input chooses."""

    def __init__(self, r: Reader):
        self.deleted = 0
        self.deleter = DELETER(self._delete)
        self.claim = (r.choice((KDL_CPU, KDL_CPU, KDL_CPU, KDL_OPENCL, KDL_OPENCL, KDL_VULKAN,
                                KDL_VULKAN, KDL_CUDA, 3, 0, 99)),
                      r.choice((0, 0, 0, 0, 0, 0, 1, -1)))
        self.device_answer = r.u8() % 24
        self.dlpack_answer = r.u8() % 20
        self.versioned = r.bool()
        self.name = (b"dltensor_versioned" if self.versioned else b"dltensor") if r.u8() % 8 else \
            r.choice((b"used_dltensor", b"dltensor", b"dltensor_versioned", b"other"))
        managed = DLManagedTensorVersioned() if self.versioned else DLManagedTensor()
        if self.versioned:
            managed.version.major = r.choice((1, 1, 1, 0, 2, 0xFFFFFFFF))
            managed.version.minor = r.u8()
            managed.flags = r.choice((0, 0, 1, 2, 3, 0xFFFFFFFFFFFFFFFF))
        managed.deleter = self.deleter
        tensor = managed.dl_tensor
        data_kind = r.u8() % 8
        if data_kind < 4:
            self.data, self.memory = HOST.ctypes.data, "host"
        elif data_kind < 6 and DEVICE_MEMORY:
            dl_type = list(DEVICE_MEMORY)[data_kind % len(DEVICE_MEMORY)]
            self.data, self.memory = DEVICE_MEMORY[dl_type], dl_type
        else:
            self.data, self.memory = r.choice((0, 0, 1, 4096, r.u64())), None
        tensor.data = self.data
        same = r.u8() % 4
        tensor.device.device_type, tensor.device.device_id = self.claim if same else (
            r.i32(), r.i32())
        tensor.ndim = self.ndim = r.choice((0, 1, 2, 2, 2, 3, 4, 8, -1, 65, 127)) if r.u8() % 8 \
            else r.i8()
        count = max(self.ndim, 1)
        self.shape_array = (ctypes.c_int64 * count)(*(_int(r, (1, 2, 3, 4, 8, 16, 0, -1, 2**31))
                                                      for _ in range(count)))
        self.strides_array = (ctypes.c_int64 * count)(*(_int(r) for _ in range(count)))
        tensor.shape = None if r.u8() % 16 == 0 else self.shape_array
        tensor.strides = None if r.u8() % 4 == 0 else self.strides_array
        tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes = r.choice(_DTYPES) \
            if r.u8() % 8 else (r.u8(), r.u8(), r.u16())
        tensor.byte_offset = _int(r, (0, 0, 0, 1, 4, 16, 1000, 4096, 2**63))
        self.managed = managed
        self.capsule = capsule_new(ctypes.addressof(managed), self.name, None)

    def _delete(self, _):
        self.deleted += 1

    def __dlpack_device__(self):
        answer = self.device_answer
        if answer < 18:
            return self.claim
        if answer == 23:
            raise RuntimeError("no device")
        return ([*self.claim], (float(self.claim[0]), 0), ("cpu", 0), None,
                (*self.claim, 0))[answer - 18]

    def __dlpack__(self, stream=None, max_version=None, **kwargs):
        answer = self.dlpack_answer
        if answer == 16 and max_version is not None:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        if answer == 17:
            raise ValueError("cannot export")
        if answer == 18:
            return None
        if answer == 19:
            return 42
        return self.capsule

    @property
    def consumed(self) -> bool:
        return not capsule_valid(self.capsule, self.name)

    def expected(self):
        """(shape, element strides, dtype) the tensor says, in numpy's terms, or None."""
        t = self.managed.dl_tensor
        n = self.ndim
        if not 0 <= n <= 64 or (n and not t.shape):
            return None
        shape = tuple(self.shape_array[i] for i in range(n))
        if t.strides:
            strides = tuple(self.strides_array[i] for i in range(n))
        else:
            strides = tuple(int(np.prod(shape[i + 1:], dtype=object)) for i in range(n))
        code, bits = t.dtype.code, t.dtype.bits
        kind = {0: "i", 1: "u", 2: "f"}.get(code)
        if code == 6 and bits == 8:
            dtype = np.dtype(np.bool_)
        elif kind is None or bits not in (8, 16, 32, 64) or (kind == "f" and bits == 8):
            return None
        else:
            dtype = np.dtype(f"{kind}{bits // 8}")
        return shape, strides, dtype

    def region(self):
        """The bytes [low, high) of its memory the tensor's elements lie in (from the data),
        or None where it cannot be worked out."""
        expected = self.expected()
        if expected is None:
            return None
        shape, strides, dtype = expected
        offset = self.managed.dl_tensor.byte_offset
        if 0 in shape:
            return offset, offset
        low = sum((e - 1) * s for e, s in zip(shape, strides) if s < 0) * dtype.itemsize
        high = (sum((e - 1) * s for e, s in zip(shape, strides) if s > 0) + 1) * dtype.itemsize
        return offset + low, offset + high

    @property
    def on_host(self) -> bool:
        """Whether the producer says its data is host memory (which the shim trusts)."""
        return self.claim[0] in HOST_TYPES

    @property
    def readable(self) -> bool:
        """Whether reading or writing the tensor's elements touches only memory they may: on
        the host, only the harness's 4 KiB; on a device, whatever the shim accepts."""
        return not self.on_host or (self.memory == "host" and self.within(len(HOST)))

    def within(self, size: int) -> bool:
        region = self.region()
        return region is not None and 0 <= region[0] <= region[1] <= size

    def view(self, memory: np.ndarray) -> np.ndarray:
        """The tensor's elements over ``memory`` (which holds them: within())."""
        shape, strides, dtype = self.expected()
        if 0 in shape:
            return np.empty(shape, dtype)
        return np.ndarray(shape, dtype, buffer=memory.view(np.uint8),
                          offset=self.managed.dl_tensor.byte_offset,
                          strides=tuple(s * dtype.itemsize for s in strides))


def _check_import(producer: Producer, buf: shim.Buffer) -> None:
    """What a Buffer made of the producer's tensor must be."""
    expected = producer.expected()
    if expected is None:
        raise PropertyViolated(f"a tensor the harness cannot read was accepted: {buf!r}")
    shape, strides, dtype = expected
    array_shape = tuple(reversed([buf.dim(d).extent() for d in range(buf.dimensions())]))
    if array_shape != shape or buf.dtype != dtype:
        raise PropertyViolated(f"imported {array_shape} {buf.dtype}, the tensor says {shape} "
                               f"{dtype}")
    if 0 not in shape:
        got = tuple(reversed([buf.dim(d).stride() for d in range(buf.dimensions())]))
        if got != tuple(s if e > 1 else got[i] for i, (e, s) in enumerate(zip(shape, strides))):
            raise PropertyViolated(f"imported strides {got}, the tensor says {strides}")
    if not producer.on_host:
        if producer.memory not in DEVICE_MEMORY:
            raise PropertyViolated(f"device data {producer.data:#x} the shim did not make was "
                                   "accepted")
        if not producer.within(len(DEVICE_BYTES)):
            raise PropertyViolated(f"device memory beyond the buffer accepted: bytes "
                                   f"{producer.region()} of {len(DEVICE_BYTES)}")
        np.testing.assert_array_equal(np.asarray(buf), producer.view(DEVICE_BYTES))


def test_import(r: Reader) -> str:
    """(What happened, for fuzz/make_seeds.py to choose seeds by.)"""
    producer = Producer(r)
    consumer = r.u8() % 6
    if consumer in (1, 4, 5) and not producer.readable:  # (a copy, a pipeline's input, output)
        consumer = 0  # (host memory is trusted: only where it is the harness's is it read)
    made, outcome = None, "taken"
    try:
        with quiet():
            if consumer in (0, 1, 2):
                made = shim.from_dlpack(producer, copy=(None, True, False)[consumer])
            elif consumer == 3:
                made = shim.Buffer(producer)
            elif consumer == 4:
                result = BRIGHTEN(producer, scale=2.0, offset=1.0)
                expected = producer.view(HOST) if producer.on_host else None
                if expected is not None and expected.ndim == 2 and expected.dtype == np.float32:
                    np.testing.assert_array_equal(result.numpy(), expected * 2 + 1)
            else:
                BRIGHTEN(np.ones((4, 4), np.float32), scale=2.0, offset=1.0, output=producer)
                if producer.memory in DEVICE_MEMORY and not producer.on_host:
                    _restore_device_memory(producer.memory)
    except shim.ShimError:
        outcome = "refused"
    except AssertionError:
        raise
    except Exception as e:  # noqa: BLE001 - the property
        check_error(e, f"DLPack import (consumer {consumer})")
    if made is not None and consumer in (0, 2, 3):
        _check_import(producer, made)
        if producer.on_host and producer.readable and producer.expected()[2] != np.bool_:
            np.testing.assert_array_equal(np.asarray(made), producer.view(HOST))
    consumed = producer.consumed
    del made
    gc.collect()
    expected_deletes = 1 if consumed else 0
    if producer.deleted != expected_deletes:
        raise PropertyViolated(f"the deleter ran {producer.deleted} times, for a capsule "
                               f"{'consumed' if consumed else 'left unconsumed'}")
    return f"import by consumer {consumer} of {producer.memory} memory: {outcome}"


class _Capsule:
    """A producer handing over a capsule the shim made."""

    def __init__(self, capsule, device):
        self.capsule, self.device = capsule, device

    def __dlpack__(self, **kwargs):
        return self.capsule

    def __dlpack_device__(self):
        return self.device


_STREAMS = (None, None, -1, 0, 1, 2, 3, "x", 1.5, True, 2**70, -2)
_VERSIONS = (None, (1, 0), (1, 1), (1, 5), (0, 8), (2, 0), (1,), "x", (1, "a"), ("1", 0))
_DEVICES = (None, None, (KDL_CPU, 0), (KDL_OPENCL, 0), (KDL_VULKAN, 0), (KDL_CUDA, 0),
            (KDL_OPENCL, 1), (KDL_CPU, 1), "x", (4,), (4.0, 0), (True, 0), (99, 0))


def test_export(r: Reader) -> str:
    """(What happened, for fuzz/make_seeds.py to choose seeds by.)"""
    values = np.arange(48, dtype=np.float32).reshape(6, 8) * np.float32(0.5)
    source = values.copy()
    if r.bool():
        source.flags.writeable = False
    buf = shim.Buffer(source)
    if r.bool():
        buf = buf.cropped(0, 1 + r.u8() % 4, 1 + r.u8() % 4)
    place = r.choice((None, "opencl", "vulkan"))
    try:
        if place is not None:
            buf.copy_to_device(shim.device(place))
    except shim.ShimError:
        pass
    expected = np.asarray(buf).copy()
    kwargs = {}
    for key, options in (("stream", _STREAMS), ("max_version", _VERSIONS),
                         ("dl_device", _DEVICES), ("copy", (None, None, True, False, 0, "x"))):
        pick = r.u8()
        if pick % 4:
            kwargs[key] = options[pick % len(options)]
    try:
        with quiet():
            device = buf.__dlpack_device__()
            capsule = buf.__dlpack__(**kwargs)
    except Exception as e:  # noqa: BLE001 - the property
        check_error(e, f"Buffer.__dlpack__(**{kwargs})", (BufferError, TypeError, ValueError))
        return "export refused"
    target = kwargs.get("dl_device") or device
    if r.bool():
        return f"export to {target} dropped"
    with quiet():
        if target[0] == KDL_CPU:
            got = np.from_dlpack(_Capsule(capsule, target))
        else:
            got = np.asarray(shim.from_dlpack(_Capsule(capsule, target)))
    np.testing.assert_array_equal(got, expected)
    return f"export to {target} read"


def test_one_input(data: bytes) -> None:
    if not data:
        return
    r = Reader(data[1:])
    (test_export if data[0] % 2 else test_import)(r)


if __name__ == "__main__":
    fuzz(test_one_input)
