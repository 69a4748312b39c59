"""Halide's Python apps (python_bindings/apps/*_generator.py), run through shim.load and through
Halide's own stock runtime side by side: a step of the Halide 22 kit (benchmarks/halide22_kit.py),
run in the interpreter whose halide builds them.

    python benchmarks/halide_python_apps.py --halide-source PATH [--ref REF] --work DIR
        [--json FILE] [--apps NAME,...]

Each app is built as its release builds Python generators, with the generator's own command
line (``python APP_generator.py -g APP -e object target=host``), its runtime bundled, and
linked into a shared library. The shim loads it (shim.load) and calls it on random inputs;
pipelines/stock.py runs the same library with the runtime it carries, in a child process that
never imports the shim; the outputs must be the same, bit for bit, and the shim must tell the
library's release as the installed halide's major version. Only the generator of each app's
own name is built: the others in its file are the same app scheduled by an autoscheduler
plugin (bilateral_grid_Adams2019...), which the kit builds without. An app whose arguments are
not the ones below (a release that changed it) fails, naming them: its inputs are chosen here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from halide_generators import run  # noqa: E402
from halide_source import HalideSource  # noqa: E402
from kit_steps import last_line, log, private_folder, stream  # noqa: E402

FOLDER = "python_bindings/apps"
HEIGHT, WIDTH = 192, 256


@dataclass(frozen=True)
class Random:
    """An input buffer of random values in [0, high) (numpy's shape: Halide's dimensions
    reversed)."""

    shape: tuple
    dtype: type
    high: float = 1.0


@dataclass(frozen=True)
class Output:
    shape: tuple
    dtype: type


# Each app's arguments, as its *_app.py calls it: images as it reads them (bilateral_grid and blur
# gray, interpolate RGBA, local_laplacian RGB; blur's values under 2**14, which its generator
# says it needs), its scalars as that script passes them.
APPS = {
    "bilateral_grid": {"input_buf": Random((HEIGHT, WIDTH), np.float32), "r_sigma": 0.1,
                       "bilateral_grid": Output((HEIGHT, WIDTH), np.float32)},
    "blur": {"input_buf": Random((HEIGHT, WIDTH), np.uint16, 2**14),
             "blur_y": Output((HEIGHT, WIDTH), np.uint16)},
    "identity": {"output": Output((1000,), np.int32)},
    "interpolate": {"input_buf": Random((4, HEIGHT, WIDTH), np.float32),
                    "output_buf": Output((3, HEIGHT, WIDTH), np.float32)},
    "local_laplacian": {"input_buf": Random((3, HEIGHT, WIDTH), np.uint16, 2**16), "levels": 8,
                        "alpha": 1 / 7, "beta": 1.0,
                        "output_buf": Output((3, HEIGHT, WIDTH), np.uint16)},
}


def build(app: str, tree: Path, work: Path) -> Path:
    """The app's shared library, its runtime bundled."""
    out = work / app
    out.mkdir(parents=True, exist_ok=True)
    generator = tree / FOLDER / f"{app}_generator.py"
    run([sys.executable, generator, "-g", app, "-o", out, "-e", "object", "target=host"], out, 900)
    run([os.environ.get("CC", "cc"), "-shared", "-o", out / f"{app}.so", out / f"{app}.o",
         "-lpthread", "-ldl", "-lm"], out, 300)
    return out / f"{app}.so"


def values(app: str, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    made = {}
    for name, spec in APPS[app].items():
        if isinstance(spec, Random):
            made[name] = (rng.random(spec.shape, dtype=np.float32) * spec.high).astype(spec.dtype)
        elif isinstance(spec, Output):
            made[name] = np.zeros(spec.shape, spec.dtype)
        else:
            made[name] = spec
    return made


def stock_outputs(app: str, library: Path, inputs: dict, work: Path, log_file) -> dict:
    """The outputs of Halide's own runtime, from pipelines/stock.py in a child process."""
    out = work / app / "stock"
    out.mkdir(exist_ok=True)
    assignments = []
    for name, value in inputs.items():
        spec = APPS[app][name]
        if isinstance(spec, Random):
            np.save(out / f"in-{name}.npy", value)
            assignments.append(f"{name}={out / f'in-{name}.npy'}")
        elif isinstance(spec, Output):
            dtype = np.dtype(spec.dtype).name
            assignments.append(f"{name}={'x'.join(map(str, spec.shape))}:{dtype}")
        else:
            assignments.append(f"{name}={value!r}")
    command = [sys.executable, "-m", "pipelines.stock", str(library), app, str(out), *assignments]
    code, output, _ = stream(command, dict(os.environ), 600, log_file, echo=False, cwd=ROOT)
    if code != 0:
        raise RuntimeError(f"the stock runtime failed ({code}): {last_line(output)}")
    return {name: np.load(out / f"{name}.npy") for name, spec in APPS[app].items()
            if isinstance(spec, Output)}


def check(app: str, library: Path, work: Path, release: str, log_file) -> dict:
    """Run ``app`` on both runtimes; its result."""
    import shim

    pipeline = shim.load(library)
    result = {"release": pipeline.release}
    names = sorted(a.name for a in pipeline.arguments)
    if names != sorted(APPS[app]):
        result["error"] = (f"its arguments are {', '.join(names)}; the kit gives it "
                           f"{', '.join(sorted(APPS[app]))}")
        return result
    inputs = values(app, seed=len(app))
    try:
        stock = stock_outputs(app, library, inputs, work, log_file)
    except RuntimeError as e:
        result["stock"] = str(e)
        return result
    result["stock"] = "ran"
    ours = {name: value.copy() if isinstance(value, np.ndarray) else value
            for name, value in inputs.items()}
    try:
        pipeline(**ours)
    except Exception as e:  # (what the shim raised is the finding)
        result["shim"] = f"{type(e).__name__}: {e}"
        return result
    result["shim"] = "ran"
    result["differ"] = {name: _differing(stock[name], ours[name]) for name in stock}
    result["elements"] = {name: int(stock[name].size) for name in stock}
    result["release_ok"] = pipeline.release == release
    return result


def _differing(a: np.ndarray, b: np.ndarray) -> int:
    """How many elements of two arrays of one shape and type differ in their bits."""
    bits = np.dtype(f"V{a.itemsize}")
    return int(np.count_nonzero(a.reshape(-1).view(bits) != b.reshape(-1).view(bits)))


def verdict(result: dict) -> str:
    """"same" (every output the stock runtime's, bit for bit, and the release told right), or
    what went wrong."""
    if "error" in result:
        return result["error"]
    if result.get("stock") != "ran":
        return f"stock runtime failed: {result['stock']}"
    if result.get("shim") != "ran":
        return f"shim failed: {result['shim']}"
    differ = [f"{name}: {n} of {result['elements'][name]} elements differ"
              for name, n in result["differ"].items() if n]
    if differ:
        return "DIFFER: " + "; ".join(differ)
    if not result["release_ok"]:
        return f"same outputs, but the shim tells release {result['release']}"
    return "same"


def table(results: dict, release: str) -> list[str]:
    same = sum(verdict(r) == "same" for r in results.values())
    lines = [f"{len(results)} Python apps: {same} give the stock runtime's outputs bit for bit "
             f"(shim tells release {release}), {len(results) - same} not",
             f"{'app':<18}{'release':<9}verdict"]
    lines += [f"{app:<18}{r.get('release', '-'):<9}{verdict(r)}" for app, r in results.items()]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--halide-source", type=Path, required=True, help="Halide's source tree")
    parser.add_argument("--ref", help="the git ref to read a repository at (default: "
                                      "v<the installed halide's version>)")
    parser.add_argument("--work", type=Path, required=True, help="a private folder to build in")
    parser.add_argument("--json", type=Path, help="the results")
    parser.add_argument("--apps", help=f"comma-separated subset of {', '.join(APPS)}")
    args = parser.parse_args(argv)
    version = metadata.version("halide")
    release = version.split(".")[0]
    source = HalideSource(args.halide_source, args.ref or f"v{version}")
    work = private_folder(args.work, "the apps' builds")
    tree = work / "source"
    source.extract([FOLDER], tree)
    present = sorted(p.name.removesuffix("_generator.py")
                     for p in (tree / FOLDER).glob("*_generator.py"))
    log(f"halide {version}; Halide's Python apps from {source}: {', '.join(present)}")
    chosen = args.apps.split(",") if args.apps else sorted(set(present) | set(APPS))
    results = {}
    with open(work / "apps.log", "w") as log_file:
        for app in chosen:
            if app not in APPS:
                results[app] = {"error": "the kit has no inputs for it (a new app: add it to APPS)"}
            elif app not in present:
                results[app] = {"error": f"{FOLDER}/{app}_generator.py is not in {source}"}
            else:
                try:
                    library = build(app, tree, work)
                except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
                    results[app] = {"error": f"build failed: {last_line(str(e))}"}
                else:
                    results[app] = check(app, library, work, release, log_file)
            log(f"{app}: {verdict(results[app])}")
            if args.json:  # (after each app: a step that times out still says what ran)
                args.json.write_text(json.dumps(
                    {"halide": version, "source": str(source), "results": results,
                     "table": table(results, release)}, indent=1) + "\n")
    print("\n".join(table(results, release)))
    return 0 if all(verdict(r) == "same" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
