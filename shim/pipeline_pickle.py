"""Pickling shim.Pipeline: a pipeline travels as its library's bytes, their sha256 and the
pipeline's name, so that a process that never saw the library's file (a Dask worker on another
machine) can run it.

What travels is what the pickling process loaded: the library reads its file's bytes as it
loads it (shim/library.py), so a file deleted or rebuilt since still pickles the code that
process runs.

Unpickling checks the bytes against the hash, writes them once into a cache directory
($HALIDE_SHIM_CACHE/libraries, else ~/.cache/halide-shim/libraries, as ``<sha256>.so``) and
loads them from there; the same (hash, name) again in the process is the same Pipeline object,
found before anything is hashed or read. A pipeline pickled in this process is found there
too, so an in-process round trip gives back the original. Unpickled pipelines stay for the
process's life (their code cannot be unloaded anyway); loaded ones only while someone holds
them.

The cache needs no lock across processes: an entry's name is its content's hash, a writer
writes a temporary file in the same directory and ``os.replace``s it into place (a reader sees
no file or a complete one, and concurrent writers write the same bytes), and an existing entry
is loaded only after its bytes hash to its name (a file damaged by a crash or a full disk is
rewritten). Entries are small (a library is tens of KB to a few MB) and are not evicted;
deleting the folder is safe whenever no process is unpickling into it. Where the directory
cannot be written (read-only, full), the library goes through a private temporary directory
that is deleted as soon as the library is loaded.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import tempfile
import threading
import weakref
from pathlib import Path

from shim.private_files import cache_root
from shim.errors import ShimError

_TEMPORARY_PREFIX = ".tmp-"


class PickledPipelineError(ShimError, pickle.UnpicklingError):
    """A pickled Pipeline's library bytes do not match their hash: they were damaged on the
    way (or the pickle was not made by the shim)."""


# (sha256, name) -> Pipeline: every pipeline pickled or unpickled in this process, while alive.
_known: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_unpickled: list = []  # keeps unpickled pipelines alive (see the docstring)
_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # A fork while another thread was loading would leave the lock held for good in the child.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def state(pipeline, library) -> tuple:
    """What ``pipeline``, loaded from ``library`` (a shim.library.Library), pickles as:
    (sha256, name, bytes). Registers it, so that unpickling in this process finds it."""
    key = (library.digest, library.name)
    with _lock:
        _known.setdefault(key, pipeline)
    return (library.digest, library.name, library.data)


def restore(digest: str, name: str, data: bytes, load):
    """The Pipeline that ``state`` described: the one this process already has, else
    ``load(path, name)`` of the bytes written into the cache. Raises PickledPipelineError if
    the bytes do not hash to ``digest``."""
    key = (digest, name)
    with _lock:
        pipeline = _known.get(key)
        if pipeline is None:
            if _sha256(data) != digest:
                raise PickledPipelineError(
                    f"the library bytes of the pickled pipeline {name!r} do not match their "
                    f"sha256 {digest}: the pickle was damaged on the way")
            pipeline = _load(digest, name, data, load)
            _known[key] = pipeline
            _unpickled.append(pipeline)
    return pipeline


def cache_directory() -> Path:
    """Where unpickled libraries are written: $HALIDE_SHIM_CACHE/libraries, else the caches'
    root's libraries folder."""
    configured = os.environ.get("HALIDE_SHIM_CACHE")
    return (Path(configured) if configured else cache_root()) / "libraries"


def _load(digest: str, name: str, data: bytes, load):
    try:
        path = _stored(cache_directory(), digest, data)
    except OSError:
        # Nowhere to keep it: a private directory, gone once the library is loaded (a loaded
        # library needs no file, and the Pipeline keeps the bytes it read for later pickles).
        private = tempfile.mkdtemp(prefix="halide-shim-")
        try:
            return load(_stored(Path(private), digest, data), name)
        finally:
            shutil.rmtree(private, ignore_errors=True)
    return load(path, name)


def _stored(directory: Path, digest: str, data: bytes) -> Path:
    """The path of a file in ``directory`` holding ``data`` (whose sha256 is ``digest``),
    written unless an intact one is there already. Raises OSError if it cannot be written."""
    path = directory / f"{digest}.so"
    try:
        with open(path, "rb") as f:
            if _sha256(f.read()) == digest:
                return path
    except OSError:
        pass  # not there yet (or unreadable: replaced below)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=_TEMPORARY_PREFIX, suffix=".so", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # A reader that opened the old entry (or dlopen'ed it) keeps the old file's contents.
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    return path


def _sha256(data) -> str:
    return hashlib.sha256(data).hexdigest()
