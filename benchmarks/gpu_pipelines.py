"""Per-call time of GPU pipelines with their data resident on the device: the shim against
Halide's stock runtime, side by side in one run.

    python benchmarks/gpu_pipelines.py [--device opencl|cuda] [--repeats R]

Three cases: a small pipeline (brighten, 64x64 float32: the launch overhead dominates), the 3x3
blur with a compute_root stage on a small image (64x64 uint16: two kernels, and the stage's
device buffer allocated and freed by the pipeline at every call, which the shim serves in C:
native_stubs/devices/served.c), and the same blur large (2048x2048: real work).
Each is timed two ways: calls back to back with one device sync at the end (throughput), and
a device sync after every call (latency, what RunGen measures).

The stock runtime runs the pipeline built with its runtime bundled, in a child process
without the shim, called through its argv entry point with the buffers bound once. The shim
runs the no_runtime build through Pipeline.prepare(), which also binds the buffers once: both
sides then measure the runtime, not argument handling. (A plain pipeline call through the shim
adds its Python argument handling, reported on its own line.)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from sidebyside import ChildProcess, interleave, serve

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

# The checkout's pipelines/ by the folder's own name, not as shim.pipelines: the stock runtime's
# child process runs this module too, and must not import the shim package.
from pipelines.build import Build, build  # noqa: E402

CASES = {
    "small": ("brighten", {"input": ((64, 64), np.float32), "scale": 2.0, "offset": 1.0},
              {"output": ((64, 64), np.float32)}),
    "small, with a stage": ("blur3x3", {"input": ((66, 66), np.uint16)},
                            {"output": ((64, 64), np.uint16)}),
    "large": ("blur3x3", {"input": ((2050, 2050), np.uint16)}, {"output": ((2048, 2048), np.uint16)}),
}
ITERATIONS = {"small": 200, "small, with a stage": 200, "large": 20}


def values_for(case: str) -> dict:
    """Deterministic inputs and empty outputs (numpy arrays) and scalars for a case."""
    _, inputs, outputs = CASES[case]
    rng = np.random.default_rng(7)
    values = {}
    for name, spec in {**inputs, **outputs}.items():
        if isinstance(spec, tuple):
            shape, dtype = spec
            values[name] = (rng.integers(0, 1000, size=shape).astype(dtype) if name in inputs
                            else np.zeros(shape, dtype))
        else:
            values[name] = spec
    return values


def requests(sync_modes=(False, True)) -> dict:
    return {(case, sync): {"case": case, "iterations": ITERATIONS[case], "sync_each": sync}
            for case in CASES for sync in sync_modes}


def per_call(request) -> int:
    return request["iterations"]


def libraries(kind: str, runtime: str) -> dict:
    return {case: build(Build(name, kind, runtime)) for case, (name, _, _) in CASES.items()}


# --- the stock runtime (child process) ---------------------------------------------------------

def stock_server(kind: str) -> None:
    from pipelines.stock import StockPipeline

    pipelines = {}
    for case, library in libraries(kind, "bundled").items():
        pipeline = StockPipeline(str(library), CASES[case][0])
        pipeline.bind(values_for(case))
        pipeline.run()  # upload the inputs once: the data stays resident
        pipelines[case] = pipeline
    serve(lambda case, iterations, sync_each: pipelines[case].seconds(iterations, sync_each))


# --- the shim --------------------------------------------------------------------------------

class ShimRunner:
    """``served``: False to time the shim with every allocation through the Python core, as
    before the native layer served pipelines' own (shim_serve_allocations)."""

    def __init__(self, kind: str, prepared: bool = True, served: bool = True):
        import shim

        self.served = served
        self.device = shim.device(kind)
        self.calls = {}
        for case, library in libraries(kind, "no_runtime").items():
            pipeline = shim.load(library)
            values = {name: shim.Buffer(v) if isinstance(v, np.ndarray) else v
                      for name, v in values_for(case).items()}
            call = pipeline.prepare(**values) if prepared else (lambda p=pipeline, v=values: p(**v))
            call()  # upload the inputs once: the data stays resident
            self.calls[case] = (call, [v for v in values.values() if isinstance(v, shim.Buffer)])

    def close(self) -> None:
        """Free the device memory (the results were only timed, not read)."""
        for call, buffers in self.calls.values():
            for buf in buffers:
                buf.device_free()

    def seconds(self, case, iterations, sync_each) -> float:
        return resident_seconds(self.device, self.calls[case][0], iterations, sync_each,
                                self.served)


