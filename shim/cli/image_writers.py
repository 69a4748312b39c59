"""The bytes halide_image_io.h (Halide 21) writes for the files RunGen saves, so that an output
``python -m shim run`` saves is RunGen's file byte for byte:

- ``.npy`` in halide_image_io's order (``--npy_order=halide``): its header, shape listed x
  first, newline before the padding (numpy's own order is np.save's, in shim/cli/images.py);
- PGM and PPM: ``P5``/``P6``, big-endian rows;
- TIFF: halide_image_io's uncompressed writer, planar (one strip per channel), its 15 tags;
- PNG: as libpng 1.6 writes it with the settings halide_image_io leaves at their defaults:
  one IHDR, each row's filter chosen by libpng's heuristic (the least sum of the filtered
  bytes taken as signed), zlib at its default level with the Z_FILTERED strategy and the
  window libpng narrows for small images, IDAT chunks of 8192 bytes. (zlib gives the same
  stream for the same settings: Python's zlib module and libpng use the system's, where
  Python is built with it.)

Arrays are in numpy order over Halide's planar layout: a W x H image with C channels is a
(C, H, W) array, a grayscale one (H, W).
"""

from __future__ import annotations

import struct
import zlib

import numpy as np


def write(f, suffix: str, array: np.ndarray) -> None:
    """Write ``array`` to the open binary file ``f`` in the format of ``suffix`` (one of
    FORMATS)."""
    FORMATS[suffix](f, np.ascontiguousarray(array))


# --- .npy ---------------------------------------------------------------------------------------

def _npy(f, array: np.ndarray) -> None:
    """halide_image_io's save_npy: the shape x first, the data in memory order."""
    dtype = array.dtype
    descr = ("|" if dtype.itemsize == 1 else "<") + dtype.kind + str(dtype.itemsize)
    extents = [str(n) for n in reversed(array.shape)]
    shape = "(" + ",".join(extents) + ("," if len(extents) == 1 else "") + ")"
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}}}\n"
    header += " " * (-(10 + len(header)) % 64)
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
    f.write(_little_endian(array).tobytes())


# --- PGM, PPM -----------------------------------------------------------------------------------

def _pnm(f, array: np.ndarray) -> None:
    """halide_image_io's save_pnm: P5 (gray) or P6 (RGB), rows big-endian, channels
    interleaved."""
    height, width = array.shape[-2:]
    channels = 3 if array.ndim == 3 else 1
    f.write(b"%s\n%d %d\n%d\n" % (b"P6" if channels == 3 else b"P5", width, height,
                                   (1 << (8 * array.dtype.itemsize)) - 1))
    f.write(_rows(array).tobytes())


# --- TIFF ---------------------------------------------------------------------------------------

_TIFF_HEADER_SIZE = 210  # (sizeof(halide_tiff_header), packed to 2 bytes)
# TIFF's SampleFormat per kind of number.
_SAMPLE_FORMATS = {"i": 2, "u": 1, "f": 3}


def _tiff(f, array: np.ndarray) -> None:
    """halide_image_io's save_tiff: its header of 15 tags, then (for several channels) the
    strips' offsets and sizes, then the data as the buffer holds it: planar."""
    extents = list(reversed(array.shape)) + [1] * (4 - array.ndim)  # x, y, z, c
    width, height, depth, channels = extents
    if channels == 1 and depth < 5:
        channels, depth = depth, 1
    size = array.dtype.itemsize
    elements = array.size
    SHORT, LONG, RATIONAL = 3, 4, 5
    tags = [(256, LONG, 1, width), (257, LONG, 1, height), (258, SHORT, 1, size * 8),
            (259, SHORT, 1, 1), (262, SHORT, 1, 2 if channels >= 3 else 1),
            (273, LONG, channels, _TIFF_HEADER_SIZE), (277, SHORT, 1, channels),
            (278, LONG, 1, height),
            (279, LONG, channels, elements * size if channels == 1
             else _TIFF_HEADER_SIZE + channels * 4),
            (282, RATIONAL, 1, 194), (283, RATIONAL, 1, 202),  # (the resolutions' offsets)
            (284, SHORT, 1, 1 if channels == 1 else 2), (296, SHORT, 1, 1),
            (339, SHORT, 1, _SAMPLE_FORMATS[array.dtype.kind]), (32997, LONG, 1, depth)]
    header = struct.pack("<2sHiH", b"II", 42, 8, len(tags))
    for tag, kind, count, value in tags:
        # (a SHORT's value in the first two bytes of the four, the rest zero)
        packed = struct.pack("<h2x", value) if kind == SHORT else struct.pack("<i", value)
        header += struct.pack("<Hhi", tag, kind, count) + packed
    header += struct.pack("<i4i", 0, 1, 1, 1, 1)
    assert len(header) == _TIFF_HEADER_SIZE
    f.write(header)
    if channels > 1:
        strip = width * height * depth * size
        first = _TIFF_HEADER_SIZE + channels * 4 * 2
        f.write(struct.pack(f"<{channels}i", *(first + i * strip for i in range(channels))))
        f.write(struct.pack(f"<{channels}i", *[strip] * channels))
    f.write(_little_endian(array).tobytes())


# --- PNG ----------------------------------------------------------------------------------------

