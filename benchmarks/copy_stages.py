"""Pipelines with copy stages: the shim against Halide's stock runtime, side by side in one run
(the stock runtime in a child process, the runtimes taking turns sample by sample).

    python benchmarks/copy_stages.py [--repeats R] [--threads T]

The five schedules of Halide's test/correctness/async_deadlock.cpp, built here with Halide as
tests/test_thread_pool.py builds them (its BUILD script): A(x, y) = x + y computed row by row
ahead of B(x, y) = A(x, y), folded to two rows, async; from schedule 2 on, wrappers of A
(``Func::in()``) that are ``copy_to_host()`` stages, one halide_buffer_copy a row each, some
nested at the outermost loop of their consumer:
  1. no copy stage (the pool alone);
  2. one copy stage;
  3. one copy stage, A nested in it;
  4. two copy stages;
  5. two copy stages, nested;
and, where OpenCL runs (PoCL here), a GPU producer with a copy stage: A computed on the device
(compute_root, gpu_tile'd 16 x 16), its wrapper copy_to_host() (one halide_buffer_copy from the
device a call), B(x, y) = 2 * wrapper(x, y) on the CPU:
  6. GPU producer, copy to host.
256 x 256 int32, numpy output given, T threads (HL_NUM_THREADS, default 3) on both sides; the
stock side runs each bundled library with its own runtime, the shim each library built
bundled and built with no_runtime. us per call, min (median) of R samples of one call each
(default 21).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from sidebyside import ChildProcess, built_once, interleave, serve

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

SHAPE = (256, 256)
SCHEDULES = {1: "no copy stage", 2: "one copy stage", 3: "one copy, nested",
             4: "two copy stages", 5: "two copies, nested", 6: "GPU producer, copy"}
GPU_SCHEDULE = 6
FLAVORS = ("bundled", "no_runtime")

# The GPU producer's library, built as BUILD builds the others; argv: the folder, the target.
GPU_BUILD = r'''
import os, subprocess, sys
import halide as hl

work, target = sys.argv[1], sys.argv[2]
x, y, xo, yo, xi, yi = hl.vars("x y xo yo xi yi")
for runtime in ("bundled", "no_runtime"):
    a, b = hl.Func("a"), hl.Func("b")
    a[x, y] = x + y
    wrapper = a.in_()
    b[x, y] = wrapper[x, y] * 2
    a.compute_root().gpu_tile(x, y, xo, yo, xi, yi, 16, 16)
    wrapper.compute_root().copy_to_host()
    obj = os.path.join(work, f"async_deadlock6-{runtime}.o")
    b.compile_to({hl.OutputFileType.object: obj}, [], "async_deadlock6",
                 hl.Target(target if runtime == "bundled" else target + "-no_runtime"))
    subprocess.run(["cc", "-shared", "-fPIC", "-o", os.path.join(work, f"async_deadlock6-{runtime}.so"),
                    obj, "-lpthread", "-ldl"], check=True)
'''


def libraries() -> dict:
    """{schedule: the folder of its libraries}, built once per build script and Halide version;
    the GPU producer's only where OpenCL runs (else it is left out, and the report says so)."""
    from test_thread_pool import BUILD, ROWS_C  # (the generators the tests build)

    cpu = built_once("copy_stages", BUILD, "async_deadlock5-no_runtime.so", {"rows.c": ROWS_C})
    folders = {schedule: cpu for schedule in SCHEDULES if schedule != GPU_SCHEDULE}
    if opencl_runs():
        from shim.pipelines.build import TARGETS

        build = GPU_BUILD.replace("sys.argv[2]", repr(TARGETS["opencl"]))
        folders[GPU_SCHEDULE] = built_once("copy_stages_gpu", build, "async_deadlock6-no_runtime.so")
    return folders


def opencl_runs() -> bool:
    import shim

    try:
        shim.device("opencl")
    except shim.DeviceUnavailable as e:
        print(f"schedule {GPU_SCHEDULE} left out: no OpenCL device here ({e})", file=sys.stderr)
        return False
    return True


