"""The first call of a pipeline in a fresh process, after one earlier process built it: the
shim against Halide's stock runtime, on the same OpenCL platform and device, or on the host.

    python benchmarks/first_call.py [--runs 3] [--cases brighten,blur3x3,histogram]
    python benchmarks/first_call.py --device host [--runs 5]

On the host (``--device host``) there is no device setup or program build: the first call is
the bounds query for a new shape and the run, with numpy arrays in and out on both sides (the
shim's plain call; also with the output given as a shape, which returns a shim.Buffer); one
setting, no caches involved.

Every figure is one fresh process: it imports, loads the library and binds its arguments
untimed, then times its first call: device setup (the OpenCL context and queue), program build,
upload, kernel, download to host memory. The stock runtime runs the pipeline built with its
runtime bundled, through its argv entry point, in a process without the shim (Halide picks the
device the shim picks: HL_OCL_PLATFORM_NAME / HL_OCL_DEVICE_TYPE in both); the shim runs the
no_runtime build with numpy arguments. Both sides load the ICD loader pyopencl ships (each child
reports the libOpenCL it mapped), and their outputs are compared bit for bit.

Caches: PoCL keeps compiled kernels in $POCL_CACHE_DIR, keyed by source and options; Halide's
stock runtime builds from source every time and relies on it. The shim keeps program binaries
in its own cache ($HALIDE_SHIM_CACHE) and builds from those. Each side gets its own fresh
POCL_CACHE_DIR (and the shim its own fresh program cache), warmed by one earlier process of
the same side: that process's figure is the "cold" column. Two settings:

- "driver cache on": PoCL's kernel cache as installed; the stock side's build hits it. The shim
  with its program cache, and with it off ($HALIDE_SHIM_NO_PROGRAM_CACHE=1: the shim's build
  from source then hits PoCL's cache as the stock runtime's does).
- "driver cache off" (POCL_KERNEL_CACHE=0): a driver without an on-disk cache; the stock side
  and the shim without its cache build from source in every process.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

# The checkout's pipelines/ by the folder's own name, not as shim.pipelines: the stock runtime's
# child process runs this module too, and must not import the shim package.
from pipelines.build import Build, build  # noqa: E402

CASES = {  # name: ({input: (shape, dtype) or scalar}, {output: (shape, dtype)})
    "brighten": ({"input": ((64, 64), np.float32), "scale": 2.0, "offset": 1.0},
                 {"output": ((64, 64), np.float32)}),
    "blur3x3": ({"input": ((66, 66), np.uint16)}, {"output": ((64, 64), np.uint16)}),
    "histogram": ({"input": ((50, 70), np.uint8)}, {"output": ((256,), np.uint32)}),
}
SIDES = ("stock", "shim", "shim, its cache off")
SETTINGS = {"driver cache on": {}, "driver cache off": {"POCL_KERNEL_CACHE": "0"}}
HOST_SIDES = ("stock", "shim", "shim, output as a shape")
HOST_SETTINGS = {"host": {}}


def inputs_for(case: str) -> dict:
    inputs, _ = CASES[case]
    rng = np.random.default_rng(7)
    return {name: (rng.integers(0, 200, size=spec[0]).astype(spec[1]) if isinstance(spec, tuple) else spec)
            for name, spec in inputs.items()}


def _mapped_opencl_loader() -> str:
    with open("/proc/self/maps") as maps:
        found = re.findall(r"(/\S*libOpenCL\S*\.so\S*)", maps.read())
    return found[0] if found else "(none)"


# --- the child: one first call -----------------------------------------------------------------

def child(side: str, case: str, kind: str) -> None:
    """Prepare untimed, print "ready", wait for a line, time the first call, print the result
    as one JSON line."""
    name = case
    outputs = CASES[case][1]
    values = inputs_for(case)
    details = {}
    if side == "stock":
        from pipelines.stock import StockPipeline

        pipeline = StockPipeline(str(build(Build(name, kind, "bundled"))), name)
        pipeline.bind({**values, **{k: np.zeros(shape, dtype) for k, (shape, dtype) in outputs.items()}})

        def first_call():
            pipeline.run()
            return [array for array in pipeline.fetch().values()]
    elif kind == "host":
        import shim

        pipeline = shim.load(build(Build(name, kind, "no_runtime")))
        as_shape = side == "shim, output as a shape"

        def first_call():
            given = {k: shape if as_shape else np.zeros(shape, dtype)
                     for k, (shape, dtype) in outputs.items()}
            results = pipeline(**values, **given)
            results = results if isinstance(results, tuple) else (results,)
            return [r.numpy() if as_shape else r for r in results]
    else:
        import pyopencl  # noqa: F401  (the stock side imports it untimed too, for its ICD loader)

        import shim
        from shim.backends import opencl

        from shim.backends.devices import created

        pipeline = shim.load(build(Build(name, "opencl", "no_runtime")))
        assert not created(), "the device must be set up in the timed call, as the stock side's is"

        def first_call():
            results = pipeline(**values, **{k: shape for k, (shape, _) in outputs.items()})
            results = results if isinstance(results, tuple) else (results,)
            return [r.numpy() for r in results]
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.perf_counter()
    arrays = first_call()
    seconds = time.perf_counter() - start
    if side != "stock" and kind != "host":
        details["program builds"] = dict(opencl.program_builds)
        details["device"] = shim.device("opencl").name
    details["loader"] = _mapped_opencl_loader()
    details["outputs sha256"] = hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()[:16]
    print(json.dumps({"seconds": seconds, **details}), flush=True)


# --- the parent --------------------------------------------------------------------------------

class FreshProcess:
    """A child process ready for its first call; ``call()`` makes it and returns its report."""

    def __init__(self, side: str, case: str, kind: str, env: dict):
        self._child = subprocess.Popen([sys.executable, str(Path(__file__)), "--child", side, case,
                                        kind],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        line = self._child.stdout.readline().strip()
        if line != "ready":
            self._child.kill()
            raise RuntimeError(f"the {side} child for {case} did not start (said {line!r})")

    def call(self, wait: bool = True) -> dict:
        """The child's report of its first call; ``wait=False`` leaves its exit to finish()."""
        self._child.stdin.write("go\n")
        self._child.stdin.flush()
        line = self._child.stdout.readline()
        if wait:
            self.finish()
        if not line:
            raise RuntimeError("the child failed")
        return json.loads(line)

    def finish(self) -> None:
        self._child.stdin.close()
        if self._child.wait() != 0:
            raise RuntimeError(f"the child failed ({self._child.returncode})")


