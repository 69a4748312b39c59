"""shim.dask.map_pipeline on xarray DataArrays: dimensions matched by name to the pipeline's
(``dims=``, numpy order), DataArrays transposed to them, and each output a DataArray whose
name, coordinates and attributes are those ``xr.apply_ufunc`` gives, along the dimensions
whose size the output keeps; the values those of one call over the whole (transposed) data.
And shim.dask without xarray, zarr and tifffile, which it imports only where used."""

import subprocess
import sys

import numpy as np
import pytest

import shim

da = pytest.importorskip("dask.array")
xr = pytest.importorskip("xarray")
zarr = pytest.importorskip("zarr")

from shim.dask import map_pipeline  # noqa: E402


def image(shape, dtype=np.uint16, seed=0):
    return np.random.default_rng(seed).integers(0, 3000, shape).astype(dtype)


def labelled(values, dims=("y", "x"), chunks=16, **extra):
    """A dask-backed DataArray with a coordinate along each dimension, a 2-D auxiliary
    coordinate, a scalar one, a name and attributes."""
    coords = {d: np.arange(n) * 0.5 + 10 for d, n in zip(dims, values.shape)}
    coords["lat"] = (dims, np.arange(values.size, dtype=np.float64).reshape(values.shape))
    coords["time"] = 7
    return xr.DataArray(da.from_array(values, chunks=chunks), dims=dims, coords=coords,
                        name="image", attrs={"units": "counts"}, **extra)


def as_apply_ufunc_gives(array, exclude=()):
    """What xr.apply_ufunc makes of ``array`` with a function keeping its data, dimensions
    ``exclude`` resized by it: the name, coordinates and attributes expected of the result."""
    def same(values):
        return values if not exclude else values[tuple(
            slice(1, -1) if d in exclude else slice(None) for d in array.dims)]

    return xr.apply_ufunc(same, array, input_core_dims=[list(array.dims)],
                          output_core_dims=[list(array.dims)], exclude_dims=set(exclude),
                          dask="allowed")


def test_a_same_size_output_keeps_every_coordinate(dask_pipeline):
    blur = shim.load(dask_pipeline("edge_blur"))  # (repeat_edge: the output is the input's size)
    values = image((40, 50))
    array = labelled(values)
    result = map_pipeline(blur, array)
    assert isinstance(result, xr.DataArray) and isinstance(result.data, da.Array)
    assert result.dims == ("y", "x") and result.chunks == array.chunks
    expected = as_apply_ufunc_gives(array)
    assert result.name == expected.name == "image"
    assert result.attrs == expected.attrs == {"units": "counts"}
    xr.testing.assert_identical(result.coords.to_dataset(), expected.coords.to_dataset())
    assert set(result.coords) == {"y", "x", "lat", "time"}
    np.testing.assert_array_equal(result.values, np.asarray(blur(values)))


def test_a_resized_output_drops_the_coordinates_of_what_it_resized(host_pipelines):
    # blur3x3's output is 2 smaller along both: the input's labels no longer name its pixels.
    blur = shim.load(host_pipelines["blur3x3", "bundled"])
    values = image((40, 50))
    result = map_pipeline(blur, labelled(values))
    assert result.dims == ("y", "x") and result.shape == (38, 48)
    expected = as_apply_ufunc_gives(labelled(values), exclude=("y", "x"))
    xr.testing.assert_identical(result.coords.to_dataset(), expected.coords.to_dataset())
    assert set(result.coords) == {"time"}  # (x, y and lat dropped, the scalar kept)
    np.testing.assert_array_equal(result.values, np.asarray(blur(values)))


def test_dimensions_are_matched_by_name(dask_pipeline):
    # The pipeline reads 17 right and 5 up: transposing wrongly would give other values.
    footprint = shim.load(dask_pipeline("footprint"))
    values = image((40, 60))
    transposed = labelled(values).transpose("x", "y")
    named = map_pipeline(footprint, transposed, dims=("y", "x"))
    assert named.dims == ("y", "x")
    np.testing.assert_array_equal(named.values, np.asarray(footprint(values)))
    assert named["y"].values.tolist() == labelled(values)["y"].values.tolist()
    # Without dims=, the first DataArray's own order is the pipeline's: x is then numpy's
    # first axis, Halide's dimension 1.
    own = map_pipeline(footprint, transposed)
    assert own.dims == ("x", "y")
    np.testing.assert_array_equal(own.values, np.asarray(footprint(np.ascontiguousarray(
        values.T))))


def test_inputs_in_different_orders_and_sizes_are_aligned_by_name(dask_pipeline):
    two = shim.load(dask_pipeline("two"))
    a, b = image((30, 40)), image((30, 40), np.int32, seed=1)
    result = map_pipeline(two, labelled(a), labelled(b, chunks=(7, 9)).transpose("x", "y"))
    assert result.dims == ("y", "x")
    np.testing.assert_array_equal(result.values, np.asarray(two(a, b)))
    # A 1-D input takes the dimension it has: weights along x only.
    weighted = shim.load(dask_pipeline("weighted"))
    weights = xr.DataArray(image((40,), seed=2), dims=("x",),
                           coords={"x": labelled(a)["x"].values})
    result = map_pipeline(weighted, labelled(a), weights)
    np.testing.assert_array_equal(result.values, np.asarray(weighted(a, weights.values)))
    assert result["x"].values.tolist() == weights["x"].values.tolist()


