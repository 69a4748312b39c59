"""Outputs the caller leaves out: sized like the first input (RunGen's default) when the bounds
query accepts that, else from the pipeline's estimates, else a bounds error that says how the
size was guessed and how to pass one."""

import subprocess

import numpy as np
import pytest

import shim


def test_estimates_that_do_not_fit_the_input_give_way_to_the_inputs_shape(load):
    out = load("brighten")(np.ones((64, 64), np.float32), scale=2.0, offset=1.0)
    assert out.shape == (64, 64)
    assert (out.numpy() == 3).all()


def test_an_elementwise_pipelines_output_is_its_inputs_shape_even_where_estimates_fit(load):
    # brighten reads only what it writes: the estimated 640x480 would fit too, but a numpy
    # user expects the input's shape back (and RunGen gives it).
    out = load("brighten")(np.ones((500, 700), np.float32), scale=2.0, offset=1.0)
    assert out.shape == (500, 700)
    assert (out.numpy() == 3).all()


def test_estimates_size_a_stencil_whose_input_shape_does_not_fit(load):
    # blur3x3 reads two more columns and rows than it writes: an output like its input would
    # read outside it, while the estimates (480x640 from a 482x642 input) fit.
    image = np.arange(482 * 642, dtype=np.uint16).reshape(482, 642)
    out = load("blur3x3")(image)
    assert out.shape == (480, 640)


def test_without_estimates_the_first_input_gives_the_size(load):
    a, b = np.full((4, 5), 3, np.uint8), np.full((4, 5), 0.5, np.float32)
    expected = load("mix")(a, b, output=(4, 5)).numpy()
    out = load("mix")(a, b)
    assert out.shape == (4, 5)
    np.testing.assert_array_equal(out.numpy(), expected)


def test_several_omitted_outputs_are_sized_together(load):
    a, b = np.arange(20, dtype=np.int32).reshape(4, 5), np.ones((4, 5), np.int32)
    total, diff = load("sum_diff")(a, b)
    np.testing.assert_array_equal(total.numpy(), a + b)
    np.testing.assert_array_equal(diff.numpy(), a - b)


def test_prepared_calls_size_omitted_outputs_once(load):
    image = np.ones((32, 48), np.float32)
    with load("brighten").prepare(image, scale=1.0, offset=1.0) as run:
        first, again = run(), run()
    assert first is again and first.shape == (32, 48)
    assert (first.numpy() == 2).all()


def test_a_guess_that_fits_nothing_says_how_it_was_made_and_how_to_pass_a_size(load):
    with pytest.raises(shim.BoundsError) as e:
        load("blur3x3")(np.zeros((100, 100), np.uint16))  # reads two more than it writes
    message = str(e.value)
    assert e.value.argument == "input" and e.value.code == -4
    assert "over [0, 102) but the input covers [0, 100)" in message
    assert "output was not given and sized like the first input, input: (100, 100)" in message
    assert "sized from the pipeline's estimates, (480, 640): input: too small" in message
    assert "over [0, 642)" in message
    assert "Pass the size: output=(height, width) in numpy order (x last)" in message
    assert "dimension 0 (x, numpy axis 1)" in message


def test_a_guess_without_estimates_says_it_came_from_the_first_input(load):
    with pytest.raises(shim.BoundsError, match=r"b: too small.*output was not given and sized "
                                               r"like the first input, a: \(4, 5\)\. Pass the size"):
        load("mix")(np.ones((4, 5), np.uint8), np.ones((2, 2), np.float32))


def test_a_given_output_is_never_resized(load):
    with pytest.raises(shim.BoundsError) as e:
        load("brighten")(np.ones((64, 64), np.float32), output=(100, 100))
    assert "not given" not in str(e.value) and "over [0, 100)" in str(e.value)


# --- pipelines compiled here, for what the sample pipelines do not have -----------------------


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """compiled(name) -> shim.Pipeline: 'shifted' (no inputs; its output estimated at x=3+10),
    'pinned' (output x from 2, no extent estimate; reads its 2-D input's row 0 from x - 2)."""
    hl = pytest.importorskip("halide", reason="compiling test pipelines needs halide")
    work = tmp_path_factory.mktemp("sizing")
    x = hl.Var("x")
    shifted = hl.Func("shifted")
    shifted[x] = hl.cast(hl.Int(32), x)
    shifted.set_estimates([hl.Range(3, 10)])
    src = hl.ImageParam(hl.UInt(8), 2, "src")
    pinned = hl.Func("pinned")
    pinned[x] = hl.cast(hl.Int(32), x) + hl.cast(hl.Int(32), src[x - 2, 0])
    pinned.output_buffer().dim(0).set_min(2)
    libraries = {}
    for name, func, args in (("shifted", shifted, []), ("pinned", pinned, [src])):
        obj = work / f"{name}.o"
        func.compile_to({hl.OutputFileType.object: str(obj)}, args, name, hl.Target("host"))
        subprocess.run(["cc", "-shared", "-o", str(work / f"{name}.so"), str(obj), "-lpthread",
                        "-ldl"], check=True)
        libraries[name] = shim.load(work / f"{name}.so")
    return libraries.__getitem__


def test_the_estimates_mins_are_the_outputs_mins(compiled):
    out = compiled("shifted")()
    np.testing.assert_array_equal(out.numpy(), np.arange(3, 13))


def test_an_output_the_pipeline_pins_gets_the_region_the_bounds_query_asks_for(compiled):
    # Sized like the input's x, [0, 5); the pipeline's output starts at 2: as in RunGen, the
    # guessed output takes the region the bounds query answers, [2, 7).
    out = compiled("pinned")(np.full((3, 5), 7, np.uint8))
    np.testing.assert_array_equal(out.numpy(), np.arange(2, 7) + 7)
