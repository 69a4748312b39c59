"""Buffers to and from files for the command line, as Halide's RunGen and halide_image_io.h
do: ``.npy`` (any type and dimensionality) and images (PNG, JPEG, PGM, PPM, BMP, TIFF).

Images are read and written by imageio (its Pillow plugin); 16-bit colour PNGs, which Pillow
cannot hold (it reads them as 8-bit), by pypng; TIFFs by tifffile, in every type
halide_image_io writes (16-bit colour, 32- and 64-bit integers, doubles; RunGen itself reads
no TIFF, the shim does). Arrays here are in numpy order over Halide's
(x, y, c) layout: a W x H RGB image is a (3, H, W) array, a grayscale one (H, W).

A file whose type or dimensionality differs from the buffer's is converted as RunGen
converts it, with a warning: halide_image_io's ImageTypeConversion for the type (an 8-bit
image given to a uint16 input is scaled by 257, a float output saved to PNG is scaled by
65535 and rounded), trailing dimensions of extent 1 added or extra ones sliced at 0.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np

from shim.base.errors import ArgumentError

# Per image suffix: the (numpy dtype, dimensions) it stores, and the channel counts a 3-D
# buffer may have (a 3-D buffer of one channel is saved as a grayscale image).
_U8, _U16, _F32 = np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.float32)


@dataclass(frozen=True)
class _ImageFormat:
    kinds: frozenset  # {(dtype, dimensions)}
    channels: tuple


_TIFF = _ImageFormat(frozenset((np.dtype(f"{kind}{size}"), dimensions)
                                for kind in "iu" for size in (1, 2, 4, 8) for dimensions in (2, 3)
                                ) | {(np.dtype(f"f{size}"), d) for size in (4, 8) for d in (2, 3)},
                     (1, 2, 3, 4))

_IMAGE_FORMATS = {
    ".png": _ImageFormat(frozenset({(_U8, 2), (_U8, 3), (_U16, 2), (_U16, 3)}), (1, 2, 3, 4)),
    ".jpg": _ImageFormat(frozenset({(_U8, 2), (_U8, 3)}), (1, 3)),
    ".jpeg": _ImageFormat(frozenset({(_U8, 2), (_U8, 3)}), (1, 3)),
    ".pgm": _ImageFormat(frozenset({(_U8, 2), (_U16, 2)}), ()),
    ".ppm": _ImageFormat(frozenset({(_U8, 3)}), (3,)),
    ".bmp": _ImageFormat(frozenset({(_U8, 2), (_U8, 3)}), (1, 3)),
    # halide_image_io writes every int, uint and 32/64-bit float type to TIFF (here through
    # tifffile: Pillow cannot write 16-bit colour).
    ".tif": _TIFF,
    ".tiff": _TIFF,
}
SUFFIXES = (".npy", *_IMAGE_FORMATS)


def suffix_of(path: str) -> str:
    return os.path.splitext(path)[1].lower()


def is_supported(path: str) -> bool:
    return suffix_of(path) in SUFFIXES


def _unsupported(argument: str, path: str) -> ArgumentError:
    return ArgumentError(argument, f"cannot tell the format of {path!r}: expected a name ending "
                                   f"in {', '.join(SUFFIXES)}")


# --- reading ------------------------------------------------------------------------------------

# How a .npy file's shape is read and written: "numpy" (numpy's np.save / np.load: a W x H
# image is shape (H, W)) or "halide" (halide_image_io's, which RunGen reads and writes: the
# same bytes, the header's shape listed x first, (W, H)).
NPY_ORDERS = ("numpy", "halide")


def read(path: str, argument: str, npy_order: str = "numpy") -> np.ndarray:
    """The array a file holds, in numpy order over Halide's layout."""
    suffix = suffix_of(path)
    if suffix not in SUFFIXES:
        raise _unsupported(argument, path)
    if not os.path.exists(path):
        raise ArgumentError(argument, f"no such file: {path!r}")
    if not os.path.isfile(path):  # (a FIFO would be read until someone writes to it)
        raise ArgumentError(argument, f"{path} is a directory" if os.path.isdir(path) else
                                      f"{path} is not a regular file")
    if suffix == ".npy":
        array = _read_npy(path, argument)
        if npy_order == "halide":
            if array.ndim > 1 and not array.flags.c_contiguous:
                raise ArgumentError(argument, f"{path} is in Fortran order, which "
                                              f"halide_image_io does not read (--npy_order=halide)")
            array = array.reshape(array.shape[::-1])  # (the same bytes, x last)
        return array
    try:
        if suffix == ".png" and _is_16_bit_colour_png(path):
            pixels = _pypng_read(path, argument)
        elif suffix in (".tif", ".tiff"):
            pixels = _tiff_read(path, argument)
        else:
            pixels = _imageio(argument).imread(path)
    except (OSError, ValueError) as e:
        raise ArgumentError(argument, f"cannot read {path}: {e}") from None
    except Exception as e:  # Pillow and pypng raise what they meet in a damaged file
        raise ArgumentError(argument, f"cannot read {path}: damaged, or not a {suffix} image "
                                      f"({type(e).__name__}: {e})") from None
    if suffix in (".pgm", ".ppm") and pixels.dtype == np.int32:
        pixels = pixels.astype(np.uint16)  # Pillow reads 16-bit PNM files as 32-bit integers
    if pixels.ndim == 3:
        pixels = np.moveaxis(pixels, 2, 0)  # (y, x, c) -> (c, y, x)
    return np.ascontiguousarray(pixels)


