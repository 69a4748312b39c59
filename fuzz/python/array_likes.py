"""atheris target: whatever a caller hands the shim as an array.

Values made of the input: numpy arrays of every dtype (foreign byte orders, structured, object,
strings, complex...) and layout (Fortran order, steps, reversed, broadcast, unaligned,
read-only, empty, 0-D); objects with the buffer protocol (memoryviews of every format and shape,
bytes, bytearray, array.array, ctypes arrays); halide.Buffers and torch tensors where those
import; numpy subclasses (masked arrays, matrices, records); Python values (lists, scalars,
strings); and objects that only look like arrays: an ``__array_interface__`` or
``__cuda_array_interface__`` dict, or ``__array__``, of which the input chooses every field.
(The shim reads arrays through the buffer protocol and DLPack only; those dicts describe only
memory of the harness's, since numpy trusts them.) Each is given to shim.Buffer (reversed axes
or not), to a pipeline (brighten) as its input, or as its output.

Checked: a refusal is one of the shim's errors; a Buffer made holds the value's elements, in
numpy's order; brighten's result from an input is ``input * 2 + 1``, computed by numpy; an
output it accepted holds ``3`` everywhere afterwards.
"""

import array
import ctypes

import numpy as np

from common import PropertyViolated, Reader, check_error, fuzz, quiet, sample_library

import shim

try:
    import halide
except ImportError:  # (the pipelines extra: without it, no halide.Buffers)
    halide = None
try:
    import torch
except ImportError:
    torch = None

BRIGHTEN = shim.load(sample_library("brighten"))
HOST = (np.arange(4096, dtype=np.uint8) * np.uint8(29)).view(np.float32)  # 4 KiB of the harness's

_DTYPES = ("f4", "f4", "f4", "f8", "f2", "u1", "i1", "u2", "i2", "i4", "u4", "i8", "u8", "?",
           "c8", ">f4", ">i2", "<f4", "O", "V4", [("a", "f4")], "M8[s]", "U2", "S4", "f16")
_FORMATS = ("f", "f", "d", "e", "B", "b", "h", "H", "i", "I", "q", "Q", "?", "c", "P", "l",
            ">f", "<f", "=f", "@f", "2f", "x", "Zf", "T{f:a:}")
_TYPESTRS = ("<f4", "<f4", "|u1", ">f4", "<f8", "|b1", "<i4", "<c8", "|V4", "|O", "xyz", "<f3")


def _shape(r: Reader, ndim: int) -> tuple:
    return tuple(r.choice((1, 2, 3, 4, 5, 6, 0, 2)) for _ in range(ndim))


def _numpy(r: Reader):
    spec = r.choice(_DTYPES)
    try:
        dtype = np.dtype(spec)
    except TypeError:
        dtype = np.dtype("f4")
    shape = _shape(r, r.choice((2, 2, 2, 1, 0, 3, 4)))
    count = int(np.prod(shape))
    if dtype.kind in "OUSVM" or dtype.fields:
        values = np.zeros(count, dtype)
    else:
        values = (np.arange(count) % 7 - 2).astype(dtype)
    values = values.reshape(shape)
    for _ in range(r.u8() % 3):
        change = r.u8() % 7
        if change == 0 and values.ndim:
            values = values.T
        elif change == 1 and values.ndim:
            values = values[..., ::2]
        elif change == 2 and values.ndim:
            values = values[::-1]
        elif change == 3 and values.ndim:
            values = np.broadcast_to(values[..., :1], values.shape)
        elif change == 4 and values.dtype.itemsize > 1 and not values.dtype.hasobject:
            raw = np.zeros(values.nbytes + 1, np.uint8)[1:]  # (unaligned)
            unaligned = raw.view(values.dtype).reshape(values.shape)
            unaligned[...] = values
            values = unaligned
        elif change == 5:
            values = np.asfortranarray(values)
        else:
            values = values.copy()
            values.flags.writeable = False
    return values


def _buffer_protocol(r: Reader):
    kind = r.u8() % 5
    data = np.arange(24, dtype=np.float32).tobytes()
    if kind == 0:
        view = memoryview(bytearray(data) if r.bool() else data)
        fmt, shape = r.choice(_FORMATS), _shape(r, r.u8() % 4)
        try:
            view = view.cast("B").cast(fmt, shape) if shape else view.cast("B").cast(fmt)
        except (TypeError, ValueError):
            pass
        if view.ndim == 1 and r.bool():
            view = view[::2]
        return view
    if kind == 1:
        return r.choice((bytes(data), bytearray(data), b"", bytearray()))
    if kind == 2:
        return array.array(r.choice("fdbBhHiIlLqQ"), range(6))
    if kind == 3:
        return ((ctypes.c_float * 3) * 2)(*((ctypes.c_float * 3)(1, 2, 3) for _ in range(2)))
    return (r.choice((ctypes.c_float, ctypes.c_double, ctypes.c_uint8, ctypes.c_bool)) * 6)()


