"""Halide's own apps on a GPU: interpolate and local_laplacian, built from Halide's generators
(apps/interpolate/interpolate_generator.cpp, apps/local_laplacian/local_laplacian_generator.cpp
at v21.0.0) with the installed halide package, the shim against the stock runtime side by side
in one run.

    python benchmarks/halide_apps.py --halide-source PATH [--device opencl|cuda] [--repeats R]

PATH is a checkout of Halide (https://github.com/halide/Halide): a git checkout is read at the
tag v21.0.0, any other folder as it is. The generators are compiled against the halide
package's headers and libraries (libHalide, libHalide_GenGen) and run for the device's target,
with the runtime bundled (the stock side) and without (the shim's); the libraries are kept in
the pipelines' build folder (pipelines/build.py), keyed by the generator's source, so that
later runs skip the builds.

Their GPU schedules allocate and free intermediate device buffers at every call
(interpolate's pyramid levels, local_laplacian's Gaussian and Laplacian pyramids): the native
layer serves those allocations (native_stubs/devices/served.c). Both sides run with their data
resident on the device and the buffers bound once (the stock runtime through the argv entry
point in a child process without the shim, the shim through Pipeline.prepare()), calls back to
back with one device sync at the end, and a sync after every call. Before timing, each app's
output through the shim is compared with the stock runtime's, bit for bit.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from gpu_pipelines import resident_seconds
from halide_generators import compile_generator, run
from halide_source import HalideSource
from sidebyside import ChildProcess, interleave, serve

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

# The checkout's pipelines/ by the folder's own name, not as shim.pipelines: the stock runtime's
# child process runs this module too, and must not import the shim package.
from pipelines.build import build_folder  # noqa: E402

TAG = "v21.0.0"
WIDTH, HEIGHT = 256, 192
APPS = {
    # name: (generator source in Halide's tree, generator params, inputs, output shape)
    "interpolate": ("apps/interpolate/interpolate_generator.cpp", [],
                    {"input": ((4, HEIGHT, WIDTH), np.float32)}, ((3, HEIGHT, WIDTH), np.float32)),
    "local_laplacian": ("apps/local_laplacian/local_laplacian_generator.cpp", [],
                        {"input": ((3, HEIGHT, WIDTH), np.uint16), "levels": 8, "alpha": 1.0,
                         "beta": 1.0}, ((3, HEIGHT, WIDTH), np.uint16)),
}
ITERATIONS = {"interpolate": 20, "local_laplacian": 10}
TARGETS = {"opencl": "host-opencl", "cuda": "host-cuda-cuda_capability_61"}


def values_for(app: str) -> dict:
    _, _, inputs, (shape, dtype) = APPS[app]
    rng = np.random.default_rng(11)
    values = {}
    for name, spec in inputs.items():
        if isinstance(spec, tuple):
            in_shape, in_dtype = spec
            values[name] = (rng.random(in_shape, dtype=np.float32) if in_dtype == np.float32
                            else rng.integers(0, 65536, size=in_shape).astype(in_dtype))
        else:
            values[name] = spec
    values["output"] = np.zeros(shape, dtype)
    return values


# --- building the apps --------------------------------------------------------------------------

def build_apps(halide_source: Path, kind: str) -> dict:
    """{(app, runtime): path of its .so}, built where missing (with progress lines)."""
    source_tree = HalideSource(halide_source, TAG)
    libraries = {}
    with build_folder() as folder:
        for app, (relative, params, _, _) in APPS.items():
            source = source_tree.read(relative)
            digest = hashlib.sha256(source + repr((params, TARGETS[kind])).encode()).hexdigest()[:16]
            names = {runtime: f"app-{app}-{kind}-{runtime}-{digest}.so"
                     for runtime in ("bundled", "no_runtime")}
            if all(folder.has(name) for name in names.values()):
                libraries.update({(app, r): folder.path / n for r, n in names.items()})
                continue
            with tempfile.TemporaryDirectory(prefix=".tmp-app-", dir=folder.path) as tmp:
                tmp = Path(tmp)
                (tmp / "generator.cpp").write_bytes(source)
                print(f"building {app}'s generator (a minute or two)...", file=sys.stderr, flush=True)
                compile_generator(["generator.cpp"], tmp / "generator", tmp)
                for runtime, name in names.items():
                    target = TARGETS[kind] + ("-no_runtime" if runtime == "no_runtime" else "")
                    print(f"generating {app} for {target}...", file=sys.stderr, flush=True)
                    run(["./generator", "-g", app, "-e", "object", "-o", ".", "-f", app,
                         f"target={target}", *params], tmp)
                    run([os.environ.get("CC", "cc"), "-shared", "-o", name, f"{app}.o",
                         "-lpthread", "-ldl", "-lm"], tmp)
                    folder.write(name, (tmp / name).read_bytes())
                    libraries[app, runtime] = folder.path / name
    return libraries


# --- the stock runtime (child process) ---------------------------------------------------------

def stock_server(paths: dict) -> None:
    from pipelines.stock import StockPipeline

    pipelines = {}
    for app in APPS:
        pipeline = StockPipeline(paths[app], app)
        pipeline.bind(values_for(app))
        pipeline.run()  # upload the input once: it stays resident
        pipelines[app] = pipeline

    def seconds(app, iterations, sync_each, output_to=None):
        if output_to is not None:  # the output's bytes written to that file, for the comparison
            pipelines[app].run()
            Path(output_to).write_bytes(pipelines[app].fetch()["output"].tobytes())
            return 0.0
        return pipelines[app].seconds(iterations, sync_each)

    serve(seconds)


# --- the shim --------------------------------------------------------------------------------

class ShimRunner:
    """``served``: False to time the shim with every allocation through the Python core, as
    before the native layer served pipelines' own (shim_serve_allocations)."""

    def __init__(self, kind: str, libraries: dict, served: bool = True):
        import shim

        self.served = served
        self.device = shim.device(kind)
        self.calls = {}
        for app in APPS:
            pipeline = shim.load(libraries[app, "no_runtime"])
            values = {name: shim.Buffer(v) if isinstance(v, np.ndarray) else v
                      for name, v in values_for(app).items()}
            call = pipeline.prepare(**values)
            call()  # upload the input once: it stays resident
            self.calls[app] = (call, values)

    def output(self, app: str) -> bytes:
        call, values = self.calls[app]
        call()
        values["output"].set_device_dirty()  # (prepare() leaves it to the caller to read)
        return values["output"].numpy().tobytes()

    def seconds(self, app, iterations, sync_each) -> float:
        return resident_seconds(self.device, self.calls[app][0], iterations, sync_each,
                                self.served)

    def close(self) -> None:
        for _, values in self.calls.values():
            for value in values.values():
                if hasattr(value, "device_free"):
                    value.device_free()


