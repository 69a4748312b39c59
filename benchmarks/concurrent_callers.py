"""Python threads calling a CPU-bound pipeline at once, with a shared input that already
lives on the device (every copy is a no-op: the production case of Halide issue 8586), the
shim against Halide's stock runtime, side by side in one run.

    python benchmarks/concurrent_callers.py [--calls N] [--repeats R]

The pipeline (pipelines/generators/cpu_heavy.py, built for OpenCL) has no parallel loop, so a
call keeps one core busy: aggregate throughput with 2 threads on 2 cores shows whether the
runtime lets the calls run at once. Both runtimes release the GIL during the call.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

from sidebyside import ChildProcess, interleave, serve

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

# The checkout's pipelines/ by the folder's own name, not as shim.pipelines: the stock runtime's
# child process runs this module too, and must not import the shim package.
from pipelines.build import Build, build  # noqa: E402

SHAPE = (16, 256)
THREADS = (1, 2)


def image() -> np.ndarray:
    return np.random.default_rng(11).random(SHAPE, dtype=np.float32)


def timed_threads(bodies) -> float:
    """Seconds for all ``bodies`` (callables) to run, each on its own thread, started together."""
    start = threading.Barrier(len(bodies) + 1)
    threads = [threading.Thread(target=lambda b=b: (start.wait(), b())) for b in bodies]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - began


# --- the stock runtime (child process) ---------------------------------------------------------

def stock_server() -> None:
    from pipelines.stock import StockPipeline

    library = str(build(Build("cpu_heavy", "opencl", "bundled")))
    shared = image()
    bindings = []
    for _ in range(max(THREADS)):
        pipeline = StockPipeline(library, "cpu_heavy")
        pipeline.bind({"input": shared, "rounds": 32, "output": np.zeros(SHAPE, np.float32)})
        pipeline.run()  # the input goes to the device once; later copies are no-ops
        bindings.append(pipeline)

    def seconds(threads, calls):
        return timed_threads([lambda p=p: [p.run() for _ in range(calls)] for p in bindings[:threads]])

    serve(seconds)


# --- the shim --------------------------------------------------------------------------------

class ShimRunner:
    def __init__(self):
        import shim

        device = shim.device("opencl")
        pipeline = shim.load(build(Build("cpu_heavy", "opencl", "no_runtime")))
        self.shared = shim.Buffer(image())
        self.shared.copy_to_device(device)
        self.outputs = [shim.Buffer(shape=SHAPE, dtype=np.float32) for _ in range(max(THREADS))]
        self.calls = [pipeline.prepare(self.shared, output=out) for out in self.outputs]
        for call in self.calls:
            call()

    def seconds(self, threads, calls):
        return timed_threads([lambda c=c: [c() for _ in range(calls)] for c in self.calls[:threads]])


def report(results: dict) -> str:
    lines = [f"{'threads':<9}{'stock us/call':>15}{'shim us/call':>14}{'shim/stock':>12}",
             "  (aggregate: wall time / all calls; min over samples)"]
    for threads in THREADS:
        stock = 1e6 * results["stock"][threads]["min"]
        ours = 1e6 * results["shim"][threads]["min"]
        lines.append(f"{threads:<9}{stock:>15.1f}{ours:>14.1f}{ours / stock:>12.2f}")
    lines.append("")
    lines.append("2-thread aggregate throughput / 1-thread throughput:")
    for name in ("stock", "shim"):
        lines.append(f"  {name:<6} {results[name][1]['min'] / results[name][2]['min']:.2f}x")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=40, help="calls per thread per sample")
    parser.add_argument("--repeats", type=int, default=9, help="samples per runtime and thread count")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        stock_server()
        return 0
    child = ChildProcess([sys.executable, str(Path(__file__)), "--serve"])
    try:
        requests = {threads: {"threads": threads, "calls": args.calls} for threads in THREADS}
        results = interleave({"stock": child, "shim": ShimRunner()}, requests, args.repeats,
                             per_sample=lambda r: r["threads"] * r["calls"])
    finally:
        child.close()
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
