"""A graph of several OpenCL pipelines on dask (blur3x3 chained ``--stages`` times) with its
intermediate chunks kept on the device (``map_pipeline(..., keep_on_device=True)``) against
today's host round trip between the stages: seconds per graph, MPixels/s of the last stage's
output, and the bytes each moved between host and device (``shim.device("opencl").transfers``).

    python benchmarks/dask_device.py [--size 4096] [--chunk 1024] [--stages 3] [--repeats 5]

Both run on dask's threaded scheduler in this process, taking turns run by run; the result is
checked against the stages called on the whole image.
"""

from __future__ import annotations

import argparse
import time

import dask.array as da
import numpy as np

import shim
from shim.dask import map_pipeline
from shim.pipelines.build import Build, build_all

MODES = {"kept on the device": True, "host round trip": False}


def blur3x3(target: str) -> shim.Pipeline:
    (path,) = build_all([Build("blur3x3", target, "bundled")], progress=None).values()
    return shim.load(path)


def graph(pipeline, source, stages: int, keep: bool):
    """``stages`` of ``pipeline`` over ``source``, every stage but the last one kept on the
    device where ``keep``; the last one's chunks come home."""
    for stage in range(stages):
        source = map_pipeline(pipeline, source, device="opencl",
                              keep_on_device=keep and stage < stages - 1)
    return source


def measure(size: int, chunk: int, stages: int, repeats: int) -> dict:
    """{mode: {figure: value}}."""
    opencl = shim.device("opencl")
    gpu = blur3x3("opencl")
    image = np.random.default_rng(0).integers(0, 60000, (size, size), dtype=np.uint16)
    expected = image
    cpu = blur3x3("host")
    for _ in range(stages):
        expected = cpu(expected).numpy()
    source = da.from_array(image, chunks=chunk)
    graphs = {mode: graph(gpu, source, stages, keep) for mode, keep in MODES.items()}
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    moved = {}
    for _ in range(repeats):
        for mode, result in graphs.items():
            t = opencl.transfers
            before = (t.uploaded, t.downloaded, t.device_copied)
            start = time.perf_counter()
            got = result.compute(scheduler="threads")
            times[mode].append(time.perf_counter() - start)
            moved[mode] = [now - then for now, then in
                           zip((t.uploaded, t.downloaded, t.device_copied), before)]
            if not np.array_equal(got, expected):
                raise AssertionError(f"{mode}: the result differs from the whole-image calls")
    pixels = expected.size
    return {mode: {"seconds": min(times[mode]),
                   "MPixels/s": pixels / min(times[mode]) / 1e6,
                   "uploaded MiB": moved[mode][0] / 2**20,
                   "downloaded MiB": moved[mode][1] / 2**20,
                   "device-copied MiB": moved[mode][2] / 2**20}
            for mode in MODES}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    figures = measure(args.size, args.chunk, args.stages, args.repeats)
    device = shim.device("opencl")
    print(f"{args.stages} x blur3x3 on {device.name}, {args.size}x{args.size} uint16, "
          f"chunks {args.chunk}x{args.chunk}, threaded scheduler, best of {args.repeats}:")
    names = list(next(iter(figures.values())))
    print(f"  {'':20}" + "".join(f"{name:>19}" for name in names))
    for mode, row in figures.items():
        print(f"  {mode:20}" + "".join(f"{row[name]:19.3f}" for name in names))
    kept, round_trip = figures["kept on the device"], figures["host round trip"]
    print(f"  time, kept / round trip: {kept['seconds'] / round_trip['seconds']:.2f}")


if __name__ == "__main__":
    main()
