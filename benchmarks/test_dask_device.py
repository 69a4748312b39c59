"""pytest-benchmark view of benchmarks/dask_device.py: three blur3x3 stages on OpenCL over a
2048x2048 image in 512x512 chunks, the intermediates kept on the device against the host
round trip between stages, on dask's threaded scheduler.

    python -m pytest benchmarks/test_dask_device.py --benchmark-enable

For the bytes each moves, run the script itself.
"""

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
import dask_device  # noqa: E402  (it imports dask: only once dask is known to be there)

SIZE, CHUNK, STAGES = 2048, 512, 3


@pytest.mark.parametrize("mode", list(dask_device.MODES))
def test_graph(benchmark, opencl, mode):
    image = np.random.default_rng(0).integers(0, 60000, (SIZE, SIZE), dtype=np.uint16)
    result = dask_device.graph(dask_device.blur3x3("opencl"), da.from_array(image, chunks=CHUNK),
                               STAGES, dask_device.MODES[mode])
    benchmark.pedantic(result.compute, kwargs={"scheduler": "threads"}, rounds=5, warmup_rounds=1)
    benchmark.extra_info["pixels"] = (SIZE - 2 * STAGES) ** 2
