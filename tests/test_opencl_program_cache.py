"""The on-disk cache of built OpenCL program binaries (shim/base/binary_cache.py, used by
shim/backends/opencl.py): a later process builds from the cache, damaged or refused entries are
rebuilt and replaced, changed sources and options miss, concurrent writers never leave a broken
entry, and the off switch works. Builds are counted (opencl.program_builds, or a build from
source made to fail), never timed. Each child process gets its own cache directory and its own
PoCL kernel cache, so nothing here depends on what earlier runs left behind."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shim.pipelines.build import Build, build_all
from shim.base import binary_cache
from shim.base import private_files
from shim.backends import opencl as opencl_backend

ROOT = Path(__file__).resolve().parent.parent
NAMES = ("brighten", "blur3x3")

# Runs one sample pipeline (argv: library, case name) in a fresh process, checks its results
# against numpy and prints how its programs were built. FORBID_SOURCE=1: a build from source
# fails the process, so its success proves that every program came from the cache.
CHILD = textwrap.dedent("""
    import json, os, sys
    import shim
    from shim.backends import opencl
    from gpu_cases import assert_matches_reference, cases

    if os.environ.get("FORBID_SOURCE") == "1":
        def refuse(self, source):
            raise AssertionError("built from source although the cache holds the binary")
        opencl.OpenCLBackend._build_from_source = refuse
    library, name = sys.argv[1:3]
    values, outputs, reference = cases()[name]
    results = shim.load(library)(**values, **{k: shape for k, (shape, _) in outputs.items()})
    results = results if isinstance(results, tuple) else (results,)
    expected = reference(values)
    for key, result in zip(outputs, results):
        assert_matches_reference(result.numpy(), expected[key])
    print(json.dumps(dict(opencl.program_builds)))
    """)


@pytest.fixture(scope="module")
def libraries(opencl):
    specs = [Build(name, "opencl", "no_runtime") for name in NAMES]
    return {spec.name: path for spec, path in build_all(specs, progress=None).items()}


@pytest.fixture
def cache_dir(tmp_path):
    return tmp_path / "programs"


def child_env(cache_dir, **extra):
    env = dict(os.environ)
    for name in ("HALIDE_SHIM_NO_PROGRAM_CACHE", "HL_OCL_BUILD_OPTIONS", "FORBID_SOURCE"):
        env.pop(name, None)
    env["HALIDE_SHIM_CACHE"] = str(cache_dir)
    env["POCL_CACHE_DIR"] = str(cache_dir.parent / "pocl")  # PoCL's own cache: fresh, not shared
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tests"), str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def start(libraries, name, cache_dir, **extra):
    return subprocess.Popen([sys.executable, "-c", CHILD, str(libraries[name]), name],
                            env=child_env(cache_dir, **extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(child) -> dict:
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def run(libraries, name, cache_dir, **extra) -> dict:
    return finish(start(libraries, name, cache_dir, **extra))


def entries(cache_dir) -> list[Path]:
    return sorted(cache_dir.glob("opencl-*.bin")) if cache_dir.exists() else []


def stored_key(path: Path) -> str:
    """The key text an entry carries (after its header)."""
    data = path.read_bytes()
    _, _, key_length, _, _ = binary_cache._HEADER.unpack_from(data)
    return data[binary_cache._HEADER.size:binary_cache._HEADER.size + key_length].decode()


def valid(path: Path) -> bool:
    return binary_cache.decode(path.read_bytes(), stored_key(path)) is not None


# --- across processes, with a real pipeline ---------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_a_second_process_builds_from_the_cache(libraries, cache_dir, name):
    first = run(libraries, name, cache_dir)
    assert first.get("source", 0) >= 1 and first.get("stored") == first["source"]
    assert first.get("binary", 0) == 0
    [entry] = entries(cache_dir)
    assert valid(entry)
    key = json.loads(stored_key(entry))
    assert {"format", "platform", "device", "options", "source sha256"} <= set(key)
    second = run(libraries, name, cache_dir, FORBID_SOURCE="1")
    assert second == {"binary": first["source"]}  # no source build, nothing stored again


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "empty", "zeroed", "foreign header"])
def test_a_damaged_entry_is_rebuilt_and_replaced(libraries, cache_dir, damage):
    run(libraries, "blur3x3", cache_dir)
    [entry] = entries(cache_dir)
    data = entry.read_bytes()
    damaged = {
        "truncated": data[:len(data) // 2],  # PoCL would crash on such a binary
        "flipped byte": data[:-100] + bytes([data[-100] ^ 0x40]) + data[-99:],
        "empty": b"",
        "zeroed": bytes(len(data)),  # a crash without fsync after the rename
        "foreign header": b"ELF" + data[3:],
    }[damage]
    entry.write_bytes(damaged)
    again = run(libraries, "blur3x3", cache_dir)  # results checked in the child
    assert again == {"source": 1, "stored": 1}
    assert entries(cache_dir) == [entry] and valid(entry)
    assert run(libraries, "blur3x3", cache_dir, FORBID_SOURCE="1") == {"binary": 1}


def test_a_binary_the_driver_refuses_is_rebuilt_and_replaced(libraries, cache_dir):
    """An entry intact on disk whose payload the driver will not build (what a driver that
    changed without changing its version string might do)."""
    run(libraries, "brighten", cache_dir)
    [entry] = entries(cache_dir)
    key = stored_key(entry)
    assert binary_cache.BinaryCache(cache_dir, "opencl").store(key, b"not a program binary" * 50)
    again = run(libraries, "brighten", cache_dir)
    assert again == {"refused binary": 1, "source": 1, "stored": 1}
    assert binary_cache.BinaryCache(cache_dir, "opencl").load(key) != b"not a program binary" * 50
    assert run(libraries, "brighten", cache_dir, FORBID_SOURCE="1") == {"binary": 1}


def test_changed_build_options_miss(libraries, cache_dir):
    run(libraries, "brighten", cache_dir)
    options = {"HL_OCL_BUILD_OPTIONS": "-D HALIDE_SHIM_TEST_OPTION=1"}
    assert run(libraries, "brighten", cache_dir, **options) == {"source": 1, "stored": 1}
    assert len(entries(cache_dir)) == 2
    assert {json.loads(stored_key(e))["options"].endswith("HALIDE_SHIM_TEST_OPTION=1")
            for e in entries(cache_dir)} == {True, False}
    assert run(libraries, "brighten", cache_dir, FORBID_SOURCE="1", **options) == {"binary": 1}


def test_concurrent_processes_never_leave_a_broken_entry(libraries, cache_dir):
    """Four processes start on an empty cache at once: each builds from source and replaces
    the entry; each gets correct results, and the entry that is left works."""
    children = [start(libraries, "blur3x3", cache_dir) for _ in range(4)]
    for child in children:
        assert finish(child).get("source") == 1
    [entry] = entries(cache_dir)
    assert valid(entry)
    assert not list(cache_dir.glob(".tmp-*"))
    assert run(libraries, "blur3x3", cache_dir, FORBID_SOURCE="1") == {"binary": 1}


HAMMER = textwrap.dedent("""
    import sys
    from pathlib import Path
    import shim
    from shim.backends import opencl

    device = shim.device("opencl")
    source = Path(sys.argv[1]).read_bytes()
    cache = opencl._program_cache()
    key = device._program_cache_key(source)
    binary = Path(sys.argv[2]).read_bytes()
    for i in range(60):
        assert cache.store(key, binary)
        loaded = cache.load(key)  # another process may have replaced it meanwhile: whole or not at all
        assert loaded == binary, (i, loaded is None)
        program = device._build_from_binary(loaded)
        assert program is not None and "twice" in [k.function_name for k in program.all_kernels()]
    print("ok")
    """)

KERNEL = b"__kernel void twice(__global float *a) { a[get_global_id(0)] *= 2.0f; }\n"


def test_concurrent_writers_and_readers_of_one_entry(opencl, cache_dir, monkeypatch, tmp_path):
    """Four processes store and load the same entry 60 times each, all at once: every load
    is the complete binary, and builds."""
    monkeypatch.setenv("HALIDE_SHIM_CACHE", str(cache_dir))
    monkeypatch.delenv("HALIDE_SHIM_NO_PROGRAM_CACHE", raising=False)
    program = opencl._build_from_source(KERNEL)
    import pyopencl as cl

    (tmp_path / "kernel.cl").write_bytes(KERNEL)
    (tmp_path / "kernel.bin").write_bytes(program.get_info(cl.program_info.BINARIES)[0])
    children = [subprocess.Popen([sys.executable, "-c", HAMMER, str(tmp_path / "kernel.cl"),
                                  str(tmp_path / "kernel.bin")], env=child_env(cache_dir),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(4)]
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0 and out.strip() == "ok", err[-3000:]
    assert len(entries(cache_dir)) == 1 and not list(cache_dir.glob(".tmp-*"))


def test_the_off_switch(libraries, cache_dir):
    off = {"HALIDE_SHIM_NO_PROGRAM_CACHE": "1"}
    assert run(libraries, "brighten", cache_dir, **off) == {"source": 1}
    assert entries(cache_dir) == []  # nothing written
    run(libraries, "brighten", cache_dir)  # now an entry exists...
    assert run(libraries, "brighten", cache_dir, **off) == {"source": 1}  # ...and is not read
    assert run(libraries, "brighten", cache_dir, HALIDE_SHIM_NO_PROGRAM_CACHE="0") == {"binary": 1}


# --- in this process: the key ---------------------------------------------------------------

@pytest.fixture
def counted(opencl, cache_dir, monkeypatch):
    """This process's device building into ``cache_dir``; the build counts, from zero."""
    monkeypatch.setenv("HALIDE_SHIM_CACHE", str(cache_dir))
    monkeypatch.delenv("HALIDE_SHIM_NO_PROGRAM_CACHE", raising=False)
    monkeypatch.setattr(opencl_backend, "program_builds", opencl_backend.Counter())
    return opencl_backend.program_builds


