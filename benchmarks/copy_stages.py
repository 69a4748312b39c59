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
  5. two copy stages, nested.
256 x 256 int32, numpy output given, T threads (HL_NUM_THREADS, default 3) on both sides; the
stock side runs each bundled library with its own runtime, the shim each library built
bundled and built with no_runtime. us per call, min (median) of R samples of one call each
(default 21).
"""

from __future__ import annotations

import argparse
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
             4: "two copy stages", 5: "two copies, nested"}
FLAVORS = ("bundled", "no_runtime")


def libraries() -> Path:
    """The folder of the schedules' libraries, built once per build script and Halide version."""
    from test_thread_pool import BUILD, ROWS_C  # (the generators the tests build)

    return built_once("copy_stages", BUILD, "async_deadlock5-no_runtime.so", {"rows.c": ROWS_C})


def library(folder: Path, schedule: int, flavor: str) -> Path:
    return folder / f"async_deadlock{schedule}-{flavor}.so"


def reference() -> np.ndarray:
    return np.add.outer(np.arange(SHAPE[0]), np.arange(SHAPE[1])).astype(np.int32)


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def checked(runners: dict) -> dict:
    """``runners`` ({schedule: (call, output)}), once each output after one call is numpy's."""
    for schedule, (call, out) in runners.items():
        out.fill(-1)
        call()
        if not np.array_equal(out, reference()):
            raise SystemExit(f"schedule {schedule}: wrong output")
    return runners


# --- the stock runtime (child process) ---------------------------------------------------------

def stock_server(folder: Path) -> None:
    from pipelines.stock import StockPipeline

    runners = {}
    for schedule in SCHEDULES:
        pipeline = StockPipeline(str(library(folder, schedule, "bundled")),
                                 f"async_deadlock{schedule}")
        out = np.zeros(SHAPE, np.int32)
        pipeline.bind({pipeline.arguments[-1][0]: out})
        runners[schedule] = (pipeline.run, out)
    checked(runners)
    serve(lambda schedule: timed(runners[schedule][0]))


# --- the shim ---------------------------------------------------------------------------------

class ShimRunner:
    def __init__(self, folder: Path, flavor: str):
        import shim

        runners = {}
        for schedule in SCHEDULES:
            pipeline, out = shim.load(library(folder, schedule, flavor)), np.zeros(SHAPE, np.int32)
            runners[schedule] = (lambda p=pipeline, o=out: p(o), out)
        self.runners = checked(runners)

    def seconds(self, schedule):
        return timed(self.runners[schedule][0])


def report(results: dict, threads: int, repeats: int) -> str:
    lines = [f"{threads} threads, 256 x 256 int32; us per call, min (median) of {repeats} calls",
             f"{'schedule':<24}{'stock':>18}" + "".join(f"{'shim ' + f:>20}{'ratio':>14}"
                                                      for f in FLAVORS)]
    for schedule, label in SCHEDULES.items():
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


def start(folder: Path, threads: int) -> dict:
    """{"stock": the child's runner, "shim bundled"/"shim no_runtime": this process's}, each on
    ``threads`` threads (set before the shim's pool starts: call it before any pipeline)."""
    os.environ["HL_NUM_THREADS"] = str(threads)
    child = ChildProcess([sys.executable, str(Path(__file__)), "--serve", str(folder)],
                         env=dict(os.environ))
    return {"stock": child, **{f"shim {f}": ShimRunner(folder, f) for f in FLAVORS}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=21, help="samples (one call each)")
    parser.add_argument("--threads", type=int, default=3, help="HL_NUM_THREADS on both sides")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        stock_server(Path(args.serve))
        return 0
    runners = start(libraries(), args.threads)
    try:
        results = interleave(runners, {s: {"schedule": s} for s in SCHEDULES}, args.repeats)
    finally:
        runners["stock"].close()
    print(report(results, args.threads, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