def requests() -> dict:
    return {(app, sync): {"app": app, "iterations": ITERATIONS[app], "sync_each": sync}
            for app in APPS for sync in (False, True)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--halide-source", type=Path, help="a checkout of Halide")
    parser.add_argument("--device", default="opencl", choices=sorted(TARGETS))
    parser.add_argument("--repeats", type=int, default=9, help="samples per runtime and case")
    parser.add_argument("--serve", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        stock_server(dict(zip(APPS, args.serve)))
        return 0
    if args.halide_source is None:
        parser.error("--halide-source: a checkout of Halide is needed for its apps' generators")
    libraries = build_apps(args.halide_source, args.device)
    shim_runner = ShimRunner(args.device, libraries)
    python_allocations = ShimRunner(args.device, libraries, served=False)
    from allocation_reuse import stock_environment

    child = ChildProcess([sys.executable, str(Path(__file__)), "--serve",
                          *(str(libraries[app, "bundled"]) for app in APPS)],
                         env=stock_environment(args.device, shim_runner.device))
    try:
        with tempfile.TemporaryDirectory() as private:
            for app in APPS:
                stock_output = Path(private) / f"{app}.bin"
                child.seconds(app=app, iterations=0, sync_each=False, output_to=str(stock_output))
                same = stock_output.read_bytes() == shim_runner.output(app)
                print(f"{app}: the shim's output is the stock runtime's, bit for bit: {same}")
                if not same:
                    return 1
        results = interleave({"stock": child, "shim": shim_runner,
                              "python allocations": python_allocations}, requests(),
                             args.repeats, per_sample=lambda request: request["iterations"])
    finally:
        child.close()
        shim_runner.close()
        python_allocations.close()
    print(f"device: {shim_runner.device.name}; {WIDTH}x{HEIGHT} images")
    print(f"{'app':<17}{'sync':<11}{'stock ms/call':>15}{'shim ms/call':>14}{'shim/stock':>12}"
          f"{'allocations in Python':>23}{'/shim':>7}")
    print("  (min over samples; the last two: the shim with pipelines' own allocations through "
          "the Python core, as before native_stubs/devices/served.c)")
    for app in APPS:
        for sync in (False, True):
            stock = 1e3 * results["stock"][app, sync]["min"]
            ours = 1e3 * results["shim"][app, sync]["min"]
            python = 1e3 * results["python allocations"][app, sync]["min"]
            print(f"{app:<17}{'each call' if sync else 'at end':<11}{stock:>15.2f}{ours:>14.2f}"
                  f"{ours / stock:>12.2f}{python:>23.2f}{python / ours:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
