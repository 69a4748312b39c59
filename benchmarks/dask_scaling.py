"""Throughput of shim.dask.map_pipeline on a LocalCluster of 2 worker processes against one
in-process call over the whole image (blur3x3, uint16), in MPixels/s, and the overhead per
chunk: the cluster's time over tiny chunks of a tiny image (where the pipeline's own work is
negligible), divided by their number.

    python benchmarks/dask_scaling.py [--size 8192] [--chunk 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import dask.array as da
import distributed
import numpy as np

import shim
from shim.dask import map_pipeline
from shim.pipelines.build import Build, build_all


def blur3x3() -> shim.Pipeline:
    (path,) = build_all([Build("blur3x3", "host", "bundled")], progress=None).values()
    return shim.load(path)


def best(seconds_of, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        seconds_of()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(client, size: int, chunk: int, repeats: int) -> dict:
    """{figure: value} for one image size and chunk size."""
    pipeline = blur3x3()
    image = np.random.default_rng(0).integers(0, 60000, (size, size), dtype=np.uint16)
    out_shape = (size - 2, size - 2)
    pixels = out_shape[0] * out_shape[1]
    out = np.empty(out_shape, np.uint16)
    single = best(lambda: pipeline(image, out), repeats)
    # The image is scattered once, as a dataset already on the cluster would be.
    source = client.persist(da.from_array(image, chunks=chunk))
    distributed.wait(source)
    mapped = map_pipeline(pipeline, source, shape=out_shape)
    cluster = best(lambda: mapped.compute(), repeats)
    tiny = map_pipeline(pipeline, client.persist(da.from_array(image[:258, :258], chunks=16)),
                        shape=(256, 256), chunks=16)
    chunks = tiny.npartitions
    tiny_seconds = best(lambda: tiny.compute(), repeats)
    return {"single call MPixels/s": pixels / single / 1e6,
            "2-worker cluster MPixels/s": pixels / cluster / 1e6,
            "chunks": mapped.npartitions,
            "overhead per chunk ms": tiny_seconds / chunks * 1e3}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with distributed.LocalCluster(processes=True, n_workers=2, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        figures = measure(client, args.size, args.chunk, args.repeats)
    print(f"blur3x3, {args.size}x{args.size} uint16, chunks {args.chunk}x{args.chunk}:")
    for name, value in figures.items():
        print(f"  {name}: {value:.3f}" if isinstance(value, float) else f"  {name}: {value}")


if __name__ == "__main__":
    main()
