"""Halide's profiler and tracing compiled into a pipeline, with no shim.profile() recording:
the shim against Halide's stock runtime, side by side in one run (issue 17: "profiling off
costs nothing measurable").

    python benchmarks/profiling_off.py [--repeats R] [--quick]

One small pipeline (a separable 3x3 box blur of float32, blur_x compute_root, no other
schedule) built three ways, each library carrying Halide's runtime (the stock side needs it;
the shim's runtime interposes it):

  - plain:   target host: the baseline ratio shim / stock;
  - profile: target host-profile: Halide's profiler compiled in (its sampling thread runs, each
    call registers with the profiler state). Outside a profile the shim adds nothing to such a
    call; its ratio should be the plain one's, within noise. Halide's report at exit goes to a
    file on both sides (shim: HALIDE_SHIM_PROFILER_REPORT; stock: its halide_print, which
    writes to stdout, redirected once the timing is over);
  - trace:   target host-trace_all, on a larger image: every load and store is a trace event
    (about 530,000 per call), and HL_TRACE_FILE points both sides at a file in a temporary
    folder, so Halide's own handler writes binary packets there on both. Under the shim every
    event first passes the native library's trace entry points (native_stubs/profiling/
    tracing.c, which serve each library by its release and keep what a profile records: an
    atomic load, then Halide's handler); its ratio should be ~1.0. Each side empties its file
    after every sample, untimed.

Both runtimes run in child processes of their own (the stock one must not share a process with
the shim; the shim's gets one too, so that HL_TRACE_FILE and Halide's exit report stay out of
the parent), each timing its own loop of calls and answering over a pipe. The shim calls a
prepare()d call, the stock side the pipeline's argv entry point through cffi; the runtimes take
turns sample by sample (benchmarks/sidebyside.py). The figures are min and median over samples
of the time per call, and the ratios shim / stock of each.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sidebyside import ChildProcess, interleave

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

# The checkout's pipelines/ by the folder's own name, not as shim.pipelines: the stock
# runtime's child process runs this module too, and must not import the shim package.
from pipelines.build import GET_HALIDE, MissingLibrary, halide_version, installed_halide_version  # noqa: E402


@dataclass(frozen=True)
class Case:
    feature: str       # Halide target feature ("" for a plain build)
    shape: tuple       # the output, numpy order (height, width); the input is 2 larger each way
    calls: int         # calls per sample


CASES = {
    "plain": Case("", (128, 128), 50),
    "profile": Case("profile", (128, 128), 50),
    "trace": Case("trace_all", (256, 256), 1),
}

# Compiled in a child process (halide's compiler stays out of the processes that time), then
# linked with the runtime inside: cc -shared.
GENERATOR = r"""
import json, subprocess, sys
import halide as hl
compiler, specs = sys.argv[1], json.loads(sys.argv[2])
x, y = hl.Var("x"), hl.Var("y")
inp = hl.ImageParam(hl.Float(32), 2, "input")
blur_x, output = hl.Func("blur_x"), hl.Func("output")
blur_x[x, y] = (inp[x, y] + inp[x + 1, y] + inp[x + 2, y]) / 3
output[x, y] = (blur_x[x, y] + blur_x[x, y + 1] + blur_x[x, y + 2]) / 3
blur_x.compute_root()
for name, feature, obj, lib in specs:
    target = hl.Target("host-" + feature if feature else "host")
    output.compile_to({hl.OutputFileType.object: obj}, [inp], name, target)
    subprocess.run([compiler, "-shared", "-o", lib, obj, "-lpthread", "-ldl", "-lm"], check=True)
