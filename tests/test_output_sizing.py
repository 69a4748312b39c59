"""Outputs the caller leaves out (issue 27): the largest the inputs cover, starting like the
first input (RunGen's default), in the Python API, the CLI and shim.dask alike; else the
pipeline's estimates; else a bounds error that says how the size was guessed and how to pass
one. Never a size the user would not expect without a SizeWarning: the estimates do not
override what the inputs say (a 3000x3000 image through a 3x3 blur is 2998x2998, not the
estimated 480x640)."""

import subprocess
import sys
import warnings

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


def _blurred(image):
    """blur3x3 in numpy: two passes of integer means over 3, the output 2 smaller each way."""
    wide = image.astype(np.uint32)
    rows = ((wide[:, :-2] + wide[:, 1:-1] + wide[:, 2:]) // 3).astype(np.uint16).astype(np.uint32)
    return ((rows[:-2] + rows[1:-1] + rows[2:]) // 3).astype(np.uint16)


@pytest.mark.parametrize("shape", [(3000, 3000), (482, 642), (64, 64), (5, 3)])
def test_a_stencils_output_is_as_large_as_its_input_covers(load, shape):
    # blur3x3 reads two more columns and rows than it writes. Its estimates (480x640) fit a
    # 3000x3000 input too, but say nothing about it: the inputs decide.
    image = np.random.default_rng(1).integers(0, 65536, shape, dtype=np.uint16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", shim.SizeWarning)
        out = load("blur3x3")(image)
    assert out.shape == (shape[0] - 2, shape[1] - 2)
    np.testing.assert_array_equal(out.numpy(), _blurred(image))


def test_inputs_of_different_shapes_give_what_all_cover_with_a_warning(load):
    a, b = np.full((4, 5), 3, np.uint8), np.full((2, 3), 0.5, np.float32)
    with pytest.warns(shim.SizeWarning, match=r"mix: output \(2, 3\), smaller than the first "
                                              r"input, a, allows: b covers less") as caught:
        out = load("mix")(a, b, alpha=0.5, offset=1)
    assert caught[0].filename == __file__  # (the caller's line)
    np.testing.assert_array_equal(out.numpy(), load("mix")(a[:2, :3], b, 0.5, 1).numpy())


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
        load("blur3x3")(np.zeros((2, 2), np.uint16))  # reads two more than it writes
    message = str(e.value)
    assert e.value.argument == "input" and e.value.code == -4
    assert "over [0, 4) but the input covers [0, 2)" in message
    assert "output was not given and sized like the first input, input: (2, 2)" in message
    assert "sized from the pipeline's estimates, (480, 640): input: too small" in message
    assert "over [0, 642)" in message
    assert "Pass the size: output=(height, width) in numpy order (x last)" in message
    assert "dimension 0 (x, numpy axis 1)" in message


def test_a_guess_without_estimates_says_it_came_from_the_first_input(compiled):
    # 'far' reads src 100 to the right of what it writes: a 50-wide input covers nothing.
    with pytest.raises(shim.BoundsError, match=r"src: too small.*far was not given and sized "
                                               r"like the first input, src: \(50,\)\. Pass"):
        compiled("far")(np.ones((3, 50), np.uint8))


def test_a_pipeline_without_buffer_inputs_is_sized_by_its_estimates_without_a_warning(compiled):
    with warnings.catch_warnings():
        warnings.simplefilter("error", shim.SizeWarning)
        np.testing.assert_array_equal(compiled("shifted")().numpy(), np.arange(3, 13))


def test_sizes_are_chosen_once_per_shape(load):
    # Remembered per shapes and scalars: the bounds queries run for a new shape only.
    blur = load("blur3x3")
    image = np.zeros((40, 30), np.uint16)
    with shim.profile() as first:
        blur(image)
    with shim.profile() as again:
        blur(image)
    queries = [r for r in first.records if r.name.endswith("(bounds query)")]
    assert len(queries) > 2
    assert not [r for r in again.records if r.name.endswith("(bounds query)") and
                r.name.startswith("blur3x3")][1:]


def test_a_given_output_is_never_resized(load):
    with pytest.raises(shim.BoundsError) as e:
        load("brighten")(np.ones((64, 64), np.float32), output=(100, 100))
    assert "not given" not in str(e.value) and "over [0, 100)" in str(e.value)


# --- pipelines compiled here, for what the sample pipelines do not have -----------------------


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """compiled(name) -> shim.Pipeline: 'shifted' (no inputs; its output estimated at x=3+10),
    'pinned' (output x from 2, no extent estimate; reads its 2-D input's row 0 from x - 2),
    'far' (no estimates; reads its 2-D input's row 0 at x + 100), 'half' (a 2x downsample
    of its 2-D input's row 0, no estimates)."""
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
    far = hl.Func("far")
    far[x] = hl.cast(hl.Int(32), src[x + 100, 0])
    half = hl.Func("half")
    half[x] = hl.cast(hl.Int(32), src[2 * x, 0]) + src[2 * x + 1, 0]
    # Rows in tiles of 64, a short last tile shifted inward (Halide's default for outputs), the
    # input read through a boundary condition: local_laplacian's shape.
    y, yo, yi = hl.Var("y"), hl.Var("yo"), hl.Var("yi")
    tiled = hl.Func("tiled")
    tiled[x, y] = hl.cast(hl.Int(32), hl.BoundaryConditions.repeat_edge(src)[x, y])
    tiled.split(y, yo, yi, 64)
    libraries = {}
    for name, func, args in (("shifted", shifted, []), ("pinned", pinned, [src]),
                             ("far", far, [src]), ("half", half, [src]), ("tiled", tiled, [src])):
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


def test_an_output_whose_region_moves_with_what_is_asked_is_asked_for(compiled):
    # A 16-row image: the pipeline computes rows -48..15 for an output of rows 0..15 (its last
    # tile of 64 shifted inward). Sized so, the output would start at y = -48, 64 rows for a
    # 16-row input: refused, naming what the pipeline computes and a size that works.
    tiled = compiled("tiled")
    image = np.arange(16 * 5, dtype=np.uint8).reshape(16, 5)
    with pytest.raises(shim.ArgumentError, match=r"tiled: not given.*y -48\.\.15.*\(64, 5\)"):
        tiled(image)
    out = tiled(image, tiled=(64, 5))  # what the message suggests: 64 rows from y = 0
    np.testing.assert_array_equal(out.numpy()[:16], image)
    np.testing.assert_array_equal(out.numpy()[16:], np.broadcast_to(image[-1], (48, 5)))
    tall = np.arange(100 * 5, dtype=np.uint8).reshape(100, 5)  # enough rows: like the input
    np.testing.assert_array_equal(tiled(tall).numpy(), tall)


def test_a_downsample_is_as_large_as_its_input_covers(compiled):
    row = np.arange(11, dtype=np.uint8)
    out = compiled("half")(row[None, :])
    np.testing.assert_array_equal(out.numpy(), row[0:10:2].astype(np.int32) + row[1:10:2])


def test_the_cli_and_dask_size_as_the_python_api_does(host_pipelines, tmp_path):
    """A 3000x3000 image through blur3x3: 2998x2998 from `python -m shim run` and shim.dask
    too, not the estimates' 480x640."""
    done = subprocess.run([sys.executable, "-m", "shim", "run",
                           str(host_pipelines["blur3x3", "no_runtime"]),
                           "input=zero:[3000,3000]", "output=:", "--verbose"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "Output output: Shape is [[0,2998,1],[0,2998,2998]]" in done.stderr
    da = pytest.importorskip("dask.array", reason="shim.dask needs the dask extra")
    import shim.dask
    image = da.zeros((3000, 3000), dtype=np.uint16, chunks=1500)
    out = shim.dask.map_pipeline(shim.load(host_pipelines["blur3x3", "no_runtime"]), image)
    assert out.shape == (2998, 2998)


def test_sizing_a_wide_input_stays_within_32_bit_boxes(load):
    # Growing x 64-fold to see whether the inputs bound it would pass 2^31 elements: the
    # trials stop where a halide_buffer_t's fields end (this raised OverflowError once).
    width = 40_000_000  # (64 times that is beyond 2^31)
    image = np.broadcast_to((np.arange(width) % 65536).astype(np.uint16), (3, width))
    out = load("blur3x3")(image)
    assert out.shape == (1, width - 2)
    np.testing.assert_array_equal(out.numpy()[:, :6], _blurred(np.asarray(image[:, :8])))
