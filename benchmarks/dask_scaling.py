"""Throughput and peak worker memory of shim.dask.map_pipeline against one call over the
whole image and against dask's own map_overlap and map_blocks (blur3x3, uint16), on a
LocalCluster of 2 worker processes of one thread each: one machine's cores, not several
hosts (the one call runs Halide's thread pool on the same cores).

The image is in a Zarr store (uncompressed, chunked as the run is) that the workers read
themselves, and every result is written to another with ``to_zarr``, chunk by chunk:

- map_pipeline, stored: over the ``zarr.Array``; each task reads its own region from the store.
- map_pipeline, from_zarr: over ``da.from_zarr``; each block is read once and held until the
  chunks whose regions span it are done.
- map_overlap: dask's, over ``da.from_zarr``, with the depth blur3x3 needs (1 on every side;
  the same for every block), each block's call padded back to the block's shape.
- map_blocks: over ``da.from_zarr``, no halo at all: wrong along the blocks' edges, the floor
  of what a chunked run costs.

The one call is timed in memory (numpy in, numpy out) and from Zarr to Zarr (the whole store
read, one call, the whole result written). Throughput: output MPixels/s, the best of
``--repeats``. Memory: the largest worker's peak resident set over a run, above what it held
before the run (benchmarks/worker_memory.py), the largest over the repeats, each method on
freshly started workers. map_pipeline's and
map_overlap's results are checked against the one call's along the chunks' edges.

    python benchmarks/dask_scaling.py [--sizes 8192 16384] [--chunks 1024 2048] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time

import dask
import dask.array as da
import distributed
import numpy as np
import zarr

import shim
import worker_memory
from shim.dask import map_pipeline
from shim.pipelines.build import Build, build_all

METHODS = ["map_pipeline, stored", "map_pipeline, from_zarr", "map_overlap", "map_blocks"]
# Spilling to disk off: each method's peak is its graph's own, not dask's spilling's.
QUIET = {"distributed.worker.memory.target": False, "distributed.worker.memory.spill": False}


def blur3x3() -> shim.Pipeline:
    (path,) = build_all([Build("blur3x3", "host", "bundled")], progress=None).values()
    return shim.load(path)


def blur_block(block: np.ndarray, pipeline=None) -> np.ndarray:
    """blur3x3 over one block, as map_blocks and map_overlap call it: the output (2 smaller,
    centred) padded with zeros back to the block's shape."""
    out = np.zeros(block.shape, np.uint16)
    pipeline(np.ascontiguousarray(block), out[1:-1, 1:-1])
    return out


def warm_up() -> None:
    """Load in a worker what every method runs on."""
    import shim.dask  # noqa: F401
    import zarr  # noqa: F401