# A .npy header longer than this is refused, as numpy's np.load refuses one by default.
_NPY_HEADER_LIMIT = 10000


def _read_npy(path: str, argument: str) -> np.ndarray:
    """The array in a .npy file: numpy's format, read here rather than by np.load, whose header
    parser (Python's tokenizer from 3.12 on) refuses the headers halide_image_io writes, with
    the newline before the padding ("IndentationError: unexpected indent")."""
    try:
        with open(path, "rb") as f:
            dtype, fortran_order, shape = _npy_header(f, path, argument)
            if dtype.kind not in "biuf":  # structured, complex, text, dates: no conversion holds
                raise ArgumentError(argument, f"cannot read {path}: its elements are {dtype}, "
                                              f"not numbers (bool, integers or floats)")
            count = int(np.prod(shape, dtype=object))
            size = os.fstat(f.fileno()).st_size - f.tell()
            if size != count * dtype.itemsize:
                raise ArgumentError(argument, f"cannot read {path}: its header says {count} "
                                              f"elements of {dtype.itemsize} bytes, and "
                                              f"{size} bytes follow it")
            data = np.frombuffer(f.read(size), dtype, count)
    except OSError as e:
        raise ArgumentError(argument, f"cannot read {path}: {e}") from None
    array = data.reshape(shape[::-1]).T if fortran_order else data.reshape(shape)
    # Halide reads this machine's byte order, and x along rows: not a Fortran-ordered array's.
    return np.asarray(array, dtype.newbyteorder("="), order="C")


def _npy_header(f, path: str, argument: str) -> tuple[np.dtype, bool, tuple[int, ...]]:
    """(element type, Fortran order, shape) from a .npy file's header, leaving ``f`` at the
    data. The header is a Python dict literal of exactly those three keys, whatever whitespace
    surrounds it."""
    import ast  # (here: only a .npy read needs it)

    def damaged(what: str) -> ArgumentError:
        return ArgumentError(argument, f"cannot read {path}: a damaged .npy header ({what})")

    magic = np.lib.format.MAGIC_PREFIX
    lead = f.read(len(magic) + 2)
    if len(lead) < len(magic) + 2 or not lead.startswith(magic):
        raise ArgumentError(argument, f"{path} is not a .npy file")
    major = lead[len(magic)]
    if major not in (1, 2, 3):
        raise damaged(f"format version {major}")
    width = 2 if major == 1 else 4
    length = int.from_bytes(f.read(width), "little")
    if length > _NPY_HEADER_LIMIT:
        raise damaged(f"{length} bytes long; at most {_NPY_HEADER_LIMIT} are read")
    raw = f.read(length)
    if len(raw) != length:
        raise damaged("the file ends inside it")
    try:
        header = ast.literal_eval(raw.decode("utf8" if major == 3 else "latin1").strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError, UnicodeDecodeError) as e:
        raise damaged(f"{type(e).__name__}: {e}") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise damaged("not a dict of descr, fortran_order and shape")
    shape, fortran_order = header["shape"], header["fortran_order"]
    if not isinstance(shape, tuple) or not all(type(n) is int and n >= 0 for n in shape):
        raise damaged(f"shape {shape!r}")
    if not isinstance(fortran_order, bool):
        raise damaged(f"fortran_order {fortran_order!r}")
    try:
        dtype = np.lib.format.descr_to_dtype(header["descr"])
    except Exception as e:  # (numpy raises what it meets in a descr it cannot take)
        raise damaged(f"descr {header['descr']!r}: {e}") from None
    return dtype, fortran_order, shape