"""


def pipeline_name(case: str) -> str:
    return f"profiling_off_{case}"


def library_path(case: str, out_dir=None) -> Path:
    """Where the library of ``case`` lives for the current recipe and halide version:
    ``out_dir``, else $HALIDE_SHIM_BENCHMARK_BUILD, else build/benchmarks."""
    out_dir = Path(out_dir or os.environ.get("HALIDE_SHIM_BENCHMARK_BUILD") or ROOT / "build" / "benchmarks")
    key = hashlib.sha256(f"{GENERATOR}|{CASES[case].feature}|{halide_version()}".encode()).hexdigest()[:12]
    return out_dir / f"{pipeline_name(case)}-{key}.so"


def build_libraries(out_dir=None) -> dict[str, str]:
    """{case: path of its library}, compiling those not built for the current recipe (one
    halide process for all)."""
    paths = {case: library_path(case, out_dir) for case in CASES}
    todo = [case for case, path in paths.items() if not path.exists()]
    if todo and installed_halide_version() is None:
        raise MissingLibrary(f"{paths[todo[0]]} is not built, and building it needs halide ({GET_HALIDE})")
    if todo:
        next(iter(paths.values())).parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="profiling-off-build-") as tmp:
            specs = [(pipeline_name(case), CASES[case].feature, os.path.join(tmp, f"{case}.o"),
                      os.path.join(tmp, f"{case}.so")) for case in todo]
            done = subprocess.run([sys.executable, "-c", GENERATOR, os.environ.get("CC", "cc"),
                                   json.dumps(specs)], check=False, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"building the profiling_off pipelines failed:\n{done.stderr}")
            for case, (_, _, _, lib) in zip(todo, specs):
                staged = paths[case].with_suffix(f".{os.getpid()}.so")
                staged.write_bytes(Path(lib).read_bytes())
                os.replace(staged, paths[case])  # a concurrent reader never sees half a library
    return {case: str(path) for case, path in paths.items()}


def image(case: str) -> np.ndarray:
    height, width = CASES[case].shape
    return np.random.default_rng(17).random((height + 2, width + 2), dtype=np.float32)


def expected(case: str) -> np.ndarray:
    a = image(case)
    blur_x = (a[:, :-2] + a[:, 1:-1] + a[:, 2:]) / np.float32(3)
    return (blur_x[:-2] + blur_x[1:-1] + blur_x[2:]) / np.float32(3)


def count_packets(path) -> int:
    """The trace packets in a file Halide's default handler wrote (each starts with its size,
    a uint32)."""
    data = Path(path).read_bytes()
    count = offset = 0
    while offset + 4 <= len(data):
        size = struct.unpack_from("<I", data, offset)[0]
        if size == 0:
            break
        offset += size
        count += 1
    return count


# --- one side, in its child process ---------------------------------------------------------

class Side:
    """The calls of one runtime, by case: ``loops[case](n) -> seconds``; ``outputs[case]``."""

    def __init__(self, trace_file: str):
        self.trace_file = trace_file
        self.loops, self.outputs = {}, {}

    def seconds(self, case: str, calls: int) -> float:
        seconds = self.loops[case](calls)
        if CASES[case].feature.startswith("trace"):
            os.truncate(self.trace_file, 0)  # (Halide opened it for appending: writes go on at 0)
        return seconds

    def answer(self, request: dict):
        op = request.get("op", "time")
        if op == "time":
            return self.seconds(request["case"], request["calls"])
        if op == "save":  # one call, then its output and the trace it wrote
            if os.path.exists(self.trace_file):
                os.truncate(self.trace_file, 0)
            self.loops[request["case"]](1)
            np.save(request["path"], self.outputs[request["case"]])
            size = os.path.getsize(self.trace_file) if os.path.exists(self.trace_file) else 0
            packets = count_packets(self.trace_file) if size else 0
            return {"trace bytes": size, "trace packets": packets}
        raise ValueError(f"unknown request {request}")


def loop_of(call, check=False):
    """``loop(n) -> seconds`` for n calls of ``call`` (``check``: a non-zero result is an error)."""
    clock = time.perf_counter
    if check:
        def loop(n):
            start = clock()
            for _ in range(n):
                if call():
                    raise RuntimeError(f"the pipeline failed ({call()})")
            return clock() - start
    else:
        def loop(n):
            start = clock()
            for _ in range(n):
                call()
            return clock() - start
    return loop


def stock_side(libraries: dict, trace_file: str) -> Side:
    from pipelines.stock import StockPipeline

    side = Side(trace_file)
    side.keep = []
    for case, library in libraries.items():
        pipeline = StockPipeline(library, pipeline_name(case))
        output = np.zeros(CASES[case].shape, np.float32)
        pipeline.bind({"input": image(case), "output": output})
        argv_fn, argv = pipeline._argv_fn, pipeline.argv
        side.loops[case] = loop_of(lambda f=argv_fn, a=argv: f(a), check=True)
        side.outputs[case] = output
        side.keep.append(pipeline)
    return side


def shim_side(libraries: dict, trace_file: str) -> Side:
    import shim

    side = Side(trace_file)
    side.keep = []
    for case, library in libraries.items():
        pipeline = shim.load(library)
        output = np.zeros(CASES[case].shape, np.float32)
        run = pipeline.prepare(image(case), output=output)
        side.loops[case] = loop_of(run)
        side.outputs[case] = output
        side.keep.append((pipeline, run))
    return side


def serve_side(which: str, libraries: dict, work: str) -> None:
    side = (stock_side if which == "stock" else shim_side)(libraries, os.environ["HL_TRACE_FILE"])
    print("ready", flush=True)
    for line in sys.stdin:
        print(json.dumps(side.answer(json.loads(line))), flush=True)
    if which == "stock":
        # Halide's profiler prints its report at exit through halide_print, whose default
        # writes to stdout (Halide 21): to a file, as the shim's side does through
        # HALIDE_SHIM_PROFILER_REPORT. (Until here stdout carries the answers; a pipeline
        # prints nothing else here: HL_TRACE_FILE takes the trace.)
        sys.stdout.flush()
        sys.stderr.flush()
        with open(os.path.join(work, "stock-profiler-report.txt"), "ab") as report:
            os.dup2(report.fileno(), 1)
            os.dup2(report.fileno(), 2)


class SideProcess(ChildProcess):
    """One runtime's child: ``seconds(case=, calls=)`` as sidebyside expects, and ``ask``."""

    def __init__(self, which: str, libraries: dict, work: str):
        env = dict(os.environ)
        env["HL_TRACE_FILE"] = os.path.join(work, f"{which}-trace.bin")
        env["HALIDE_SHIM_PROFILER_REPORT"] = os.path.join(work, f"{which}-profiler-report.txt")
        super().__init__([sys.executable, str(Path(__file__)), "--serve", which, "--work", work,
                          "--libraries", json.dumps(libraries)], env=env)

    def ask(self, **request):
        self._child.stdin.write(json.dumps(request) + "\n")
        self._child.stdin.flush()
        return json.loads(self._child.stdout.readline())

    def seconds(self, case: str, calls: int) -> float:
        return self.ask(op="time", case=case, calls=calls)


