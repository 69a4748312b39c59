"""DLPack from producers that lie or hand over broken tensors, and consumers that pass streams
that are not streams: every case is refused with a named shim error (BufferError for the
export's stream, as the standard has it), never a crash, a hang or the wrong bytes.

Capsules here are built with ctypes from dlpack.h's layout, independently of the code under
test. Cases that crashed the interpreter before they were refused run in a subprocess."""

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import shim
from support.dlpack_structs import (DELETER, KDL_CPU, KDL_OPENCL, DLManagedTensor,
                                    DLManagedTensorVersioned, capsule_new, capsule_valid)
TIMEOUT = 120  # seconds for a subprocess; a few when nothing goes wrong


# --- capsules built by hand ------------------------------------------------------------------


class Hostile:
    """A producer whose __dlpack_device__ says ``claim`` and whose __dlpack__ hands over a
    capsule (without a destructor) for the tensor described by the keyword arguments: by
    default a well-formed 2x3 float32 tensor over ``self.array`` on the CPU."""

    def __init__(self, claim=(KDL_CPU, 0), *, versioned=True, name=None, major=1, data=None,
                 device=None, ndim=None, shape=(2, 3), strides=(3, 1), code=2, bits=32, lanes=1,
                 byte_offset=0, null_shape=False):
        self.claim = claim
        self.array = np.arange(6, dtype=np.float32).reshape(2, 3)
        self.deleted = 0
        self.deleter = DELETER(self._delete)  # kept alive with the producer
        managed = DLManagedTensorVersioned() if versioned else DLManagedTensor()
        if versioned:
            managed.version.major, managed.version.minor = major, 1
        managed.deleter = self.deleter
        tensor = managed.dl_tensor
        tensor.data = self.array.ctypes.data if data is None else data
        tensor.device.device_type, tensor.device.device_id = claim if device is None else device
        tensor.ndim = len(shape) if ndim is None else ndim
        tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes = code, bits, lanes
        self.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self.strides = (None if strides is None
                        else (ctypes.c_int64 * max(len(strides), 1))(*strides))
        tensor.shape = None if null_shape else self.shape
        tensor.strides = self.strides
        tensor.byte_offset = byte_offset
        self.managed = managed
        self.name = name or (b"dltensor_versioned" if versioned else b"dltensor")
        self.capsule = capsule_new(ctypes.addressof(managed), self.name, None)

    def _delete(self, _):
        self.deleted += 1

    def __dlpack_device__(self):
        return self.claim

    def __dlpack__(self, **kwargs):
        return self.capsule

    @property
    def consumed(self) -> bool:
        return not capsule_valid(self.capsule, self.name)


class Raising:
    """A producer whose __dlpack_device__ returns ``device`` and whose __dlpack__ raises
    ``error``, or returns ``returns``."""

    def __init__(self, device=(KDL_CPU, 0), error=None, returns=None):
        self.device, self.error, self.returns = device, error, returns

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, **kwargs):
        if self.error is not None:
            raise self.error
        return self.returns


def run_isolated(code: str) -> str:
    """Run ``code`` (after this module's imports) in a subprocess, where a crash or hang cannot
    take the test session along; its stdout."""
    tests = Path(__file__).parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(tests), str(tests.parent), os.environ.get("PYTHONPATH")])))
    preamble = "import numpy as np, pyopencl as cl, shim\nfrom test_dlpack_hostile import *\n"
    done = subprocess.run([sys.executable, "-c", preamble + code], capture_output=True,
                          text=True, env=env, timeout=TIMEOUT)
    assert done.returncode == 0, f"exit status {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def on_opencl(opencl, data):
    buf = shim.Buffer(data)
    buf.copy_to_device(opencl)
    return buf


@pytest.fixture(scope="module")
def brighten(host_pipelines):
    return shim.load(host_pipelines["brighten", "no_runtime"])


# --- 1. streams a consumer passes to an OpenCL export ----------------------------------------
# (Each asks for the device with dl_device=: by default an OpenCL Buffer exports host memory.)

