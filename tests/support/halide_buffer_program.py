"""A program written against halide.Buffer's Python API, in the style of Halide's own Python
tests and tutorials (python_bindings/test/correctness/buffer.py; tutorial lessons 1, 6, 12):
tests/test_halide_buffer_api.py runs it with halide.Buffer and with shim.Buffer and compares
what it saw.

It imports neither: ``run(Buffer, hl, device_target)`` takes the Buffer class, the halide
module (element types, targets, device APIs) and a halide.Target naming a GPU API for the
device part (None: no device part). Run as a script, in a process without the shim (Halide's
own runtime does the device work there), it runs with halide.Buffer and prints what it saw as
JSON:

    python tests/support/halide_buffer_program.py [TARGET]      # e.g. host-opencl
"""

import ctypes
import glob
import json
import os
import sys

import numpy as np


def run(Buffer, hl, device_target=None) -> list:
    """[label, value] for everything the program looks at, in order."""
    seen = []

    def record(label, value):
        seen.append([label, _plain(value)])

    def dims(b):
        return [[b.dim(i).min(), b.dim(i).extent(), b.dim(i).stride(), b.dim(i).max()]
                for i in range(b.dimensions())]

    def raises(what, function):
        try:
            function()
        except IndexError:
            record(what, "IndexError")
        except ValueError:
            record(what, "ValueError")
        else:
            record(what, "no error")

    # A numpy array, wrapped: the axes reversed, memory shared.
    a0 = np.ones((200, 300), dtype=np.int32)
    b0 = Buffer(a0, "int32_buffer")
    record("b0 type", [b0.type() == hl.Int(32), str(b0.type())])
    record("b0 name", b0.name())
    record("b0 all_equal", [b0.all_equal(1), b0.all_equal(2)])
    record("b0 dims", dims(b0))
    record("b0 shape names", [b0.dimensions(), b0.width(), b0.height(), b0.channels(),
                              b0.left(), b0.right(), b0.top(), b0.bottom()])
    record("b0 sizes", [b0.number_of_elements(), b0.size_in_bytes()])
    record("b0 host_dirty", [b0.host_dirty(), b0.device_dirty(), b0.has_device_allocation()])
    a0[12, 34] = 56
    record("b0[34, 12] reads the array", b0[34, 12])
    b0[56, 34] = 12
    record("the array reads b0[56, 34]", a0[34, 56])
    b1 = Buffer(np.ones((200, 300), dtype=np.int32), "b1", False)
    record("reverse_axes=False dims", dims(b1))

    # Allocated by type and sizes; to numpy and back.
    buf0 = Buffer(hl.Int(16), [4, 6])
    record("allocated", [str(buf0.type()), dims(buf0), buf0.host_dirty()])
    buf0.fill(0)
    buf0[1, 2] = 42
    shared = np.array(buf0, copy=False)
    copied = np.array(buf0, copy=True)
    record("to numpy", [shared.shape, str(shared.dtype), shared[2, 1], copied[2, 1]])
    buf0[1, 2] = 3
    record("shared and copied", [shared[2, 1], copied[2, 1]])
    cropped_buf0 = buf0.copy()
    cropped_buf0.crop(dimension=0, min=1, extent=2)
    cropped_array = np.array(cropped_buf0, copy=False)
    record("crop in place", [dims(cropped_buf0), cropped_array.shape, cropped_array[2, 0]])
    cropped_buf0[1, 2] = 5
    record("a copy's crop", [cropped_buf0[1, 2], cropped_array[2, 0], buf0[1, 2]])
    reversed_buf0 = buf0.reverse_axes()
    record("reverse_axes", [dims(reversed_buf0), np.asarray(reversed_buf0).shape,
                            reversed_buf0[2, 1]])

    # Element by element.
    buf = Buffer(hl.Float(32), [3, 4])
    for x in range(3):
        for y in range(4):
            buf[x, y] = x + y
    visited = []
    buf.for_each_element(lambda pos: visited.append([pos[0], pos[1], buf[pos[0], pos[1]]]))
    record("for_each_element", visited)
    scalar = Buffer.make_scalar(hl.Float(32))
    scalar.fill(0)
    scalar[()] = 2.5
    record("scalar", [scalar.dimensions(), scalar[()], scalar.number_of_elements(),
                      scalar.size_in_bytes(), scalar.width(), scalar.contains([])])
    visited = []
    scalar.for_each_element(lambda pos: visited.append(list(pos)))
    record("scalar's elements", visited)
    raises("below min", lambda: buf0[-1, 2])
    raises("above max", lambda: buf0[1, 6])
    raises("too few coordinates", lambda: buf0[1])

    # Layouts.
    interleaved = Buffer.make_interleaved(type=hl.UInt(8), width=7, height=13, channels=3)
    view = np.array(interleaved, copy=False)
    record("make_interleaved", [dims(interleaved), view.shape, view.strides])
    reordered = Buffer(type=hl.UInt(8), sizes=[7, 5, 3], storage_order=[2, 0, 1])
    record("storage_order", dims(reordered))
    b2 = Buffer(hl.UInt(8), [3, 2, 7, 5])
    b2.transpose([2, 3, 0, 1])
    record("transpose in place", dims(b2))
    record("make_with_shape_of", dims(Buffer.make_with_shape_of(reordered.translated([1, 2]))))
    record("copy keeps the layout", dims(reordered.copy()))

    # Crops and slices share memory.
    data = np.arange(100, dtype=np.int32).reshape(10, 10)
    buf = Buffer(data, "buf")
    bc0 = buf.cropped([(5, 5), (5, 5)])
    bc0.set_name("bc")
    record("cropped(rect)", [dims(bc0), buf.name(), bc0.name()])
    for row in range(bc0.dim(1).min(), bc0.dim(1).max() + 1):
        for col in range(bc0.dim(0).min(), bc0.dim(0).max() + 1):
            bc0[col, row] = -1
    bc1 = buf.cropped(0, 0, 5).cropped(1, 0, 5)
    bc1.fill(-2)
    record("crops wrote the array", data)
    row = buf.sliced(1, 3)
    record("sliced", [dims(row), [row[x] for x in range(10)], dims(buf.sliced(0))])
    cube = Buffer(np.arange(60, dtype=np.int32).reshape(3, 4, 5))
    line = cube.sliced(2, 1).cropped(0, 1, 3).sliced(1, 2)
    record("slice of a crop of a slice", [dims(line), [line[x] for x in range(1, 4)]])
    plane = cube.copy()
    plane.slice(0, 4)
    record("slice in place", [dims(plane), plane[2, 1]])
    record("contains", [buf.contains([9, 9]), buf.contains([10, 0]), buf.contains([3]),
                        bc0.contains([4, 9])])

    # Coordinates: translate, set_min (lesson 6), negative mins.
    bt0 = buf.translated(0, -3).translated(1, 3)
    record("translated", [dims(bt0), bt0[-3, 3], bt0[6, 12]])
    bt1 = buf.translated([-3, 3])
    for row in range(bt1.top(), bt1.bottom() + 1):
        bt1[bt1.left(), row] = -7
    record("translated(delta) writes the array", data)
    shifted = Buffer(hl.Int(32), [5, 7])
    shifted.set_min([100, 50])
    for yy in range(50, 57):
        for xx in range(100, 105):
            shifted[xx, yy] = xx + yy
    record("set_min", [dims(shifted), shifted[104, 56], np.asarray(shifted)[0].tolist()])
    negative = Buffer(hl.Int(32), [3, 2])
    negative.set_min([-5, -7])
    negative.fill(1)
    negative[-5, -7] = 9
    negative.translate(1, 2)
    negative.set_min([-1])
    record("negative mins", [dims(negative), np.asarray(negative), negative[-1, -5],
                             negative.contains([-2, -5])])

    # Transposes and added dimensions are views too.
    t = Buffer(hl.Int(32), [2, 3, 4])
    t.for_each_element(lambda pos: t.__setitem__(pos, pos[0] + 10 * pos[1] + 100 * pos[2]))
    tt = t.transposed([1, 2, 0])
    record("transposed(order)", [dims(tt), tt[3, 1, 2], np.asarray(tt).shape])
    swapped = t.transposed(0, 2)
    record("transposed(d1, d2)", [dims(swapped), swapped[3, 2, 1]])
    embedded = buf.embedded(1, 7)
    record("embedded", [dims(embedded), embedded[3, 7, 4], dims(buf.embedded(0)),
                        dims(buf.embedded(2))])
    grown = buf.copy()
    grown.embed(2, 5)
    grown.add_dimension()
    record("embed in place", [dims(grown), grown[1, 2, 5, 0]])

    # Copies.
    duplicate = bt1.copy()
    duplicate[-3, 3] = 1000
    record("copy", [dims(duplicate), duplicate.host_dirty(), bt1[-3, 3], duplicate[-3, 3]])
    target = Buffer(hl.Int(32), [6, 3])
    target.fill(-1)
    source = Buffer(hl.Int(32), [4, 3])
    source.fill(5)
    source.set_min([2, -1])
    target.copy_from(source)
    record("copy_from", [np.asarray(target), target.host_dirty()])

    # Dirty bits.
    flags = Buffer(hl.Int(32), [4])
    marks = [flags.host_dirty()]
    flags.set_host_dirty(True)
    marks.append(flags.host_dirty())
    flags.set_host_dirty(False)
    marks.append(flags.host_dirty())
    flags.fill(3)
    marks.append(flags.host_dirty())
    flags.set_host_dirty(False)
    flags[2] = 4
    marks.append(flags.host_dirty())
    flags.set_host_dirty(False)
    flags.set_host_dirty()
    marks.append(flags.host_dirty())
    record("host_dirty", marks)
    flags.set_host_dirty(False)
    record("an element", flags[1])
    record("host_dirty after a read", flags.host_dirty())

    if device_target is not None:
        _device_part(Buffer, hl, device_target, record)
    return seen