def library(folders: dict, schedule: int, flavor: str) -> Path:
    return folders[schedule] / f"async_deadlock{schedule}-{flavor}.so"


def reference(schedule: int) -> np.ndarray:
    values = np.add.outer(np.arange(SHAPE[0]), np.arange(SHAPE[1])).astype(np.int32)
    return 2 * values if schedule == GPU_SCHEDULE else values


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def checked(runners: dict) -> dict:
    """``runners`` ({schedule: (call, output)}), once each output after one call is numpy's."""
    for schedule, (call, out) in runners.items():
        out.fill(-1)
        call()
        if not np.array_equal(out, reference(schedule)):
            raise SystemExit(f"schedule {schedule}: wrong output")
    return runners


# --- the stock runtime (child process) ---------------------------------------------------------

def stock_server(folders: dict) -> None:
    from pipelines.stock import StockPipeline

    runners = {}
    for schedule in folders:
        pipeline = StockPipeline(str(library(folders, schedule, "bundled")),
                                 f"async_deadlock{schedule}")
        out = np.zeros(SHAPE, np.int32)
        pipeline.bind({pipeline.arguments[-1][0]: out})
        runners[schedule] = (pipeline.run, out)
    checked(runners)
    serve(lambda schedule: timed(runners[schedule][0]))


# --- the shim ---------------------------------------------------------------------------------

class ShimRunner:
    def __init__(self, folders: dict, flavor: str):
        import shim

        runners = {}
        for schedule in folders:
            pipeline, out = shim.load(library(folders, schedule, flavor)), np.zeros(SHAPE, np.int32)
            runners[schedule] = (lambda p=pipeline, o=out: p(o), out)
        self.runners = checked(runners)

    def seconds(self, schedule):
        return timed(self.runners[schedule][0])


def report(results: dict, threads: int, repeats: int) -> str:
    lines = [f"{threads} threads, 256 x 256 int32; us per call, min (median) of {repeats} calls",
             f"{'schedule':<24}{'stock':>18}" + "".join(f"{'shim ' + f:>20}{'ratio':>14}"
                                                      for f in FLAVORS)]
    for schedule, label in SCHEDULES.items():
        if schedule not in results["stock"]:
            continue
        stock = results["stock"][schedule]
        line = (f"{f'{schedule} {label}':<24}"
                f"{1e6 * stock['min']:>9.1f} ({1e6 * stock['median']:>6.1f})")
        for flavor in FLAVORS:
            ours = results[f"shim {flavor}"][schedule]
            line += (f"{1e6 * ours['min']:>11.1f} ({1e6 * ours['median']:>6.1f})"
                     f"{ours['min'] / stock['min']:>6.2f}x"
                     f" ({ours['median'] / stock['median']:.2f})")
        lines.append(line)
    return "\n".join(lines)


def start(folders: dict, threads: int) -> dict:
    """{"stock": the child's runner, "shim bundled"/"shim no_runtime": this process's}, each on
    ``threads`` threads (set before the shim's pool starts: call it before any pipeline)."""
    os.environ["HL_NUM_THREADS"] = str(threads)
    child = ChildProcess([sys.executable, str(Path(__file__)), "--serve",
                          json.dumps({s: str(f) for s, f in folders.items()})],
                         env=dict(os.environ))
    return {"stock": child, **{f"shim {f}": ShimRunner(folders, f) for f in FLAVORS}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=21, help="samples (one call each)")
    parser.add_argument("--threads", type=int, default=3, help="HL_NUM_THREADS on both sides")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        stock_server({int(s): Path(f) for s, f in json.loads(args.serve).items()})
        return 0
    folders = libraries()
    runners = start(folders, args.threads)
    try:
        results = interleave(runners, {s: {"schedule": s} for s in folders}, args.repeats)
    finally:
        runners["stock"].close()
    print(report(results, args.threads, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