class Bench:
    """Both sides' children, over the libraries of every case, in a temporary folder (their
    trace files and profiler reports). ``close()`` ends them (Halide's reports at exit are
    then in the folder: profiler_reports()); ``cleanup()`` ends them and removes the folder."""

    def __init__(self):
        self.libraries = build_libraries()
        self._work = tempfile.TemporaryDirectory(prefix="profiling-off-")
        self.work = self._work.name
        self.sides = {}
        try:
            for which in ("stock", "shim"):
                self.sides[which] = SideProcess(which, self.libraries, self.work)
        except BaseException:
            self.close()
            raise

    def check(self) -> dict:
        """One call of each case on each side: {case: {side: {"correct": bool, "trace bytes":
        n, "trace packets": n}}}."""
        results = {}
        for case in CASES:
            results[case] = {}
            for which, side in self.sides.items():
                path = os.path.join(self.work, f"{which}-{case}.npy")
                answer = side.ask(op="save", case=case, path=path)
                answer["correct"] = bool(np.allclose(np.load(path), expected(case), rtol=1e-5))
                results[case][which] = answer
        return results

    def profiler_reports(self) -> dict:
        """{side: Halide's profiler report at exit} (once closed)."""
        reports = {}
        for which in ("stock", "shim"):
            path = Path(self.work) / f"{which}-profiler-report.txt"
            reports[which] = path.read_text(errors="replace") if path.exists() else ""
        return reports

    def close(self) -> None:
        for side in self.sides.values():
            side.close()
        self.sides = {}

    def cleanup(self) -> None:
        self.close()
        self._work.cleanup()


