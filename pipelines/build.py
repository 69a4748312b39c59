"""Build the sample pipelines into shared libraries.

    python -m shim.pipelines.build                 # every pipeline, host target, both runtimes
    python -m shim.pipelines.build blur3x3 --target opencl --runtime no_runtime
    python -m shim.pipelines.build blur3x3 --feature profile      # Halide's profiler built in
    python -m shim.pipelines.build --list

Each (pipeline, target, runtime, features) becomes one .so in the cache directory
($HALIDE_SHIM_PIPELINES, default ~/.cache/halide-shim/pipelines), named after a hash of the
generator's source, the target, the runtime choice and the halide version, so a build is
reused until one of them changes. ``runtime`` is "bundled" (Halide's default: the runtime
is compiled into the .so) or "no_runtime" (the .so needs the shim's runtime to load).
``features`` are Halide target features added to the target (``profile``,
``trace_realizations``, ...): such a build is named NAME-TARGET-FEATURE...-RUNTIME-HASH.so.

Prebuilt libraries are found without halide: each build records the halide version it used
in the directory (a ``HALIDE_VERSION`` file), and where halide is not installed the cache
keys take the version from there. The generator's source is still hashed, so a library built
from other source is never used; one that is missing then raises MissingLibrary, which says
that building it needs halide.
"""

from __future__ import annotations

import argparse
import ast
import atexit
import hashlib
import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

# This folder: pipelines/ beside shim/ in the source tree (the link shim/pipelines points to
# it), shim/pipelines/ once installed.
PIPELINES_DIR = Path(__file__).resolve().parent
GENERATORS_DIR = PIPELINES_DIR / "generators"

# Short names for the targets the project builds. CUDA's default PTX (sm_20) is older than
# any current driver accepts, so the cuda target asks for compute capability 6.1.
TARGETS = {
    "host": "host",
    "opencl": "host-opencl",
    "cuda": "host-cuda-cuda_capability_61",
    # Vulkan 1.3 with 8-, 16-bit integers and half floats in shaders: what lavapipe and current
    # GPU drivers offer, and what the sample pipelines' types need.
    "vulkan": "host-vulkan-vk_int8-vk_int16-vk_float16-vk_v13",
}
RUNTIMES = ("bundled", "no_runtime")

# Bump when the recipe below changes in a way that changes the output.
RECIPE_VERSION = "1"

# In a directory of built libraries: the halide version that built them.
VERSION_STAMP = "HALIDE_VERSION"

# How to get halide, which the shim does not install (it is 168 MB, and loading and calling
# pipelines does not need it): the package, or the extra that pins it.
GET_HALIDE = 'pip install halide==21.0.0 (the extra: pip install "halide-shim[pipelines]")'


class MissingLibrary(RuntimeError):
    """A library is not built, and it cannot be built here: halide is not installed."""


def generator_modules() -> dict[str, str]:
    """{generator name: module} for every generator in generators/. A module
    defines the generator of its own name, or those its GENERATOR_NAMES lists (read without
    importing the module, which would load Halide).

    Parsed once per state of the folder (the files' names, sizes and times), under a lock:
    CPython 3.11's ast.parse is not safe on several threads at once (it can raise SystemError
    "AST constructor recursion depth mismatch" when a garbage collection runs Python code on
    another thread meanwhile), and build_all's worker threads all ask for the modules."""
    paths = [path for path in sorted(GENERATORS_DIR.glob("*.py")) if not path.stem.startswith("_")]
    state = tuple((path.name, path.stat().st_size, path.stat().st_mtime_ns) for path in paths)
    with _parse_lock:
        known = _parsed.get(GENERATORS_DIR)
        if known is None or known[0] != state:
            modules = {}
            for path in paths:
                names = [path.stem]
                for node in ast.parse(path.read_text()).body:
                    if isinstance(node, ast.Assign) and any(
                            isinstance(t, ast.Name) and t.id == "GENERATOR_NAMES" for t in node.targets):
                        names = list(ast.literal_eval(node.value))
                modules.update({name: path.stem for name in names})
            known = _parsed[GENERATORS_DIR] = (state, modules)
    return dict(known[1])


