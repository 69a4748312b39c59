"""pytest-benchmark view of benchmarks/dask_scaling.py: blur3x3 over a 2048x2048 image, one
in-process call against a LocalCluster of 2 worker processes.

    python -m pytest benchmarks/test_dask_scaling.py --benchmark-enable

For MPixels/s and the overhead per chunk, run the script itself.
"""

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")
import dask_scaling  # noqa: E402  (it imports dask: only once dask is known to be there)
SIZE, CHUNK = 2048, 512


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(processes=True, n_workers=2, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def image():
    return np.random.default_rng(0).integers(0, 60000, (SIZE, SIZE), dtype=np.uint16)


def test_single_call(benchmark, image):
    pipeline = dask_scaling.blur3x3()
    out = np.empty((SIZE - 2, SIZE - 2), np.uint16)
    benchmark.pedantic(pipeline, args=(image, out), rounds=5, warmup_rounds=1)
    benchmark.extra_info["pixels"] = out.size


def test_two_worker_cluster(benchmark, client, image):
    source = client.persist(da.from_array(image, chunks=CHUNK))
    distributed.wait(source)
    mapped = dask_scaling.map_pipeline(dask_scaling.blur3x3(), source, shape=(SIZE - 2, SIZE - 2))
    benchmark.pedantic(mapped.compute, rounds=5, warmup_rounds=1)
    benchmark.extra_info["pixels"] = (SIZE - 2) ** 2
    benchmark.extra_info["chunks"] = mapped.npartitions