def resident_seconds(device, call, iterations: int, sync_each: bool, served: bool = True) -> float:
    """``iterations`` calls of ``call`` (a prepared call on data resident on ``device``), the
    device synchronized after each or once at the end; ``served`` False: with the pipelines' own
    allocations through the Python core (shim_serve_allocations) for the while."""
    from shim.native import lib

    lib.shim_serve_allocations(device.index, served)
    try:
        start = time.perf_counter()
        for _ in range(iterations):
            call()
            if sync_each:
                device.sync()
        device.sync()
        return time.perf_counter() - start
    finally:
        lib.shim_serve_allocations(device.index, True)


class ProfilingRunner(ShimRunner):
    """The shim with a shim.profile recording every call of each sample (started before and
    stopped after the timed loop)."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.records_per_call = {}

    def seconds(self, case, iterations, sync_each) -> float:
        import shim

        with shim.profile() as prof:
            elapsed = super().seconds(case, iterations, sync_each)
        self.records_per_call[case] = len(prof.records) / iterations
        return elapsed


def report(results: dict, records_per_call: dict) -> str:
    lines = [f"{'case':<21}{'sync':<11}{'stock us/call':>15}{'shim us/call':>14}{'shim/stock':>12}"
             f"{'shim, plain call':>18}{'profiling':>11}{'profiling/shim':>16}{'us/record':>11}"
             f"{'python allocs':>15}{'/shim':>7}",
             "  (min over samples; 'plain call' includes the shim's argument handling; "
             "'profiling': the shim while shim.profile records, us/record: its extra time per "
             "record; 'python allocs': the shim with pipelines' own allocations through the "
             "Python core, as before native_stubs/devices/served.c)"]
    for case in CASES:
        for sync in (False, True):
            stock = 1e6 * results["stock"][case, sync]["min"]
            ours = 1e6 * results["shim"][case, sync]["min"]
            plain = 1e6 * results["shim, plain call"][case, sync]["min"]
            profiled = 1e6 * results["shim, profiling"][case, sync]["min"]
            per_record = (profiled - ours) / records_per_call[case]
            python = 1e6 * results["shim, python allocations"][case, sync]["min"]
            lines.append(f"{case:<21}{'each call' if sync else 'at end':<11}{stock:>15.1f}"
                         f"{ours:>14.1f}{ours / stock:>12.2f}{plain:>18.1f}{profiled:>11.1f}"
                         f"{profiled / ours:>16.2f}{per_record:>11.1f}{python:>15.1f}"
                         f"{python / ours:>7.2f}")
    lines.append("records per call while profiling: " + ", ".join(
        f"{case} {n:g}" for case, n in records_per_call.items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="opencl", choices=["opencl", "cuda"])
    parser.add_argument("--repeats", type=int, default=15, help="samples per runtime and case")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        stock_server(args.device)
        return 0
    child = ChildProcess([sys.executable, str(Path(__file__)), "--serve", "--device", args.device])
    try:
        runners = {"stock": child, "shim": ShimRunner(args.device),
                   "shim, plain call": ShimRunner(args.device, prepared=False),
                   "shim, profiling": ProfilingRunner(args.device),
                   "shim, python allocations": ShimRunner(args.device, served=False)}
        results = interleave(runners, requests(), args.repeats, per_sample=per_call)
        for name in ("shim", "shim, plain call", "shim, profiling", "shim, python allocations"):
            runners[name].close()
    finally:
        child.close()
    print(f"device: {runners['shim'].device.name}")
    print(report(results, runners["shim, profiling"].records_per_call))
    return 0


if __name__ == "__main__":
    sys.exit(main())