# generators folder -> (its state, its modules), for generator_modules.
_parsed: dict[Path, tuple] = {}
_parse_lock = threading.Lock()


def generator_names() -> list[str]:
    return sorted(generator_modules())


def cache_dir() -> Path:
    """Where builds are kept: $HALIDE_SHIM_PIPELINES, else the caches' root's pipelines folder.
    (Used only if it passes shim/base/private_files.py's rule: see build_folder.)"""
    configured = os.environ.get("HALIDE_SHIM_PIPELINES")
    if configured:
        return Path(configured)
    return _private_files().cache_root() / "pipelines"


def _private_files():
    """shim/base/private_files.py, the rule every cache follows (and the caches' root). Imported as
    shim.pipelines.build, this module comes with the shim package. A process that runs
    Halide's stock runtime must not load the shim's (pipelines/stock.py): it imports this
    module from a checkout by the folder's own name, pipelines.build, and private_files.py
    (standard library only) is loaded from its file in shim/base/, beside the folder."""
    if __package__ == "shim.pipelines":
        from shim.base import private_files

        return private_files
    module = sys.modules.get("_halide_shim_private_files")
    if module is None:
        spec = importlib.util.spec_from_file_location(
            "_halide_shim_private_files", PIPELINES_DIR.parent / "shim" / "base" / "private_files.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[spec.name] = module
    return module


def build_folder(directory: Path | None = None):
    """The folder (a shim.base.private_files.PrivateFolder, open: use it in a ``with`` block) that
    builds go into and are loaded from: ``directory`` (default: cache_dir()), made if missing,
    where it passes the rule of shim/base/private_files.py (its .so files are loaded into the
    user's processes, so nobody else may be able to write there). Otherwise, after a warning
    that says why, a private temporary folder of this process's, removed at exit."""
    private_files = _private_files()
    folder = private_files.open_folder(
        cache_dir() if directory is None else directory,
        instead="Pipelines are built into a private temporary folder instead, for this "
                "process only.")
    if folder is None:
        temporary = _temporary_folder()
        if not _is_own_folder(temporary):
            # Gone (removed by the process this one was forked from, as it ended; or by a
            # cleaner of old files in /tmp), or taken since: never made again under that name,
            # which others saw in /tmp and may have taken, but anew, for this process.
            temporary = _temporary_folder(gone=temporary)
        try:
            folder = private_files.open_folder(temporary, create=False)
        except FileNotFoundError:
            folder = None  # (gone meanwhile: the next build makes another)
        if folder is None:
            raise RuntimeError(f"no private folder to build pipelines in: neither the cache nor "
                               f"{temporary} can be trusted (see the warnings)")
    return folder


def _temporary_folder(gone: str | None = None) -> str:
    """This process's private temporary build folder (made once, removed at exit by the
    process that made it; made anew where it is ``gone``)."""
    global _temporary
    with _temporary_lock:
        if _temporary is None or _temporary == gone:
            _temporary = tempfile.mkdtemp(prefix="halide-shim-pipelines-")
            atexit.register(_remove_temporary_folder, _temporary, os.getpid())
        return _temporary


def _is_own_folder(path: str) -> bool:
    """Whether ``path`` is a folder of this user's (a first look: open_folder decides)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()


def _remove_temporary_folder(path: str, owner: int) -> None:
    # Only by the process that made it: a child forked from it runs its exit handlers too, and
    # would leave the parent to make it again under a name others can see in /tmp (and take).
    if os.getpid() == owner:
        shutil.rmtree(path, ignore_errors=True)


_temporary: str | None = None
_temporary_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # Another thread of the parent may have held these at the fork (as it parsed the
    # generators or made the temporary folder): the child's are new.
    global _parse_lock, _temporary_lock
    _parse_lock, _temporary_lock = threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def installed_halide_version() -> str | None:
    """The version of the halide package this interpreter can import, or None. (An import
    that is blocked, ``sys.modules["halide"] = None``, counts as not installed.)"""
    try:
        if importlib.util.find_spec("halide") is None:
            return None
    except (ImportError, ValueError):
        return None
    try:
        return metadata.version("halide")
    except metadata.PackageNotFoundError:
        return None


def stamped_halide_version(directory: Path | None = None) -> str | None:
    """The halide version recorded in a directory of built libraries, or None (also where the
    directory cannot be used: see build_folder)."""
    try:
        folder = _private_files().open_folder(cache_dir() if directory is None else directory,
                                              create=False)
    except OSError:
        return None
    if folder is None:
        return None
    with folder:
        stamp = folder.read(VERSION_STAMP)
    return (stamp or b"").decode(errors="replace").strip() or None


def halide_version(directory: Path | None = None) -> str:
    """The halide version in the cache keys: the installed halide's, else the one recorded in
    ``directory`` (default: the cache directory) by the builds that made its libraries."""
    version = installed_halide_version() or stamped_halide_version(directory)
    if version is None:
        where = cache_dir() if directory is None else Path(directory)
        raise MissingLibrary(
            f"halide is not installed and {where} has no {VERSION_STAMP} file: without halide only "
            "prebuilt pipeline libraries can be used, from a directory a build wrote "
            "(python -m shim.pipelines.build --out DIR, or benchmarks/gpu_kit.py prepare); "
            f"to build them: {GET_HALIDE}")
    return version


def record_halide_version(directory: Path, version: str) -> None:
    """Write the version stamp into ``directory`` (atomically; unchanged if it says that)."""
    if stamped_halide_version(directory) == version:
        return
    folder = _private_files().open_folder(directory)
    if folder is not None:  # (refused, with a warning: nothing is loaded from there either)
        with folder:
            folder.write(VERSION_STAMP, (version + "\n").encode())


@dataclass(frozen=True)
class Build:
    """One shared library to build: a generator for a target, with or without its runtime,
    with Halide target features added (``features``: names such as "profile" or
    "trace_realizations", or one string "profile-trace_realizations"; kept sorted)."""

    name: str
    target: str = "host"
    runtime: str = "bundled"
    features: tuple[str, ...] = ()

    def __post_init__(self):
        given = self.features
        if isinstance(given, str):
            given = (given,) if given else ()
        if not isinstance(given, (tuple, list, set, frozenset)) or \
                not all(isinstance(f, str) for f in given):
            raise ValueError(f"features: expected a str or a sequence of str, got {given!r}")
        # ("profile-trace_all" and ("profile", "trace_all") alike, here and on the command line)
        features = tuple(sorted({f for text in given for f in text.split("-")}))
        for feature in features:
            if not _FEATURE.fullmatch(feature):
                raise ValueError(f"bad target feature {feature!r}: expected a Halide target "
                                 "feature's name, such as profile or trace_realizations")
            if feature == "no_runtime":
                raise ValueError("no_runtime is a runtime choice: pass runtime='no_runtime'")
        object.__setattr__(self, "features", features)
        if self.name not in generator_names():
            raise ValueError(f"unknown pipeline {self.name!r}; known: {', '.join(generator_names())}")
        if self.target not in TARGETS:
            raise ValueError(f"unknown target {self.target!r}; known: {', '.join(TARGETS)}")
        if self.runtime not in RUNTIMES:
            raise ValueError(f"unknown runtime {self.runtime!r}; known: {', '.join(RUNTIMES)}")

    @property
    def halide_target(self) -> str:
        target = "-".join((TARGETS[self.target], *self.features))
        return f"{target}-no_runtime" if self.runtime == "no_runtime" else target

    @property
    def variant(self) -> str:
        """The target and its added features, as the file name has them: host-profile."""
        return "-".join((self.target, *self.features))

    @property
    def module(self) -> str:
        return generator_modules()[self.name]

    def key(self, directory: Path | None = None, version: str | None = None) -> str:
        """Hash of the generator's source, the target, the runtime choice, the halide version
        (``version``, else halide_version(directory)) and the recipe."""
        digest = hashlib.sha256()
        for source in (GENERATORS_DIR / f"{self.module}.py", GENERATORS_DIR / "_schedule.py"):
            digest.update(source.read_bytes())
        version = version or halide_version(directory)
        digest.update(f"{self.halide_target}|{version}|{RECIPE_VERSION}".encode())
        return digest.hexdigest()[:12]

    def path(self, directory: Path | None = None, version: str | None = None) -> Path:
        directory = cache_dir() if directory is None else Path(directory)
        return directory / f"{self.name}-{self.variant}-{self.runtime}-{self.key(directory, version)}.so"


# A Halide target feature's name (Target::Feature's spelling in target strings).
_FEATURE = re.compile(r"[a-z][a-z0-9_]*")


def _missing(spec: Build, out: Path) -> MissingLibrary:
    others = sorted(p.name for p in out.parent.glob(f"{spec.name}-{spec.variant}-{spec.runtime}-*.so"))
    hint = (f" ({', '.join(others)} there was built from other generator source or for another "
            "halide version)" if others else "")
    return MissingLibrary(
        f"pipeline library {out.name} ({spec.name}, target {spec.variant}, runtime {spec.runtime}) "
        f"is not in {out.parent}{hint}, and halide is not installed: building it needs halide "
        f"({GET_HALIDE}), or bring it prebuilt (benchmarks/gpu_kit.py prepare)")


def build(spec: Build, directory: Path | None = None) -> Path:
    """The .so for ``spec``, compiling it unless an up-to-date one is cached (in
    build_folder(directory)). Without halide, only a cached one can be returned: else
    MissingLibrary."""
    with build_folder(directory) as folder:
        out = spec.path(folder.path)
        if folder.has(out.name):
            return out
        installed = installed_halide_version()
        if installed is None:
            raise _missing(spec, out)
        # Compiled in a folder of its own inside the checked one, not under $TMPDIR: what is
        # compiled there is cached and loaded, and $TMPDIR may be a folder others can write
        # (with no sticky bit, they could swap the folder for theirs mid-build).
        with tempfile.TemporaryDirectory(prefix=".tmp-build-", dir=folder.path) as tmp:
            # The generator runs as generators.NAME, this folder on the path: as
            # shim.pipelines.generators.NAME it would import the shim package first, loading
            # the shim's runtime into Halide's compiler for nothing. It runs in that private
            # folder: python -m puts the working directory first on the path, and a halide.py
            # or generators/ someone left in the caller's would be imported.
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(GENERATORS_DIR.parent), env.get("PYTHONPATH")]))
            # The tools' own temporary files too (gcc's collect2 and LTO resolution files, which
            # a link reads back): in $TMPDIR, they could be swapped for others' as the library is.
            env["TMPDIR"] = tmp
            library = compile_library(
                [sys.executable, "-m", f"generators.{spec.module}", "-g", spec.name,
                 "-f", spec.name], spec.halide_target, tmp, env)
            # Renamed into place: a concurrent reader never sees a half-written library.
            folder.write(out.name, library.read_bytes())
    record_halide_version(out.parent, installed)
    return out


class BuildFailed(RuntimeError):
    """A generator or the linker failed, or could not be started (the message has what it
    printed)."""


def compile_library(generator: list, target: str, folder, env: dict | None = None) -> Path:
    """A shared library of a Halide generator's pipeline, made in ``folder`` (empty) as users
    make one: ``generator`` (Halide's generator command line: the program, the flags choosing
    the generator and naming its pipeline, and its parameters as NAME=VALUE; not -o, -e or
    target=) run there for ``target``, and what it wrote linked by ``cc -shared`` ($CC). One
    target: Halide's object file (-e object). Several, comma-separated (a multitarget
    library: one object per target and the dispatcher that picks one at the first call): its
    static library (-e static_library), linked whole. Returns the library, named like the
    generator's output (FUNCTION.so); BuildFailed where the generator or the linker fails."""
    folder = Path(folder).absolute()  # (the tools run in it)
    several = "," in target
    _run([*map(str, generator), "-o", str(folder), "-e",
          "static_library" if several else "object", f"target={target}"], env, folder)
    written = sorted(folder.glob("*.a" if several else "*.o"))
    if len(written) != 1:
        raise BuildFailed(f"the generator wrote {', '.join(p.name for p in written) or 'nothing'} "
                          f"in {folder}: expected one {'static library' if several else 'object file'}")
    inputs = (["-Wl,--whole-archive", str(written[0]), "-Wl,--no-whole-archive"] if several
              else [str(written[0])])
    library = written[0].with_suffix(".so")
    compiler = (os.environ if env is None else env).get("CC", "cc")
    _run([compiler, "-shared", "-o", str(library), *inputs, "-lpthread", "-ldl", "-lm"], env, folder)
    return library


def _run(command, env, cwd):
    try:
        done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    except OSError as e:  # (no such program: no compiler, or a generator that is not one)
        raise BuildFailed(f"{' '.join(command)} could not start: {e}") from None
    if done.returncode != 0:
        raise BuildFailed(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")


def build_all(specs, directory=None, jobs=None, progress=print) -> dict[Build, Path]:
    """Build many specs in parallel (one compiler process per core); reports each as it ends."""
    specs = list(dict.fromkeys(specs))
    with build_folder(directory) as folder:
        directory = folder.path  # (where the cache was refused: this process's own folder)
        todo = [s for s in specs if not folder.has(s.path(directory).name)]
    results = {s: s.path(directory) for s in specs if s not in todo}
    installed = installed_halide_version()
    if installed is None and todo:
        error = _missing(todo[0], todo[0].path(directory))
        if len(todo) > 1:
            error.args = (f"{error} (and {len(todo) - 1} more: "
                          f"{', '.join(f'{s.name}/{s.variant}/{s.runtime}' for s in todo[1:])})",)
        raise error
    if installed is not None and results:
        # Directories filled before versions were recorded get their stamp here.
        record_halide_version(directory, installed)
    if not todo:
        return results
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        futures = {pool.submit(build, s, directory): s for s in todo}
        for done, future in enumerate(as_completed(futures), 1):
            spec = futures[future]
            results[spec] = future.result()
            if progress:
                progress(f"[{done}/{len(todo)}] built {spec.name} ({spec.variant}, {spec.runtime}) "
                         f"at {time.monotonic() - started:.1f}s")
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shim.pipelines.build", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="PIPELINE",
                        help=f"pipelines to build (default: all of {', '.join(generator_names())})")
    parser.add_argument("--target", action="append", choices=sorted(TARGETS),
                        help="target to build for; repeatable (default: host)")
    parser.add_argument("--runtime", action="append", choices=RUNTIMES,
                        help="bundled runtime or no_runtime; repeatable (default: both)")
    parser.add_argument("--feature", action="append", default=[], metavar="FEATURE",
                        help="Halide target feature to add to every build (profile, "
                             "trace_realizations, ...); repeatable")
    parser.add_argument("--out", type=Path, help="output directory (default: the cache directory)")
    parser.add_argument("-j", "--jobs", type=int, help="parallel builds (default: one per core)")
    parser.add_argument("--list", action="store_true", help="list the pipelines and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(generator_names()))
        return 0
    unknown = sorted(set(args.names) - set(generator_names()))
    if unknown:
        parser.error(f"unknown pipeline(s): {', '.join(unknown)}")
    try:
        specs = [Build(n, t, r, tuple(args.feature))
                 for n in (args.names or generator_names())
                 for t in (args.target or ["host"])
                 for r in (args.runtime or list(RUNTIMES))]
    except ValueError as e:
        parser.error(str(e))
    try:
        results = build_all(specs, args.out, args.jobs)
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    for spec in specs:
        print(results[spec])
    return 0


if __name__ == "__main__":
    sys.exit(main())
