"""Where a buffer's elements lie in memory, and copy plans between two such layouts.

Halide addresses an element by its byte offset from the buffer's min coordinate, which is
where ``host`` points; a device allocation mirrors the host layout (same strides), starting at
the element the device handle stands for. So host<->device copies of one buffer are copies
between two bases with the same strides, and buffer_copy between two buffers is a copy of the
overlapping box between two bases with different strides. Both reduce to a ``CopyPlan``: the
outer loop extents and strides on each side, and the contiguous chunk copied at each step.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from shim.native import ffi


# Halide's names of its first dimensions (x is the innermost: numpy's last axis).
DIMENSION_NAMES = "xyzw"


def dimension_label(d: int, dimensions: int) -> str:
    """Halide's dimension ``d`` of a ``dimensions``-D buffer, by number and name, and the numpy
    axis it is, for messages: Halide counts from x, the innermost, which is numpy's last axis,
    so "dimension 0" alone reads as the wrong axis to a numpy user."""
    name = f"{DIMENSION_NAMES[d]}, " if d < len(DIMENSION_NAMES) else ""
    return f"dimension {d} ({name}numpy axis {dimensions - 1 - d})"


class NegativeStrides(ValueError):
    """Device allocations mirror host layouts from the min coordinate up; Halide refuses
    buffers with negative strides on devices, and so does the shim."""


class Layout(NamedTuple):
    """A buffer's shape in memory: per Halide dimension, min, extent and stride in bytes.
    (A NamedTuple, not a frozen dataclass: it is made on device paths, and a frozen
    dataclass's construction and its class's creation at import cost several times more.)"""

    elem_size: int
    mins: tuple[int, ...]
    extents: tuple[int, ...]
    strides: tuple[int, ...]

    @classmethod
    def of(cls, raw) -> Layout:
        elem = (raw.type.bits + 7) // 8
        dims = [raw.dim[i] for i in range(raw.dimensions)]
        return cls(elem, tuple(d.min for d in dims), tuple(d.extent for d in dims),
                   tuple(d.stride * elem for d in dims))

    @property
    def nbytes_span(self) -> int:
        """Bytes from the min element to just past the last one: the size of an allocation
        that mirrors this layout."""
        if any(e == 0 for e in self.extents):
            return 0
        if any(s < 0 for s in self.strides):
            raise NegativeStrides("buffers with negative strides cannot have device allocations")
        return sum((e - 1) * s for e, s in zip(self.extents, self.strides)) + self.elem_size

    @property
    def box(self) -> tuple:
        """The buffer's box: (min, extent) per dimension."""
        return tuple(zip(self.mins, self.extents))

    def offset_of(self, coords) -> int:
        """Byte offset of the element at Halide coordinates ``coords`` from the min element."""
        return sum((c - m) * s for c, m, s in zip(coords, self.mins, self.strides))


class CopyPlan(NamedTuple):
    """Copy ``shape`` (outer extents..., chunk bytes) from src_offset to dst_offset, stepping
    the outer dimensions by src_strides on one side and dst_strides on the other (a NamedTuple,
    as Layout)."""

    shape: tuple[int, ...]
    src_strides: tuple[int, ...]
    dst_strides: tuple[int, ...]
    src_offset: int = 0
    dst_offset: int = 0

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def chunk(self) -> int:
        return self.shape[-1]

    @property
    def src_span(self) -> int:
        return _span(self.shape, self.src_strides, self.src_offset)

    @property
    def dst_span(self) -> int:
        return _span(self.shape, self.dst_strides, self.dst_offset)

    def src_view(self, memory: np.ndarray) -> np.ndarray:
        """The bytes this plan reads, as a strided view of ``memory`` (a uint8 array)."""
        return _view(memory, self.src_offset, self.shape, self.src_strides)

    def dst_view(self, memory: np.ndarray) -> np.ndarray:
        """The bytes this plan writes, as a strided view of ``memory`` (a uint8 array)."""
        return _view(memory, self.dst_offset, self.shape, self.dst_strides)

    def src_host_view(self, address: int) -> np.ndarray:
        """The bytes this plan reads from host memory whose base is at ``address``: its
        strides may be negative (a host buffer's may), reaching below the base."""
        return _host_view(address, self.src_offset, self.shape, self.src_strides)

    def dst_host_view(self, address: int) -> np.ndarray:
        """The bytes this plan writes to host memory whose base is at ``address`` (as
        src_host_view)."""
        return _host_view(address, self.dst_offset, self.shape, self.dst_strides)

    def host_window(self, address: int, host_is_src: bool) -> tuple[np.ndarray, "CopyPlan"]:
        """For a driver that copies rows between a device allocation and host memory by
        offsets from a host array (OpenCL): the host memory the plan's host side reaches,
        ``address`` being its base (negative strides reach below it), and the plan with that
        side's offset counted from the window's start, never negative."""
        offset, strides = ((self.src_offset, self.src_strides) if host_is_src
                           else (self.dst_offset, self.dst_strides))
        if self.nbytes == 0:
            return host_memory(address, 0), self
        lo, hi = _reach(offset, self.shape, strides)
        lo = min(lo, 0)
        rebased = (self._replace(src_offset=offset - lo) if host_is_src
                   else self._replace(dst_offset=offset - lo))
        return host_memory(address + lo, hi - lo), rebased


