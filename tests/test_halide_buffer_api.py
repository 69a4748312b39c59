"""shim.Buffer offers halide.Buffer's Python API (issue 15).

A program written for halide.Buffer, in the style of Halide's own Python tests and tutorials
(tests/support/halide_buffer_program.py), runs unchanged on shim.Buffer and sees what it sees
on halide.Buffer, with the shim's two deliberate differences pinned below. Then the corners:
mins, in-place forms, 0-D Buffers, read-only memory, bad arguments; and views (translated,
transposed, embedded, slices of crops of slices) given to pipelines, on the CPU and on the
GPUs, against numpy.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import shim
from shim.pipelines.build import RUNTIMES, Build, build_all
from support import halide_buffer_program

PROGRAM = Path(halide_buffer_program.__file__)
TIMEOUT = 600

# Where shim.Buffer sees something else than halide.Buffer, on purpose: label -> (halide's,
# the shim's).
DEVIATIONS = {
    # halide.Buffer reads an element through C++'s non-const operator(), which marks the
    # buffer host-dirty; the shim's reads change no flag (and copy device results back first).
    "host_dirty after a read": (True, False),
    # New device memory holds nothing, so the shim makes the host the newer copy, uploaded by
    # the next copy_to_device (README, Devices); Halide leaves the device's garbage current.
    "host_dirty after device_malloc": (False, True),
}
# The Halide target each device kind's part of the program runs on.
TARGETS = {"opencl": "host-opencl", "cuda": "host-cuda-cuda_capability_61"}


@pytest.fixture(params=["host", "opencl", "cuda"])
def device_target(request):
    """The program's device part: none ("host"), or a GPU backend's target (the test skips
    where this machine lacks that device)."""
    if request.param == "host":
        return None
    request.getfixturevalue(request.param)
    return TARGETS[request.param]


def run_with_halide(target) -> list:
    """What the program sees with halide.Buffer, in a process without the shim."""
    done = subprocess.run([sys.executable, str(PROGRAM), *([target] if target else [])],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, f"exit status {done.returncode}\n{done.stderr}"
    return json.loads(done.stdout)


def test_a_halide_buffer_program_runs_unchanged_on_shim_buffer(device_target):
    hl = pytest.importorskip("halide")
    expected = run_with_halide(device_target)
    target = hl.Target(device_target) if device_target else None
    seen = json.loads(json.dumps(halide_buffer_program.run(shim.Buffer, hl, target)))
    assert [label for label, _ in seen] == [label for label, _ in expected]
    for (label, theirs), (_, ours) in zip(expected, seen):
        assert (theirs, ours) == DEVIATIONS.get(label, (theirs, theirs)), label
    assert device_target is None or {label for label, _ in seen} >= DEVIATIONS.keys()


# --- the API's corners -------------------------------------------------------------------------

def dims(buf):
    return [tuple(buf.dim(i)) for i in range(buf.dimensions())]


def test_mins_in_every_constructor_and_in_place():
    array = np.arange(20, dtype=np.int32).reshape(4, 5)
    placed = shim.Buffer(array, mins=[3, -3])
    assert dims(placed) == [(3, 5, 1), (-3, 4, 5)] and placed[3, -3] == 0 and placed[7, 0] == 19
    # numpy has no mins: the same memory (through the buffer protocol, which numpy asks
    # first), and numpy() is the array itself.
    assert placed.numpy() is array and np.shares_memory(np.asarray(placed), array)
    assert dims(shim.Buffer(np.int32, [5, 4], mins=[-2])) == [(-2, 5, 1), (0, 4, 5)]
    assert dims(shim.Buffer(shape=(4, 5), dtype=np.float32, mins=(1, 2))) == [(1, 5, 1),
                                                                             (2, 4, 5)]
    placed.set_min([10])  # the dimensions it leaves out keep theirs
    assert dims(placed) == [(10, 5, 1), (-3, 4, 5)] and placed[14, 0] == 19
    placed.translate([-20, 3])
    assert [d.min() for d in (placed.dim(0), placed.dim(1))] == [-10, 0]
    assert placed.left() == -10 and placed.right() == -6 and placed.bottom() == 3
    edge = 2**31 - 5
    assert shim.Buffer(np.zeros(5, np.uint8), mins=[edge]).dim(0).max() == 2**31 - 1
    with pytest.raises(shim.ArgumentError, match="32-bit coordinates") as e:
        shim.Buffer(np.zeros(6, np.uint8), mins=[edge])
    assert e.value.argument == "mins"
    for move in (lambda: placed.translated(0, 2**31 + 10), lambda: placed.translate(0, 2**31 + 10)):
        with pytest.raises(shim.ArgumentError) as e:
            move()
        assert e.value.argument == "dx"
    assert dims(placed) == [(-10, 5, 1), (0, 4, 5)]  # a refused change changes nothing


def test_elements_are_read_and_written_at_halide_coordinates():
    buf = shim.Buffer(np.zeros((3, 4), np.uint8), mins=[-1, 5])
    buf[np.int64(2), 7] = 200
    assert buf[[2, 7]] == 200 and np.asarray(buf)[2, 3] == 200
    assert isinstance(buf[2, 7], int) and isinstance(shim.Buffer(np.ones(1, bool))[0], bool)
    with pytest.raises(IndexError):
        buf[3, 5]
    with pytest.raises(shim.ArgumentError, match=r"index 3 is out of bounds for axis 0 with "
                                                 r"min=-1, extent=4 \(dimension 0 \(x, numpy axis 1\)"
                       ) as e:
        buf[3, 5] = 1
    assert isinstance(e.value, shim.CoordinateError) and e.value.argument == "pos"
    for pos in ((1,), (1, 6, 0), (1.0, 6), slice(0, 2)):
        with pytest.raises(shim.ArgumentError) as e:
            buf[pos]
        assert e.value.argument == "pos"
    for value in (1.5, 256, -1, "7", None):  # halide.Buffer refuses them too
        with pytest.raises(shim.ArgumentError) as e:
            buf.fill(value)
        assert e.value.argument == "value"
    assert buf.all_equal(0) is False and np.asarray(buf).sum() == 200  # nothing was written
    floats = shim.Buffer(np.float16, [2])
    floats.fill(3)
    floats[1] = np.float64(0.5)
    assert floats[0] == 3.0 and floats[1] == 0.5 and floats.type().bits() == 16


@pytest.mark.parametrize("value", [300, -1, 1.5, "7", None])
def test_a_value_an_element_cannot_hold_raises_what_halide_buffer_raises(value):
    """halide.Buffer raises RuntimeError for a value its element cannot hold; the shim's
    ElementValueError is that RuntimeError and an ArgumentError naming the value, in element
    assignment, fill and all_equal alike, and nothing is written."""
    hl = pytest.importorskip("halide")
    theirs = hl.Buffer(hl.UInt(8), [4, 3])
    with pytest.raises(RuntimeError):
        theirs[1, 1] = value
    ours = shim.Buffer(np.zeros((3, 4), np.uint8))
    for operation in (lambda: ours.__setitem__((1, 1), value), lambda: ours.fill(value),
                      lambda: ours.all_equal(value)):
        with pytest.raises(RuntimeError) as e:
            operation()
        assert isinstance(e.value, shim.ElementValueError)
        assert isinstance(e.value, shim.ArgumentError) and e.value.argument == "value"
    assert not np.asarray(ours).any()


# Calls halide.Buffer refuses with an exception (its bindings' TypeError for an argument of
# the wrong kind or a missing one, ValueError, IndexError, RuntimeError), made the same way on
# both: (label, call(Buffer class, make(type name, sizes)), what shim.Buffer raises). Where
# halide.Buffer checks nothing (a crop outside the buffer, a dimension out of range...), the
# shim's ArgumentError is a deliberate difference, pinned in test_bad_arguments_name_the_argument.
REFUSED_BY_BOTH = [
    ("Buffer(type) with no sizes", lambda B, new: B(new.type("Int", 32)), shim.ArgumentTypeError),
    ("a float extent", lambda B, new: B(new.type("Int", 32), [2, 2.0]), shim.ArgumentTypeError),
    ("a name not a str", lambda B, new: B(new.type("Int", 32), [2], name=3),
     shim.ArgumentTypeError),
    ("reverse_axes not a bool", lambda B, new: B(np.zeros(2), reverse_axes="no"),
     shim.ArgumentTypeError),
    ("an unknown keyword", lambda B, new: B(np.zeros(2), colour=1), shim.ArgumentTypeError),
    ("an object with no memory", lambda B, new: B(object()), shim.ArgumentTypeError),
    ("a complex array", lambda B, new: B(np.zeros(2, np.complex64)), shim.ArgumentError),
    ("set_min of an int", lambda B, new: new("Int", 32, [4, 3]).set_min(1),
     shim.ArgumentTypeError),
    ("set_min of too many", lambda B, new: new("Int", 32, [4, 3]).set_min([1, 2, 3]),
     shim.ArgumentError),
    ("translated without dx", lambda B, new: new("Int", 32, [4, 3]).translated(0),
     shim.ArgumentTypeError),
    ("transposed of one dimension", lambda B, new: new("Int", 32, [4, 3]).transposed(0),
     shim.ArgumentTypeError),
    ("embedded at a float", lambda B, new: new("Int", 32, [4, 3]).embedded(0, 1.5),
     shim.ArgumentTypeError),
    ("cropped without extent", lambda B, new: new("Int", 32, [4, 3]).cropped(0, 1),
     shim.ArgumentTypeError),
    ("cropped with nothing", lambda B, new: new("Int", 32, [4, 3]).cropped(),
     shim.ArgumentTypeError),
    ("contains an int", lambda B, new: new("Int", 32, [4, 3]).contains(0),
     shim.ArgumentTypeError),
    ("contains too many", lambda B, new: new("Int", 32, [4, 3]).contains([0, 0, 0]),
     shim.ArgumentError),
    ("make_with_shape_of an array", lambda B, new: B.make_with_shape_of(np.zeros(3)),
     shim.ArgumentTypeError),
    ("set_name of an int", lambda B, new: new("Int", 32, [4, 3]).set_name(3),
     shim.ArgumentTypeError),
    ("an element outside", lambda B, new: new("Int", 32, [4, 3])[4, 0], shim.CoordinateError),
    ("an element at -1", lambda B, new: new("Int", 32, [4, 3])[-1, 0], shim.CoordinateError),
    ("three coordinates", lambda B, new: new("Int", 32, [4, 3])[0, 0, 0], shim.ArgumentError),
    ("one coordinate", lambda B, new: new("Int", 32, [4, 3])[0], shim.ArgumentError),
    ("writing outside", lambda B, new: new("Int", 32, [4, 3]).__setitem__((4, 0), 1),
     shim.CoordinateError),
    ("writing 300 to uint8", lambda B, new: new("UInt", 8, [2]).__setitem__((0,), 300),
     shim.ElementValueError),
    ("filling with a str", lambda B, new: new("Int", 32, [2]).fill("x"), shim.ElementValueError),
]


@pytest.mark.parametrize("label, call, ours", REFUSED_BY_BOTH, ids=[c[0] for c in REFUSED_BY_BOTH])
def test_what_halide_buffer_refuses_raises_its_exception_class(label, call, ours):
    """shim.Buffer raises an instance of the class halide.Buffer raises for the same call (a
    shim.ArgumentTypeError is the TypeError of halide's bindings), naming the argument."""
    hl = pytest.importorskip("halide")

    class Made:
        """new(code, bits, sizes): a Buffer of that element type; new.type(code, bits) the type,
        as each side names it."""

        def __init__(self, cls, typed):
            self.cls, self.type = cls, typed

        def __call__(self, code, bits, sizes):
            return self.cls(self.type(code, bits), sizes)

    theirs = Made(hl.Buffer, lambda code, bits: getattr(hl, code)(bits))
    with pytest.raises(Exception) as stock:
        call(hl.Buffer, theirs)
    mine = Made(shim.Buffer, lambda code, bits: np.dtype(f"{code.lower()}{bits}"))
    with pytest.raises(ours) as e:
        call(shim.Buffer, mine)
    assert type(stock.value) in (TypeError, ValueError, IndexError, RuntimeError), stock.value
    assert isinstance(e.value, type(stock.value)), (e.value, stock.value)
    assert e.value.argument


def test_zero_dimensional_buffers():
    element = shim.Buffer(np.array(7, np.int32))
    assert element.dimensions() == 0 and element[()] == 7 and dims(element) == []
    assert (element.width(), element.height(), element.channels()) == (1, 1, 1)
    assert element.number_of_elements() == 1 and element.size_in_bytes() == 4
    assert element.contains([])
    # make_scalar takes an element type as Buffer(type=...) does (numpy's names too), by name:
    # a bad one is the type's error.
    assert shim.Buffer.make_scalar("uint16").dtype == np.uint16
    with pytest.raises(shim.ArgumentError, match="has no Halide equivalent") as e:
        shim.Buffer.make_scalar(np.complex64)
    assert e.value.argument == "type"
    seen = []
    element.for_each_element(seen.append)
    assert seen == [[]]
    with pytest.raises(shim.ArgumentError) as e:
        element.top()
    assert e.value.argument == "dimension"
    copy = element.copy()
    copy[()] = 8
    assert element[()] == 7 and copy[()] == 8 and copy.host_dirty()
    row = shim.Buffer(np.arange(5, dtype=np.int32), mins=[10])
    one = row.sliced(0, 12)
    assert one.dimensions() == 0 and one[()] == 2
    back = one.embedded(0, 3)
    assert dims(back) == [(3, 1, 1)] and back[3] == 2
    one.add_dimension()
    one.add_dimension()
    assert dims(one) == [(0, 1, 1), (0, 1, 1)] and one[0, 0] == 2
    one[0, 0] = 20
    assert row[12] == 20
    scalar = shim.Buffer.make_scalar(np.float64)
    scalar.fill(2.5)
    assert scalar.all_equal(2.5) and scalar[()] == 2.5 and scalar.host_dirty()


def test_read_only_memory_reads_and_refuses_writes():
    array = np.arange(12, dtype=np.int32).reshape(3, 4)
    array.flags.writeable = False
    buf = shim.Buffer(array)
    assert not buf.writeable and buf[3, 2] == 11 and buf.all_equal(0) is False
    views = [buf, buf.cropped(0, 1, 2), buf.transposed(0, 1), buf.embedded(1, 4),
             buf.translated([5, 5]).sliced(1, 6)]
    for view in views:
        assert not view.writeable
        first = [view.dim(d).min() for d in range(view.dimensions())]
        for write, argument in ((lambda: view.fill(0), "value"),
                                (lambda: view.__setitem__(first, 0), "value"),
                                (lambda: view.copy_from(view.copy()), "other")):
            with pytest.raises(shim.ArgumentError, match="read-only") as e:
                write()
            assert e.value.argument == argument
    copy = buf.copy()
    copy[0, 0] = -1
    assert copy.writeable and copy[0, 0] == -1
    np.testing.assert_array_equal(array, np.arange(12).reshape(3, 4))


def test_views_share_memory_and_map_coordinates():
    base = np.zeros((3, 12, 9), np.int32)  # c, y, x
    buf = shim.Buffer(base)
    deep = buf.sliced(2, 1).translated([10, 20]).cropped(0, 12, 5).sliced(1, 25)
    assert dims(deep) == [(12, 5, 1)]
    for x in range(12, 17):
        deep[x] = x
    assert base[1, 5, 2:7].tolist() == list(range(12, 17)) and base.sum() == sum(range(12, 17))
    swapped = buf.transposed([2, 0, 1])  # x -> 2, y -> 0, c -> 1
    assert dims(swapped) == [(0, 12, 9), (0, 3, 108), (0, 9, 1)]
    swapped[11, 2, 8] = -5
    assert base[2, 11, 8] == -5
    np.testing.assert_array_equal(np.asarray(swapped), base.transpose(2, 0, 1))
    planes = buf.embedded(3, 7).embedded(0)
    # An added dimension's stride is the outermost one's span, as in halide.Buffer.
    assert dims(planes)[0] == (0, 1, 324) and dims(planes)[4] == (7, 1, 324)
    assert planes[0, 8, 11, 2, 7] == -5
    np.testing.assert_array_equal(np.from_dlpack(planes), base.reshape(1, 3, 12, 9, 1))
    same = shim.Buffer(buf.translated([4, 4, 4]))  # halide.Buffer(buf): mins 0, memory shared
    assert dims(same) == dims(buf) and same.family is buf.family
    flipped = shim.Buffer(buf, reverse_axes=False)
    assert dims(flipped) == [(0, 3, 108), (0, 12, 9), (0, 9, 1)] and flipped[2, 11, 8] == -5


def test_in_place_forms_change_the_buffer_itself():
    buf = shim.Buffer(np.arange(24, dtype=np.int32).reshape(4, 6))
    buf.crop(0, 1, 3)
    buf.crop(rect=[(2, 2)])
    assert dims(buf) == [(2, 2, 1), (0, 4, 6)] and buf[2, 3] == 20
    buf.slice(1)  # at the min
    assert dims(buf) == [(2, 2, 1)] and buf[3] == 3
    buf.embed(1, 9)
    buf.transpose(0, 1)
    assert dims(buf) == [(9, 1, 2), (2, 2, 1)] and buf[9, 3] == 3
    name = buf.name()
    buf.set_name("renamed")
    assert name.startswith("b") and buf.name() == "renamed" and buf.same_as(buf)
    assert not buf.same_as(buf.cropped(1, 2, 1)) and buf.defined()


ARGUMENT_ERRORS = [
    (lambda b: shim.Buffer(np.int32), "sizes"),
    (lambda b: shim.Buffer(np.int32, [2, -1]), "sizes"),
    (lambda b: shim.Buffer(np.int32, [2, 2.0]), "sizes"),
    (lambda b: shim.Buffer(np.int32, [2, 3], [0, 0]), "storage_order"),
    (lambda b: shim.Buffer(np.int32, [2, 3], name=3), "name"),
    (lambda b: shim.Buffer(np.complex64, [2]), "type"),
    (lambda b: shim.Buffer(np.int32, [2], shape=(2,)), "shape"),
    (lambda b: shim.Buffer(np.zeros(2), dtype=np.int32), "dtype"),
    (lambda b: shim.Buffer(np.zeros(2), reverse_axes="no"), "reverse_axes"),
    (lambda b: shim.Buffer(np.zeros(2), colour=1), "colour"),
    (lambda b: shim.Buffer(np.zeros(2), mins=[1, 2]), "mins"),
    (lambda b: shim.Buffer(np.zeros(2), mins=1), "mins"),
    (lambda b: shim.Buffer(shape=(2,), dtype=None), "dtype"),
    (lambda b: b.set_min([1, 2, 3]), "mins"),
    (lambda b: b.translated([1, 2, 3]), "delta"),
    (lambda b: b.translated(0), "dx"),
    (lambda b: b.transposed([0, 0]), "order"),
    (lambda b: b.transposed(0), "d2"),
    (lambda b: b.transposed(0, 2), "dimension"),
    (lambda b: b.embedded(3), "dimension"),
    (lambda b: b.embedded(0, 1.5), "pos"),
    (lambda b: b.cropped(0, 0, 9), "min"),
    (lambda b: b.cropped([(0, 9)]), "rect"),
    (lambda b: b.cropped(0, 1), "extent"),
    (lambda b: b.sliced(1, 4), "pos"),
    (lambda b: b.dim(2), "dimension"),
    (lambda b: b.contains([0, 0, 0]), "coords"),
    (lambda b: b.contains(0), "coords"),
    (lambda b: b.copy_from(np.zeros((3, 4))), "other"),
    (lambda b: b.copy_from(shim.Buffer(np.zeros((3, 4), np.float32))), "other"),
    (lambda b: b.set_device_dirty(), "dirty"),
    (lambda b: shim.Buffer.make_with_shape_of(np.zeros(3)), "src"),
    (lambda b: b.copy_to_device("metal"), "kind"),
]


@pytest.mark.parametrize("bad, argument", ARGUMENT_ERRORS)
def test_bad_arguments_name_the_argument(bad, argument):
    buf = shim.Buffer(np.zeros((3, 4), np.int32))
    with pytest.raises(shim.ArgumentError) as e:
        bad(buf)
    assert e.value.argument == argument, e.value
    assert dims(buf) == [(0, 4, 1), (0, 3, 4)]


def test_element_types_as_halide_and_numpy_name_them():
    hl = pytest.importorskip("halide")
    for htype, dtype in ((hl.UInt(8), np.uint8), (hl.Int(16), np.int16), (hl.Float(16), np.float16),
                         (hl.Float(64), np.float64), (hl.Bool(), np.bool_)):
        made = shim.Buffer(htype, [2, 3])
        assert made.dtype == dtype and made.type() == htype and made.shape == (3, 2)
        assert shim.Buffer(np.dtype(dtype), [1]).type() == htype
        assert not made.host_dirty()  # as halide.Buffer's: nothing was written yet
    assert shim.Buffer(hl.UInt(8), [2]).type() != hl.UInt(16)
    with pytest.raises(shim.ArgumentError, match="no numpy equivalent") as e:
        shim.Buffer(hl.BFloat(16), [2])
    assert e.value.argument == "type"


def test_devices_named_as_halide_names_them(opencl):
    hl = pytest.importorskip("halide")
    buf = shim.Buffer(np.arange(4, dtype=np.float32))
    assert buf.copy_to_device(hl.DeviceAPI.Default_GPU, hl.Target("host-opencl")) == 0
    assert buf.device is opencl and not buf.host_dirty()
    assert buf.device_free() == 0 and buf.device_malloc(hl.Target("host-cuda-opencl")) == 0
    assert buf.device is opencl  # Halide's choice among a target's APIs: OpenCL first
    assert buf.device_deallocate() == 0 and not buf.has_device_allocation()
    with pytest.raises(shim.ArgumentError, match="DeviceAPI.Metal") as e:
        buf.copy_to_device(hl.DeviceAPI.Metal)
    assert e.value.argument == "device_api"
    assert buf.copy_to_device(hl.Target("host")) == 0  # no GPU feature: the default device
    assert buf.device is shim.default_device()
    buf.device_free()


# --- views given to pipelines ---------------------------------------------------------------------

def fill(xs, ys, param):
    return xs * 100 + ys + param * 10000


def test_cpu_pipelines_read_views(load):
    plane_sum = load("plane_sum")
    stored = np.arange(5 * 3 * 4, dtype=np.int32).reshape(4, 3, 5)  # y, c, x: channels inside rows
    transposed = shim.Buffer(stored).transposed(1, 2)  # x, y, c
    np.testing.assert_array_equal(plane_sum(transposed, output=(4, 5)).numpy(),
                                  stored.sum(axis=1))
    flat = np.arange(12, dtype=np.int32).reshape(3, 4)
    np.testing.assert_array_equal(plane_sum(shim.Buffer(flat).embedded(2, 5), output=(3, 4))
                                  .numpy(), flat)
    moved = shim.Buffer(stored).transposed(1, 2).translated([-3, -2, 7])
    out = shim.Buffer(np.int32, [5, 4], mins=[-3, -2])
    plane_sum(moved, output=out)
    np.testing.assert_array_equal(out.numpy(), stored.sum(axis=1))


def test_cpu_pipelines_write_through_views(load):
    crop_fill, plane_fill = load("crop_fill"), load("plane_fill")
    shifted = shim.Buffer(np.int32, [5, 7])
    shifted.set_min([100, 50])  # tutorial lesson 6
    crop_fill(param=0, f=shifted)
    ys, xs = np.mgrid[50:57, 100:105]
    np.testing.assert_array_equal(shifted.numpy(), fill(xs, ys, 0))
    negative = shim.Buffer(np.int32, [4, 3], mins=[-9, -20])
    crop_fill(param=2, f=negative)
    ys, xs = np.mgrid[-20:-17, -9:-5]
    np.testing.assert_array_equal(negative.numpy(), fill(xs, ys, 2))
    stored = np.zeros((4, 3, 5), np.int32)  # y, c, x
    plane_fill(param=1, f=shim.Buffer(stored).transposed(1, 2))
    cs, ys, xs = np.mgrid[0:3, 0:4, 0:5]
    np.testing.assert_array_equal(stored.transpose(1, 0, 2), fill(xs, ys, 1) + cs * 10)
    row = np.zeros(9, np.int32)
    crop_fill(param=3, f=shim.Buffer(row).embedded(1, 4))
    np.testing.assert_array_equal(row, fill(np.arange(9), 4, 3))
    base = np.zeros((3, 12, 9), np.int32)
    crop_fill(param=0, f=shim.Buffer(base).sliced(2, 1).translated([10, 20]).cropped(0, 12, 5))
    ys, xs = np.mgrid[20:32, 12:17]
    np.testing.assert_array_equal(base[1, :, 2:7], fill(xs, ys, 0))
    assert base.sum() == base[1, :, 2:7].sum()


def test_a_pipeline_refuses_an_output_whose_x_is_not_dense(load):
    memory = np.zeros((9, 12), np.int32)
    with pytest.raises(shim.PipelineError, match="stride"):
        load("crop_fill")(param=1, f=shim.Buffer(memory).transposed(0, 1))
    assert not memory.any()


def test_in_place_changes_and_prepared_calls(load):
    out = shim.Buffer(np.int32, [9, 12])
    with load("crop_fill").prepare(param=1, f=out) as run:
        out.set_min([100, 50])  # the struct the call holds: it computes these coordinates
        run()
        ys, xs = np.mgrid[50:62, 100:109]
        np.testing.assert_array_equal(out.numpy(), fill(xs, ys, 1))
        out.crop(0, 102, 3)  # the Buffer becomes the crop; the call keeps the whole struct
        out.fill(0)
        run()
        np.testing.assert_array_equal(out.numpy(), fill(xs[:, 2:5], ys[:, 2:5], 1))


@pytest.fixture(scope="module")
def gpu_libraries():
    """{(name, kind, runtime): path}, built for the GPU backends on first use."""
    return {}


def gpu_pipeline(gpu_libraries, gpu, name, runtime):
    key = (name, gpu.kind, runtime)
    if key not in gpu_libraries:
        specs = [Build(n, gpu.kind, r) for n in ("crop_fill", "plane_fill", "plane_sum")
                 for r in RUNTIMES]
        for spec, path in build_all(specs, progress=None).items():
            gpu_libraries[spec.name, spec.target, spec.runtime] = path
    return shim.load(gpu_libraries[key])


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_gpu_pipelines_write_through_views_of_one_family(gpu, gpu_libraries, runtime):
    crop_fill = gpu_pipeline(gpu_libraries, gpu, "crop_fill", runtime)
    plane_fill = gpu_pipeline(gpu_libraries, gpu, "plane_fill", runtime)
    plane_sum = gpu_pipeline(gpu_libraries, gpu, "plane_sum", runtime)
    base = np.zeros((3, 12, 9), np.int32)  # c, y, x
    buf = shim.Buffer(base)
    buf.copy_to_device(gpu)
    deep = buf.sliced(2, 1).translated([10, 20]).cropped(0, 12, 5)
    crop_fill(param=0, f=deep)
    swapped = buf.transposed([0, 2, 1]).translated([0, 0, 5]).cropped(2, 5, 1)  # x, c, y = 0
    crop_fill(param=7, f=swapped.sliced(2))  # writes c as y: f(x, c)
    plane = buf.cropped(2, 2, 1).embedded(3, 4).sliced(2)  # x, y, (c = 2 as a new dim)
    plane_fill(param=5, f=plane)
    buf.copy_to_host()
    expected = np.zeros_like(base)
    ys, xs = np.mgrid[20:32, 12:17]
    expected[1, :, 2:7] = fill(xs, ys, 0)
    cs, xs = np.mgrid[0:3, 0:9]
    expected[:, 0, :] = fill(xs, cs, 7)
    ys, xs = np.mgrid[0:12, 0:9]
    expected[2] = fill(xs, ys, 5) + 40
    np.testing.assert_array_equal(base, expected)
    sums = plane_sum(buf.transposed(0, 0).translated([1, 1, 1]).cropped(2, 1, 2),
                     output=shim.Buffer(np.int32, [9, 12], mins=[1, 1]))
    np.testing.assert_array_equal(sums.numpy(), expected[:2].sum(axis=0))


# --- halide.Type and the rest of halide.Buffer's API (issue 27) -----------------------------

TYPE_QUERIES = ("bits", "bytes", "lanes", "is_bool", "is_int", "is_uint", "is_float",
                "is_bfloat", "is_handle", "is_vector", "is_scalar")


def _halide_types(hl):
    return [hl.Bool(), hl.Int(8), hl.Int(16), hl.Int(32), hl.Int(64), hl.UInt(8), hl.UInt(16),
            hl.UInt(32), hl.UInt(64), hl.Float(16), hl.Float(32), hl.Float(64),
            hl.Int(32).with_lanes(4), hl.Float(32).with_lanes(8)]


def test_shim_type_answers_halide_types_queries_as_halide_does():
    hl = pytest.importorskip("halide", reason="the reference is halide.Type")
    for theirs in _halide_types(hl):
        mine = shim.Type(int(theirs.code()), theirs.bits(), theirs.lanes())
        for query in TYPE_QUERIES:
            assert getattr(mine, query)() == getattr(theirs, query)(), (theirs, query)
        assert mine.code() == theirs.code() and str(mine.code()) == str(theirs.code())
        assert str(mine) == str(theirs)
        assert mine == theirs and mine == shim.HalideType(int(theirs.code()), theirs.bits(),
                                                          theirs.lanes())
        assert mine.element_of() == theirs.element_of()
        assert mine.with_bits(16) == theirs.with_bits(16)
        assert mine.with_lanes(2) == theirs.with_lanes(2)
        assert mine.with_code(shim.TypeCode.Int) == theirs.with_code(hl.TypeCode.Int)
        for other in _halide_types(hl):
            mine_other = shim.Type(int(other.code()), other.bits(), other.lanes())
            assert mine.can_represent(mine_other) == theirs.can_represent(other), (theirs, other)
        if theirs.is_scalar() and not theirs.is_float():
            # halide's max() and min() are Exprs of the type; the shim's are Python numbers.
            assert mine.max() == _expr_value(theirs.max())
            assert mine.min() == _expr_value(theirs.min())


def _expr_value(expr) -> int:
    """The value of a constant halide.Expr, from its text: "<halide.Expr of type T: (T)V>"
    (int32's without the cast)."""
    return int(re.search(r"(-?\d+)>$", str(expr)).group(1))


def test_shim_type_limits_and_numbers_against_numpy():
    for dtype in (np.int8, np.uint16, np.int32, np.uint64):
        t = shim.Type.of(shim.HalideType.from_dtype(np.dtype(dtype)))
        info = np.iinfo(dtype)
        assert (t.max(), t.min()) == (info.max, info.min)
        assert t.can_represent(int(info.max)) and not t.can_represent(int(info.max) + 1)
        assert t.is_max(info.max) and t.is_min(info.min)
    f32 = shim.Type(shim.TypeCode.Float, 32)
    assert f32.max() == np.inf and f32.can_represent(0.5) and not f32.can_represent(0.1)
    with pytest.raises(AttributeError):
        f32._t = None
    with pytest.raises(TypeError, match="a Type or a number"):
        f32.can_represent("1")


def test_buffer_type_is_halides_where_halide_is_imported_else_shims():
    # In a child: whether halide is imported decides, and both compare equal to halide's.
    code = ("import numpy as np, shim, sys\n"
            "b = shim.Buffer(np.zeros((2, 3), np.uint16))\n"
            "t = b.type(); print(type(t).__module__, t.bits(), t.is_uint(), str(t))\n"
            "import halide as hl\n"
            "h = b.type(); print(type(h).__module__, h == hl.UInt(16), hl.UInt(16) == h, "
            "t == hl.UInt(16), hl.UInt(16).code() == t.code())\n")
    pytest.importorskip("halide", reason="the comparison is with halide.Type")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["shim.base.types 16 True uint16",
                                           "halide.halide_ True True True True"]


def test_a_buffer_exports_its_host_memory_through_the_buffer_protocol():
    data = np.arange(12, dtype=np.int32).reshape(3, 4)
    buf = shim.Buffer(data)
    view = memoryview(buf)
    assert view.shape == (3, 4) and view.format == "i" and not view.readonly
    assert bytes(buf) == data.tobytes()
    view[1, 2] = 99  # the Buffer's own memory
    assert buf[2, 1] == 99
    del buf
    assert view.tolist()[1][2] == 99  # (the view keeps the memory)
    read_only = data.copy()
    read_only.flags.writeable = False
    assert memoryview(shim.Buffer(read_only)).readonly
    hl = pytest.importorskip("halide", reason="halide.Buffer(shim.Buffer)")
    theirs = hl.Buffer(shim.Buffer(data))
    assert (theirs.width(), theirs.height(), theirs[3, 2]) == (4, 3, data[2, 3])


def test_an_undefined_buffer_is_halides_and_refuses_everything_else():
    buf = shim.Buffer()
    assert isinstance(buf, shim.Buffer) and not buf.defined()
    assert str(buf) == "<undefined halide.Buffer>"
    for use in (buf.dimensions, buf.type, lambda: buf.shape, lambda: memoryview(buf),
                lambda: buf[0], buf.numpy, buf.copy_to_device, lambda: np.asarray(buf)):
        with pytest.raises(shim.ArgumentError, match="the Buffer is undefined"):
            use()
    with pytest.raises(shim.ArgumentError, match="undefined"):
        shim.load(_host_library("brighten"))(buf, scale=1.0, offset=0.0)
    assert shim.Buffer(np.zeros(3, np.uint8)).defined()


def _host_library(name):
    [path] = build_all([Build(name, "host", "no_runtime")], progress=None).values()
    return path


def test_halide_texts_for_printing_out_of_bounds_and_overflow():
    buf = shim.Buffer(shim.Type(shim.TypeCode.Int, 32), [128, 256])
    assert str(buf) == "<halide.Buffer of type int32 shape:[[0,128,1],[0,256,128]]>"
    small = shim.Buffer(shim.Type(shim.TypeCode.Int, 16), [4, 6])
    with pytest.raises(IndexError, match="index -1 is out of bounds for axis 0 with min=0, "
                                         "extent=4"):
        small[-1, 2]
    with pytest.raises(IndexError, match="index 6 is out of bounds for axis 1 with min=0, "
                                         "extent=6"):
        small[1, 6] = 42
    huge = np.ndarray(dtype=np.uint8, shape=(2**31,))  # (never touched: no memory used)
    with pytest.raises(ValueError, match="Out of range dimensions in buffer conversion"):
        shim.Buffer(huge)


def test_the_construction_rows_of_the_differences_table_side_by_side():
    """docs/using.md's table of differences, its rows on constructors, checked against
    halide.Buffer in this process: what is the same is the same, what differs differs as the
    table says."""
    hl = pytest.importorskip("halide", reason="the comparison is with halide.Buffer")
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    for make in (hl.Buffer, shim.Buffer):
        # The same: an array's Buffer is host-dirty, a new one is not.
        assert make(array.copy()).host_dirty() and not make(hl.Float(32), [4, 3]).host_dirty()
    assert shim.Buffer(hl.Float(32), [4, 3]).all_equal(0)
    # Buffer(other_buffer): both a view of the memory with mins 0; the shim's shares the device
    # state too (the one flag a host-only Buffer has to show it: dirty set through the view).
    for make in (hl.Buffer, shim.Buffer):
        first = make(array.copy())
        first.set_min([5, 6])
        view = make(first)
        view[0, 0] = 7.0
        assert first[5, 6] == 7.0 and view.dim(0).min() == 0
        first.set_host_dirty(False)
        view.set_host_dirty(True)
        assert first.host_dirty() == (make is shim.Buffer)
    read_only = array.copy()
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        hl.Buffer(read_only)
    assert shim.Buffer(read_only)[3, 2] == 11
