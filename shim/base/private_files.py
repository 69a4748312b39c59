"""Folders no other local user can write into, and the files in them (DESIGN.md, invariant 11):
the one rule every on-disk cache of the shim follows, as ssh, ccache and pip do.

The threat is another user of the machine. Whatever the shim loads from a cache (an OpenCL
program binary, which on PoCL is native code; a pipeline's .so) runs in the user's process,
and an entry's name can be computed by anyone, so a folder someone else can write into is a
folder they can plant code in. ``open_folder(path)`` therefore uses a folder only if

- every folder on its resolved path (its links followed, as ``os.path.realpath`` does: a link
  into someone else's folder is judged where it leads) is owned by root or the user, and is not
  writable by its group or others, unless it is sticky as /tmp is (then others cannot rename or
  delete what is in it, and the next folder down must be ours or root's, as every folder must);
- every link on the way is the user's or root's, in a folder that passes the rule above:
  whoever owns a link, or can replace it, chooses where it leads, and another user's link in
  /tmp would have the user make folders and write where that user chose (the kernel's
  fs.protected_symlinks refuses to follow such a link for the same reason, but realpath reads
  links rather than following them, so it never asks the kernel); and
- the folder itself is the user's and not writable by its group or others (sticky or not);

it creates the folders missing on the way (mode 0700, each one: ``mkdir(parents=True)`` would
give only the last that mode). A folder that breaks the rule is refused with an
UnsafeCacheWarning, once per folder and process; the caller then works as if there were no
cache. Never an exception: an unsafe cache only costs time.

An accepted folder is held open (``PrivateFolder``), and everything after the check is done
relative to that descriptor, never following a link, so a path changed after the check cannot
redirect what follows. A file in it is read only if, opened without following a link and
without blocking (a FIFO would block an open for reading forever), it is a regular file the
user owns that its group and others cannot write; files are written under a temporary name
created exclusively (mode 0600) and renamed into place, so a reader sees the old file or the
new one, whole; only regular files the user owns are deleted, and only those the caller names.

Linux only, as the shim is (O_PATH descriptors let the walk pass folders it may enter but not
list). Standard library only, importing nothing from the shim: pipelines/build.py loads this
file by path in processes that must not load the shim's runtime (see ``_private_files`` there).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
import warnings
from pathlib import Path

# What a folder on the way is opened as: enough to be walked through and checked, not listed.
_WALK = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH

# A file being written: ".tmp-NAME.RANDOM", renamed to NAME once complete.
_TEMPORARY = re.compile(r"\.tmp-(.+)\.[0-9a-f]{16}")

# Folders already warned about in this process (a race between two threads may warn twice).
_warned: set[str] = set()


class UnsafeCacheWarning(UserWarning):
    """A cache folder (``$HALIDE_SHIM_CACHE``, ``$HALIDE_SHIM_PIPELINES``, the default under
    ``~/.cache/halide-shim``) was not used because another user could write into it: it, or a
    folder on its path, is someone else's or writable by its group or others. The shim works
    without it (OpenCL programs built from source, pipelines built into a private temporary
    folder)."""


def cache_root() -> Path:
    """The root of halide-shim's on-disk caches: $XDG_CACHE_HOME/halide-shim (an unset or empty
    $XDG_CACHE_HOME means ~/.cache, as the XDG spec says)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "halide-shim"