def test_opencl_export_refuses_streams_that_are_not_queues_it_holds(opencl):
    out = run_isolated("""
opencl = shim.device("opencl")
buf = shim.Buffer(np.zeros(4, np.float32)); buf.copy_to_device(opencl)
other = cl.Context([opencl.queue.device])
for stream in (0, 1, 2, 12345, -2, 2**64 + 1, opencl.context.int_ptr, other.int_ptr,
               cl.CommandQueue(other).int_ptr):
    try:
        buf.__dlpack__(stream=stream, dl_device=(KDL_OPENCL, 0))
    except BufferError as e:
        assert "stream" in str(e) and ("pyopencl.CommandQueue" in str(e) or "context" in str(e)), e
        print("refused")
    else:
        print(f"accepted {stream}")
""")
    assert out.split() == ["refused"] * 9


def test_opencl_export_accepts_none_minus_one_its_queue_and_live_pyopencl_queues(opencl):
    import pyopencl as cl

    buf = on_opencl(opencl, np.arange(4, dtype=np.float32))
    consumer = cl.CommandQueue(opencl.context)
    for stream in (None, -1, opencl.queue.int_ptr, consumer.int_ptr, consumer.int_ptr):
        buf.__dlpack__(stream=stream, dl_device=(KDL_OPENCL, 0))  # dropped unconsumed: the capsule's destructor frees it
    np.testing.assert_array_equal(buf.numpy(), np.arange(4))


def test_a_queue_handle_stays_valid_after_the_consumer_drops_its_queue(opencl):
    # The shim holds the queues it synchronized with; before, the handle of a freed queue
    # was dereferenced.
    out = run_isolated("""
opencl = shim.device("opencl")
buf = shim.Buffer(np.arange(4, dtype=np.float32)); buf.copy_to_device(opencl)
consumer = cl.CommandQueue(opencl.context)
handle = consumer.int_ptr
buf.__dlpack__(stream=handle, dl_device=(KDL_OPENCL, 0))
del consumer
for _ in range(3):
    buf.__dlpack__(stream=handle, dl_device=(KDL_OPENCL, 0))
    cl.CommandQueue(opencl.context)  # (one may reuse the freed queue's memory)
np.testing.assert_array_equal(buf.numpy(), np.arange(4))
print("ok")
""")
    assert out.split() == ["ok"]


# --- 2. what a producer says and hands over --------------------------------------------------

def test_the_capsules_device_is_checked_against_what_the_producer_says(opencl):
    # Said OpenCL, handed over a CPU tensor: its data was taken for a cl_mem (a segfault).
    out = run_isolated("""
shim.device("opencl")
for producer in (Hostile(claim=(4, 0), device=(1, 0)), Hostile(claim=(1, 0), device=(4, 0))):
    try:
        shim.from_dlpack(producer)
    except shim.ArgumentError as e:
        assert "__dlpack_device__() says" in str(e) and not producer.consumed, e
        print("refused")
""")
    assert out.split() == ["refused"] * 2


def test_device_tensors_must_be_memory_the_process_holds(opencl):
    import pyopencl as cl

    buf = on_opencl(opencl, np.zeros(6, np.float32))
    mem = opencl.native(buf.family.memory)
    too_far = Hostile(claim=(KDL_OPENCL, 0), data=mem, byte_offset=8)  # 24 bytes from 8 of 24
    with pytest.raises(shim.ArgumentError, match=r"bytes \[8, 32\) of an OpenCL buffer of 24"):
        shim.from_dlpack(too_far)
    elsewhere = cl.Buffer(cl.Context([opencl.queue.device]), cl.mem_flags.READ_WRITE, 64)
    with pytest.raises(shim.ArgumentError, match="another context"):
        shim.from_dlpack(Hostile(claim=(KDL_OPENCL, 0), data=elsewhere.int_ptr))
    with pytest.raises(shim.ArgumentError, match="NULL device memory"):
        shim.from_dlpack(Hostile(claim=(KDL_OPENCL, 0), data=0, shape=(0,), strides=(1,)))
    fits = Hostile(claim=(KDL_OPENCL, 0), data=mem, byte_offset=4, shape=(5,), strides=(1,))
    assert shim.from_dlpack(fits).shape == (5,)
    # A handle nothing in the process owns: OpenCL would have dereferenced it.
    out = run_isolated("""
opencl = shim.device("opencl")
for data in (0x1234, 0x7fff00000000, opencl.context.int_ptr):
    try:
        shim.from_dlpack(Hostile(claim=(4, 0), data=data))
    except shim.ArgumentError as e:
        assert "not an OpenCL buffer this process holds" in str(e), e
        print("refused")
""")
    assert out.split() == ["refused"] * 3