def _span(shape, strides, offset) -> int:
    if any(e == 0 for e in shape):
        return offset
    return offset + sum((e - 1) * s for e, s in zip(shape[:-1], strides)) + shape[-1]


def _reach(offset: int, shape, strides) -> tuple[int, int]:
    """The lowest byte a side of a (non-empty) plan touches and one past its highest, from
    the base: below ``offset`` where a stride is negative."""
    reaches = [(e - 1) * s for e, s in zip(shape[:-1], strides)]
    return (offset + sum(r for r in reaches if r < 0),
            offset + sum(r for r in reaches if r > 0) + shape[-1])


def _host_view(address: int, offset: int, shape, strides) -> np.ndarray:
    """The view _view makes, over just the host memory it reaches: from its lowest byte (below
    ``address`` + ``offset`` where a stride is negative) to just past its highest."""
    if any(e == 0 for e in shape):
        return np.zeros(shape, np.uint8)
    lo, hi = _reach(offset, shape, strides)
    return _view(host_memory(address + lo, hi - lo), offset - lo, shape, strides)


def _view(memory: np.ndarray, offset: int, shape, strides) -> np.ndarray:
    return np.lib.stride_tricks.as_strided(memory[offset:], shape=shape, strides=(*strides, 1),
                                           writeable=True)


def plan(elem_size, extents, src_strides, dst_strides, src_offset=0, dst_offset=0) -> CopyPlan:
    """The copy of a box of ``extents`` elements between two layouts, with dimensions that are
    contiguous on both sides merged into the chunk (as Halide's device_buffer_utils does)."""
    if any(e == 0 for e in extents):
        return CopyPlan((0,), (), (), src_offset, dst_offset)
    dims = sorted(((e, s, d) for e, s, d in zip(extents, src_strides, dst_strides) if e != 1),
                  key=lambda dim: abs(dim[2]))
    chunk = elem_size
    while dims and dims[0][1] == chunk and dims[0][2] == chunk:
        chunk *= dims.pop(0)[0]
    merged = []
    for extent, src, dst in dims:
        if merged:
            last_extent, last_src, last_dst = merged[-1]
            if src == last_src * last_extent and dst == last_dst * last_extent:
                merged[-1] = (last_extent * extent, last_src, last_dst)
                continue
        merged.append((extent, src, dst))
    merged.reverse()
    return CopyPlan(tuple(e for e, _, _ in merged) + (chunk,),
                    tuple(s for _, s, _ in merged), tuple(d for _, _, d in merged),
                    src_offset, dst_offset)


class Rectangle(NamedTuple):
    """One strided block of a CopyPlan, as the drivers' rectangle copies take it
    (clEnqueueCopyBufferRect, cuMemcpy3D): ``region`` is (bytes per row, rows, slices);
    ``*_pitches`` are (bytes from row to row, bytes from slice to slice) on each side."""

    src_offset: int
    dst_offset: int
    region: tuple[int, int, int]
    src_pitches: tuple[int, int]
    dst_pitches: tuple[int, int]


def rectangles(copy: CopyPlan, *, whole_rows: bool = False, max_pitch: int | None = None):
    """A CopyPlan as few rectangle copies as it can be. A rectangle takes up to the two
    innermost outer dimensions, as long as each pitch covers the rows below it (as both
    drivers require); a loop runs over the rest. ``whole_rows``: a slice pitch must also be
    a whole number of rows (CUDA gives it as a row count); ``max_pitch``: the largest pitch
    the driver takes."""
    if copy.nbytes == 0:
        return
    outer = list(zip(copy.shape[:-1], copy.src_strides, copy.dst_strides))  # outermost first
    rect = []
    covered_src = covered_dst = copy.chunk
    for extent, src, dst in reversed(outer):
        fits = (len(rect) < 2 and src >= covered_src and dst >= covered_dst
                and (max_pitch is None or max(src, dst) <= max_pitch)
                and not (whole_rows and rect and (src % rect[0][1] or dst % rect[0][2])))
        if not fits:
            break
        rect.append((extent, src, dst))
        covered_src, covered_dst = src * extent, dst * extent
    loop = outer[:len(outer) - len(rect)]
    region = (copy.chunk, *(e for e, _, _ in rect), *(1,) * (2 - len(rect)))
    src_pitches = _pitches(copy.chunk, [(e, s) for e, s, _ in rect])
    dst_pitches = _pitches(copy.chunk, [(e, d) for e, _, d in rect])
    for index in np.ndindex(*(e for e, _, _ in loop)):
        src = copy.src_offset + sum(i * s for i, (_, s, _) in zip(index, loop))
        dst = copy.dst_offset + sum(i * d for i, (_, _, d) in zip(index, loop))
        yield Rectangle(src, dst, region, src_pitches, dst_pitches)


