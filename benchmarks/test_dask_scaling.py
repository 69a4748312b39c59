"""pytest-benchmark view of benchmarks/dask_scaling.py: blur3x3 over a 2048x2048 image, one
in-process call against a LocalCluster of 2 worker processes reading the image from a Zarr
store and writing the result to another, each method of the script.

    python -m pytest benchmarks/test_dask_scaling.py --benchmark-enable

For the tables (MPixels/s, peak worker memory, two sizes and two chunkings), run the script.
"""

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr")
import dask  # noqa: E402
import dask_scaling  # noqa: E402  (it imports dask: only once dask is known to be there)

SIZE, CHUNK = 2048, 512


@pytest.fixture(scope="module")
def client():
    with dask_scaling.cluster() as c:
        yield c


@pytest.fixture(scope="module")
def image():
    return np.random.default_rng(0).integers(0, 60000, (SIZE, SIZE), dtype=np.uint16)


@pytest.fixture(scope="module")
def store(tmp_path_factory, image):
    path = str(tmp_path_factory.mktemp("dask_scaling") / "image.zarr")
    zarr.create_array(path, shape=image.shape, chunks=(CHUNK, CHUNK), dtype=np.uint16,
                      compressors=None)[:] = image
    return path


def test_single_call(benchmark, image):
    pipeline = dask_scaling.blur3x3()
    out = np.empty((SIZE - 2, SIZE - 2), np.uint16)
    benchmark.pedantic(pipeline, args=(image, out), rounds=5, warmup_rounds=1)
    benchmark.extra_info["pixels"] = out.size


@pytest.mark.parametrize("method", dask_scaling.METHODS)
def test_two_worker_cluster_zarr_to_zarr(benchmark, client, image, store, tmp_path, method):
    pipeline = dask_scaling.blur3x3()
    result = dask_scaling.graph(method, pipeline, store, dask.delayed(pipeline))
    target = str(tmp_path / "out.zarr")
    benchmark.pedantic(lambda: result.to_zarr(target, overwrite=True), rounds=3,
                       warmup_rounds=1)
    benchmark.extra_info["chunks"] = result.npartitions
    written = zarr.open_array(target, mode="r")
    expected = np.asarray(pipeline(image))
    if method.startswith("map_pipeline"):
        np.testing.assert_array_equal(written[:], expected)
    elif method == "map_overlap":
        np.testing.assert_array_equal(written[1:-1, 1:-1], expected)
