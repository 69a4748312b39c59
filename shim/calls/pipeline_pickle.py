"""Pickling shim.Pipeline: a pipeline travels as its library's bytes, their sha256 and the
pipeline's name, so that a process that never saw the library's file (a Dask worker on another
machine) can run it.

What travels is what the pickling process loaded: the library reads its file's bytes as it
loads it (shim/calls/library.py), so a file deleted or rebuilt since still pickles the code that
process runs.

Unpickling checks the bytes against the hash and loads exactly those bytes: they go into a
sealed memory file (memfd_create, then F_SEAL_WRITE, F_SEAL_SHRINK, F_SEAL_GROW and
F_SEAL_SEAL: from then on nobody, this process included, can change them) and the library is
opened as /proc/self/fd/N. No folder is involved, so nothing another user does to a file can
put other code in between the check and the load (or block the load, as a FIFO would), and
nothing is left behind. shim/calls/library.py reads the library's bytes back from that path: the
same bytes, for later pickles. Once the library is loaded, the descriptor stays open for the
life of the process: the dynamic loader knows the libraries it loaded by name, and a later
library opened at a reused /proc/self/fd/N would be taken for this one (nor could the code be
unloaded anyway). Bytes the load refuses (not a library, another machine's, no such pipeline in
it: the shim's checks, before any dlopen, or a dlopen that failed, which leaves nothing loaded)
leave nothing behind: their descriptor is closed, or a process fed such pickles would run out.

The same (hash, name) again in the process is the same Pipeline object, found before anything
is hashed or loaded. A pipeline pickled in this process is found there too, so an in-process
round trip gives back the original (of a library loaded more than once, the one pickled last). Unpickled pipelines stay for the process's life (their
code cannot be unloaded); loaded ones only while someone holds them.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import pickle
import threading
import weakref

from shim.base.errors import ShimError

# What makes a memory file's contents final (see the docstring).
_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class PickledPipelineError(ShimError, pickle.UnpicklingError):
    """A pickled Pipeline's library bytes do not match their hash, or one of its fields is not
    what the shim pickles: it was damaged on the way (or not made by the shim)."""


# (sha256, name) -> Pipeline: every pipeline pickled or unpickled in this process, while alive.
_known: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_unpickled: list = []  # keeps unpickled pipelines alive (see the docstring)
_library_files: list[int] = []  # the sealed memory files they were loaded from: never closed
_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # A fork while another thread was loading would leave the lock held for good in the child.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def state(pipeline, library) -> tuple:
    """What ``pipeline``, loaded from ``library`` (a shim.calls.library.Library), pickles as:
    (sha256, name, bytes). Registers it, so that unpickling in this process finds it."""
    key = (library.digest, library.name)
    with _lock:
        # (The library may be loaded more than once: unpickling gives the one pickled last.)
        _known[key] = pipeline
    return (library.digest, library.name, library.data)


def restore(digest: str, name: str, data: bytes, load):
    """The Pipeline that ``state`` described: the one this process already has, else
    ``load(path, name)`` of a sealed memory file holding the bytes. Raises PickledPipelineError
    if the bytes do not hash to ``digest``."""
    for field, value, expected in (("sha256", digest, str), ("name", name, str),
                                   ("library bytes", data, bytes)):
        if not isinstance(value, expected):
            raise PickledPipelineError(
                f"a pickled pipeline's {field}: expected {expected.__name__}, got "
                f"{type(value).__name__}: the pickle was not made by the shim, or was damaged")
    key = (digest, name)
    with _lock:
        pipeline = _known.get(key)
        if pipeline is None:
            if _sha256(data) != digest:
                raise PickledPipelineError(
                    f"the library bytes of the pickled pipeline {name!r} do not match their "
                    f"sha256 {digest}: the pickle was damaged on the way")
            fd = _sealed_file(f"halide-shim {digest}", data)
            path = f"/proc/self/fd/{fd}"
            try:
                pipeline = load(path, name)
            except BaseException:
                if not _loaded(path):  # (refused, or a dlopen that failed: see the docstring)
                    os.close(fd)
                else:
                    _library_files.append(fd)
                raise
            _library_files.append(fd)
            _known[key] = pipeline
            _unpickled.append(pipeline)
    return pipeline


def _sealed_file(label: str, data: bytes) -> int:
    """A new sealed memory file holding ``data``: its descriptor."""
    fd = os.memfd_create(label, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        rest = memoryview(data)
        while rest:
            rest = rest[os.write(fd, rest):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _loaded(path: str) -> bool:
    """Whether the dynamic loader holds a library it opened as ``path`` (RTLD_NOLOAD: asked,
    never loaded; a library it holds gets one more reference, and is never unloaded anyway)."""
    try:
        ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return False
    return True


def _sha256(data) -> str:
    import hashlib  # (here: 4 ms of every import shim otherwise)

    return hashlib.sha256(data).hexdigest()