def best(seconds_of, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        seconds_of()
        times.append(time.perf_counter() - start)
    return min(times)


def graph(method: str, pipeline, store: str, runner):
    """The dask array ``method`` writes: blur3x3's output, or for map_overlap and map_blocks
    the image's shape with the output at offset (1, 1)."""
    if method == "map_pipeline, stored":
        return map_pipeline(pipeline, zarr.open_array(store, mode="r"))
    blocks = da.from_zarr(store)
    if method == "map_pipeline, from_zarr":
        return map_pipeline(pipeline, blocks)
    if method == "map_overlap":
        return da.map_overlap(blur_block, blocks, depth=1, boundary="none", dtype=np.uint16,
                              pipeline=runner)
    return blocks.map_blocks(blur_block, runner, dtype=np.uint16)


def measure(pipeline, image: np.ndarray, chunk: int, repeats: int, work: str) -> dict:
    """{figure: value} for one image and chunk size."""
    out_shape = tuple(n - 2 for n in image.shape)
    pixels = out_shape[0] * out_shape[1]
    out = np.empty(out_shape, np.uint16)
    figures = {"one call": pixels / best(lambda: pipeline(image, out), repeats) / 1e6}
    store, target = os.path.join(work, "image.zarr"), os.path.join(work, "out.zarr")
    zarr.create_array(store, shape=image.shape, chunks=(chunk, chunk), dtype=np.uint16,
                      compressors=None, overwrite=True)[:] = image

    def one_call_zarr_to_zarr():
        result = np.asarray(pipeline(zarr.open_array(store, mode="r")[:]))
        zarr.create_array(target, shape=result.shape, chunks=(chunk, chunk), dtype=np.uint16,
                          compressors=None, overwrite=True)[:] = result

    figures["one call, Zarr to Zarr"] = pixels / best(one_call_zarr_to_zarr, repeats) / 1e6
    edges = slice(chunk - 3, chunk + 3)  # (rows and columns along the first chunks' edges)
    for method in METHODS:
        # A fresh cluster for each method, with the libraries every method uses loaded: what
        # one method's run left in a worker's heap (memory freed, kept by malloc) would hide
        # part of the next one's peak. (client.restart() instead at times waited past its
        # timeout for workers that never came back.)
        with cluster() as client:
            client.run(warm_up)
            figures.update(run_method(client, method, pipeline, store, target, pixels, repeats))
        written = zarr.open_array(target, mode="r")
        if method.startswith("map_pipeline"):
            np.testing.assert_array_equal(written[edges, :], out[edges, :])
            np.testing.assert_array_equal(written[:, edges], out[:, edges])
        elif method == "map_overlap":
            np.testing.assert_array_equal(written[1:-1, 1:-1][edges, :], out[edges, :])
            np.testing.assert_array_equal(written[1:-1, 1:-1][:, edges], out[:, edges])
    return figures


@contextlib.contextmanager
def cluster():
    """A client of a LocalCluster of 2 worker processes of one thread each, spilling off."""
    with dask.config.set(QUIET), \
            distributed.LocalCluster(processes=True, n_workers=2, threads_per_worker=1,
                                     dashboard_address=None) as local, \
            distributed.Client(local) as client:
        yield client


def run_method(client, method: str, pipeline, store: str, target: str, pixels: int,
               repeats: int) -> dict:
    """{method: MPixels/s, method MiB: peak} of ``method`` from ``store`` to ``target``."""
    runner = dask.delayed(pipeline, name="blur3x3-pipeline")
    peaks, times = [], []
    for _ in range(repeats):
        result = graph(method, pipeline, store, runner)
        worker_memory.reset_workers(client)
        before = worker_memory.worker_peaks(client)
        start = time.perf_counter()
        result.to_zarr(target, overwrite=True)
        times.append(time.perf_counter() - start)
        after = worker_memory.worker_peaks(client)
        peaks.append(max(after[w] - before[w] for w in after))
    return {method: pixels / min(times) / 1e6, f"{method} MiB": max(peaks)}


def chunk_overhead(client, pipeline, repeats: int) -> float:
    """ms per chunk of the cluster's time over tiny chunks of a tiny image already on it,
    where the pipeline's own work is negligible."""
    tiny = np.random.default_rng(0).integers(0, 60000, (258, 258), dtype=np.uint16)
    source = client.persist(da.from_array(tiny, chunks=16))
    distributed.wait(source)
    mapped = map_pipeline(pipeline, source, chunks=16)
    return best(lambda: mapped.compute(), repeats) / mapped.npartitions * 1e3


def table(rows: list, columns: list, unit: str, ratio_to: str | None) -> str:
    head = "| image | chunks | " + " | ".join(columns) + " |"
    lines = [head, "|" + "---|" * (len(columns) + 2)]
    for size, chunk, figures in rows:
        cells = []
        for column in columns:
            value = figures[column if ratio_to else f"{column} MiB"]
            ratio = f" ({value / figures[ratio_to]:.2f}x)" if ratio_to and column != ratio_to \
                else ""
            cells.append(f"{value:.0f}{ratio}")
        lines.append(f"| {size}x{size} | {chunk}x{chunk} | " + " | ".join(cells) + " |")
    return f"{unit}:\n\n" + "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--chunks", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    pipeline = blur3x3()
    rows = []
    with cluster() as client:
        overhead = chunk_overhead(client, pipeline, args.repeats)
    with tempfile.TemporaryDirectory() as work:
        for size in args.sizes:
            image = np.random.default_rng(0).integers(0, 60000, (size, size), dtype=np.uint16)
            for chunk in args.chunks:
                rows.append((size, chunk, measure(pipeline, image, chunk, args.repeats, work)))
                print(f"{size}x{size}, chunks {chunk}x{chunk}: done", flush=True)
    print(f"\nblur3x3, uint16; 2 worker processes x 1 thread on {os.cpu_count()} cores; "
          f"best of {args.repeats}\n")
    print(table(rows, ["one call", "one call, Zarr to Zarr", *METHODS],
                "Output MPixels/s (x: against one call)", "one call"))
    print()
    print(table(rows, METHODS, "Largest worker's peak memory over its resident set before "
                               "the run, MiB", None))
    print(f"\nOverhead per chunk: {overhead:.2f} ms (16x16 chunks of a 258x258 image)")


if __name__ == "__main__":
    main()
