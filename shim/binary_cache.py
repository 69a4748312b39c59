"""An on-disk cache of compiled device code (OpenCL program binaries), shared by processes.

The root of the project's caches is $XDG_CACHE_HOME/halide-shim (``cache_root()``); this
module is standard library only and imports nothing from the shim, so that pipelines/build.py
can load it by path for ``cache_root()`` without importing the shim (which loads the native
runtime, something Halide's stock runtime must not share a process with).

One file per entry, ``<namespace>-<sha256 of the key>.bin``: a header (magic, format version,
lengths, sha256 of key and payload), the key text, the payload.

Concurrency without locks: a writer writes a temporary file in the same directory and
``os.replace``s it over the entry, so a reader opens either the old complete file or the new
complete one, and concurrent writers of one entry just replace each other (their payloads are
equivalent: same key). Without fsync, though, a crash or power loss can leave a renamed file
whose data never reached the disk (zeros, or short), and a file can be truncated or damaged
by other means (a full disk on a copy, a network file system, a person). Drivers do not all
refuse such input gracefully (PoCL crashes on a truncated program binary), so a reader checks
the header's lengths and checksum before anything reaches the driver: a damaged entry is a
miss, and the next store replaces it. The checksum costs well under a millisecond for the
binaries involved (tens of KB to a few MB).

Size: beyond ``max_bytes`` (256 MiB by default, $HALIDE_SHIM_CACHE_MAX_MB), the entries used
least recently (by mtime, refreshed on every hit) are deleted after each store. An OpenCL
program binary is ~10 KB-1 MB on GPU drivers and ~0.1-1 MB on PoCL, so 256 MiB holds hundreds
to thousands of programs, more than the pipelines x devices x driver versions one user runs,
while a cache left behind by many driver upgrades cannot grow without limit. Temporary files
a killed writer left are deleted when over an hour old.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
import time
from pathlib import Path

FORMAT_VERSION = 1
MAGIC = b"HSHIMBIN"
_HEADER = struct.Struct("<8sIIQ32s")  # magic, format version, key length, payload length, sha256
DEFAULT_MAX_BYTES = 256 << 20
STALE_TEMPORARY_SECONDS = 3600
_TEMPORARY_PREFIX = ".tmp-"


def cache_root() -> Path:
    """The root of halide-shim's on-disk caches: $XDG_CACHE_HOME/halide-shim (an unset or empty
    $XDG_CACHE_HOME means ~/.cache, as the XDG spec says)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "halide-shim"


def max_bytes_from_environment() -> int:
    configured = os.environ.get("HALIDE_SHIM_CACHE_MAX_MB", "").strip()
    try:
        return max(int(float(configured) * (1 << 20)), 0) if configured else DEFAULT_MAX_BYTES
    except ValueError:
        return DEFAULT_MAX_BYTES


def _digest(key_bytes: bytes, payload: bytes) -> bytes:
    digest = hashlib.sha256(key_bytes)
    digest.update(payload)
    return digest.digest()


def encode(key: str, payload: bytes) -> bytes:
    key_bytes = key.encode()
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, len(key_bytes), len(payload), _digest(key_bytes, payload))
    return header + key_bytes + payload


def decode(data: bytes, key: str) -> bytes | None:
    """The payload of an entry's bytes, or None unless they are a complete, undamaged entry
    for ``key``."""
    if len(data) < _HEADER.size:
        return None
    magic, version, key_length, payload_length, digest = _HEADER.unpack_from(data)
    key_bytes = key.encode()
    if (magic != MAGIC or version != FORMAT_VERSION or key_length != len(key_bytes)
            or len(data) != _HEADER.size + key_length + payload_length):
        return None
    start = _HEADER.size + key_length
    if data[_HEADER.size:start] != key_bytes:
        return None
    payload = data[start:]
    return payload if _digest(key_bytes, payload) == digest else None


class BinaryCache:
    """Entries of one ``namespace`` (say "opencl") in ``directory``; the size bound covers every
    entry in the directory. Every failure to read or write (a missing, read-only or full
    directory) is a miss, never an error: the cache only ever saves time."""

    def __init__(self, directory, namespace: str, max_bytes: int | None = None):
        self.directory = Path(directory)
        self.namespace = namespace
        self.max_bytes = max_bytes_from_environment() if max_bytes is None else max_bytes

    def path(self, key: str) -> Path:
        return self.directory / f"{self.namespace}-{hashlib.sha256(key.encode()).hexdigest()}.bin"

    def load(self, key: str) -> bytes | None:
        """The payload stored for ``key``, or None (missing or damaged)."""
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                data = f.read(self.max_bytes + 1)
        except OSError:
            return None
        payload = decode(data, key)
        if payload is not None:
            try:
                os.utime(path)  # recently used: evicted last
            except OSError:
                pass
        return payload

    def store(self, key: str, payload: bytes) -> bool:
        """Write the entry for ``key`` (replacing any), then evict beyond the size bound.
        False if it was not written (empty, too large, or the directory is not writable)."""
        data = encode(key, payload)
        if not payload or len(data) > self.max_bytes:
            return False
        temporary = None
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(prefix=_TEMPORARY_PREFIX, suffix=".bin", dir=self.directory)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(temporary, self.path(key))
            temporary = None
        except OSError:
            return False
        finally:
            if temporary is not None:
                try:
                    os.unlink(temporary)
                except OSError:
                    pass
        self.evict()
        return True

    def evict(self) -> None:
        """Delete the least recently used entries until the rest fit in ``max_bytes``, and
        temporary files left by writers that died. Races with other processes only make it
        delete a little more or find a file gone."""
        entries, total, now = [], 0, time.time()
        try:
            listing = list(os.scandir(self.directory))
        except OSError:
            return
        for entry in listing:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if entry.name.startswith(_TEMPORARY_PREFIX):
                if now - info.st_mtime > STALE_TEMPORARY_SECONDS:
                    _unlink(entry.path)
            elif entry.name.endswith(".bin") and entry.is_file(follow_symlinks=False):
                entries.append((info.st_mtime_ns, info.st_size, entry.path))
                total += info.st_size
        entries.sort()
        for _, size, path in entries:
            if total <= self.max_bytes:
                break
            _unlink(path)
            total -= size


def _unlink(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