def test_a_changed_source_misses(opencl, counted):
    opencl._build_program(KERNEL)
    assert counted == {"source": 1, "stored": 1}
    opencl._build_program(KERNEL)
    assert counted == {"source": 1, "stored": 1, "binary": 1}
    opencl._build_program(KERNEL.replace(b"2.0f", b"3.0f"))
    assert counted == {"source": 2, "stored": 2, "binary": 1}
    opencl._build_program(KERNEL + b"// only a comment changed: another source all the same\n")
    assert counted == {"source": 3, "stored": 3, "binary": 1}


def test_the_key_covers_device_driver_and_options(opencl, counted, monkeypatch):
    key = json.loads(opencl._program_cache_key(KERNEL))
    device, platform = opencl._device, opencl._platform
    assert key["device"] == [device.name, device.vendor, device.version, device.driver_version]
    assert key["platform"] == [platform.name, platform.vendor, platform.version]
    assert key["options"] == opencl._build_options
    assert key["format"] == opencl_backend.PROGRAM_CACHE_FORMAT
    opencl._build_program(KERNEL)
    monkeypatch.setattr(opencl, "_build_options", opencl._build_options + " -cl-fast-relaxed-math")
    opencl._build_program(KERNEL)
    assert counted == {"source": 2, "stored": 2}


