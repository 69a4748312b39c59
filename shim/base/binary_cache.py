"""An on-disk cache of compiled device code (OpenCL program binaries), shared by processes.

One file per entry, ``<namespace>-<sha256 of the key>.bin``: a header (magic, format version,
lengths, sha256 of key and payload), the key text, the payload.

Trust: a payload reaches a driver, and on PoCL a program binary is native code, while anyone
can compute an entry's name and checksum. So the folder is used only under the rule of
shim/base/private_files.py (ours, with every folder above it, and nobody else can write into it;
otherwise a warning once and no cache at all), and an entry is read only if it is a regular
file of ours, opened without following a link.

Concurrency without locks: a writer writes a temporary file in the same directory and
renames it over the entry, so a reader opens either the old complete file or the new
complete one, and concurrent writers of one entry just replace each other (their payloads are
equivalent: same key). Without fsync, though, a crash or power loss can leave a renamed file
whose data never reached the disk (zeros, or short), and a file can be truncated or damaged
by other means (a full disk on a copy, a network file system, a person). Drivers do not all
refuse such input gracefully (PoCL crashes on a truncated program binary), so a reader checks
the header's lengths and checksum before anything reaches the driver: a damaged entry is a
miss, and the next store replaces it. The checksum costs well under a millisecond for the
binaries involved (tens of KB to a few MB).

Size: beyond ``max_bytes`` (256 MiB by default, $HALIDE_SHIM_CACHE_MAX_MB), the namespace's
entries used least recently (by mtime, refreshed on every hit) are deleted after each store.
An OpenCL program binary is ~10 KB-1 MB on GPU drivers and ~0.1-1 MB on PoCL, so 256 MiB
holds hundreds to thousands of programs, more than the pipelines x devices x driver versions
one user runs, while a cache left behind by many driver upgrades cannot grow without limit.
Temporary files a killed writer left are deleted when over an hour old. Only files the cache
named itself are ever deleted (an entry's exact name, or its temporary's): the folder may be
one the user keeps other files in.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import struct
import sys
from pathlib import Path

from shim.base import private_files

FORMAT_VERSION = 1
MAGIC = b"HSHIMBIN"
_HEADER = struct.Struct("<8sIIQ32s")  # magic, format version, key length, payload length, sha256
DEFAULT_MAX_BYTES = 256 << 20
STALE_TEMPORARY_SECONDS = 3600


def max_bytes_from_environment() -> int:
    configured = os.environ.get("HALIDE_SHIM_CACHE_MAX_MB", "").strip()
    try:
        megabytes = float(configured) if configured else math.nan
    except ValueError:
        megabytes = math.nan
    if math.isnan(megabytes):
        return DEFAULT_MAX_BYTES
    # (clamped before int(): "inf" or "1e400", no bound, would raise OverflowError there;
    # and below sys.maxsize, since load reads up to one byte more than the bound)
    return int(min(max(megabytes * (1 << 20), 0), sys.maxsize - 1))


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
    """Entries of one ``namespace`` (say "opencl") in ``directory``; the size bound covers the
    namespace's entries. Every failure to read or write (a missing, read-only or full
    directory, one refused as unsafe) is a miss, never an error: the cache only ever saves
    time."""

    def __init__(self, directory, namespace: str, max_bytes: int | None = None):
        self.directory = Path(directory)
        self.namespace = namespace
        self.max_bytes = max_bytes_from_environment() if max_bytes is None else max_bytes
        self._entry_names = re.compile(re.escape(namespace) + r"-[0-9a-f]{64}\.bin")

    def name(self, key: str) -> str:
        """The file name of ``key``'s entry."""
        return f"{self.namespace}-{hashlib.sha256(key.encode()).hexdigest()}.bin"

    def path(self, key: str) -> Path:
        return self.directory / self.name(key)

    def load(self, key: str) -> bytes | None:
        """The payload stored for ``key``, or None (missing, damaged, or not ours)."""
        folder = self._folder(create=False)
        if folder is None:
            return None
        with folder:
            payload = decode(folder.read(self.name(key), self.max_bytes + 1) or b"", key)
            if payload is not None:
                folder.touch(self.name(key))  # recently used: evicted last
        return payload

    def store(self, key: str, payload: bytes) -> bool:
        """Write the entry for ``key`` (replacing any), then evict beyond the size bound.
        False if it was not written (empty, too large, or the directory is not usable)."""
        data = encode(key, payload)
        if not payload or len(data) > self.max_bytes:
            return False
        folder = self._folder(create=True)
        if folder is None:
            return False
        with folder:
            try:
                folder.write(self.name(key), data)
            except OSError:
                return False
            self._evict(folder)
        return True

    def evict(self) -> None:
        """Delete the least recently used entries until the rest fit in ``max_bytes``, and
        temporary files left by writers that died. Races with other processes only make it
        delete a little more or find a file gone."""
        folder = self._folder(create=False)
        if folder is not None:
            with folder:
                self._evict(folder)

    def _evict(self, folder) -> None:
        folder.remove_stale_temporaries(self._entry_names, STALE_TEMPORARY_SECONDS)
        entries = sorted((info.st_mtime_ns, info.st_size, name)
                         for name, info in folder.files(self._entry_names))
        total = sum(size for _, size, _ in entries)
        for _, size, name in entries:
            if total <= self.max_bytes:
                break
            folder.remove(name)
            total -= size

    def _folder(self, create: bool):
        """The cache's folder, open, or None where it is missing, unreachable or refused."""
        try:
            return private_files.open_folder(
                self.directory, create=create,
                instead=f"Its {self.namespace} entries are neither read nor written.")
        except OSError:
            return None