class PrivateFolder:
    """An open folder that passed the rule (see the module's docstring); ``path`` is where it
    was found (resolved). Use it in a ``with`` block, which closes it. Names given to its
    methods are plain file names in it."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._fd = fd

    def __enter__(self) -> PrivateFolder:
        return self

    def __exit__(self, *exc) -> None:
        os.close(self._fd)

    def read(self, name: str, limit: int = -1) -> bytes | None:
        """The contents of ``name`` (at most ``limit`` bytes), or None where it is missing or
        is not a regular file of the user's that nobody else can write."""
        try:
            fd = os.open(_plain(name), _READ, dir_fd=self._fd)
        except OSError:
            return None
        with open(fd, "rb") as f:
            info = os.fstat(fd)
            if not _is_own_file(info):
                return None
            # Never asking for more than the file holds (and one byte, to see it grew): read()
            # allocates what it is asked for at once, 256 MiB for a program-cache entry.
            return f.read(min(limit, info.st_size + 1) if limit >= 0 else -1)

    def has(self, name: str) -> bool:
        """Whether ``name`` is a regular file of the user's that nobody else can write (what
        ``read`` would read)."""
        try:
            return _is_own_file(os.stat(_plain(name), dir_fd=self._fd, follow_symlinks=False))
        except OSError:
            return False

    def write(self, name: str, data: bytes) -> None:
        """Make ``name`` hold ``data`` (mode 0600), replacing it whole: written under a
        temporary name first, then renamed. Raises OSError if it cannot be written."""
        temporary = f".tmp-{_plain(name)}.{os.urandom(8).hex()}"
        fd = os.open(temporary, _CREATE, 0o600, dir_fd=self._fd)
        try:
            with open(fd, "wb") as f:
                f.write(data)
            os.replace(temporary, name, src_dir_fd=self._fd, dst_dir_fd=self._fd)
        except BaseException:
            self._unlink(temporary)
            raise

    def touch(self, name: str) -> None:
        """Set ``name``'s times to now, if it is there."""
        try:
            os.utime(_plain(name), dir_fd=self._fd, follow_symlinks=False)
        except OSError:
            pass

    def files(self, names: re.Pattern) -> list[tuple[str, os.stat_result]]:
        """(name, stat) of each regular file of the user's whose whole name ``names`` matches."""
        found = []
        try:
            with os.scandir(self._fd) as listing:
                for entry in listing:
                    if names.fullmatch(entry.name):
                        try:
                            info = entry.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        if _is_own_file(info):
                            found.append((entry.name, info))
        except OSError:
            pass
        return found

    def remove(self, name: str) -> None:
        """Delete ``name`` if it is a regular file of the user's (nothing else, ever)."""
        if self.has(name):
            self._unlink(name)

    def remove_stale_temporaries(self, names: re.Pattern, older_than_s: float) -> None:
        """Delete what ``write`` left half-written (a writer killed) more than ``older_than_s``
        seconds ago, for files whose whole name ``names`` matches."""
        now = time.time()
        for name, info in self.files(_TEMPORARY):
            if names.fullmatch(_TEMPORARY.fullmatch(name)[1]) and now - info.st_mtime > older_than_s:
                self._unlink(name)

    def _unlink(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self._fd)
        except OSError:
            pass


def open_folder(path, create: bool = True, instead: str = "") -> PrivateFolder | None:
    """The folder at ``path``, checked and open (see the module's docstring), or None where it
    breaks the rule: then an UnsafeCacheWarning, once per folder, says why and adds ``instead``
    (what the caller does without it). Folders missing on the way are made when ``create``.
    Raises OSError where the folder cannot be reached (missing and not ``create``, a file of
    the user's or root's in the way, no permission); someone else's file in the way is theirs
    to have put there, and refused as a folder of theirs would be."""
    resolved, problem = _resolve(path)
    if not problem:
        folder = _walk(resolved, create)
        if isinstance(folder, PrivateFolder):
            return folder
        problem = folder
    _warn_once(path, resolved, problem, instead)
    return None


def _resolve(path) -> tuple[Path, str]:
    """``path``, absolute, its links followed as ``os.path.realpath`` follows them, and '';
    or, where a link or a folder met on the way breaks the rule (see the module's docstring),
    ``path`` made absolute but not resolved (the problem names what breaks it), and why."""
    user = os.geteuid()
    given = os.fsdecode(path)
    absolute = given if given.startswith("/") else os.path.join(os.getcwd(), given)
    rest = absolute.split("/")[::-1]
    asked = Path(os.path.normpath(absolute))  # (what a problem is reported for)
    names: list[str] = []
    links = 0
    while rest:
        name = rest.pop()
        if name in ("", "."):
            continue
        if name == "..":
            names = names[:-1]
            continue
        here = Path("/", *names, name)
        try:
            info = os.lstat(here)
        except OSError:  # (missing, or not reachable: the walk says which)
            info = None
        if info is None or not stat.S_ISLNK(info.st_mode):
            # Judged as the walk judges a folder on the way, also where it is not on the
            # resolved path (a folder a link is in): a link in a folder others can replace it
            # in (between its lstat and its readlink, too) leads wherever they choose. Each
            # folder is judged before anything in it is looked at, so what passed cannot be
            # changed by anyone else while this runs.
            problem = "" if info is None else _problem(info, here, last=False)
            if problem:
                return asked, problem
            names.append(name)
            continue
        if info.st_uid not in (user, 0):
            return asked, (f"{here} is a link of uid {info.st_uid}'s, not this user's (uid "
                           f"{user}): whoever owns a link chooses where it leads")
        links += 1
        if links > 40:  # (as the kernel's limit: a loop)
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), os.fsdecode(path))
        target = os.readlink(here)
        if target.startswith("/"):
            names = []
        rest.extend(target.split("/")[::-1])
    return Path("/", *names), ""