def test_sources_with_includes_are_not_cached(opencl, counted, cache_dir, tmp_path):
    (tmp_path / "factor.h").write_text("#define FACTOR 2.0f\n")
    source = KERNEL.replace(b"2.0f", b"FACTOR")
    source = b'#include "' + str(tmp_path / "factor.h").encode() + b'"\n' + source
    opencl._build_program(source)
    opencl._build_program(source)
    assert counted == {"source": 2}
    assert entries(cache_dir) == []


# --- the file store, without a device -----------------------------------------------------

def test_entries_round_trip_and_reject_damage(tmp_path):
    cache = binary_cache.BinaryCache(tmp_path, "test")
    assert cache.load("k") is None
    assert cache.store("k", b"payload" * 100)
    assert cache.load("k") == b"payload" * 100
    assert cache.load("other key") is None
    path = cache.path("k")
    data = path.read_bytes()
    for damaged in (data[:-1], data + b"x", data[:20], data.replace(b"payload", b"paylaod", 1)):
        path.write_bytes(damaged)
        assert cache.load("k") is None
    path.write_bytes(data)
    other = binary_cache.BinaryCache(tmp_path, "test")
    other.name = lambda key: path.name  # an entry filed under another key's name is not that key's
    assert other.load("not k") is None
    assert not cache.store("k", b"")  # drivers without binaries give empty ones: not stored


