"""Chunks that stay on a device between dask tasks: what ``shim.dask.map_pipeline(...,
device=..., keep_on_device=True)`` returns its chunks as, and how a task cuts and joins its
input region from such chunks on the device.

The chunk type is the device's (``chunks_for``):

- CUDA, where CuPy is installed: ``cupy.ndarray``, as dask-cuda's workers hold them. Dask
  knows CuPy already (meta, concatenation, ``to_backend("numpy")``, its serializers); a task
  reads a chunk through DLPack (``shim.from_dlpack``: a Buffer over the array's memory) and
  hands its results over the same way (``cupy.from_dlpack`` of the output Buffer, which the
  shim, as the producer, orders before the consumer's stream).
- Any other shim device (OpenCL, Vulkan; CUDA without CuPy): ``DeviceArray``, a thin array over
  a ``shim.Buffer`` whose data lives in the device's memory. pyopencl's Array was the first
  candidate and falls short: its strided views (what a block's part of a halo region is)
  cannot be read (``get()``), assigned into another Array or concatenated, and it does not
  pickle (its CommandQueue does not). A shim.Buffer's crops are views of any stride on every
  device, and ``halide_buffer_copy`` copies between Buffers device to device.

A task's region (the blocks its halo spans, cut and joined) is new device memory that each
block's part is copied into, device to device (one ``halide_buffer_copy`` per block, of the
overlap of their boxes), or, where one block holds the whole region, a view of that block.

A ``DeviceArray`` is a carrier, not an array library: shape and dtype, basic indexing
(integers, slices of step 1, ``...``, ``None``) as views sharing its memory, concatenation
(registered with dask: where the chunks are, on the device or in host memory), downloading
(``get()``, ``np.asarray``, dask's ``to_backend("numpy")``), and pickling, which downloads: a
chunk that crosses processes (a distributed worker sends it to another, or spills it to disk)
travels as host bytes, and goes up to the receiver's device, once, when a task there first
reads it. Arithmetic on it is a pipeline's job (or pyopencl's: ``shim.to_pyopencl(x.buffer)``).
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np
from dask.array.dispatch import concatenate_lookup, to_numpy_dispatch
from dask.sizeof import sizeof

from shim.backends.devices import device as shim_device
from shim.base.errors import ArgumentError, CoordinateError
from shim.buffers.buffer import Buffer
from shim.interop.dlpack import from_dlpack


class DeviceArray:
    """An array in a shim device's memory, in numpy's axis order: ``buffer``, a shim.Buffer
    (at any mins: a DeviceArray's indices start at 0), and ``device``, the kind it belongs on.
    Where the data is: ``on_device`` (one made by unpickling holds it in host memory until a
    task reads it on the device)."""

    # dask concatenates with the function registered for the chunk of highest priority: this
    # one's takes numpy chunks too, where an array mixes them.
    __array_priority__ = 1

    __slots__ = ("buffer", "device")

    def __init__(self, buffer: Buffer, device: str):
        if not isinstance(buffer, Buffer):
            raise ArgumentError("buffer", f"expected a shim.Buffer, got {type(buffer).__name__}")
        if not isinstance(device, str):
            raise ArgumentError("device", f"expected a device kind (\"opencl\"), got {device!r}")
        self.buffer, self.device = buffer, device

    @classmethod
    def from_host(cls, array: Any, device: str) -> DeviceArray:
        """``array`` (anything ``np.asarray`` takes) for ``device``, in host memory until
        a task reads it there."""
        return cls(Buffer(np.ascontiguousarray(array)), device)  # (dense: as pipelines read x)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.buffer.shape

    @property
    def dtype(self) -> np.dtype:
        return self.buffer.dtype

    @property
    def ndim(self) -> int:
        return len(self.buffer.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self.shape[0]

    @property
    def on_device(self) -> bool:
        """Whether the data is in device memory (else in host memory, waiting to go up)."""
        return self.buffer.device is not None

    def __getitem__(self, index) -> DeviceArray:
        """A view sharing this array's memory: numpy's basic indexing with integers, slices of
        step 1, ``...`` and ``None``."""
        entries = index if isinstance(index, tuple) else (index,)
        if sum(e is Ellipsis for e in entries) > 1:
            raise ArgumentError("index", "an index can only have a single ellipsis ('...')")
        real = sum(e is not None and e is not Ellipsis for e in entries)
        if real > self.ndim:
            raise CoordinateError("index", f"too many indices for a {self.ndim}-D array: {index!r}")
        at = next((i for i, e in enumerate(entries) if e is Ellipsis), len(entries))
        entries = entries[:at] + (slice(None),) * (self.ndim - real) + entries[at + 1:]
        box = self.buffer.box  # (Halide's order: x first)
        rect: list = [None] * self.ndim
        dropped, new_axes, axis, out_axis = [], [], 0, 0
        for entry in entries:
            if entry is None:
                new_axes.append(out_axis)
                out_axis += 1
                continue
            d = self.ndim - 1 - axis
            lo, n = box[d]
            if isinstance(entry, slice):
                start, stop, step = entry.indices(n)
                if step != 1:
                    raise ArgumentError("index", f"a DeviceArray takes slices of step 1 (views "
                                                 f"of its memory), got {entry!r}; download it "
                                                 f"first (get())")
                rect[d] = (lo + start, max(stop - start, 0))
                out_axis += 1
            else:
                try:
                    if isinstance(entry, (bool, np.bool_)):
                        raise TypeError  # (numpy's mask of one element, not a position)
                    pos = operator.index(entry)
                except TypeError:
                    raise ArgumentError("index", f"a DeviceArray takes integers, slices, ... and "
                                                 f"None, got {entry!r}") from None
                if not -n <= pos < n:
                    raise CoordinateError("index", f"index {entry!r} is out of bounds for axis "
                                                   f"{axis} with size {n}")
                rect[d] = (lo + pos % n, 1)
                dropped.append((d, lo + pos % n))
            axis += 1
        view = self.buffer.cropped(rect)
        for d, pos in sorted(dropped, reverse=True):  # (the highest first: the others stay put)
            view = view.sliced(d, pos)
        for h in sorted(out_axis - 1 - j for j in new_axes):  # (the lowest first, likewise)
            view = view.embedded(h)
        return DeviceArray(view, self.device)

    def get(self) -> np.ndarray:
        """A host copy (downloads what only the device holds)."""
        return np.array(self.buffer.numpy())

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """Host data, downloaded (``np.asarray(chunk)``; a Zarr store's write of the chunk)."""
        return self.buffer.__array__(dtype, copy)

    def __reduce__(self):
        # The Buffer pickles as its host data (downloaded first) and unpickles as a host
        # Buffer, which goes up to the device when a task first reads it there.
        return DeviceArray, (self.buffer, self.device)

    def __repr__(self) -> str:
        where = "on the device" if self.on_device else "in host memory"
        return f"<shim DeviceArray {self.device} shape={self.shape} dtype={self.dtype} {where}>"


def device_buffer(shape: Sequence[int], dtype: Any, device: str, mins=None) -> Buffer:
    """A Buffer of ``shape`` (numpy order) at ``mins`` (x first) with an allocation on
    ``device`` and nothing to upload: what a pipeline writes into, or a region is joined in.
    Its host memory is the shim's own, which nobody sees: device data never comes home for it."""
    buf = Buffer.over_array(np.empty(tuple(shape), dtype), "chunk", exposed=False, mins=mins)
    buf.device_malloc(device)
    buf.set_host_dirty(False)  # (device_malloc made the host memory the newer: it holds nothing)
    return buf


def _place(source: Buffer, target: Buffer, offset: Sequence[int], device: str | None) -> None:
    """Copy into ``target`` the elements of ``source`` that fall inside it when ``source``'s
    first element sits ``offset`` (numpy order, any sign) from ``target``'s: one
    halide_buffer_copy of the overlap of their boxes, device to device where both are on
    ``device`` (None: into host memory). ``target`` is a Buffer no other thread uses: it is
    moved into ``source``'s coordinates for the copy, and back."""
    home = [lo for lo, _ in target.box]
    target.set_min([lo - o for (lo, _), o in zip(source.box, reversed(offset))])
    try:
        source.copy_into(target, shim_device(device) if device else None,
                         "copying a chunk's part")
    finally:
        target.set_min(home)


def concatenate(arrays: Sequence[Any], axis: int = 0) -> DeviceArray:
    """``arrays`` (DeviceArrays; numpy arrays among them too) joined along ``axis``: on the
    device where any of them is there (device copies), else in host memory (the chunks a
    client gathers arrive in host memory, and stay there)."""
    arrays = list(arrays)
    first = next((a for a in arrays if isinstance(a, DeviceArray)), None)
    if first is None:
        raise ArgumentError("arrays", "expected a DeviceArray among them")
    ndim = first.ndim
    try:
        axis = operator.index(axis)
    except TypeError:
        raise ArgumentError("axis", f"expected an integer, got {axis!r}") from None
    if not -ndim <= axis < ndim:
        raise ArgumentError("axis", f"{axis} is out of bounds for {ndim}-D arrays")
    axis %= ndim
    pieces = [a if isinstance(a, DeviceArray) else DeviceArray.from_host(a, first.device)
              for a in arrays]
    for piece in pieces:
        if piece.ndim != ndim or piece.dtype != first.dtype or any(
                n != m for k, (n, m) in enumerate(zip(piece.shape, first.shape)) if k != axis):
            raise ArgumentError("arrays", f"expected {ndim}-D arrays of {first.dtype} shaped as "
                                          f"{first.shape} but along axis {axis}, got "
                                          f"{piece.shape} {piece.dtype}")
    shape = list(first.shape)
    shape[axis] = sum(p.shape[axis] for p in pieces)
    device = first.device if any(p.on_device for p in pieces) else None
    joined = (device_buffer(shape, first.dtype, device) if device else
              Buffer.over_array(np.empty(shape, first.dtype), "concatenate", exposed=False))
    offset = [0] * ndim
    for piece in pieces:
        _place(piece.buffer, joined, offset, device)
        offset[axis] += piece.shape[axis]
    return DeviceArray(joined, first.device)


# --- the chunk types, and what map_pipeline's tasks ask of them -------------------------------

class DeviceChunks(ABC):
    """A chunk type on the shim device ``kind``: what a task asks of chunks."""

    def __init__(self, kind: str):
        self.kind = kind

    @abstractmethod
    def is_chunk(self, block) -> bool:
        """Whether ``block`` is one of these chunks (else a host array)."""

    @abstractmethod
    def memory(self, chunk) -> Buffer:
        """A Buffer over ``chunk``'s memory, current on the device."""

    @abstractmethod
    def result(self, buffer: Buffer):
        """The chunk over a pipeline's output ``buffer`` (an ``output``)."""

    @abstractmethod
    def meta(self, ndim: int, dtype):
        """An empty chunk: the dask array's ``_meta``."""

    def source(self, block) -> Buffer:
        """A Buffer over ``block``'s memory: a chunk's, or a host array's (which goes up
        where it is read on the device)."""
        if self.is_chunk(block):
            return self.memory(block)
        return Buffer(np.ascontiguousarray(block))  # (dense: as pipelines read x)

    def output(self, shape, dtype, mins) -> Buffer:
        """A Buffer on the device at ``mins`` (x first) for a pipeline's output chunk."""
        return device_buffer(shape, dtype, self.kind, mins)

    def assemble(self, region, blocks, starts) -> Buffer:
        """The ``region`` (Halide's box, x first) of an input, at its mins, from the blocks it
        spans (chunks, or host arrays among them) at their numpy-order ``starts``: a view of a
        block where one holds it all, else new device memory each block's part is copied into
        (device to device from chunks on the device, uploaded from host memory)."""
        lows = [lo for lo, _ in reversed(region)]
        shape = [extent for _, extent in reversed(region)]
        mins = [lo for lo, _ in region]
        sources = [self.source(block) for block in blocks]
        if len(sources) == 1:
            (source,), (start,) = sources, starts
            view = source.cropped([(lo + low - s, n) for (lo, _), s, low, n in zip(
                source.box, reversed(start), reversed(lows), reversed(shape))])
            view.set_min(mins)
            return view
        joined = device_buffer(shape, sources[0].dtype, self.kind, mins)
        for source, start in zip(sources, starts):
            _place(source, joined, [s - low for s, low in zip(start, lows)], self.kind)
        return joined


class ShimChunks(DeviceChunks):
    """Chunks as DeviceArrays."""

    def is_chunk(self, block) -> bool:
        return isinstance(block, DeviceArray)

    def memory(self, chunk: DeviceArray) -> Buffer:
        held = chunk.buffer.device
        if held is None or held.kind != self.kind:
            # Come from another process (pickled), or from another device: up once, at its
            # first read here, for every task of this worker that reads it.
            chunk.buffer.copy_to_device(self.kind)
        return chunk.buffer

    def result(self, buffer: Buffer) -> DeviceArray:
        buffer.mark_read()  # (the next task reads it: dropping it then warns of nothing)
        return DeviceArray(buffer, self.kind)

    def meta(self, ndim: int, dtype) -> DeviceArray:
        return DeviceArray(Buffer.over_array(np.empty((0,) * ndim, dtype), "meta",
                                             exposed=False), self.kind)


class DLPackChunks(DeviceChunks):
    """Chunks as another library's device arrays, exchanged by DLPack: ``xp`` is its module
    (CuPy's), with ``ndarray``, ``empty`` and ``from_dlpack``."""

    def __init__(self, xp, kind: str):
        super().__init__(kind)
        self.xp = xp

    def is_chunk(self, block) -> bool:
        return isinstance(block, self.xp.ndarray)

    def memory(self, chunk) -> Buffer:
        return from_dlpack(chunk)

    def result(self, buffer: Buffer):
        # The shim as DLPack producer: the consumer's stream waits for the pipeline's work,
        # and the capsule keeps the memory alive once the Buffer is gone.
        buffer.mark_read()
        return self.xp.from_dlpack(buffer)

    def meta(self, ndim: int, dtype):
        return self.xp.empty((0,) * ndim, dtype)


def chunks_for(device: str) -> DeviceChunks:
    """The chunk type of ``device``: CuPy's arrays on CUDA where CuPy imports, else
    DeviceArrays."""
    if device == "cuda":
        try:
            import cupy
        except ImportError:
            pass
        else:
            return DLPackChunks(cupy, device)
    return ShimChunks(device)


def kept_chunks(device: str | None, keep_on_device: object) -> DeviceChunks | None:
    """``map_pipeline``'s ``keep_on_device``, checked: the chunk type its results stay on
    ``device`` as, or None where they come to the host."""
    if not isinstance(keep_on_device, (bool, np.bool_)):
        raise ArgumentError("keep_on_device", f"expected True or False, got {keep_on_device!r}")
    if not keep_on_device:
        return None
    if device is None:
        raise ArgumentError("keep_on_device", "results stay on a device only with device= (the "
                                              "device the pipeline runs on, \"opencl\")")
    return chunks_for(device)


# --- dask's registrations -----------------------------------------------------------------------

concatenate_lookup.register(DeviceArray, concatenate)
# x.to_backend("numpy"): each chunk downloaded by the task that holds it.
to_numpy_dispatch.register(DeviceArray, lambda data, **kwargs: data.get())
# What a chunk holds on its device (its host memory is untouched until it is downloaded).
sizeof.register(DeviceArray, lambda chunk: chunk.nbytes)