def conform(array: np.ndarray, dimensions: int, dtype: np.dtype, what: str, warn) -> np.ndarray:
    """``array`` with ``dimensions`` dimensions and element type ``dtype``, changed as RunGen
    changes a file's contents to fit an argument, saying so through ``warn``."""
    array = _with_dimensions(array, dimensions, what, warn)
    if array.dtype != dtype:
        warn(f"{what} is of type {_type_name(array.dtype)} but is used as {_type_name(dtype)}; "
             f"data loss may have occurred")
        array = np.asarray(convert(array, dtype))  # (numpy's arithmetic makes 0-D a scalar)
    return array


def _with_dimensions(array: np.ndarray, dimensions: int, what: str, warn) -> np.ndarray:
    """Halide dimensions are numpy axes from the last: missing ones are added outermost with
    extent 1, extra ones (the outermost) are sliced at their first coordinate."""
    if array.ndim < dimensions:
        warn(f"{what} has {array.ndim} dimensions, but {dimensions} are needed: adding "
             f"dimensions of extent 1")
        # (reshape gives them real strides: np.newaxis's 0 breaks Halide's stride.0 == 1)
        return array.reshape((1,) * (dimensions - array.ndim) + array.shape)
    if array.ndim > dimensions:
        extra = array.ndim - dimensions
        if any(extent > 1 for extent in array.shape[:extra]):
            warn(f"{what} has {array.ndim} dimensions, but only the first {dimensions} are "
                 f"used; data loss may have occurred")
        return array[(0,) * extra + (...,)]  # (the ... keeps a 0-D result an array)
    return array


# --- writing ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SavePlan:
    """How an output is saved: the file, and the dimensions and element type it is saved
    with, chosen before any run so that a file that cannot hold it is refused first."""

    path: str
    dimensions: int
    dtype: np.dtype
    npy_order: str = "numpy"  # (for a .npy file: see NPY_ORDERS)


def plan_save(argument: str, path: str, shape: tuple, dtype: np.dtype, warn,
              npy_order: str = "numpy") -> SavePlan:
    """The SavePlan for an output of numpy ``shape`` and ``dtype`` (RunGen's best format:
    the fewest dimensions added or dropped, then the nearest bit width, then the same kind of
    number), after checking that it can be written; conversions are announced through
    ``warn``. Refuses what cannot be saved there, naming the output."""
    suffix = suffix_of(path)
    if suffix != ".npy" and suffix not in _IMAGE_FORMATS:
        raise _unsupported(argument, path)
    check_writable(argument, path)
    if suffix == ".npy":
        return SavePlan(path, len(shape), dtype, npy_order)
    image_format = _IMAGE_FORMATS[suffix]
    dims = len(shape)
    # Ties go to the first in halide_image_io's order: by type code, bits, dimensions.
    candidates = sorted(image_format.kinds, key=lambda kind: ("iuf".index(kind[0].kind),
                                                              kind[0].itemsize, kind[1]))
    best_dtype, best_dims = min(candidates, key=lambda kind: (
        abs(kind[1] - dims) * 128 + abs(kind[0].itemsize - dtype.itemsize) * 8
        + (kind[0].kind != dtype.kind)))
    what = f"output {argument!r}"
    if best_dims != dims:
        warn(f"{what} has {dims} dimensions but is saved with {best_dims} to {path}")
    # (The shape alone, over no memory: the output does not exist yet.)
    saved_shape = _with_dimensions(np.broadcast_to(np.empty((), np.bool_), shape), best_dims,
                                   what, lambda _: None).shape
    if best_dims == 3 and saved_shape[0] not in image_format.channels:
        *others, last = image_format.channels
        counts = f"{', '.join(map(str, others))} or {last}" if others else str(last)
        raise ArgumentError(argument, f"{path}: {suffix} images have {counts} channels; "
                                      f"{argument} has {saved_shape[0]} (extent of dimension 2); "
                                      f"use .npy")
    if best_dtype != dtype:
        warn(f"{what} is of type {_type_name(dtype)} but is saved as {_type_name(best_dtype)} "
             f"to {path}; data loss may have occurred")
    # The libraries are needed now, not after the runs.
    if suffix == ".png" and best_dtype == _U16 and best_dims == 3 and saved_shape[0] > 1:
        _pypng(argument)
    elif suffix in (".tif", ".tiff"):
        _tifffile(argument)
    else:
        _imageio(argument)
    return SavePlan(path, best_dims, best_dtype)