class Setup:
    """Fresh cache directories for one setting: per side its own PoCL kernel cache, for the
    shim its own program cache; and the environment each side runs in."""

    def __init__(self, setting: str, root: Path, device_environment: dict, kind: str):
        self.setting, self.root, self.kind = setting, root, kind
        self.environments = {}
        for side in sides_of(kind):
            slug = re.sub(r"\W+", "-", side)
            env = {**os.environ, **device_environment, **settings_of(kind)[setting],
                   "POCL_CACHE_DIR": str(root / f"pocl-{slug}"),
                   "HALIDE_SHIM_CACHE": str(root / f"programs-{slug}")}
            env.pop("HALIDE_SHIM_NO_PROGRAM_CACHE", None)
            if side == "shim, its cache off":
                env["HALIDE_SHIM_NO_PROGRAM_CACHE"] = "1"
            self.environments[side] = env

    def start(self, side: str, case: str) -> FreshProcess:
        return FreshProcess(side, case, self.kind, self.environments[side])

    def first_call(self, side: str, case: str) -> dict:
        return self.start(side, case).call()


def device_environment() -> tuple[dict, str]:
    """HL_OCL_PLATFORM_NAME / HL_OCL_DEVICE_TYPE naming the device the shim picks (for both
    sides), and that device's name. Asked of a child, so this process stays free of the shim."""
    script = ("import json, pyopencl as cl, shim; d = shim.device('opencl'); print(json.dumps("
              "[d._platform.name.strip(), 'gpu' if d._device.type & cl.device_type.GPU else 'cpu', d.name]))")
    platform, kind, name = json.loads(subprocess.run([sys.executable, "-c", script], check=True,
                                                     capture_output=True, text=True).stdout)
    return {"HL_OCL_PLATFORM_NAME": platform, "HL_OCL_DEVICE_TYPE": kind}, name


