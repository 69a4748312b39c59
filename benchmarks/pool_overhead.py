"""What the thread pool costs a parallel loop and an async pipeline: the shim's pool
(native_stubs/calls/thread_pool.c) against Halide's own, in its stock runtime, side by side in
one run (the stock runtime in a child process, the runtimes taking turns sample by sample).

    python benchmarks/pool_overhead.py [--calls N] [--repeats R] [--threads T]

Cases (built here with Halide, bundled runtime: the stock side runs the library's own runtime,
the shim interposes its pool on the same library; us per call, numpy output given):
  - serial rows: out(x, y) = 3x + y, 64 x 1000, no parallel loop: what a call costs each
    side beyond the pool, the baseline of the next row;
  - parallel rows: the same with y parallel: 1000 tasks of 64 elements, little work each;
  - async: A(x, y) = x + y computed row by row ahead of B(x, y) = A(x, y) on another task,
    folded to 2 rows (Halide's async_deadlock schedule 1), 256 x 256: semaphores both ways,
    one release and one acquire per row and direction;
  - nested async: a chain of three such producers, two of them nested at the outermost loop
    of their consumer (schedule 5 of async_deadlock, without its copy_to_host wrappers, whose
    host copies would be timed instead of the pool).
T threads (HL_NUM_THREADS, default: the CPUs online) on both sides.
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

# name: (shape in numpy order, reference); the libraries are NAME.so with entry point NAME.
ROWS, SQUARE = (1000, 64), (256, 256)
CASES = {
    "serial_rows": (ROWS, lambda y, x: 3 * x + y),
    "parallel_rows": (ROWS, lambda y, x: 3 * x + y),
    "async": (SQUARE, lambda y, x: x + y),
    "nested_async": (SQUARE, lambda y, x: x + y),
}

# argv: the folder. The cases, compiled with the halide package (run in a child: the benchmark's
# processes need no halide).
BUILD = r'''
import os, subprocess, sys
import halide as hl

work = sys.argv[1]
x, y = hl.Var("x"), hl.Var("y")


def link(func, name):
    obj = os.path.join(work, name + ".o")
    func.compile_to({hl.OutputFileType.object: obj}, [], name, hl.Target("host"))
    subprocess.run(["cc", "-shared", "-o", os.path.join(work, name + ".so"), obj, "-lpthread",
                    "-ldl"], check=True)


for name in ("serial_rows", "parallel_rows"):
    rows = hl.Func(name)
    rows[x, y] = 3 * x + y
    rows.vectorize(x, 8)
    if name == "parallel_rows":
        rows.parallel(y)
    link(rows, name)

a, b = hl.Func("a"), hl.Func("b")
a[x, y] = x + y
b[x, y] = a[x, y]
a.store_root().compute_at(b, y).fold_storage(y, 2).async_()
link(b, "async")

a, b = hl.Func("a"), hl.Func("b")
a[x, y] = x + y
b[x, y] = a[x, y]
first, second = a.in_(), a.in_().in_()
a.store_root().compute_at(first, hl.Var.outermost()).fold_storage(y, 2).async_()
first.store_root().compute_at(second, hl.Var.outermost()).fold_storage(y, 2).async_()
second.store_root().compute_at(b, y).fold_storage(y, 2).async_()
link(b, "nested_async")
'''


def libraries() -> Path:
    """The folder of the cases' libraries, built once per build script and Halide version."""
    return built_once("pool_overhead", BUILD, "nested_async.so")


def reference(case: str) -> np.ndarray:
    shape, formula = CASES[case]
    return formula(*np.indices(shape)).astype(np.int32)


def timed(call, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return time.perf_counter() - start


# --- the stock runtime (child process) ---------------------------------------------------------

def stock_runners(folder: Path) -> dict:
    """{case: (call, output)}: each case's library under Halide's own runtime."""
    from pipelines.stock import StockPipeline

    runners = {}
    for case, (shape, _) in CASES.items():
        pipeline = StockPipeline(str(folder / f"{case}.so"), case)
        out = np.zeros(shape, np.int32)
        pipeline.bind({pipeline.arguments[-1][0]: out})
        runners[case] = (pipeline.run, out)
    return runners


def stock_server(folder: Path) -> None:
    """Serves timings, once its outputs are numpy's (else it says which are not, instead of
    "ready")."""
    runners = stock_runners(folder)
    wrong = wrong_outputs(runners)
    if wrong:
        print("wrong:", *wrong, flush=True)
        return

    def seconds(case, calls):
        return timed(runners[case][0], calls)

    serve(seconds)


# --- the shim ---------------------------------------------------------------------------------

def shim_runners(folder: Path) -> dict:
    import shim

    runners = {}
    for case, (shape, _) in CASES.items():
        pipeline, out = shim.load(folder / f"{case}.so"), np.zeros(shape, np.int32)
        runners[case] = (lambda p=pipeline, o=out: p(o), out)
    return runners


class ShimRunner:
    def __init__(self, folder: Path, threads: int):
        import shim

        shim.set_num_threads(threads)
        self.runners = shim_runners(folder)

    def seconds(self, case, calls):
        return timed(self.runners[case][0], calls)


def wrong_outputs(runners: dict) -> list[str]:
    """The cases whose output, after one call, is not numpy's."""
    wrong = []
    for case, (call, out) in runners.items():
        out.fill(-1)
        call()
        if not np.array_equal(out, reference(case)):
            wrong.append(case)
    return wrong


def report(results: dict, threads: int) -> str:
    lines = [f"{threads} threads; us per call, min (median) over samples",
             f"{'case':<16}{'stock':>18}{'shim':>18}{'shim/stock':>16}"]
    for case in CASES:
        stock, ours = results["stock"][case], results["shim"][case]
        lines.append(f"{case:<16}{1e6 * stock['min']:>9.1f} ({1e6 * stock['median']:>6.1f})"
                     f"{1e6 * ours['min']:>9.1f} ({1e6 * ours['median']:>6.1f})"
                     f"{ours['min'] / stock['min']:>8.2f} ({ours['median'] / stock['median']:.2f})")
    return "\n".join(lines)


def start(folder: Path, threads: int) -> dict:
    """{"stock": the child's runner, "shim": this process's}, both on ``threads`` threads."""
    child = ChildProcess([sys.executable, str(Path(__file__)), "--serve", str(folder)],
                         env=dict(os.environ, HL_NUM_THREADS=str(threads)))
    return {"stock": child, "shim": ShimRunner(folder, threads)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200, help="calls per sample")
    parser.add_argument("--repeats", type=int, default=15, help="samples per runtime and case")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="HL_NUM_THREADS on both sides")
    parser.add_argument("--serve", metavar="FOLDER", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        stock_server(Path(args.serve))
        return 0
    runners = start(libraries(), args.threads)
    try:
        requests = {case: {"case": case, "calls": args.calls} for case in CASES}
        results = interleave(runners, requests, args.repeats, per_sample=lambda r: r["calls"])
    finally:
        runners["stock"].close()
    print(report(results, args.threads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