def check_writable(argument: str, path: str) -> None:
    """Refuse a file that cannot be written (before the runs whose results it would hold)."""
    directory = os.path.dirname(path) or "."
    if os.path.isdir(path):
        problem = "is a directory"
    elif not os.path.isdir(directory):
        problem = "no such directory"
    elif not os.access(path if os.path.exists(path) else directory, os.W_OK):
        problem = "permission denied"
    else:
        return
    raise ArgumentError(argument, f"cannot write {path}: {problem}")


def save(plan: SavePlan, array: np.ndarray, argument: str) -> None:
    suffix = suffix_of(plan.path)
    if suffix != ".npy":
        array = convert(_with_dimensions(array, plan.dimensions, "", lambda _: None), plan.dtype)
        if array.ndim == 3:
            array = np.moveaxis(array, 0, 2)  # (c, y, x) -> (y, x, c)
            if array.shape[2] == 1:
                array = array[:, :, 0]
        array = np.ascontiguousarray(array)
    try:
        # Into a file of our own: np.save would add .npy to a name in .NPY, and imageio's own
        # file, failing to close (a full disk), fails again when collected, with a traceback.
        with open(plan.path, "wb") as f:
            if suffix == ".npy" and plan.npy_order == "halide":
                dense = np.ascontiguousarray(array)
                np.save(f, dense.reshape(dense.shape[::-1]))  # the same bytes, x first
            elif suffix == ".npy":
                np.save(f, array)
            elif array.ndim == 3 and array.dtype == _U16 and suffix == ".png":
                _pypng_write(f, array, argument)
            elif suffix in (".tif", ".tiff"):
                colour = array.ndim == 3 and array.shape[2] in (3, 4)
                _tifffile(argument).imwrite(f, array, photometric="rgb" if colour else
                                            "minisblack")
            else:
                _imageio(argument).imwrite(f, array, extension=suffix)
    except (OSError, ValueError) as e:
        raise ArgumentError(argument, f"cannot write {plan.path}: {e}") from None


# --- Halide's type conversion -----------------------------------------------------------------