def test_least_recently_used_entries_are_evicted_beyond_the_bound(tmp_path):
    cache = binary_cache.BinaryCache(tmp_path, "test", max_bytes=3500)
    for i, name in enumerate("abc"):
        assert cache.store(name, bytes(1000))
        os.utime(cache.path(name), ns=(10**18 + i * 10**9,) * 2)  # a, b, c: oldest first
    assert cache.load("a") is not None  # a hit makes "a" the most recent
    assert cache.store("d", bytes(1000))  # 4 x ~1.1 KB > 3.5 KB: the oldest, "b", goes
    assert [cache.load(n) is not None for n in "abcd"] == [True, False, True, True]
    assert not cache.store("huge", bytes(4000))  # larger than the whole cache: not stored
    stale = tmp_path / f".tmp-{cache.name('e')}.{'0' * 16}"  # what a writer killed left
    stale.write_bytes(b"half")
    os.utime(stale, (0, 0))
    fresh = tmp_path / f".tmp-{cache.name('f')}.{'1' * 16}"
    fresh.write_bytes(b"half")
    cache.evict()
    assert not stale.exists() and fresh.exists()


@pytest.mark.parametrize("given, bound", [
    ("1", 1 << 20), ("0.5", 1 << 19), ("-3", 0), ("", binary_cache.DEFAULT_MAX_BYTES),
    ("lots", binary_cache.DEFAULT_MAX_BYTES), ("nan", binary_cache.DEFAULT_MAX_BYTES),
    ("inf", sys.maxsize - 1), ("1e400", sys.maxsize - 1), ("-inf", 0)])
def test_the_size_bound_from_the_environment(monkeypatch, tmp_path, given, bound):
    """Whatever $HALIDE_SHIM_CACHE_MAX_MB says, never an error (inf raised OverflowError out
    of every OpenCL program build): beyond any number is no bound."""
    monkeypatch.setenv("HALIDE_SHIM_CACHE_MAX_MB", given)
    assert binary_cache.max_bytes_from_environment() == bound
    cache = binary_cache.BinaryCache(tmp_path, "test")
    assert cache.store("k", b"payload") == (bound > 1000)
    assert cache.load("k") == (b"payload" if bound > 1000 else None)


def test_an_unwritable_directory_is_only_a_miss(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    cache = binary_cache.BinaryCache(blocked / "cache", "test")
    assert not cache.store("k", b"payload")
    assert cache.load("k") is None


def test_the_cache_root_follows_xdg(monkeypatch, tmp_path):
    from shim.pipelines.build import cache_dir

    monkeypatch.delenv("HALIDE_SHIM_PIPELINES", raising=False)
    monkeypatch.delenv("HALIDE_SHIM_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert private_files.cache_root() == tmp_path / "halide-shim"
    assert cache_dir() == tmp_path / "halide-shim" / "pipelines"
    assert opencl_backend._program_cache().directory == tmp_path / "halide-shim" / "opencl"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert private_files.cache_root() == Path.home() / ".cache" / "halide-shim"
    monkeypatch.setenv("HALIDE_SHIM_CACHE", str(tmp_path / "mine"))
    assert opencl_backend._program_cache().directory == tmp_path / "mine"