def ratios(stock: dict, shim: dict) -> dict:
    """Each side's {"min": s, "median": s} per call -> the figures in us and the ratios shim /
    stock of the mins and of the medians."""
    return {"stock us min": 1e6 * stock["min"], "stock us median": 1e6 * stock["median"],
            "shim us min": 1e6 * shim["min"], "shim us median": 1e6 * shim["median"],
            "ratio min": shim["min"] / stock["min"], "ratio median": shim["median"] / stock["median"]}


def measure(bench: Bench, repeats: int) -> dict:
    """{case: ratios(...)}: each side's time per call, min and median over ``repeats`` samples
    taken in turns (one warm-up sample first), and the ratios shim / stock."""
    requests = {case: {"case": case, "calls": c.calls} for case, c in CASES.items()}
    measured = interleave(bench.sides, requests, repeats, per_sample=lambda r: r["calls"])
    return {case: {**ratios(measured["stock"][case], measured["shim"][case]), "samples": repeats,
                   "calls per sample": request["calls"]}
            for case, request in requests.items()}


def report(results: dict, checks: dict) -> str:
    lines = [(f"{'build':<9}{'stock us':>10}{'shim us':>10}{'ratio':>8}{'stock med':>11}"
              f"{'shim med':>10}{'ratio':>8}{'samples':>9}{'calls':>7}"),
             "  (us per call, min and median over samples; ratio = shim / stock)"]
    for case, r in results.items():
        lines.append(f"{case:<9}{r['stock us min']:>10.1f}{r['shim us min']:>10.1f}{r['ratio min']:>7.3f}x"
                     f"{r['stock us median']:>11.1f}{r['shim us median']:>10.1f}{r['ratio median']:>7.3f}x"
                     f"{r['samples']:>9}{r['calls per sample']:>7}")
    trace = checks.get("trace", {})
    if trace:
        lines.append("trace events per call (packets Halide wrote to HL_TRACE_FILE): " + ", ".join(
            f"{which} {answer['trace packets']:,} ({answer['trace bytes'] / 1e6:.1f} MB)"
            for which, answer in trace.items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, help="samples per side and build (default 41, --quick 5)")
    parser.add_argument("--quick", action="store_true", help="few samples")
    parser.add_argument("--serve", choices=["stock", "shim"], help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--libraries", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve_side(args.serve, json.loads(args.libraries), args.work)
        return 0
    repeats = args.repeats or (5 if args.quick else 41)
    bench = Bench()
    try:
        checks = bench.check()
        results = measure(bench, repeats)
        bench.close()
        reports = bench.profiler_reports()
    finally:
        bench.cleanup()
    print(report(results, checks))
    failures = [f"{case} ({which}): output differs from numpy"
                for case, sides in checks.items() for which, a in sides.items() if not a["correct"]]
    trace = checks["trace"]
    if trace["stock"]["trace packets"] != trace["shim"]["trace packets"] or not trace["shim"]["trace packets"]:
        failures.append(f"trace files differ: {trace}")
    for which, text in reports.items():
        if pipeline_name("profile") not in text:
            failures.append(f"{which}: no profiler report of {pipeline_name('profile')} at exit")
    print("outputs checked against numpy, the same trace events on both sides, Halide's profiler "
          "report at exit in a file on both sides: " + ("ok" if not failures else "FAILED: " + "; ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
