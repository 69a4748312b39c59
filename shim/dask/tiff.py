"""``open_tiff``: a TIFF file (or a sequence of them) as an array that the workers read
themselves, through tifffile's Zarr interface, reading only the tiles or strips a region
covers.

Why not ``da.from_zarr(tifffile.imread(path, aszarr=True))``: that works on dask's threaded
scheduler, but the store it makes for one file holds the open file and its lock, and does not
pickle, so a distributed scheduler cannot send it to its workers. ``TiffSource`` pickles as
its path and options, and each process opens the file once, on its first read.
"""

from __future__ import annotations

import os
import threading

from shim.base.errors import ArgumentError


def open_tiff(files, **options) -> "TiffSource":
    """A TIFF file's image, read lazily through tifffile's Zarr interface
    (``tifffile.imread(files, aszarr=True, **options)``: a path, a glob pattern or a sequence
    of paths, with tifffile's ``series``, ``level``, ``key``...), as ``zarr.open_array`` opens
    a Zarr store: an array that ``map_pipeline`` reads region by region in its tasks, and
    that ``da.from_array(source, chunks=source.chunks)`` reads block by block. The workers open
    the file at the same path: a local cluster, or a shared file system. Needs tifffile and
    zarr."""
    return TiffSource(files, options)


class TiffSource:
    """The array of a TIFF file as tifffile's Zarr store reads it: shape, dtype, the file's
    chunks, and regions on request (``source[key]``). Pickles without the open store."""

    def __init__(self, files, options: dict):
        self.files = _paths(files)
        self.options = dict(options)
        self._lock = threading.Lock()
        self._store = self._array = None
        array = self._open()
        self.shape, self.dtype, self.chunks = array.shape, array.dtype, array.chunks
        self.ndim = len(self.shape)

    def _open(self):
        with self._lock:  # (a worker's threads share one store)
            if self._array is None:
                import tifffile
                import zarr

                store = None
                try:
                    store = tifffile.imread(self.files, aszarr=True, **self.options)
                    self._array = zarr.open_array(store, mode="r")
                except (OSError, ValueError, TypeError) as e:  # (zarr's errors are ValueErrors)
                    if store is not None:
                        store.close()
                    raise ArgumentError("files", f"cannot read {self.files!r} as one TIFF image "
                                                 f"(a pyramid's level: level=N): {e}") from None
                self._store = store
            return self._array

    def __getitem__(self, key):
        return self._open()[key]

    def close(self) -> None:
        """Close the open file, if any (a later read opens it again)."""
        with self._lock:
            if self._store is not None:
                self._store.close()
            self._store = self._array = None

    def __dask_tokenize__(self):
        """The same file, unchanged, with the same options: the same dask keys."""
        paths = [self.files] if isinstance(self.files, str) else self.files
        return ("shim.dask.TiffSource", self.files, sorted(self.options.items()),
                [_stat(path) for path in paths])

    def __getstate__(self) -> dict:
        return {"files": self.files, "options": self.options, "shape": self.shape,
                "dtype": self.dtype, "chunks": self.chunks, "ndim": self.ndim}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._store = self._array = None


def _paths(files):
    """``files`` as tifffile takes them: a path or pattern, or a list of paths."""
    if isinstance(files, (str, os.PathLike)):
        return os.fspath(files)
    if isinstance(files, (list, tuple)) and files and \
            all(isinstance(f, (str, os.PathLike)) for f in files):
        return [os.fspath(f) for f in files]
    raise ArgumentError("files", f"expected a path, a glob pattern or a sequence of paths, got "
                                 f"{files!r}")


def _stat(path: str):
    """(size, modification time) of a file, None for a pattern or a name that is not one."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns
