"""The offline GPU check kit: the CUDA checks on a GPU machine that is bare, offline and lent
for minutes (Python 3.12 with torch, cupy, numpy, cuda-python and pytest; no cffi, no
pyopencl, no halide).

    python benchmarks/gpu_kit.py prepare [--out .gpukit]    # here: halide, a compiler, pip
    python3 benchmarks/gpu_kit.py run [--kit .gpukit]       # there: nothing outside the kit

``prepare`` lays in one git-ignored folder everything the run needs that the working tree
does not carry: the CUDA builds (bundled and no_runtime) of every sample pipeline and the
host builds the tests load, with the halide version that made them (pipelines/HALIDE_VERSION,
so they are found without halide), the native module shim._native (abi3: it loads on 3.12),
docs/own-pipeline.md's CUDA libraries (made by the page's own commands), the benchmark's
compiled C loop, and the wheels the image lacks (cffi, pycparser: the
versions installed here, for CPython 3.12 manylinux x86_64). It checks the native module and
the wheels with a Python 3.12 interpreter where it finds one, writes manifest.json and fails
if the folder is over its budget.

``run`` installs the carried wheels into a private folder (only those the interpreter lacks),
makes halide and pyopencl unimportable (the kit must not need them: --block ''
lifts that), points the shim at the carried native module ($HALIDE_SHIM_NATIVE), pipelines
($HALIDE_SHIM_PIPELINES) and the page's builds ($HALIDE_SHIM_OWN_PIPELINE), then runs each step
with its own time limit, printing as it goes: the devices, the CUDA tests, the DLPack round
trips with torch and CuPy, the seed-001 crop repro on CUDA, the page's CUDA examples, the tests of the default device and of running without pyopencl/halide, and
the launch and no-op copy benchmarks against Halide's stock runtime. Logs and summary.txt
(every figure and pass/fail count) go to $OUT (default build/gpu-kit). The exit status is
1 if a step failed (every step runs anyway), and 3 where there is no CUDA device, so nothing
ran on a GPU ("no GPU: nothing run"), unless --dry-run asks for exactly that: the kit checked
on a machine without one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_KIT = ROOT / ".gpukit"
DEFAULT_OUT = ROOT / "build" / "gpu-kit"
BUDGET_MIB = 48  # the kit; the working tree and the kit travel together, 64 MiB in all
TRAVEL_LIMIT_MIB = 64
TARGET_PYTHON = "3.12"
# The distributions the GPU image lacks that the run needs: cffi (shim._native's backend,
# pipelines/stock.py) and pycparser (cffi's cdef, used by pipelines/stock.py).
WHEELS = ("cffi", "pycparser")
MODULES = {"cffi": "cffi", "pycparser": "pycparser"}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")

sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from kit_steps import junit_counts, log, package_module, stream  # noqa: E402

# The native module's stamp: what it was built from, against this tree's sources.
native_stamp = package_module("native/stamp.py")


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def git(*args) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def tree_size() -> int:
    """Bytes of what travels besides the kit: tracked and untracked-not-ignored files."""
    listing = git("ls-files", "-z", "--cached", "--others", "--exclude-standard")
    total = 0
    for name in filter(None, listing.split("\0")):
        path = ROOT / name
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


# --- wheels ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Wheel:
    path: Path
    distribution: str  # normalized: lower case, "_" for runs of "-_."
    version: str
    python: tuple
    abi: tuple
    platform: tuple

    @classmethod
    def parse(cls, path) -> Wheel | None:
        path = Path(path)
        if path.suffix != ".whl":
            return None
        parts = path.name[:-4].split("-")
        if len(parts) not in (5, 6):
            return None
        dist, version, *_, python, abi, platform = parts
        return cls(path, re.sub(r"[-_.]+", "_", dist).lower(), version, tuple(python.split(".")),
                   tuple(abi.split(".")), tuple(platform.split(".")))

    def fits(self, python_version: str) -> bool:
        """Installable on CPython ``python_version`` (X.Y), Linux x86-64 (glibc)."""
        major, minor = (int(n) for n in python_version.split("."))
        cp = f"cp{major}{minor}"
        stable = [int(p[3:]) for p in self.python if re.fullmatch(rf"cp{major}\d+", p)]
        python_ok = (cp in self.python or f"py{major}" in self.python
                     or ("abi3" in self.abi and any(n <= minor for n in stable)))
        abi_ok = "none" in self.abi or "abi3" in self.abi or cp in self.abi
        platform_ok = "any" in self.platform or any(
            p.startswith("manylinux") and p.endswith("_x86_64") for p in self.platform)
        return python_ok and abi_ok and platform_ok


def pinned_versions() -> dict[str, str]:
    """The versions installed here of the distributions the kit carries."""
    return {name: metadata.version(name) for name in WHEELS}


def select_wheel(directory: Path, name: str, version: str, python_version: str) -> Path:
    normalized = re.sub(r"[-_.]+", "_", name).lower()
    found = [w for w in map(Wheel.parse, sorted(Path(directory).glob("*.whl")))
             if w and w.distribution == normalized and w.version == version and w.fits(python_version)]
    if not found:
        raise RuntimeError(f"no wheel of {name}=={version} for CPython {python_version}, Linux x86-64, "
                           f"in {directory}")
    return found[0].path


def fetch_wheels(dest: Path, python_version: str = TARGET_PYTHON, wheels_from: Path | None = None,
                 pins: dict | None = None) -> list[Path]:
    """One wheel per carried distribution, pinned to the version installed here, for CPython
    ``python_version`` on manylinux x86-64, copied into ``dest``: from the folder
    ``wheels_from``, else downloaded by pip."""
    pins = pins or pinned_versions()
    dest.mkdir(parents=True, exist_ok=True)
    chosen = []
    with tempfile.TemporaryDirectory(prefix="gpu-kit-wheels-") as tmp:
        source = Path(wheels_from) if wheels_from else Path(tmp)
        for name, version in pins.items():
            if not wheels_from:
                command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                           "--only-binary=:all:", "--python-version", python_version,
                           "--implementation", "cp", *[f"--platform={p}" for p in PLATFORMS],
                           "-d", tmp, f"{name}=={version}"]
                done = subprocess.run(command, capture_output=True, text=True, timeout=300)
                if done.returncode != 0:
                    raise RuntimeError(f"pip download {name}=={version} for CPython {python_version} "
                                       f"failed (no network? then --wheels-from DIR):\n"
                                       f"{done.stdout}{done.stderr}")
            wheel = select_wheel(source, name, version, python_version)
            shutil.copyfile(wheel, dest / wheel.name)
            chosen.append(dest / wheel.name)
    return chosen


# --- prepare ---------------------------------------------------------------------------------

def pipeline_specs(names=None, targets=("cuda", "host", "vulkan")):
    """The CUDA and Vulkan builds of every sample pipeline, and the host builds (the tests'
    session fixture loads every host pipeline), both runtimes each."""
    from pipelines.build import RUNTIMES, Build, generator_names

    names = names or generator_names()
    return [Build(n, t, r) for t in targets for n in names for r in RUNTIMES]


def prepare_pipelines(kit: Path, names=None, jobs=None) -> list[dict]:
    """Build (into the build cache, reusing it) and copy into kit/pipelines, with the halide
    version stamp the carried libraries are found by."""
    from pipelines.build import build_all, cache_dir, installed_halide_version, record_halide_version

    version = installed_halide_version()
    if version is None:
        raise RuntimeError("prepare builds the pipelines: it needs halide (pip install halide==21.0.0)")
    out = kit / "pipelines"
    if out.resolve() == cache_dir().resolve():
        raise RuntimeError(f"the build cache ({cache_dir()}) is the kit's own folder: unset "
                           "HALIDE_SHIM_PIPELINES for prepare")
    specs = pipeline_specs(names)
    paths = build_all(specs, jobs=jobs, progress=log)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for spec in specs:
        source = paths[spec]
        shutil.copyfile(source, out / source.name)
        entries.append({"file": source.name, "name": spec.name, "target": spec.target,
                        "runtime": spec.runtime, "bytes": source.stat().st_size})
    record_halide_version(out, version)
    return entries


def prepare_own_pipeline(kit: Path) -> dict:
    """docs/own-pipeline.md's CUDA libraries, made by the page's own commands (its generator and
    its CUDA shell blocks, tests/support/own_pipeline.py) in kit/own-pipeline, with the kit's
    native module: run's own-pipeline step runs the page's CUDA examples on them."""
    sys.path.insert(0, str(ROOT / "tests"))
    from support import own_pipeline

    out = kit / "own-pipeline"
    out.mkdir()
    failed = {key: outcome for key, outcome in
              own_pipeline.build(out, own_pipeline.uses_cuda,
                                 HALIDE_SHIM_NATIVE=str(kit / "native" / "_native.abi3.so")).items()
              if outcome is not None}
    if failed:
        raise RuntimeError(f"docs/own-pipeline.md's CUDA commands failed: {failed}")
    files = sorted(p for p in out.rglob("*") if p.is_file())
    return {"page_sha256": sha256(own_pipeline.PAGE),
            "files": [{"file": str(p.relative_to(kit)), "bytes": p.stat().st_size} for p in files]}


def prepare_native(kit: Path, how: str) -> dict:
    """shim._native for the kit: built from this tree's sources ("build", into a temporary
    folder: the tree's own shim/_native*.so is left alone) or copied from shim/ ("copy"). Its
    stamp goes into the manifest: a module that would not import with this tree fails prepare,
    one built from other C files than this tree's is a warning."""
    out = kit / "native"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "_native.abi3.so"
    if how == "build":
        with tempfile.TemporaryDirectory(prefix="gpu-kit-native-") as tmp:
            command = [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", tmp,
                       "--build-temp", str(Path(tmp) / "temp")]
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
            built = sorted((Path(tmp) / "shim").glob("_native*.so"))
            if done.returncode != 0 or not built:
                raise RuntimeError(f"building shim._native failed ({' '.join(command)}); "
                                   f"--native copy takes shim/'s instead:\n{done.stdout}{done.stderr}")
            library = built[0]
            _check_abi3(library)
            shutil.copyfile(library, path)
    else:
        candidates = sorted((ROOT / "shim").glob("_native*.so"))
        if not candidates:
            raise RuntimeError("shim/ has no compiled _native module: pip install -e . first, "
                               "or --native build")
        library = candidates[0]
        _check_abi3(library)
        shutil.copyfile(library, path)
    stamp = native_stamp.read(path)
    problems = native_stamp.problems(stamp, package_module("_version.py").__version__, ROOT)
    if problems:
        raise RuntimeError(f"{library} would not import with this tree: {'; '.join(problems)} "
                           "(--native build makes a fresh one)")
    stale = native_stamp.changes(stamp["sources"], native_stamp.digests(ROOT))
    if stale:
        log(f"WARNING: {library} was built from other sources than this tree's "
            f"({', '.join(stale)}): the kit carries a stale native module (--native build makes "
            "a fresh one)")
    return {"file": "native/_native.abi3.so", "how": how, "bytes": path.stat().st_size,
            "sha256": sha256(path), "version": stamp["version"], "sources": stamp["sources"],
            "glibc": _glibc_needed(path)}


def _check_abi3(library: Path) -> None:
    if not library.name.endswith(".abi3.so"):
        raise RuntimeError(f"{library} is not a stable-ABI (abi3) module: it would not load on "
                           f"Python {TARGET_PYTHON}")


def _glibc_needed(library: Path) -> str | None:
    """The newest GLIBC_x.y symbol version a library asks for (objdump), if it can tell."""
    if not shutil.which("objdump"):
        return None
    done = subprocess.run(["objdump", "-T", str(library)], capture_output=True, text=True)
    versions = {tuple(int(n) for n in v.split(".")) for v in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", done.stdout)}
    return ".".join(map(str, max(versions))) if versions else None


def find_python(version: str, explicit: str | None = None) -> str | None:
    """An interpreter of ``version`` (X.Y) on this machine: ``explicit``, this one, python3.12
    on PATH, or one pyenv installed."""
    candidates = [explicit] if explicit else [
        sys.executable, shutil.which(f"python{version}"),
        *sorted(map(str, Path.home().glob(f".pyenv/versions/{version}*/bin/python{version}"))),
        f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"]
    for candidate in filter(None, candidates):
        try:
            done = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                  capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout.strip() == version:
            return candidate
    if explicit:
        raise RuntimeError(f"{explicit} is not a working Python {version}")
    return None


VERIFY_SCRIPT = """
import importlib.util, sys
sys.path.insert(0, sys.argv[1])
spec = importlib.util.spec_from_file_location("shim._native", sys.argv[2])
native = importlib.util.module_from_spec(spec)
spec.loader.exec_module(native)
assert hasattr(native.lib, "halide_copy_to_host"), "not the shim's native module"
import cffi, pycparser
cffi.FFI().cdef("int f(int);")  # pycparser at work, as pipelines/stock.py needs it
print(f"Python {sys.version.split()[0]}: shim._native loads; cffi {cffi.__version__}, "
      f"pycparser {pycparser.__version__} from the carried wheels")
"""


def verify_kit(kit: Path, python: str) -> str:
    """Install the kit's wheels offline into a temporary folder with ``python`` and load the
    native module with them: what run does first on the GPU machine."""
    with tempfile.TemporaryDirectory(prefix="gpu-kit-verify-") as site:
        wheels = sorted(str(p) for p in (kit / "wheels").glob("*.whl"))
        install = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                   "--no-cache-dir", "--upgrade", "--target", site, *wheels]
        done = subprocess.run(install, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"offline install of the kit's wheels with {python} failed:\n"
                               f"{done.stdout}{done.stderr}")
        done = subprocess.run([python, "-I", "-c", VERIFY_SCRIPT, site, str(kit / "native" / "_native.abi3.so")],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"the kit's native module or wheels do not load with {python}:\n"
                               f"{done.stdout}{done.stderr}")
        return done.stdout.strip()


def prepare(kit: Path, names=None, native="build", wheels_from=None, python_version=TARGET_PYTHON,
            verify="auto", budget_mib=BUDGET_MIB, jobs=None) -> dict:
    """Make the kit in ``kit`` (replacing an earlier one there); returns the manifest."""
    from noop_copies import build_harness
    from pipelines.build import installed_halide_version

    kit = Path(kit).resolve()
    if kit.exists():
        if any(kit.iterdir()) and not (kit / "manifest.json").exists():
            raise RuntimeError(f"{kit} exists and is not a GPU kit (no manifest.json): not replacing it")
        shutil.rmtree(kit)
    kit.mkdir(parents=True)
    timings = {}

    started = time.monotonic()
    log(f"== pipelines: CUDA and host builds, both runtimes, into {kit / 'pipelines'}")
    pipelines = prepare_pipelines(kit, names, jobs)
    timings["pipelines"] = time.monotonic() - started

    started = time.monotonic()
    log(f"== native module ({native})")
    native_entry = prepare_native(kit, native)
    timings["native"] = time.monotonic() - started

    started = time.monotonic()
    log("== docs/own-pipeline.md's CUDA builds, by its commands")
    own = prepare_own_pipeline(kit)
    timings["own-pipeline"] = time.monotonic() - started

    started = time.monotonic()
    log("== benchmark harness")
    harness = build_harness(kit / "benchmarks")
    timings["harness"] = time.monotonic() - started

    started = time.monotonic()
    pins = pinned_versions()
    log(f"== wheels for CPython {python_version}: "
        + ", ".join(f"{n}=={v}" for n, v in pins.items())
        + (f" from {wheels_from}" if wheels_from else " (pip download)"))
    wheels = fetch_wheels(kit / "wheels", python_version, wheels_from, pins)
    timings["wheels"] = time.monotonic() - started

    started = time.monotonic()
    verified = "not checked (--verify no)"
    if verify != "no":
        python = find_python(python_version, None if verify == "auto" else verify)
        if python:
            log(f"== check: offline install of the wheels and the native module, with {python}")
            verified = verify_kit(kit, python)
            log(verified)
        else:
            verified = (f"not checked: no Python {python_version} here (the module is abi3, "
                        f"glibc {native_entry['glibc']} or newer)")
            log(verified)
    timings["verify"] = time.monotonic() - started

    size = folder_size(kit)
    travel = size + tree_size()
    manifest = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git_commit": git("rev-parse", "HEAD"),
        "git_modified_paths": git("diff", "--name-only", "HEAD").splitlines(),
        "halide_version": installed_halide_version(),
        "built_with_python": sys.version.split()[0],
        "target_python": python_version,
        "native": native_entry,
        "verified": verified,
        "harness": {"file": f"benchmarks/{harness.name}", "bytes": harness.stat().st_size},
        "wheels": [{"file": f"wheels/{w.name}", "bytes": w.stat().st_size, "sha256": sha256(w)} for w in wheels],
        "pipelines": pipelines,
        "own_pipeline": own,
        "bytes": size,
        "budget_bytes": budget_mib * 2**20,
        "travel_bytes": travel,
        "seconds": {k: round(v, 1) for k, v in timings.items()},
    }
    for _ in range(3):  # "bytes" counts the manifest too
        (kit / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        if manifest["bytes"] == folder_size(kit):
            break
        manifest["bytes"] = size = folder_size(kit)
        manifest["travel_bytes"] = travel = size + tree_size()
    log(f"== kit: {kit}: {len(pipelines)} pipeline libraries, {len(wheels)} wheels, "
        f"{mib(size)} (budget {budget_mib} MiB); with the working tree {mib(travel)} travels "
        f"(limit {TRAVEL_LIMIT_MIB} MiB)")
    if size > budget_mib * 2**20:
        raise RuntimeError(f"the kit is {mib(size)}, over its budget of {budget_mib} MiB")
    if travel > TRAVEL_LIMIT_MIB * 2**20:
        raise RuntimeError(f"the working tree and the kit are {mib(travel)}: over the "
                           f"{TRAVEL_LIMIT_MIB} MiB that can travel")
    return manifest


# --- run ---------------------------------------------------------------------------------------

SITECUSTOMIZE = '''"""Written by benchmarks/gpu_kit.py: these packages count as not installed."""
import importlib.machinery
import importlib.util
import os
import sys

for _name in {names!r}:
    sys.modules[_name] = None  # import raises ImportError, find_spec returns None

# The interpreter's own sitecustomize, if it has one, still runs.
_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here])
if _spec is not None and _spec.loader is not None:
    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
'''

ENV_SCRIPT = """
import importlib.util, json, sys
from importlib import metadata
info = {"python": sys.version.split()[0], "executable": sys.executable, "importable": {}}
for module in ("halide", "pyopencl", "cffi", "torch", "cupy", "cuda.bindings"):
    try:
        info["importable"][module] = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        info["importable"][module] = False
for dist in ("torch", "cupy-cuda13x", "cupy-cuda12x", "cupy", "cuda-bindings", "cuda-core",
             "cuda-python", "numpy", "cffi", "pycparser", "pytest", "pytest-timeout"):
    try:
        info[dist] = metadata.version(dist)
    except metadata.PackageNotFoundError:
        pass
reason = "shim did not import"
try:
    import shim
    from shim.backends import cuda
    info["shim native module"] = shim.native._native.__file__
    info["shim version"] = shim.__version__
    info["shim.devices()"] = shim.devices()
    reason = cuda.unavailable_reason()
    info["CUDA unavailable because"] = reason
    if reason is None:
        device = shim.device("cuda")
        info["shim CUDA device"] = device.name
        info["compute capability"] = device.compute_capability()
finally:
    try:
        import torch
        info["torch.cuda.is_available()"] = torch.cuda.is_available()
        info["torch.version.cuda"] = torch.version.cuda
    except Exception as e:
        info["torch"] = repr(e)
    print(json.dumps(info, indent=1, default=str))
    print("GPU_KIT_CUDA_REASON=" + json.dumps(reason))
"""


@dataclass
class Step:
    name: str
    what: str
    commands: list  # argv lists, run in turn
    timeout: float
    log: str
    kind: str = "pytest"  # pytest | benchmark | env
    needs_cuda: bool = False
    result: dict = field(default_factory=dict)


def pytest_command(junit: Path, *args) -> list:
    command = [sys.executable, "-m", "pytest", "-v", "-rfEs", "-p", "no:cacheprovider",
               f"--junitxml={junit}", *args]
    import importlib.util

    if importlib.util.find_spec("pytest_timeout"):
        command.append("--timeout=120")  # one hanging test does not take the whole step
    return command


def make_steps(work: Path) -> list[Step]:
    py = sys.executable
    return [
        Step("env", "nvidia-smi -L, versions, shim.devices()",
             [["nvidia-smi", "-L"], [py, "-c", ENV_SCRIPT]], 90, "env.log", kind="env"),
        Step("cuda-tests", "the GPU suites (tests/test_gpu_backends.py, tests/test_cuda.py) and "
             "the conformance table on CUDA",
             [pytest_command(work / "cuda-tests.xml", "tests/test_gpu_backends.py", "tests/test_cuda.py",
                             "tests/test_device_conformance.py", "-k", "cuda")], 180, "tests.log"),
        Step("interop", "DLPack with torch and CuPy on the GPU (tests/test_cuda_interop.py)",
             [pytest_command(work / "interop.xml", "tests/test_cuda_interop.py")], 120, "tests.log"),
        Step("seed-crop", "seed 001: realizing into crops on CUDA (tests/test_crops.py -k cuda)",
             [pytest_command(work / "seed-crop.xml", "tests/test_crops.py", "-k", "cuda")], 60,
             "tests.log"),
        Step("vulkan-tests", "the GPU suite, the conformance table and tests/test_vulkan.py on "
             "the GPU's Vulkan driver, where it has one (they skip, saying why, where not)",
             [pytest_command(work / "vulkan-tests.xml", "tests/test_gpu_backends.py",
                             "tests/test_vulkan.py", "tests/test_device_conformance.py",
                             "-k", "vulkan or test_vulkan")], 240, "tests.log"),
        Step("own-pipeline", "docs/own-pipeline.md's CUDA examples, on the libraries its "
             "commands built (tests/test_own_pipeline.py)",
             [pytest_command(work / "own-pipeline.xml", "tests/test_own_pipeline.py")], 90,
             "tests.log"),
        Step("host-side", "the default device; prebuilt pipelines without pyopencl or halide",
             [pytest_command(work / "host-side.xml", "tests/test_default_device.py",
                             "tests/test_light_install.py")], 90, "tests.log"),
        Step("bench-gpu", "launches on resident data, stock runtime vs shim, CUDA",
             [[py, str(HERE / "gpu_pipelines.py"), "--device", "cuda", "--repeats", "7"]], 180,
             "benchmarks.log", kind="benchmark", needs_cuda=True),
        Step("bench-reuse", "allocating calls with allocation reuse on and off, stock vs shim, CUDA",
             [[py, str(HERE / "allocation_reuse.py"), "--device", "cuda", "--repeats", "7"]], 150,
             "benchmarks.log", kind="benchmark", needs_cuda=True),
        Step("bench-noop", "no-op copies, stock runtime vs shim",
             [[py, str(HERE / "noop_copies.py"), "--repeats", "15"]], 120, "benchmarks.log",
             kind="benchmark"),
    ]


def figures(step: Step, output: str) -> list[str]:
    """The benchmark's report: its table, without the progress lines before it."""
    lines = output.splitlines()
    marker = "device:" if step.name in ("bench-gpu", "bench-reuse") else "operation"
    for i, line in enumerate(lines):
        if line.startswith(marker):
            return [line for line in lines[i:] if line.strip()]
    return []


def install_wheels(kit: Path, site: Path) -> list[str]:
    """Install (offline, into ``site``) the carried wheels this interpreter lacks."""
    import importlib.util

    notes, todo = [], []
    for wheel in sorted((kit / "wheels").glob("*.whl")):
        parsed = Wheel.parse(wheel)
        module = MODULES.get(parsed.distribution if parsed else "", parsed.distribution if parsed else "")
        if importlib.util.find_spec(module) is not None:
            notes.append(f"{wheel.name}: not needed, {module} is installed")
        else:
            todo.append(wheel)
    if todo:
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                   "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, todo)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"offline install of {', '.join(w.name for w in todo)} failed:\n"
                               f"{done.stdout}{done.stderr}")
        notes += [f"{w.name}: installed into {site}" for w in todo]
    return notes


def kit_warnings(kit: Path, manifest: dict) -> list[str]:
    """What in this tree no longer matches the kit."""
    from pipelines.build import Build

    warnings = []
    built_from = manifest.get("native", {}).get("sources")
    if built_from is None:
        warnings.append("the manifest does not say what the kit's native module was built from "
                        "(a kit from before native stamps): run prepare again")
    elif changed := native_stamp.changes(built_from, native_stamp.digests(ROOT)):
        warnings.append(f"the kit's native module was built from other native_stubs/abi sources than "
                        f"this tree's ({', '.join(changed)}): run prepare again")
    stale = []
    for entry in manifest.get("pipelines", []):
        spec = Build(entry["name"], entry["target"], entry["runtime"])
        if spec.path(kit / "pipelines", manifest["halide_version"]).name != entry["file"]:
            stale.append(f"{entry['name']}/{entry['target']}/{entry['runtime']}")
    if stale:
        warnings.append(f"generator source changed since prepare, these cannot be used: {', '.join(stale)}")
    own = manifest.get("own_pipeline")
    if own is None:
        warnings.append("the kit has no builds of docs/own-pipeline.md (a kit from before "
                        "them): run prepare again")
    elif own["page_sha256"] != sha256(ROOT / "docs" / "own-pipeline.md"):
        warnings.append("docs/own-pipeline.md changed since prepare: its CUDA examples run on "
                        "the builds of the page as it was then (run prepare again)")
    return warnings


# The exit status of a run that found no CUDA device: a check that ran nothing on a GPU must not
# look like one that passed.
NOTHING_RUN = 3


def run(kit: Path, out: Path, steps: list[str] | None = None, block=("halide", "pyopencl"),
        budget_seconds: float = 450, dry_run: bool = False) -> int:
    """Run the checks from ``kit``; logs and summary.txt in ``out``. Returns the exit status."""
    deadline = time.monotonic() + budget_seconds
    kit, out = Path(kit).resolve(), Path(out).resolve()
    manifest_path = kit / "manifest.json"
    if not manifest_path.exists():
        log(f"no GPU kit at {kit}: run `python benchmarks/gpu_kit.py prepare` where halide is installed, "
            "and carry the folder")
        return 2
    manifest = json.loads(manifest_path.read_text())
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-kit-run-"))
    site, blocker = work / "site", work / "block"
    site.mkdir()
    blocker.mkdir()
    blocked = [b for b in block if b]
    (blocker / "sitecustomize.py").write_text(SITECUSTOMIZE.format(names=blocked))

    log(f"== kit {kit}: commit {manifest['git_commit'][:12]}, halide {manifest['halide_version']}, "
        f"made {manifest['created']}; logs in {out}")
    setup = install_wheels(kit, site)
    for line in setup:
        log(line)
    warnings = kit_warnings(kit, manifest)
    for line in warnings:
        log(f"WARNING: {line}")

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(blocker) if blocked else "", str(site), str(ROOT), env.get("PYTHONPATH", "")]).strip(os.pathsep)
    env["PYTHONPATH"] = os.pathsep.join(p for p in env["PYTHONPATH"].split(os.pathsep) if p)
    env.update(PYTHONUNBUFFERED="1", HALIDE_SHIM_NATIVE=str(kit / "native" / "_native.abi3.so"),
               HALIDE_SHIM_PIPELINES=str(kit / "pipelines"),
               HALIDE_SHIM_OWN_PIPELINE=str(kit / "own-pipeline"),
               HALIDE_SHIM_BENCHMARK_BUILD=str(kit / "benchmarks"))
    shutil.copyfile(manifest_path, out / "manifest.json")

    all_steps = make_steps(work)
    chosen = [s for s in all_steps if not steps or s.name in steps]
    unknown = set(steps or ()) - {s.name for s in all_steps}
    if unknown:
        log(f"unknown steps: {', '.join(sorted(unknown))}; known: {', '.join(s.name for s in all_steps)}")
        return 2
    cuda_reason, gpu_listed = "the env step did not run", False
    logs = {}
    try:
        for step in chosen:
            log_file = logs.get(step.log) or open(out / step.log, "w")
            logs[step.log] = log_file
            header = f"\n== {step.name}: {step.what}\n"
            sys.stdout.write(header)
            log_file.write(header)
            if step.needs_cuda and cuda_reason:
                step.result = {"status": "skipped", "seconds": 0.0, "reason": f"no CUDA device: {cuda_reason}"}
                message = f"skipped: no CUDA device: {cuda_reason}\n"
                sys.stdout.write(message)
                log_file.write(message)
                continue
            left = deadline - time.monotonic()
            if left < 10:
                step.result = {"status": "not run", "seconds": 0.0, "reason": "the run's time budget is spent"}
                log("not run: the run's time budget is spent")
                continue
            status, seconds, output = "passed", 0.0, ""
            for command in step.commands:
                code, text, took = stream(command, env, min(step.timeout - seconds, left - seconds), log_file)
                seconds += took
                output += text
                if code is None:
                    status = "timeout"
                    break
                if code != 0 and not (step.kind == "env" and command[0] == "nvidia-smi"):
                    status = "failed"
            step.result = {"status": status, "seconds": round(seconds, 1)}
            if step.kind == "env":
                found = re.search(r"^GPU_KIT_CUDA_REASON=(.*)$", output, re.M)
                cuda_reason = json.loads(found.group(1)) if found else "shim did not import"
                gpu_listed = bool(re.search(r"^GPU \d+:", output, re.M))
                step.result["cuda"] = "available" if cuda_reason is None else cuda_reason
            elif step.kind == "pytest":
                counts = junit_counts(work / f"{step.name}.xml")
                step.result.update(counts)
                if status == "failed" and counts["failed"] + counts["errors"] == 0:
                    step.result["reason"] = "pytest failed before running tests (see the log)"
            else:
                step.result["figures"] = figures(step, output)
    finally:
        for log_file in logs.values():
            log_file.close()

    failed = [s.name for s in chosen if s.result.get("status") in ("failed", "timeout")]
    if gpu_listed and cuda_reason:
        failed.append("env")  # nvidia-smi sees a GPU, the shim does not
        warnings.append(f"nvidia-smi lists a GPU but the shim has no CUDA device: {cuda_reason}")
    summary = summarize(manifest, chosen, setup, warnings, failed, time.monotonic() - (deadline - budget_seconds))
    (out / "summary.txt").write_text(summary)
    (out / "summary.json").write_text(json.dumps(
        {"failed_steps": failed, "warnings": warnings, "setup": setup,
         "steps": {s.name: s.result for s in chosen}}, indent=1) + "\n")
    log("\n" + summary)
    shutil.rmtree(work, ignore_errors=True)
    if failed:
        return 1
    if cuda_reason and not dry_run:
        log(f"no GPU: nothing run on a GPU ({cuda_reason}); --dry-run checks the kit without one")
        return NOTHING_RUN
    return 0


def summarize(manifest, steps, setup, warnings, failed, seconds) -> str:
    lines = [f"GPU kit run: {'FAILED: ' + ', '.join(failed) if failed else 'ok'} in {seconds:.0f} s",
             f"kit: commit {manifest['git_commit'][:12]}"
             f"{' (+' + str(len(manifest['git_modified_paths'])) + ' modified paths)' if manifest['git_modified_paths'] else ''}"
             f", halide {manifest['halide_version']}, {len(manifest['pipelines'])} pipelines, "
             f"{mib(manifest['bytes'])}, made {manifest['created']}"]
    lines += [f"setup: {line}" for line in setup]
    lines += [f"WARNING: {line}" for line in warnings]
    lines.append("")
    lines.append(f"{'step':<12}{'status':<10}{'seconds':>8}  counts")
    for step in steps:
        r = step.result
        counts = (f"{r['passed']} passed, {r['failed']} failed, {r['errors']} errors, {r['skipped']} skipped"
                  if "passed" in r else r.get("cuda") and f"CUDA: {r['cuda']}" or "")
        lines.append(f"{step.name:<12}{r.get('status', '?'):<10}{r.get('seconds', 0):>8.1f}  {counts}")
        if r.get("reason"):
            lines.append(f"{'':<32}{r['reason']}")
    for step in steps:
        r = step.result
        for reason, n in r.get("skip_reasons", {}).items():
            lines.append(f"  {step.name}: {n} skipped: {reason}")
        for test in r.get("failures", []):
            lines.append(f"  {step.name}: FAILED {test}")
    for step in steps:
        if step.result.get("figures"):
            lines += ["", f"{step.name}: {step.what}", *step.result["figures"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/gpu_kit.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("prepare", help="make the kit (here: needs halide, a C compiler, pip)")
    p.add_argument("--out", type=Path, default=DEFAULT_KIT, help="the kit's folder (default .gpukit)")
    p.add_argument("--pipelines", help="comma-separated subset of the sample pipelines (default: all)")
    p.add_argument("--native", choices=("build", "copy"), default="build",
                   help="build shim._native from this tree's sources (default) or copy shim/'s")
    p.add_argument("--wheels-from", type=Path, help="take the wheels from this folder instead of pip download")
    p.add_argument("--python-version", default=TARGET_PYTHON, help="the target's Python (default 3.12)")
    p.add_argument("--verify", default="auto",
                   help="'auto' (a Python of the target version, if one is here), 'no', or an interpreter")
    p.add_argument("--budget-mib", type=float, default=BUDGET_MIB)
    p.add_argument("-j", "--jobs", type=int, help="parallel pipeline builds (default: one per core)")
    r = commands.add_parser("run", help="run the checks from a kit (there: offline, python3)")
    r.add_argument("--kit", type=Path, default=DEFAULT_KIT)
    r.add_argument("--out", type=Path, help="logs and summary (default $OUT, else build/gpu-kit)")
    r.add_argument("--steps", help="comma-separated subset of: " + ", ".join(s.name for s in make_steps(Path("."))))
    r.add_argument("--block", default="halide,pyopencl",
                   help="packages made unimportable for the checks (default halide,pyopencl; '' for none)")
    r.add_argument("--budget-seconds", type=float, default=450, help="all steps together (default 450)")
    r.add_argument("--dry-run", action="store_true",
                   help="a machine without a CUDA device is expected: exit 0 if the rest passed "
                        "(without it, such a run exits 3: nothing ran on a GPU)")
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            names = args.pipelines.split(",") if args.pipelines else None
            prepare(args.out, names, args.native, args.wheels_from, args.python_version, args.verify,
                    args.budget_mib, args.jobs)
            return 0
        out = args.out or Path(os.environ.get("OUT") or DEFAULT_OUT)
        steps = args.steps.split(",") if args.steps else None
        return run(args.kit, out, steps, tuple(args.block.split(",")), args.budget_seconds,
                   args.dry_run)
    except RuntimeError as e:
        print(f"gpu_kit {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