def runs(copy: CopyPlan):
    """(source offset, destination offset) of each of the plan's contiguous chunks, in order:
    for drivers that copy one range at a time."""
    if copy.nbytes == 0:
        return
    outer = list(zip(copy.shape[:-1], copy.src_strides, copy.dst_strides))
    for index in np.ndindex(*(e for e, _, _ in outer)):
        yield (copy.src_offset + sum(i * s for i, (_, s, _) in zip(index, outer)),
               copy.dst_offset + sum(i * d for i, (_, _, d) in zip(index, outer)))


def _pitches(chunk, dims):
    """(row pitch, slice pitch) for a rectangle of ``dims`` = [(extent, stride), ...]."""
    if not dims:
        return (chunk, chunk)
    if len(dims) == 1:
        extent, stride = dims[0]
        return (stride, stride * extent)
    return (dims[0][1], dims[1][1])


def host_memory(address: int, nbytes: int) -> np.ndarray:
    """``nbytes`` of host memory at ``address`` as a writable uint8 array (no copy)."""
    if nbytes == 0:
        return np.zeros(0, np.uint8)
    return np.frombuffer(ffi.buffer(ffi.cast("uint8_t *", address), nbytes), np.uint8)


# --- boxes: a buffer's region as ((min, extent), ...) per dimension -----------------------------

def intersect(a, b):
    """The box where ``a`` and ``b`` overlap, or None."""
    out = []
    for (a_min, a_extent), (b_min, b_extent) in zip(a, b):
        lo, hi = max(a_min, b_min), min(a_min + a_extent, b_min + b_extent)
        if hi <= lo:
            return None
        out.append((lo, hi - lo))
    return tuple(out)


def contains(outer, inner) -> bool:
    return all(o_min <= i_min and i_min + i_extent <= o_min + o_extent
               for (o_min, o_extent), (i_min, i_extent) in zip(outer, inner))


def subtract(box, hole) -> list:
    """``box`` minus ``hole``, as disjoint boxes (none if the hole covers it)."""
    overlap = intersect(box, hole)
    if overlap is None:
        return [box]
    pieces, rest = [], list(box)
    for d, ((lo, extent), (h_lo, h_extent)) in enumerate(zip(box, overlap)):
        if h_lo > lo:
            pieces.append(tuple(rest[:d] + [(lo, h_lo - lo)] + rest[d + 1:]))
        if h_lo + h_extent < lo + extent:
            pieces.append(tuple(rest[:d] + [(h_lo + h_extent, lo + extent - h_lo - h_extent)]
                                + rest[d + 1:]))
        rest[d] = (h_lo, h_extent)
    return pieces


def subtract_all(boxes, holes) -> list:
    for hole in holes:
        boxes = [piece for box in boxes for piece in subtract(box, hole)]
    return boxes


def overlaps(regions, box) -> bool:
    """Whether one of ``regions`` overlaps ``box``."""
    return any(intersect(region, box) for region in regions)


def without_box(regions: frozenset, box) -> frozenset:
    """``regions`` less ``box`` (those it cuts, in pieces)."""
    return frozenset(subtract_all(regions, [box]))


def with_box(regions: frozenset, box) -> frozenset:
    """``regions`` and ``box``: the regions ``box`` contains go (so that a buffer written over
    and over does not grow its set), and ``box`` joins unless one of the others contains it."""
    kept = frozenset(region for region in regions if not contains(box, region))
    return kept if any(contains(region, box) for region in kept) else kept | {box}


def box_plan(layout: Layout, box, device_offset: int, to_device: bool) -> CopyPlan:
    """The copy of the elements of ``box`` (in ``layout``'s coordinates) between host memory
    laid out as ``layout`` and a device allocation mirroring it from ``device_offset``."""
    offset = layout.offset_of([lo for lo, _ in box])
    extents = [extent for _, extent in box]
    if to_device:
        return plan(layout.elem_size, extents, layout.strides, layout.strides,
                    offset, device_offset + offset)
    return plan(layout.elem_size, extents, layout.strides, layout.strides,
                device_offset + offset, offset)


def mirror_plan(layout: Layout, device_offset: int, to_device: bool) -> CopyPlan:
    """The copy of a whole buffer between its host memory and a device allocation mirroring
    it from ``device_offset``."""
    return box_plan(layout, layout.box, device_offset, to_device)


def overlap_plan(src: Layout, dst: Layout, src_base: int, dst_base: int) -> CopyPlan:
    """The copy of the elements two buffers both have (where their boxes overlap; nothing
    where they do not) from ``src``'s memory at ``src_base`` to ``dst``'s at ``dst_base``
    (halide_buffer_copy). The two may have different strides, never different element sizes."""
    box = intersect(src.box, dst.box)
    if box is None:
        return plan(src.elem_size, [0], [], [], src_base, dst_base)
    lo = [lo for lo, _ in box]
    return plan(src.elem_size, [extent for _, extent in box], src.strides, dst.strides,
                src_base + src.offset_of(lo), dst_base + dst.offset_of(lo))