# libpng's defaults (png.h, pnglibconf.h): PNG_ZBUF_SIZE, and the strategy for filtered rows.
_IDAT_SIZE = 8192
_COLOUR_TYPES = {1: 0, 2: 4, 3: 2, 4: 6}  # channels: gray, gray+alpha, RGB, RGBA


def _png(f, array: np.ndarray) -> None:
    height, width = array.shape[-2:]
    channels = array.shape[0] if array.ndim == 3 else 1
    bits = 8 * array.dtype.itemsize
    raw = _rows(array).reshape(height, -1)  # (each row's bytes)
    filtered = _filtered(raw, channels * bits // 8)
    data = height * (raw.shape[1] + 1)
    window = 15
    if data <= 16384:  # (png_deflate_claim: zlib needs 262 bytes beyond the data)
        while data + 262 <= 1 << (window - 1):
            window -= 1
    compressor = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, window, 8,
                                  zlib.Z_FILTERED)
    stream = bytearray(compressor.compress(filtered.tobytes()) + compressor.flush())
    _optimize_cmf(stream, data)
    f.write(b"\x89PNG\r\n\x1a\n")
    _chunk(f, b"IHDR", struct.pack(">IIBBBBB", width, height, bits, _COLOUR_TYPES[channels],
                                   0, 0, 0))
    for start in range(0, len(stream), _IDAT_SIZE):
        _chunk(f, b"IDAT", bytes(stream[start:start + _IDAT_SIZE]))
    _chunk(f, b"IEND", b"")


def _filtered(raw: np.ndarray, bpp: int) -> np.ndarray:
    """Each row (of ``raw``: rows of bytes) with its filter byte, filtered as libpng's
    png_write_find_filter filters it: of None, Sub, Up, Average and Paeth, the one whose
    bytes, taken as signed, sum least in magnitude (the first of equals); the rows above
    are the unfiltered ones, zero above the first. A single row takes None or Sub only, a
    single column None or Up."""
    height, length = raw.shape
    row = raw.astype(np.int32)
    above = np.vstack([np.zeros((1, length), np.int32), row[:-1]])
    left = np.hstack([np.zeros((height, bpp), np.int32), row[:, :-bpp]])
    corner = np.hstack([np.zeros((height, bpp), np.int32), above[:, :-bpp]])
    p = above - corner  # Paeth's predictor, as libpng computes it
    pc = left - corner
    pa, pb, pc = np.abs(p), np.abs(pc), np.abs(p + pc)
    paeth = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, above, corner))
    candidates = np.stack([row, row - left, row - above, row - (above + left) // 2,
                           row - paeth]) & 0xFF
    allowed = [True] * 5
    if height == 1:
        allowed[2] = allowed[3] = allowed[4] = False
    if length == bpp:  # (one pixel a row)
        allowed[1] = allowed[3] = allowed[4] = False
    costs = np.where(candidates < 128, candidates, 256 - candidates).sum(axis=2)
    costs[~np.array(allowed)] = np.iinfo(costs.dtype).max
    best = costs.argmin(axis=0)
    rows = candidates[best, np.arange(height)].astype(np.uint8)
    return np.hstack([best.astype(np.uint8)[:, None], rows])


def _optimize_cmf(stream: bytearray, data: int) -> None:
    """libpng's optimize_cmf: the zlib header's window size narrowed to what ``data`` bytes
    need (the compressor's own window is 262 bytes wider)."""
    if data > 16384 or stream[0] & 0x0F != 8 or stream[0] & 0xF0 > 0x70:
        return
    cinfo = stream[0] >> 4
    half = 1 << (cinfo + 7)
    if data > half:
        return
    while True:
        half >>= 1
        cinfo -= 1
        if not (cinfo > 0 and data <= half):
            break
    cmf = (stream[0] & 0x0F) | (cinfo << 4)
    flags = stream[1] & 0xE0
    flags += 0x1F - ((cmf << 8) + flags) % 0x1F
    stream[0], stream[1] = cmf, flags


def _chunk(f, kind: bytes, data: bytes) -> None:
    f.write(struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", zlib.crc32(kind + data)))


# --- JPEG ---------------------------------------------------------------------------------------

def _jpeg(f, array: np.ndarray) -> None:
    """halide_image_io's save_jpg: libjpeg's defaults at quality 99 (here through Pillow,
    with libjpeg's defaults: 4:2:0, baseline, a JFIF header)."""
    from PIL import Image

    pixels = np.moveaxis(array, 0, 2) if array.ndim == 3 else array
    Image.fromarray(np.ascontiguousarray(pixels)).save(f, format="JPEG", quality=99)


# --- helpers ------------------------------------------------------------------------------------

def _little_endian(array: np.ndarray) -> np.ndarray:
    return array.astype(array.dtype.newbyteorder("<"), copy=False)


def _rows(array: np.ndarray) -> np.ndarray:
    """The pixels row by row, channels interleaved, each value big-endian (halide_image_io's
    write_big_endian_row)."""
    pixels = np.moveaxis(array, 0, 2) if array.ndim == 3 else array
    return np.ascontiguousarray(pixels.astype(array.dtype.newbyteorder(">"), copy=False)
                                ).view(np.uint8)


FORMATS = {".npy": _npy, ".pgm": _pnm, ".ppm": _pnm, ".tiff": _tiff, ".tif": _tiff,
           ".png": _png, ".jpg": _jpeg, ".jpeg": _jpeg}
