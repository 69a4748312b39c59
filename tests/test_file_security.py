"""What another local user can do through the files the shim reads, writes, loads and deletes
(DESIGN.md, invariant 11; shim/base/private_files.py): plant an OpenCL program binary or a pipeline
library in a cache, swap the library an unpickling process loads, put a FIFO or a link where
the shim opens a file, leave code in the working directory, or watch a cache delete files it
never wrote.

The tests play the other user: as root (CI runs as root) a child process switches to uid and
gid 65534 to plant what that user could, and such a test skips, saying why, elsewhere.
Results are checked against numpy; whatever could block (a FIFO) runs in a child process with
a time limit, and nothing is timed."""

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import shim
from gpu_cases import blur_reference
from shim.base import binary_cache
from shim.calls import pipeline_pickle
from shim.base import private_files
from shim.pipelines import build as build_module
from shim.pipelines.build import Build, build

ROOT = Path(__file__).resolve().parent.parent
OTHER = 65534  # the other user (nobody), and its group

as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="playing another local user needs root, to switch to uid 65534 "
                              "in a child process (CI runs as root)")


def as_other_user(*command) -> None:
    """Run ``command`` as the other user (uid and gid 65534, no other groups)."""
    done = subprocess.run([str(c) for c in command], user=OTHER, group=OTHER, extra_groups=[],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def shared():
    """A folder everyone may enter but only root may write: where the other user's folders
    go (pytest's tmp_path is private to this user, so the other user could not reach them)."""
    base = Path(tempfile.mkdtemp(prefix="halide-shim-security-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base)


def folder_of(base: Path, name: str, mode: int = 0o755, owner: int = 0, group: int = 0) -> Path:
    path = base / name
    path.mkdir()
    os.chown(path, owner, group)
    path.chmod(mode)
    return path


def plant(data: bytes, where: Path) -> None:
    """The other user writes ``data`` at ``where`` (a file of theirs)."""
    source = Path(tempfile.mkdtemp(prefix="halide-shim-planted-"))
    try:
        source.chmod(0o755)
        (source / "data").write_bytes(data)
        (source / "data").chmod(0o644)
        as_other_user("cp", source / "data", where)
    finally:
        shutil.rmtree(source)


def run_child(code: str, *args, env: dict, timeout: float = 240) -> dict:
    """Run ``code`` in a fresh Python process and return the JSON its last line prints; a
    process that does not end within ``timeout`` (blocked, say on a FIFO) fails the test."""
    child = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        pytest.fail(f"the process blocked: killed after {timeout} s\n{err[-3000:]}")
    assert child.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def child_env(tmp_path, **variables) -> dict:
    env = dict(os.environ)
    for name in ("HALIDE_SHIM_NO_PROGRAM_CACHE", "HL_OCL_BUILD_OPTIONS", "HALIDE_SHIM_CACHE"):
        env.pop(name, None)
    pocl = Path(tempfile.mkdtemp(prefix="pocl-", dir=tmp_path))  # PoCL's own cache: fresh
    env["POCL_CACHE_DIR"] = str(pocl)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update({k: str(v) for k, v in variables.items()})
    return env


def stored_key(data: bytes) -> str:
    """The key text a program-cache entry carries (after its header)."""
    _, _, key_length, _, _ = binary_cache._HEADER.unpack_from(data)
    return data[binary_cache._HEADER.size:binary_cache._HEADER.size + key_length].decode()


# --- the other user's brighten, which adds 1000 -----------------------------------------------

@pytest.fixture(scope="module")
def evil_generators(tmp_path_factory):
    """A copy of the generators in which brighten adds 1000: what the other user compiles to
    make a program binary or a library that passes for brighten's (same kernels, same name)."""
    folder = tmp_path_factory.mktemp("evil") / "generators"
    shutil.copytree(build_module.GENERATORS_DIR, folder)
    source = folder / "brighten.py"
    text = source.read_text()
    assert "* self.scale + self.offset\n" in text
    source.write_text(text.replace("* self.scale + self.offset\n",
                                   "* self.scale + self.offset + 1000.0\n"))
    return folder


def evil_build(evil_generators, target: str, runtime: str, out: Path) -> Path:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(build_module, "GENERATORS_DIR", evil_generators)
        return build(Build("brighten", target, runtime), out)


@pytest.fixture(scope="module")
def evil_host_library(evil_generators, tmp_path_factory):
    return evil_build(evil_generators, "host", "bundled", tmp_path_factory.mktemp("evil_host"))


IMAGE = np.ones((48, 64), np.float32)


def brighten_reference(image=IMAGE, scale=2.0, offset=0.0):
    return image * np.float32(scale) + np.float32(offset)


# --- planted OpenCL program binaries (issue 24, item 3) -----------------------------------------

# Runs the OpenCL brighten (argv: library) with the program cache the environment names and
# prints its first value, whether all match numpy, the UnsafeCacheWarnings and how its
# program was built. The cache is looked at a second time: still one warning.
VICTIM = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import shim
        from shim.backends import opencl
        image = np.ones((48, 64), np.float32)
        out = shim.load(sys.argv[1])(image, scale=2.0, offset=0.0, output=image.shape).numpy()
        opencl._program_cache().load("another key")
    print(json.dumps({
        "value": float(out[0, 0]), "matches": bool((out == image * np.float32(2)).all()),
        "warnings": [str(w.message) for w in caught if w.category.__name__ == "UnsafeCacheWarning"],
        "builds": dict(opencl.program_builds)}))
    """)


@pytest.fixture(scope="module")
def planted_program(opencl, evil_generators, tmp_path_factory):
    """(brighten's OpenCL library, its program-cache entry's name, the entry the other user
    makes): brighten's key, which anyone can compute from the public library, with the program
    binary of the evil brighten, and a valid checksum. Checked to work where the cache is
    trusted (the victim's own private folder): else every test below would pass for nothing."""
    work = tmp_path_factory.mktemp("planted_program")
    real = build(Build("brighten", "opencl", "no_runtime"))
    evil = evil_build(evil_generators, "opencl", "no_runtime", work / "evil")
    entries = {}
    for name, library in (("real", real), ("evil", evil)):
        cache = work / f"{name}-cache"
        run_child(VICTIM, library, env=child_env(work, HALIDE_SHIM_CACHE=cache))
        [entries[name]] = cache.glob("opencl-*.bin")
    evil_data = entries["evil"].read_bytes()
    payload = binary_cache.decode(evil_data, stored_key(evil_data))
    planted = binary_cache.encode(stored_key(entries["real"].read_bytes()), payload)
    trusted = work / "trusted"
    trusted.mkdir(mode=0o700)
    (trusted / entries["real"].name).write_bytes(planted)
    result = run_child(VICTIM, real, env=child_env(work, HALIDE_SHIM_CACHE=trusted))
    assert result["value"] == 1002.0 and result["builds"] == {"binary": 1}, result
    return real, entries["real"].name, planted


def theirs(base):
    return folder_of(base, "theirs", owner=OTHER, group=OTHER), None


def world_writable(base):
    return folder_of(base, "shared", mode=0o777), None


def sticky_world_writable(base):
    return folder_of(base, "sticky", mode=0o1777), None


def group_writable(base):
    return folder_of(base, "ours", mode=0o770, group=OTHER), None


def link_into_theirs(base):
    planted, _ = theirs(base)
    (base / "mine").symlink_to(planted)
    return planted, base / "mine"


# How the victim's cache folder is another user's to write: (the folder the other user plants
# in, the path the victim is given, when that is another: a link), and what the warning says.
UNSAFE_FOLDERS = {
    "another user's folder": (theirs, "theirs belongs to uid 65534, not to this user"),
    "a world-writable folder": (world_writable, "shared is writable by others (mode 777)"),
    "a sticky world-writable folder": (sticky_world_writable, "sticky is writable by others (mode 1777)"),
    "the user's own folder, writable by its group": (group_writable, "ours is writable by its group"),
    "a link into another user's folder": (link_into_theirs, "theirs belongs to uid 65534"),
}


@as_root
@pytest.mark.parametrize("case", UNSAFE_FOLDERS)
def test_a_program_planted_in_a_folder_others_can_write_never_runs(
        planted_program, shared, tmp_path, case):
    make, reason = UNSAFE_FOLDERS[case]
    library, name, planted = planted_program
    folder, given = make(shared)
    plant(planted, folder / name)
    result = run_child(VICTIM, library, env=child_env(tmp_path, HALIDE_SHIM_CACHE=given or folder))
    assert result["value"] == 2.0 and result["matches"], result  # numpy's, not 1002.0
    assert result["builds"] == {"source": 1}  # and nothing stored there either
    [warning] = result["warnings"]  # once, though the cache was looked at twice
    assert reason in warning and "another user could put files there" in warning, warning
    assert (folder / name).read_bytes() == planted  # left alone


def link_to_theirs(mine: Path, theirs_folder: Path, name: str, planted: bytes) -> None:
    plant(planted, theirs_folder / name)
    (mine / name).symlink_to(theirs_folder / name)


def file_of_theirs(mine: Path, _, name: str, planted: bytes) -> None:
    (mine / name).write_bytes(planted)
    os.chown(mine / name, OTHER, OTHER)


def file_others_can_write(mine: Path, _, name: str, planted: bytes) -> None:
    (mine / name).write_bytes(planted)
    (mine / name).chmod(0o666)


def fifo(mine: Path, _, name: str, planted: bytes) -> None:
    os.mkfifo(mine / name)


# What may be found under an entry's name in the victim's own private folder (left by whoever
# could write there once, or by a link the user made).
UNSAFE_ENTRIES = {"a link to another user's file": link_to_theirs,
                  "a file of another user's": file_of_theirs,
                  "a file others can write": file_others_can_write,
                  "a FIFO": fifo}


@as_root
@pytest.mark.parametrize("case", UNSAFE_ENTRIES)
def test_an_entry_that_is_not_a_regular_file_of_the_users_is_never_read(
        planted_program, shared, tmp_path, case):
    library, name, planted = planted_program
    mine = folder_of(shared, "mine", mode=0o700)
    theirs_folder, _ = theirs(shared)
    UNSAFE_ENTRIES[case](mine, theirs_folder, name, planted)
    result = run_child(VICTIM, library, env=child_env(tmp_path, HALIDE_SHIM_CACHE=mine))
    assert result["value"] == 2.0 and result["matches"], result
    assert result["builds"] == {"source": 1, "stored": 1} and result["warnings"] == []
    # The entry is now the user's own, the program built from source; nothing else changed.
    info = os.lstat(mine / name)
    assert info.st_uid == 0 and info.st_mode & 0o777 == 0o600 and (mine / name).is_file()
    assert (mine / name).read_bytes() != planted
    if case == "a link to another user's file":
        assert (theirs_folder / name).read_bytes() == planted


# --- the same rule, on the file store alone ----------------------------------------------------

LOAD = textwrap.dedent("""
    import json, sys
    from shim.base.binary_cache import BinaryCache
    print(json.dumps(BinaryCache(sys.argv[1], "test").load("k") is None))
    """)


def test_folders_the_cache_makes_are_private_at_every_level(tmp_path):
    cache = binary_cache.BinaryCache(tmp_path / "a" / "b" / "c", "test")
    assert cache.store("k", b"payload")
    for folder in ("a", "a/b", "a/b/c"):
        assert (tmp_path / folder).stat().st_mode & 0o777 == 0o700, folder
    assert cache.path("k").stat().st_mode & 0o777 == 0o600


def unsafe_cache_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, shim.UnsafeCacheWarning)]


@pytest.mark.parametrize("mode, reason", [(0o777, "writable by others"), (0o775, "writable by its group"),
                                          (0o1777, "writable by others")])
def test_a_folder_others_can_write_is_not_used(tmp_path, mode, reason):
    folder = tmp_path / "cache"
    assert binary_cache.BinaryCache(folder, "test").store("k", b"payload")
    folder.chmod(mode)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert binary_cache.BinaryCache(folder, "test").load("k") is None
        assert not binary_cache.BinaryCache(folder, "test").store("k", b"other")
    [warning] = unsafe_cache_warnings(caught)
    assert reason in warning, warning


def test_a_folder_under_one_others_can_write_is_not_used_unless_that_one_is_sticky(tmp_path):
    above = tmp_path / "above"
    cache = binary_cache.BinaryCache(above / "cache", "test")
    assert cache.store("k", b"payload")
    above.chmod(0o777)  # others could rename "cache" away and put their own in its place
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.load("k") is None
    [warning] = unsafe_cache_warnings(caught)
    assert "above is writable by others" in warning, warning
    above.chmod(0o1777)  # as /tmp: they cannot touch what is ours in it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.load("k") == b"payload"
    assert caught == []


@as_root
@pytest.mark.parametrize("where", ["sticky", "theirs"])
def test_a_link_another_user_made_does_not_choose_where_the_cache_goes(shared, tmp_path, where):
    """The other user's link, in /tmp or in a folder of theirs, where the user's cache is to
    be: followed, it would have the user make folders and write entries wherever that user
    chose among the user's own folders (realpath reads links: fs.protected_symlinks, which
    would refuse to follow it in /tmp, is never asked)."""
    folder = folder_of(shared, where, mode=0o1777) if where == "sticky" else theirs(shared)[0]
    chosen = tmp_path / "chosen by them"
    as_other_user("ln", "-s", chosen / "deep", folder / "cache")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not binary_cache.BinaryCache(folder / "cache", "opencl").store("k", b"payload")
        assert not binary_cache.BinaryCache(folder / "cache" / "below", "opencl").store("k", b"x")
        with build_module.build_folder(folder / "cache") as built:
            assert built.path.parent != chosen
    assert not chosen.exists()
    warned = unsafe_cache_warnings(caught)
    # once per folder asked for (build_folder asked for the first again)
    reason = ("cache is a link of uid 65534's" if where == "sticky"
              else "theirs belongs to uid 65534")
    assert len(warned) == 2 and all(reason in warning for warning in warned), warned


@as_root
def test_a_link_of_the_users_in_a_folder_others_can_write_is_not_followed(shared, tmp_path):
    """The link is the user's, but anyone can replace it there, between its check and its
    reading too: where it leads is theirs to choose, as if it were their link."""
    open_folder = folder_of(shared, "open", mode=0o777)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (open_folder / "cache").symlink_to(mine)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not binary_cache.BinaryCache(open_folder / "cache", "opencl").store("k", b"x")
    [warning] = unsafe_cache_warnings(caught)
    assert "open is writable by others" in warning, warning
    assert list(mine.iterdir()) == []


@as_root
@pytest.mark.parametrize("taken_by", ["a file", "a link made once the path was resolved"])
def test_a_name_another_user_took_where_the_cache_goes_is_refused_not_raised(
        shared, monkeypatch, taken_by):
    """In /tmp, they can take the cache's name first: as a folder of theirs it is refused with
    a warning, and so it must be as a file of theirs, or a link they make between the path's
    resolving and its walk (both raised NotADirectoryError from build())."""
    sticky = folder_of(shared, "sticky", mode=0o1777)
    taken = sticky / "taken"
    if taken_by == "a file":
        as_other_user("touch", taken)
    else:
        resolve = private_files._resolve

        def resolve_then_link(path):
            resolved = resolve(path)
            if not taken.is_symlink():
                as_other_user("ln", "-s", "/nonexistent", taken)
            return resolved

        monkeypatch.setattr(private_files, "_resolve", resolve_then_link)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with build_module.build_folder(taken / "pipelines") as built:
            assert sticky not in built.path.parents  # this process's private folder
    [warning] = unsafe_cache_warnings(caught)
    assert f"{taken} belongs to uid 65534" in warning, warning


@as_root
@pytest.mark.parametrize("taken_by", ["a folder", "a file"])
def test_a_name_another_user_puts_and_takes_away_mid_check_is_refused_not_raised(
        shared, monkeypatch, taken_by):
    """The same race, tighter: their folder appears as the user's mkdir runs (which then finds
    it there) and is gone before it is opened; or their file is gone before it is looked at.
    Each raised FileNotFoundError out of build() (a loop of theirs in /tmp did it hundreds
    of times a minute)."""
    sticky = folder_of(shared, "sticky", mode=0o1777)
    taken = sticky / "taken"
    if taken_by == "a folder":
        mkdir = os.mkdir

        def mkdir_raced(path, *args, **kwargs):
            if path == "taken":
                as_other_user("mkdir", taken)
                try:
                    return mkdir(path, *args, **kwargs)
                finally:
                    as_other_user("rmdir", taken)
            return mkdir(path, *args, **kwargs)

        monkeypatch.setattr(os, "mkdir", mkdir_raced)
    else:
        open_child = private_files._open_child

        def open_child_raced(parent, name, create):
            if name != "taken":
                return open_child(parent, name, create)
            as_other_user("touch", taken)
            try:
                return open_child(parent, name, create)
            finally:
                as_other_user("rm", taken)

        monkeypatch.setattr(private_files, "_open_child", open_child_raced)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with build_module.build_folder(taken / "pipelines") as built:
            assert sticky not in built.path.parents
    [warning] = unsafe_cache_warnings(caught)
    assert f"{taken} changed while it was checked" in warning, warning
    assert not taken.exists()


def test_an_entry_that_is_a_fifo_is_a_miss_and_never_blocks(tmp_path):
    cache = binary_cache.BinaryCache(tmp_path, "test")
    os.mkfifo(cache.path("k"))
    assert run_child(LOAD, tmp_path, env=child_env(tmp_path), timeout=60) is True
    assert cache.store("k", b"payload") and cache.load("k") == b"payload"  # replaced


def test_an_entry_that_is_a_link_is_a_miss(tmp_path):
    elsewhere = binary_cache.BinaryCache(tmp_path / "elsewhere", "test")
    assert elsewhere.store("k", b"payload")
    cache = binary_cache.BinaryCache(tmp_path / "cache", "test")
    cache.directory.mkdir(mode=0o700)
    cache.path("k").symlink_to(elsewhere.path("k"))
    assert cache.load("k") is None
    assert cache.store("k", b"mine") and cache.load("k") == b"mine"
    assert elsewhere.load("k") == b"payload"  # the link was replaced, not written through


# --- eviction deletes only what the cache named (issue 24, item 5) -----------------------------

def test_eviction_deletes_only_the_files_the_cache_named(tmp_path):
    """$HALIDE_SHIM_CACHE may name a folder the user keeps other files in: none of them goes,
    however old or large, while the cache's own entries stay within the bound."""
    cache = binary_cache.BinaryCache(tmp_path, "opencl", max_bytes=3500)
    users = {"firmware.bin": os.urandom(64 << 10), "opencl-notes.bin": b"notes",
             f"opencl-{'0' * 64}.bin.bak": b"a backup", f"opencl-{'0' * 63}.bin": b"short",
             f"OPENCL-{'0' * 64}.bin": b"capitals", ".tmp-notes": b"mine",
             f".tmp-firmware.bin.{'0' * 16}": b"mine too", f"test-{'0' * 64}.bin": b"another namespace"}
    for name, data in users.items():
        (tmp_path / name).write_bytes(data)
        os.utime(tmp_path / name, (0, 0))  # older than anything the cache writes
    (tmp_path / f"opencl-{'1' * 64}.bin").symlink_to(tmp_path / "firmware.bin")
    for i in range(6):
        assert cache.store(f"key {i}", bytes(1000))
    for name, data in users.items():
        assert (tmp_path / name).read_bytes() == data, name
    assert (tmp_path / f"opencl-{'1' * 64}.bin").is_symlink()
    kept = [i for i in range(6) if cache.load(f"key {i}") is not None]
    assert kept == [3, 4, 5]  # bounded: 3 x ~1.1 KB fit in 3.5 KB, the oldest went


@as_root
def test_eviction_leaves_another_users_files_alone(tmp_path):
    cache = binary_cache.BinaryCache(tmp_path, "opencl", max_bytes=3500)
    foreign = tmp_path / f"opencl-{'2' * 64}.bin"
    foreign.write_bytes(bytes(3000))
    os.utime(foreign, (0, 0))
    os.chown(foreign, OTHER, OTHER)
    for i in range(3):
        assert cache.store(f"key {i}", bytes(1000))
    assert foreign.exists() and foreign.stat().st_uid == OTHER
    assert [cache.load(f"key {i}") is not None for i in range(3)] == [True, True, True]


# --- unpickling loads exactly the pickled bytes (issue 24, item 4) -----------------------------

def test_unpickling_loads_the_pickled_bytes_though_the_file_is_swapped_before_it_is_loaded(
        host_pipelines, evil_host_library, tmp_path, monkeypatch):
    """The worst case of the race: the other user's library replaces whatever the loader is
    about to open, just before it opens it (here even as this user, from inside the process)."""
    monkeypatch.setenv("HALIDE_SHIM_CACHE", str(tmp_path / "cache"))
    data = host_pipelines["brighten", "bundled"].read_bytes() + b"\0swap test %d" % os.getpid()
    digest = hashlib.sha256(data).hexdigest()
    attempts = []

    def swapped_then_loaded(path, name):
        staged = tmp_path / "staged.so"
        shutil.copyfile(evil_host_library, staged)
        try:
            os.replace(staged, path)
            attempts.append("replaced")
        except OSError as e:
            attempts.append(f"replace refused: {e.strerror}")
        try:
            with open(path, "r+b") as f:
                f.write(evil_host_library.read_bytes())
            attempts.append("overwritten")
        except OSError as e:
            attempts.append(f"write refused: {e.strerror}")
        return shim.Pipeline(path, name)

    pipeline = pipeline_pickle.restore(digest, "brighten", data, swapped_then_loaded)
    out = pipeline(IMAGE, scale=2.0, offset=0.0, output=IMAGE.shape).numpy()
    np.testing.assert_array_equal(out, brighten_reference())
    assert [a.split(":")[0] for a in attempts] == ["replace refused", "write refused"], attempts
    assert pipeline.__reduce__()[1] == (digest, "brighten", data)  # and it pickles those bytes
    assert not (tmp_path / "cache").exists()


UNPICKLE = textwrap.dedent("""
    import json, pickle, sys
    import numpy as np
    pipeline = pickle.loads(open(sys.argv[1], "rb").read())
    image = np.ones((48, 64), np.float32)
    out = pipeline(image, scale=2.0, offset=0.0, output=image.shape).numpy()
    print(json.dumps(bool((out == image * np.float32(2)).all())))
    """)


@as_root
def test_a_fifo_where_an_unpickled_library_once_went_never_blocks(host_pipelines, shared, tmp_path):
    data = host_pipelines["brighten", "no_runtime"].read_bytes() + b"\0fifo test %d" % os.getpid()
    library = tmp_path / "brighten.so"
    library.write_bytes(data)
    pickled = tmp_path / "pipeline.pickle"
    pickled.write_bytes(pickle.dumps(shim.load(library)))
    cache = folder_of(shared, "cache", mode=0o1777)
    as_other_user("mkdir", "-m", "777", cache / "libraries")
    as_other_user("mkfifo", "-m", "666", cache / "libraries" / f"{hashlib.sha256(data).hexdigest()}.so")
    assert run_child(UNPICKLE, pickled, env=child_env(tmp_path, HALIDE_SHIM_CACHE=cache),
                     timeout=60) is True


# --- the pipeline build cache, building, outputs the shim names (issue 24, item 6) -------------

@as_root
@pytest.mark.parametrize("given_by", ["HALIDE_SHIM_PIPELINES", "directory"])
@pytest.mark.parametrize("make", [theirs, world_writable], ids=["another user's folder",
                                                                "a world-writable folder"])
def test_the_build_cache_never_loads_a_library_another_user_planted(
        evil_host_library, shared, monkeypatch, make, given_by):
    folder, _ = make(shared)
    spec = Build("brighten", "host", "bundled")
    plant(evil_host_library.read_bytes(), spec.path(folder))  # the name the victim looks for
    if given_by == "HALIDE_SHIM_PIPELINES":
        monkeypatch.setenv("HALIDE_SHIM_PIPELINES", str(folder))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = build(spec, folder if given_by == "directory" else None)
    out = shim.load(path)(IMAGE, scale=2.0, offset=0.0, output=IMAGE.shape).numpy()
    np.testing.assert_array_equal(out, brighten_reference())  # numpy's, not 1000 more
    assert path.parent != folder
    [warning] = unsafe_cache_warnings(caught)
    assert "private temporary folder" in warning, warning
    assert path.parent.stat().st_mode & 0o777 == 0o700 and path.parent.stat().st_uid == os.geteuid()


@as_root
def test_building_runs_no_code_from_the_working_directory(shared, tmp_path):
    """``python -m`` puts the working directory first on the path: a halide.py the other user
    left where the user happens to be must not be what the generator imports."""
    folder, _ = theirs(shared)
    marker = tmp_path / "planted code ran"
    planted = f"open({str(marker)!r}, 'w').close()\nraise ImportError('a planted halide')\n"
    plant(planted.encode(), folder / "halide.py")
    script = tmp_path / "victim.py"
    script.write_text("import sys\nfrom shim.pipelines.build import Build, build\n"
                      "print(build(Build('brighten', 'host', 'bundled'), sys.argv[1]))\n")
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "out")], cwd=folder,
                          env=child_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert not marker.exists()
    assert done.returncode == 0, done.stderr[-3000:]
    assert Path(done.stdout.strip()).parent == tmp_path / "out"


@as_root
def test_a_chunked_run_writes_through_no_file_another_user_named(host_pipelines, shared, tmp_path):
    """A .npy output is computed into a file beside it and renamed: under a name known in
    advance, the other user could have put a link there to a file of the user's."""
    pytest.importorskip("dask.array")
    out_folder = folder_of(shared, "outputs", mode=0o777)  # a folder the user chose, shared
    precious = tmp_path / "precious.txt"
    precious.write_bytes(b"the user's own file")
    as_other_user("ln", "-s", precious, out_folder / "out.npy.partial")
    image = np.random.default_rng(5).integers(0, 1 << 16, (40, 50), dtype=np.uint16)
    np.save(tmp_path / "in.npy", image)
    done = subprocess.run([sys.executable, "-m", "shim", "run", str(host_pipelines["blur3x3", "bundled"]),
                           f"input={tmp_path / 'in.npy'}", f"output={out_folder / 'out.npy'}",
                           "--chunks", "16x16"], env=child_env(tmp_path), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert precious.read_bytes() == b"the user's own file"
    assert not (out_folder / "out.npy").is_symlink()
    np.testing.assert_array_equal(np.load(out_folder / "out.npy"), blur_reference(image))
    assert sorted(p.name for p in out_folder.iterdir()) == ["out.npy", "out.npy.partial"]  # (theirs)


@as_root
def test_the_demo_timeline_is_never_written_through_a_folder_another_user_swapped_in(
        shared, tmp_path, monkeypatch, capsys):
    """$TMPDIR may be a folder others can write that is not sticky (a cluster's /scratch):
    there the other user can rename the demo's new folder away and put theirs in its place,
    holding a link to a file of the user's, before the timeline is written into it by path.
    (The demo's pipelines are left out: only where its timeline goes is tested.)"""
    from shim.cli import demo

    scratch = folder_of(shared, "scratch", mode=0o777)
    precious = tmp_path / "precious.txt"
    precious.write_bytes(b"the user's own file")
    mkdtemp = tempfile.mkdtemp

    def mkdtemp_then_swapped(*args, **kwargs):
        made = Path(mkdtemp(*args, **{**kwargs, "dir": scratch}))
        as_other_user("mv", made, f"{made}.moved")
        as_other_user("mkdir", made)
        as_other_user("ln", "-s", precious, made / "trace.json")
        return str(made)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp_then_swapped)
    monkeypatch.setattr(demo, "build_all", lambda specs, progress: {})
    monkeypatch.setattr(demo, "_run_all", lambda say, specs, paths: 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        demo._demo(print)
    assert precious.read_bytes() == b"the user's own file"
    [warning] = unsafe_cache_warnings(caught)
    assert "scratch is writable by others" in warning, warning
    assert "timeline: not saved" in capsys.readouterr().out


FORK = textwrap.dedent("""
    import json, os, sys, warnings
    from shim.pipelines.build import build_folder
    warnings.simplefilter("ignore")
    with build_folder(sys.argv[1]) as folder:  # refused: this process's private folder
        private = folder.path
    child = os.fork()
    if child == 0:
        sys.exit(0)  # a normal exit: the exit handlers inherited from the parent run
    os.waitpid(child, 0)
    print(json.dumps([str(private), private.is_dir()]))
    """)


def test_the_private_build_folder_is_removed_by_its_own_process_only(tmp_path):
    """Else a forked child's exit would remove it under the parent, which would make it again
    under a name anyone can see in /tmp, and take first."""
    refused = tmp_path / "refused"
    refused.mkdir(mode=0o777)
    refused.chmod(0o777)
    private, there_after_the_child = run_child(FORK, refused, env=child_env(tmp_path), timeout=120)
    assert there_after_the_child
    assert not Path(private).exists()  # and gone once the process that made it ended


OUTLIVES = textwrap.dedent("""
    import json, os, sys, time, warnings
    from pathlib import Path
    from shim.pipelines.build import build_folder
    warnings.simplefilter("ignore")
    with build_folder(sys.argv[1]) as folder:  # refused: this process's private folder
        made = folder.path
    if os.fork() == 0:  # a child that outlives this process, which removes it as it ends
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        go = Path(sys.argv[2] + ".go")
        while not go.exists():
            time.sleep(0.02)
        try:
            with build_folder(sys.argv[1]) as folder:
                info = folder.path.stat()
                result = [str(folder.path), info.st_uid, info.st_mode & 0o777]
        except Exception as e:
            result = repr(e)
        Path(sys.argv[2]).write_text(json.dumps(result))
        sys.exit(0)
    print(json.dumps(str(made)))
    """)


@as_root
def test_a_child_that_outlives_the_process_never_makes_its_private_folder_again(shared, tmp_path):
    """The folder's name was seen in /tmp: once the process that made it has ended and removed
    it, the other user can take it. A child forked from that process, still building, must
    not make it again (nor use theirs, nor give up: it raised RuntimeError), but a new one."""
    refused = folder_of(shared, "refused", mode=0o777)
    result = tmp_path / "child.json"
    made = run_child(OUTLIVES, refused, result, env=child_env(tmp_path), timeout=120)
    assert not Path(made).exists()  # removed by its process, as it ended
    as_other_user("mkdir", made)
    (tmp_path / "child.json.go").touch()
    for _ in range(3000):
        if result.exists():
            break
        time.sleep(0.02)
    shutil.rmtree(made)
    path, uid, mode = json.loads(result.read_text())
    assert path != made and uid == os.geteuid() and mode == 0o700, (path, made)


@as_root
def test_a_library_is_never_compiled_in_a_folder_others_can_write(shared, tmp_path):
    """$TMPDIR may be such a folder (a cluster's /scratch): without a sticky bit, the other user
    can rename the build's temporary folder away and put theirs, holding their library, in its
    place before it is cached. The compiler is watched: where it writes the library, and where
    its own temporary files go ($TMPDIR: gcc's collect2 and LTO resolution files, which a
    link reads back)."""
    scratch = folder_of(shared, "scratch", mode=0o777)
    compiler = tmp_path / "cc"
    compiler.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "compiled"}\n'
                        f'echo "$TMPDIR" >> {tmp_path / "temporaries"}\nexec cc "$@"\n')
    compiler.chmod(0o755)
    script = tmp_path / "victim.py"
    script.write_text("import sys\nfrom shim.pipelines.build import Build, build\n"
                      "print(build(Build('brighten', 'host', 'bundled'), sys.argv[1]))\n")
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "out")], timeout=600,
                          env=child_env(tmp_path, TMPDIR=scratch, CC=compiler),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    [arguments] = (tmp_path / "compiled").read_text().splitlines()
    written = Path(arguments.split()[arguments.split().index("-o") + 1])
    assert written.parent.parent == tmp_path / "out", written  # inside the private build folder
    [temporaries] = (tmp_path / "temporaries").read_text().splitlines()
    assert Path(temporaries) == written.parent, temporaries  # and the compiler's own files too
    assert list(scratch.iterdir()) == [] and not list((tmp_path / "out").glob(".tmp-build-*"))
    out = shim.load(done.stdout.strip())(IMAGE, scale=2.0, offset=0.0, output=IMAGE.shape).numpy()
    np.testing.assert_array_equal(out, brighten_reference())