def test_inputs_whose_coordinates_differ_are_refused(dask_pipeline):
    two = shim.load(dask_pipeline("two"))
    a, b = labelled(image((30, 40))), labelled(image((30, 40), np.int32))
    with pytest.raises(shim.ArgumentError, match="arrays: the DataArrays' coordinates differ"):
        map_pipeline(two, a, b.assign_coords(x=b["x"] + 1))


def test_plain_arrays_beside_dataarrays_are_in_the_pipelines_order(dask_pipeline):
    two = shim.load(dask_pipeline("two"))
    a, b = image((30, 40)), image((30, 40), np.int32, seed=1)
    result = map_pipeline(two, labelled(a).transpose("x", "y"), b, dims=("y", "x"))
    np.testing.assert_array_equal(result.values, np.asarray(two(a, b)))


def test_several_outputs_are_dataarrays(host_pipelines):
    sum_diff = shim.load(host_pipelines["sum_diff", "bundled"])
    a, b = image((30, 40), np.int32), image((30, 40), np.int32, seed=3)
    total, diff = map_pipeline(sum_diff, labelled(a), labelled(b))
    assert total.dims == diff.dims == ("y", "x") and set(total.coords) == set(labelled(a).coords)
    np.testing.assert_array_equal(total.values, a + b)
    np.testing.assert_array_equal(diff.values, a - b)


def test_chunks_by_dimension_name(dask_pipeline):
    blur = shim.load(dask_pipeline("edge_blur"))
    result = map_pipeline(blur, labelled(image((40, 50))), chunks={"x": 20, "y": 15})
    assert result.chunks == ((15, 15, 10), (20, 20, 10))
    with pytest.raises(shim.ArgumentError, match="chunks: names \\['z'\\]"):
        map_pipeline(blur, labelled(image((40, 50))), chunks={"z": 20})


def test_numpy_backed_and_lazily_opened_dataarrays(dask_pipeline, tmp_path):
    # A DataArray opened without dask chunks is read in its store's chunks, never whole.
    blur = shim.load(dask_pipeline("edge_blur"))
    values = image((60, 80))
    in_memory = xr.DataArray(values, dims=("y", "x"), name="image")
    np.testing.assert_array_equal(map_pipeline(blur, in_memory).values, np.asarray(blur(values)))
    in_memory.to_dataset().to_zarr(tmp_path / "image.zarr", encoding={"image": {
        "chunks": (20, 40)}}, consolidated=False)
    lazy = xr.open_dataset(tmp_path / "image.zarr", engine="zarr", chunks=None,
                           consolidated=False)["image"]
    assert lazy.chunks is None
    result = map_pipeline(blur, lazy)
    assert result.chunks == ((20, 20, 20), (40, 40))
    np.testing.assert_array_equal(result.values, np.asarray(blur(values)))


def test_a_result_written_to_zarr_reads_back_with_its_coordinates(dask_pipeline, tmp_path):
    blur = shim.load(dask_pipeline("edge_blur"))
    values = image((40, 50))
    result = map_pipeline(blur, labelled(values).drop_vars("lat"))
    result.to_dataset().to_zarr(tmp_path / "out.zarr", consolidated=False)
    back = xr.open_zarr(tmp_path / "out.zarr", consolidated=False)["image"]
    xr.testing.assert_identical(back.load(), result.compute())


@pytest.mark.parametrize("dims, message", [
    ("yx", "dims: expected the pipeline's dimension names"),
    (("y", "y"), "dims: expected distinct dimension names"),
    (("y", "x", "z"), "dims: names 3 dimensions"),
    (7, "dims: expected the pipeline's dimension names"),
])
def test_bad_dims_are_argument_errors(dask_pipeline, dims, message):
    blur = shim.load(dask_pipeline("edge_blur"))
    with pytest.raises(shim.ArgumentError, match=message):
        map_pipeline(blur, labelled(image((20, 30))), dims=dims)


def test_what_a_dataarray_cannot_give_is_refused(dask_pipeline):
    blur = shim.load(dask_pipeline("edge_blur"))
    bands = xr.DataArray(da.zeros((3, 20, 30), np.uint16), dims=("band", "y", "x"))
    with pytest.raises(shim.ArgumentError, match="src: has dimensions \\['band'\\]"):
        map_pipeline(blur, bands, dims=("y", "x"))
    with pytest.raises(shim.ArgumentError, match="src: expected an array, got an xarray "
                                                 "Dataset"):
        map_pipeline(blur, labelled(image((20, 30))).to_dataset())
    with pytest.raises(shim.ArgumentError, match="dims: names the dimensions of xarray"):
        map_pipeline(blur, image((20, 30)), dims=("y", "x"))
    with pytest.raises(shim.ArgumentError, match="src: expected uint16"):
        map_pipeline(blur, labelled(image((20, 30), np.float32)))


def test_shim_dask_needs_neither_xarray_nor_zarr_nor_tifffile(host_pipelines):
    # Each is imported only where it is used: without them, dask arrays map as before.
    code = ("import sys\n"
            "for name in ('xarray', 'zarr', 'tifffile'):\n"
            "    sys.modules[name] = None  # (import raises ImportError)\n"
            "import numpy as np, dask.array as da, shim\n"
            "from shim.dask import map_pipeline\n"
            f"blur = shim.load({str(host_pipelines['blur3x3', 'bundled'])!r})\n"
            "image = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64)\n"
            "got = map_pipeline(blur, da.from_array(image, chunks=16)).compute()\n"
            "assert (got == np.asarray(blur(image))).all()\n"
            "assert 'shim.dask' in sys.modules and 'shim.dask.labelled' not in sys.modules\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr[-3000:]