def _device_part(Buffer, hl, target, record) -> None:
    """A device round trip (lesson 12's calls) on the GPU API ``target`` names."""
    g = Buffer(np.arange(8, dtype=np.int32))
    record("copy_to_device", [g.copy_to_device(target), g.has_device_allocation(),
                              g.host_dirty(), g.device_dirty()])
    g.set_device_dirty()
    record("set_device_dirty", [g.host_dirty(), g.device_dirty()])
    record("copy_to_host", [g.copy_to_host(), g.host_dirty(), g.device_dirty()])
    g[3] = 30
    record("written on the host", [g.host_dirty(), g.device_dirty()])
    record("copied up again", [g.copy_to_device(target), g.host_dirty(), g.device_dirty(),
                               g.device_sync()])
    crop = g.cropped(0, 2, 4)
    record("a crop of a Buffer on the device", [crop.has_device_allocation(), crop[3]])
    del crop  # (halide.Buffer's crop would point into memory device_free frees)
    record("device_free", [g.device_free(), g.has_device_allocation(), g.host_dirty(),
                           g.device_dirty(), np.asarray(g)])
    api = Buffer(hl.Float(32), [4, 4])
    api.fill(1.5)
    record("copy_to_device(device_api, target)",
           [api.copy_to_device(hl.DeviceAPI.OpenCL if "opencl" in target.to_string()
                               else hl.DeviceAPI.CUDA, target),
            api.has_device_allocation(), api.host_dirty()])
    record("device_free again", [api.device_free(), api.has_device_allocation(), api[3, 3]])
    fresh = Buffer(hl.Int(32), [4])
    record("device_malloc", [fresh.device_malloc(target), fresh.has_device_allocation(),
                             fresh.device_dirty()])
    record("host_dirty after device_malloc", fresh.host_dirty())
    fresh.device_free()


def _plain(value):
    """``value`` as JSON has it (numpy's numbers and arrays as Python's)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _load_opencl_loader() -> None:
    """Halide's runtime finds clGetPlatformIDs & co. among the process's global symbols: the
    ICD loader pyopencl ships (which finds PoCL) goes there first (as pipelines/stock.py)."""
    import pyopencl

    for loader in glob.glob(os.path.join(os.path.dirname(pyopencl.__file__), ".libs",
                                         "libOpenCL*")):
        ctypes.CDLL(loader, mode=os.RTLD_GLOBAL | os.RTLD_NOW)


if __name__ == "__main__":
    import halide

    device_target = None
    if len(sys.argv) > 1:
        device_target = halide.Target(sys.argv[1])
        if "opencl" in sys.argv[1]:
            _load_opencl_loader()
    json.dump(run(halide.Buffer, halide, device_target), sys.stdout)
