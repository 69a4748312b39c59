"""pipelines/build.py (shim.pipelines.build): cache keys and the command line."""

import ast
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from shim.pipelines import build as build_module
from shim.pipelines.build import Build, generator_names
from support.forks import exit_code_of_child_forked_while_held

ROOT = Path(__file__).resolve().parent.parent


def test_every_required_sample_pipeline_exists():
    assert {"brighten", "blur3x3", "mix", "sum_diff", "histogram", "crop_fill"} <= set(generator_names())


def test_cache_key_depends_on_target_and_runtime():
    keys = {Build("brighten", t, r).key() for t in ("host", "opencl", "cuda")
            for r in ("bundled", "no_runtime")}
    assert len(keys) == 6


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="unknown pipeline"):
        Build("nope")
    with pytest.raises(ValueError, match="unknown target"):
        Build("brighten", "metal")


def test_cached_builds_are_reused(host_pipelines):
    path = host_pipelines["brighten", "bundled"]
    before = path.stat().st_mtime_ns
    done = subprocess.run([sys.executable, "-m", "shim.pipelines.build", "brighten", "--runtime", "bundled"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(path)
    assert path.stat().st_mtime_ns == before


def test_command_line_errors_are_argparse_errors():
    done = subprocess.run([sys.executable, "-m", "shim.pipelines.build", "nope"], capture_output=True,
                          text=True)
    assert done.returncode == 2 and "unknown pipeline(s): nope" in done.stderr


def test_a_process_without_the_shim_imports_the_tool_by_the_folders_name(host_pipelines):
    """What a process that runs Halide's stock runtime does: it imports the checkout's
    pipelines/ as pipelines, and finds the libraries without loading the shim."""
    script = ("import sys\n"
              "from pipelines.build import Build, build\n"
              "print(build(Build('brighten', 'host', 'bundled')))\n"
              "assert not [m for m in sys.modules if m.split('.')[0] == 'shim'], 'the shim is loaded'")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(host_pipelines["brighten", "bundled"])


# --- prebuilt libraries without halide (the GPU check kit) ----------------------------------

@pytest.fixture
def prebuilt(tmp_path, host_pipelines):
    """A directory holding brighten's bundled host build, as `shim.pipelines.build --out` leaves it."""
    done = subprocess.run([sys.executable, "-m", "shim.pipelines.build", "brighten", "--runtime", "bundled",
                           "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return tmp_path, Path(done.stdout.splitlines()[-1])


def test_a_build_records_the_halide_version(prebuilt):
    from importlib import metadata

    directory, _ = prebuilt
    assert (directory / "HALIDE_VERSION").read_text().strip() == metadata.version("halide")


def test_prebuilt_libraries_are_found_without_halide(prebuilt):
    directory, library = prebuilt
    script = ("import sys; sys.modules['halide'] = None\n"
              "from shim.pipelines.build import Build, build\n"
              "print(build(Build('brighten', 'host', 'bundled'), sys.argv[1]))")
    done = subprocess.run([sys.executable, "-c", script, str(directory)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(library)


def test_without_halide_a_library_of_changed_source_is_not_used(prebuilt, tmp_path, monkeypatch):
    directory, library = prebuilt
    generators = tmp_path / "generators"
    shutil.copytree(build_module.GENERATORS_DIR, generators)
    with open(generators / "brighten.py", "a") as f:
        f.write("\n# changed\n")
    monkeypatch.setattr(build_module, "GENERATORS_DIR", generators)
    monkeypatch.setattr(build_module, "installed_halide_version", lambda: None)
    with pytest.raises(build_module.MissingLibrary) as e:
        build_module.build(Build("brighten", "host", "bundled"), directory)
    message = str(e.value)
    assert "brighten-host-bundled-" in message and "halide is not installed" in message
    assert library.name in message  # the one there, built from other source
    assert library.exists()


def test_without_halide_or_a_version_stamp_the_error_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(build_module, "installed_halide_version", lambda: None)
    with pytest.raises(build_module.MissingLibrary, match="has no HALIDE_VERSION file"):
        build_module.build(Build("brighten"), tmp_path)
    with pytest.raises(build_module.MissingLibrary, match="halide is not installed"):
        build_module.build_all([Build("brighten")], tmp_path / "elsewhere")


def test_target_features_get_their_own_builds():
    plain = Build("blur3x3")
    profiled = Build("blur3x3", features=("profile",))
    assert profiled.halide_target == "host-profile"
    assert Build("blur3x3", runtime="no_runtime", features="trace_realizations-profile").halide_target \
        == "host-profile-trace_realizations-no_runtime"
    # kept sorted and once each: one build whichever order they are given in
    assert Build("blur3x3", features=["trace_realizations", "profile", "profile"]) == \
        Build("blur3x3", features=("profile", "trace_realizations"))
    assert len({plain.key(), profiled.key(), Build("blur3x3", features=("trace_realizations",)).key()}) == 3
    assert profiled.path().name.startswith("blur3x3-host-profile-bundled-")
    assert plain.path().name.startswith("blur3x3-host-bundled-")  # (names of existing builds kept)
    for bad in ("Profile", "no_runtime", "", "a b", "profile--trace_all"):
        with pytest.raises(ValueError):
            Build("blur3x3", features=(bad,))
    for bad in (None, (1, "profile"), 5):  # named, not a TypeError from deep inside
        with pytest.raises(ValueError, match="features: expected a str or a sequence of str"):
            Build("blur3x3", features=bad)
    # one syntax everywhere: "profile-trace_all" inside a sequence too (--feature gives that)
    assert Build("blur3x3", features=("profile-trace_all",)).features == ("profile", "trace_all")


def test_command_line_adds_target_features(tmp_path):
    done = subprocess.run([sys.executable, "-m", "shim.pipelines.build", "brighten", "--runtime", "no_runtime",
                           "--feature", "profile", "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    library = Path(done.stdout.splitlines()[-1])
    assert library.name.startswith("brighten-host-profile-no_runtime-") and library.exists()
    import shim

    assert "profile" in shim.load(library).target.split("-")
    done = subprocess.run([sys.executable, "-m", "shim.pipelines.build", "brighten", "--feature", "Bad"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "bad target feature 'Bad'" in done.stderr


class _Overlaps:
    """A stand-in for ast.parse that notes how many threads are inside it at once (each
    stays 2 ms, so that threads running together overlap)."""

    def __init__(self, parse):
        self.parse, self.inside, self.most, self.calls = parse, 0, 0, 0
        self.lock = threading.Lock()

    def __call__(self, *args, **kwargs):
        with self.lock:
            self.inside += 1
            self.calls += 1
            self.most = max(self.most, self.inside)
        try:
            time.sleep(0.002)
            return self.parse(*args, **kwargs)
        finally:
            with self.lock:
                self.inside -= 1


@pytest.fixture
def fresh_generators(tmp_path, monkeypatch):
    """A copy of the generators folder the tool has never parsed, and ast.parse watched."""
    copy = tmp_path / "generators"
    shutil.copytree(build_module.GENERATORS_DIR, copy)
    monkeypatch.setattr(build_module, "GENERATORS_DIR", copy)
    overlaps = _Overlaps(ast.parse)
    monkeypatch.setattr(ast, "parse", overlaps)
    return overlaps


def test_generators_are_never_parsed_on_two_threads_at_once(fresh_generators):
    """CPython 3.11's ast.parse on several threads at once can raise SystemError ("AST
    constructor recursion depth mismatch"): on a fresh machine, build_all's threads did, and
    the suite ended in 9 errors."""
    start = threading.Barrier(8)
    results, errors = [], []

    def ask():
        start.wait()
        try:
            results.append(build_module.generator_modules())
        except Exception as e:  # (reported below, with the overlap count)
            errors.append(e)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and fresh_generators.most == 1
    assert len(results) == 8 and all(r == results[0] for r in results)
    assert set(results[0]) == set(generator_names())


def test_build_all_parses_the_generators_once(fresh_generators, tmp_path, monkeypatch):
    """Each of build_all's workers asks for the generator modules (cache keys, the module to
    run): one parse serves them all."""
    monkeypatch.setattr(build_module, "build", lambda spec, directory: spec.path(directory))
    specs = [Build(name, "host", runtime) for name in generator_names()[:6]
             for runtime in ("bundled", "no_runtime")]
    built = build_module.build_all(specs, tmp_path / "out", jobs=6, progress=None)
    assert set(built) == set(specs)
    files = len([p for p in build_module.GENERATORS_DIR.glob("*.py") if not p.stem.startswith("_")])
    assert fresh_generators.calls == files and fresh_generators.most == 1


def test_a_changed_generator_is_parsed_again(fresh_generators):
    before = build_module.generator_modules()
    extra = build_module.GENERATORS_DIR / "zz_extra.py"
    extra.write_text('GENERATOR_NAMES = ["zz_one", "zz_two"]\n')
    after = build_module.generator_modules()
    assert after == {**before, "zz_one": "zz_extra", "zz_two": "zz_extra"}


@pytest.mark.parametrize("lock, use", [
    ("_parse_lock", "generator_names()"),
    ("_temporary_lock", "_temporary_folder()"),
])
def test_a_child_forked_while_another_thread_holds_a_build_lock_goes_on(lock, use):
    """Another thread parsing the generators or making the temporary folder at the fork held
    its lock for good in the child, whose next build waited for it forever."""
    assert exit_code_of_child_forked_while_held("from shim.pipelines import build\n",
                                                f"build.{lock}", f"build.{use}") == 0