class _LooksLikeAnArray:
    """An object with only an array's attributes, each the input's."""

    def __init__(self, r: Reader):
        shape = _shape(r, r.u8() % 4)
        typestr = r.choice(_TYPESTRS)
        # (within the harness's memory, whatever the shape and strides: numpy trusts them)
        interface = {"version": r.choice((3, 3, 2, 0, "3")), "shape": shape, "typestr": typestr,
                     "data": (HOST.ctypes.data, r.bool()),
                     "strides": r.choice((None, tuple(4 for _ in shape), "x"))}
        for key in list(interface):
            if r.u8() % 16 == 0:
                del interface[key]
        self.kind = r.u8() % 3
        if self.kind == 0:
            self.__array_interface__ = interface
        elif self.kind == 1:
            self.__cuda_array_interface__ = dict(interface, stream=r.choice((None, 1, 0)))
        else:
            self.returns = r.choice((HOST[:6].reshape(2, 3), None, [1, 2], "x"))

    def __array__(self, dtype=None, copy=None):
        if self.kind != 2:
            raise TypeError("no __array__")
        return self.returns


def _value(r: Reader):
    kind = r.u8() % 9
    if kind <= 2:
        return _numpy(r)
    if kind == 3:
        return _buffer_protocol(r)
    if kind == 4 and halide is not None:
        try:
            return halide.Buffer(_numpy(r))
        except ValueError:  # (a dtype or layout halide.Buffer refuses)
            return halide.Buffer(np.ones((3, 4), np.float32))
    if kind == 5 and torch is not None:
        tensor = torch.arange(24).reshape(4, 6).to(r.choice((
            torch.float32, torch.float32, torch.float64, torch.uint8, torch.bfloat16,
            torch.int16, torch.bool, torch.complex64)))
        change = r.u8() % 4
        return (tensor, tensor.t(), tensor[:, ::2], tensor[:1].expand(4, 6))[change]
    if kind == 6:
        return _LooksLikeAnArray(r)
    if kind == 7:
        values = np.arange(6, dtype=np.float32).reshape(2, 3)
        return r.choice((np.ma.masked_array(values, values > 2), np.asmatrix(values),
                         np.rec.fromarrays([values.ravel()]), values.view(np.recarray)))
    return r.choice(([[1.0, 2.0], [3.0, 4.0]], [], 3.5, "text", None, (1, 2), {"a": 1}))


def _reference(value):
    """The value's elements as numpy reads them (None where numpy does not)."""
    try:
        if torch is not None and isinstance(value, torch.Tensor):
            return value.numpy() if value.dtype != torch.bfloat16 else None
        if isinstance(value, _LooksLikeAnArray):
            return None
        if isinstance(value, np.ndarray):
            return value.view(np.ndarray)  # (a masked array's data, mask or not, as Halide's)
        return np.asarray(memoryview(value))
    except (TypeError, ValueError, NotImplementedError, RuntimeError):
        return None


def run(data: bytes) -> str:
    """One input; what happened (for fuzz/make_seeds.py to choose seeds by)."""
    r = Reader(data)
    with quiet():
        value = _value(r)
    consumer = r.u8() % 4
    reference = _reference(value)
    try:
        with quiet():
            if consumer in (0, 1):
                made = np.asarray(shim.Buffer(value, reverse_axes=consumer == 0))
                expected = reference if consumer == 0 or reference is None else reference.T
            elif consumer == 2:
                made = BRIGHTEN(value, scale=2.0, offset=1.0).numpy()
                expected = None if reference is None else (
                    reference * np.float32(2) + np.float32(1))
            else:
                BRIGHTEN(np.ones((3, 4), np.float32), scale=2.0, offset=1.0, output=value)
                made = _reference(value)
                expected = None if made is None else np.full(made.shape, 3, np.float32)
    except Exception as e:  # noqa: BLE001 - the property
        check_error(e, f"consumer {consumer} of {type(value).__name__}")
        return f"{type(value).__name__} refused by consumer {consumer}"
    if expected is not None and made is not None and not (
            made.shape == expected.shape and np.array_equal(made, expected, equal_nan=True)):
        raise PropertyViolated(f"consumer {consumer} of {type(value).__name__} "
                               f"{getattr(value, 'dtype', '')}: got\n{made!r}\nexpected\n"
                               f"{expected!r}")
    return f"{type(value).__name__} taken by consumer {consumer}"


def test_one_input(data: bytes) -> None:
    run(data)


if __name__ == "__main__":
    fuzz(test_one_input)