def convert(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """halide_image_io's ImageTypeConversion: integers are fixed-point fractions of their
    type's range (signed ones read as the unsigned of their width), floats are in [0, 1], and
    bools are 0 or 1. Widening an integer replicates its bits (0xAB -> 0xABAB), narrowing to
    8 bits rounds, and narrowing to wider types truncates. Floats beyond [0, 1] are clamped
    (Halide's conversion lets them wrap around)."""
    dtype = np.dtype(dtype)
    if array.dtype == dtype:
        return array
    if dtype == np.bool_:
        return array != 0
    if array.dtype == np.bool_:
        return array.astype(dtype)
    if array.dtype.kind == "f" and dtype.kind == "f":
        return array.astype(dtype)
    if array.dtype.kind == "f":
        bits = dtype.itemsize * 8
        if bits == 64:  # through uint32, as Halide does
            return convert(convert(array, np.uint32), dtype)
        # In Halide's precision: float (float16 widened: its 65535 is infinity), double for a
        # double or for 32 bits (float's 2^32 - 1 is 2^32, which wraps to 0).
        work = np.float64 if bits == 32 or array.dtype.itemsize == 8 else np.float32
        unit = np.clip(np.nan_to_num(array.astype(work, copy=False), nan=0.0), 0, 1)
        scaled = np.floor(unit * float(2**bits - 1) + 0.5)  # halves away from 0, as lround
        return scaled.astype(f"u{dtype.itemsize}").view(_same_width(dtype))
    unsigned = array.view(f"u{array.dtype.itemsize}")
    from_bits = array.dtype.itemsize * 8
    if dtype.kind == "f":
        if from_bits == 64:
            unsigned, from_bits = unsigned >> np.uint64(32), 32
        return (unsigned / float(2**from_bits - 1)).astype(dtype)
    return _convert_unsigned(unsigned, from_bits, dtype.itemsize * 8).view(_same_width(dtype))


def _convert_unsigned(values: np.ndarray, from_bits: int, to_bits: int) -> np.ndarray:
    if to_bits > from_bits:
        factor = (2**to_bits - 1) // (2**from_bits - 1)  # 0x0101, 0x00010001, ...
        return values.astype(f"u{to_bits // 8}") * np.array(factor, f"u{to_bits // 8}")
    if to_bits == from_bits:
        return values
    if to_bits == 8:
        if from_bits == 64:
            values, from_bits = (values >> np.uint64(32)).astype(np.uint32), 32
        wide = values.astype(np.uint64)
        if from_bits == 16:
            rounded = ((wide + 0x80) * 255 + 255) >> np.uint64(16)
        else:
            rounded = (wide + 0x00808080) // 0x01010101
        return rounded.astype(np.uint8)
    return (values >> np.array(from_bits - to_bits, values.dtype)).astype(f"u{to_bits // 8}")


def _same_width(dtype: np.dtype) -> np.dtype:
    return dtype if dtype.kind != "f" else np.dtype(f"u{dtype.itemsize}")


def _type_name(dtype: np.dtype) -> str:
    return "bool" if dtype == np.bool_ else str(dtype)


# --- the libraries ----------------------------------------------------------------------------

def _imageio(argument: str):
    try:
        import imageio.v3 as iio
    except ImportError:
        raise ArgumentError(argument, "reading and writing images needs imageio (pip install "
                                      "\"halide-shim[images]\"); .npy files work without it"
                            ) from None
    return iio


def _tiff_read(path: str, argument: str) -> np.ndarray:
    """A TIFF's first image; a damaged file (tifffile logs it and finds no image) is refused."""
    tifffile = _tifffile(argument)
    logger = logging.getLogger("tifffile")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # (its complaints become this refusal)
    try:
        with tifffile.TiffFile(path) as tif:
            if not tif.pages:
                raise ValueError("no image in it")
            pixels = tif.asarray()
    finally:
        logger.setLevel(level)
    if pixels.size == 0:
        raise ValueError("no pixels in it")
    return pixels


def _tifffile(argument: str):
    try:
        import tifffile
    except ImportError:
        raise ArgumentError(argument, "TIFF files need tifffile (pip install "
                                      "\"halide-shim[images]\"): Pillow writes no 16-bit colour "
                                      "and no 32-bit integers") from None
    return tifffile


def _pypng(argument: str):
    try:
        import png
    except ImportError:
        raise ArgumentError(argument, "16-bit colour PNGs need pypng (pip install "
                                      "\"halide-shim[images]\"): Pillow reads and writes them "
                                      "only as 8-bit") from None
    return png


def _is_16_bit_colour_png(path: str) -> bool:
    """From the PNG header (IHDR: bit depth, then colour type): 16 bits, and colour (2: RGB,
    4: gray + alpha, 6: RGBA)."""
    with open(path, "rb") as f:
        header = f.read(26)
    return len(header) == 26 and header[24] == 16 and header[25] in (2, 4, 6)


def _pypng_read(path: str, argument: str) -> np.ndarray:
    width, height, rows, info = _pypng(argument).Reader(filename=path).asDirect()
    pixels = np.vstack([np.asarray(row, np.uint16) for row in rows])
    return pixels.reshape(height, width, info["planes"])


def _pypng_write(file, pixels: np.ndarray, argument: str) -> None:
    height, width, planes = pixels.shape
    writer = _pypng(argument).Writer(width=width, height=height, bitdepth=16,
                                     greyscale=planes < 3, alpha=planes in (2, 4))
    writer.write(file, pixels.reshape(height, width * planes))