BROKEN = {
    "wrong capsule name": dict(name=b"not_a_tensor"),
    "DLPack 2": dict(major=2),
    "NULL data": dict(data=0),
    "negative ndim": dict(ndim=-1),
    "huge ndim": dict(ndim=100000),
    "NULL shape": dict(null_shape=True),
    "negative extent": dict(shape=(-2, 3)),
    "extent beyond 32 bits": dict(shape=(2**40, 3)),
    "stride beyond 32 bits": dict(strides=(2**40, 1)),
    "vector lanes": dict(lanes=4),
    "unknown type code": dict(code=9),
    "bfloat16": dict(code=4, bits=16),
    "float8": dict(code=2, bits=8),
    "odd bits": dict(code=0, bits=12),
    "packed bits": dict(code=1, bits=1),
}


def test_broken_tensors_are_refused_unconsumed(opencl):
    # In a subprocess: a NULL shape crashed numpy, NULL data was read as fresh garbage memory.
    out = run_isolated("""
from shim.pipelines.build import Build, build
brighten = shim.load(build(Build("brighten", "host", "no_runtime")))
for case, fields in sorted(BROKEN.items()):
    imports = {"obj": shim.from_dlpack, "buffer": shim.Buffer,
               "input": lambda p: brighten(p, scale=1.0, offset=0.0, output=(2, 3))}
    for argument, use in imports.items():
        producer = Hostile(**fields)
        try:
            use(producer)
        except shim.ArgumentError as e:
            assert e.argument == argument, e
            assert str(e).startswith(f"{argument}: Hostile.__dlpack__() gave"), e
            assert not producer.consumed and producer.deleted == 0, e  # the producer's to free
        else:
            raise AssertionError(f"{case}: accepted as {argument}")
    print(case)
""")
    assert out.split("\n")[:-1] == sorted(BROKEN)


@pytest.mark.parametrize("versioned", [True, False])
def test_null_strides_mean_compact_row_major(versioned):
    producer = Hostile(strides=None, versioned=versioned, byte_offset=4, shape=(1, 5))
    buf = shim.from_dlpack(producer)
    assert producer.consumed
    np.testing.assert_array_equal(buf.numpy(), producer.array.reshape(-1)[1:].reshape(1, 5))
    del buf
    assert producer.deleted == 1


def test_read_only_tensors_import_read_only():
    producer = Hostile()
    producer.managed.flags = 1  # READ_ONLY
    assert not shim.from_dlpack(producer).numpy().flags.writeable


GARBAGE_DEVICES = ["cpu", None, (1,), (1, 0, 0), (99, 0), ("1", 0), (1.0, 0), (1, -1),
                   ((1, 0), 0)]


@pytest.mark.parametrize("device", GARBAGE_DEVICES, ids=repr)
def test_garbage_from_dlpack_device_is_an_argument_error(device, brighten):
    with pytest.raises(shim.ArgumentError, match=r"^obj: Raising.__dlpack_device__\(\) returned"):
        shim.from_dlpack(Raising(device))
    with pytest.raises(shim.ArgumentError, match=r"^input: Raising.__dlpack_device__") as e:
        brighten(Raising(device), scale=1.0, offset=0.0, output=(2, 3))
    assert e.value.argument == "input"


@pytest.mark.parametrize("claim", [(KDL_CPU, 0), (KDL_OPENCL, 0)])
@pytest.mark.parametrize("kind", [KeyError, ValueError, BufferError])
def test_a_raising_dlpack_is_an_argument_error(claim, kind, brighten, request):
    if claim[0] == KDL_OPENCL:
        request.getfixturevalue("opencl")
    error = kind("boom")  # (made here: a shared instance's traceback would outlive the test)
    producer = Raising(claim, error)
    with pytest.raises(shim.ArgumentError, match=f"^obj: Raising.__dlpack__\\(\\) raised "
                                                 f"{type(error).__name__}") as e:
        shim.from_dlpack(producer)
    assert e.value.__cause__ is error
    with pytest.raises(shim.ArgumentError, match="^output: Raising.__dlpack__") as e:
        brighten(np.zeros((2, 3), np.float32), scale=1.0, offset=0.0, output=producer)
    assert e.value.argument == "output"


@pytest.mark.parametrize("returns", ["capsule", None, 42])
def test_a_dlpack_that_returns_no_capsule_is_an_argument_error(returns):
    with pytest.raises(shim.ArgumentError, match="not an unused DLPack capsule"):
        shim.from_dlpack(Raising(returns=returns))