def sides_of(kind: str) -> tuple:
    return HOST_SIDES if kind == "host" else SIDES


def settings_of(kind: str) -> dict:
    return HOST_SETTINGS if kind == "host" else SETTINGS


def measure(cases, runs: int, root: Path, environment: dict, kind: str) -> dict:
    """{setting: {case: {side: {"cold": report, "runs": [report, ...]}}}}: per setting and case,
    one earlier process per side (cold), then ``runs`` rounds of one fresh process per side,
    the sides taking turns."""
    results = {}
    for setting in settings_of(kind):
        setup = Setup(setting, root / re.sub(r"\W+", "-", setting), environment, kind)
        results[setting] = {}
        for case in cases:
            per_side = {side: {"cold": setup.first_call(side, case), "runs": []}
                        for side in sides_of(kind)}
            for _ in range(runs):
                for side in sides_of(kind):
                    per_side[side]["runs"].append(setup.first_call(side, case))
            results[setting][case] = per_side
    return results


def report(results: dict, device_name: str, runs: int, kind: str) -> str:
    lines = [f"device: {device_name}",
             "first call in a fresh process, ms (cold: the first process ever, which also fills "
             "the caches; then one fresh process per run)"]
    loaders, digests, worst = set(), {}, None
    for setting, cases in results.items():
        lines.append(f"\n{setting}:")
        lines.append(f"  {'case':<10}{'side':<24}{'cold':>8}" + "".join(f"{f'run {i + 1}':>8}" for i in range(runs))
                     + f"{'median':>8}{'/stock':>8}  built from")
        for case, sides in cases.items():
            stock_median = statistics.median(r["seconds"] for r in sides["stock"]["runs"])
            for side, figures in sides.items():
                seconds = [r["seconds"] for r in figures["runs"]]
                median = statistics.median(seconds)
                ratio = median / stock_median
                how = ("source, via PoCL's kernel cache" if setting == "driver cache on" else "source")
                if kind == "host":
                    how = "(no program)"
                elif side != "stock":
                    builds = {k for r in figures["runs"] for k in r["program builds"]}
                    how = "shim cache (binary)" if builds == {"binary"} else (
                        how if builds == {"source"} else ", ".join(sorted(builds)))
                digits = 3 if kind == "host" else 1  # (host calls take tenths of a ms)
                lines.append(f"  {case:<10}{side:<24}{1e3 * figures['cold']['seconds']:>8.{digits}f}"
                             + "".join(f"{1e3 * s:>8.{digits}f}" for s in seconds)
                             + f"{1e3 * median:>8.{digits}f}{ratio:>8.2f}  {how}")
                if side == "shim" and setting in ("driver cache on", "host"):
                    worst = ratio if worst is None else max(worst, ratio)
                for r in [figures["cold"], *figures["runs"]]:
                    loaders.add(r["loader"])
                    digests.setdefault((setting, case), set()).add(r["outputs sha256"])
    lines.append("")
    lines.append(f"OpenCL ICD loader mapped by the children: {', '.join(sorted(loaders))}")
    same = all(len(d) == 1 for d in digests.values())
    lines.append(f"outputs identical across sides and runs: {'yes' if same else 'NO'}")
    lines.append(f"worst median shim/stock{' with the driver' + chr(39) + 's cache on' if kind != 'host' else ''}: "
                 f"{worst:.2f} (target <= {1.3 if kind == 'host' else 1.5})")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per side, case and setting")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    parser.add_argument("--device", default="opencl", choices=["opencl", "host"])
    parser.add_argument("--child", nargs=3, metavar=("SIDE", "CASE", "KIND"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    cases = [c for c in args.cases.split(",") if c]
    for case in cases:  # build the libraries first, outside any timing
        build(Build(case, args.device, "bundled"))
        build(Build(case, args.device, "no_runtime"))
    if args.device == "host":
        environment, device_name = {}, "host"
    else:
        environment, device_name = device_environment()
    with tempfile.TemporaryDirectory(prefix="first-call-") as root:
        results = measure(cases, args.runs, Path(root), environment, args.device)
    print(report(results, device_name, args.runs, args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