def _walk(resolved: Path, create: bool) -> PrivateFolder | str:
    """The folder ``resolved`` (no link on its path), checked folder by folder from / and
    open, or why it cannot be trusted."""
    names = resolved.parts[1:]
    fd = os.open("/", _WALK)
    try:
        for depth in range(len(names) + 1):
            where = Path("/", *names[:depth])
            if depth:
                try:
                    child = _open_child(fd, names[depth - 1], create)
                except (NotADirectoryError, FileNotFoundError) as error:
                    problem = _in_the_way(fd, names[depth - 1], where, error, create)
                    if not problem:
                        raise
                    return problem
                os.close(fd)
                fd = child
            problem = _problem(os.fstat(fd), where, last=depth == len(names))
            if problem:
                return problem
        # Opened again, from the descriptor that was checked, so that it can be listed.
        return PrivateFolder(resolved, os.open(".", _FOLDER, dir_fd=fd))
    finally:
        os.close(fd)


def _open_child(parent: int, name: str, create: bool) -> int:
    try:
        return os.open(name, _WALK, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:
        pass  # made meanwhile (another process): checked as any other
    return os.open(name, _WALK, dir_fd=parent)


def _in_the_way(parent: int, name: str, where: Path, error: OSError, create: bool) -> str:
    """Why ``name``, which the walk could not open as a folder in ``parent`` (a folder that
    passed), makes the cache unsafe rather than unreachable, or '' (then ``error`` stands).
    In a sticky folder others can write, such as /tmp, they can take the name first, with a
    file or a link (put there since _resolve looked, maybe), or put a folder there and take it
    away again between two steps of the walk: theirs to do, unsafe as a folder of theirs is."""
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        # Not a folder a moment ago, or there when mkdir looked (create), and gone since.
        if isinstance(error, NotADirectoryError) or create:
            return f"{where} changed while it was checked: made and removed by someone else"
        return ""  # simply missing
    if info.st_uid in (os.geteuid(), 0):
        return ""  # the user's own file in the way
    return f"{where} belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()})"


def _problem(info: os.stat_result, where: Path, last: bool) -> str:
    """Why the folder ``where`` (its fstat ``info``) cannot be trusted, or ''."""
    user = os.geteuid()
    if info.st_uid != user and (last or info.st_uid != 0):
        return f"{where} belongs to uid {info.st_uid}, not to this user (uid {user})"
    writable = info.st_mode & _WRITABLE_BY_OTHERS
    if writable and (last or not info.st_mode & stat.S_ISVTX):
        by = "others" if writable & stat.S_IWOTH else "its group or users its ACL names"
        return f"{where} is writable by {by} (mode {stat.S_IMODE(info.st_mode):o})"
    return ""


def _is_own_file(info: os.stat_result) -> bool:
    return (stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()
            and not info.st_mode & _WRITABLE_BY_OTHERS)


def _plain(name: str) -> str:
    """``name``, which must be a file's name, not a path: everything stays in the folder."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"not a plain file name: {name!r}")
    return name


def _warn_once(path, resolved: Path, problem: str, instead: str) -> None:
    if str(resolved) in _warned:
        return
    _warned.add(str(resolved))
    shown = f"{path}" if Path(path) == resolved else f"{path} (that is, {resolved})"
    warnings.warn(UnsafeCacheWarning(
        f"halide-shim does not use {shown} as a cache: {problem}, so another user could put "
        f"files there. {instead}".rstrip()), stacklevel=3)
