"""Buffers to and from files for the command line, as Halide's RunGen and halide_image_io.h
do: ``.npy`` (any number type) and images (PNG, JPEG, PGM, PPM, TIFF; BMP the shim's).

Files are read by imageio (its Pillow plugin); 16-bit colour PNGs, which Pillow cannot hold
(it reads them as 8-bit), by pypng; TIFFs (which RunGen cannot read) by tifffile, in every
type halide_image_io writes. Files are written as halide_image_io writes them, byte for byte
(shim/cli/image_writers.py), in the types and dimensions its formats take (its save_query),
the nearest chosen as RunGen chooses. Arrays here are in numpy order over Halide's (x, y, c)
layout: a W x H RGB image is a (3, H, W) array, a grayscale one (H, W).

A file whose type or dimensionality differs from the buffer's is converted as RunGen
converts it, with RunGen's warnings: halide_image_io's ImageTypeConversion for the type (an
8-bit image given to a uint16 input is scaled by 257, a float output saved to PNG is scaled
by 65535 and rounded), trailing dimensions of extent 1 added or extra ones sliced at 0.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np

from shim.base.errors import ArgumentError
from shim.cli import image_writers
from shim.cli.rungen import Failure, dense_shape, shape_text


def _kinds(kinds: str, bits, dimensions) -> tuple:
    """(dtype, dimensions) of each kind of number ("i", "u", "f") and size, in
    halide_image_io's order (its FormatInfo's: type code, bits, dimensions)."""
    return tuple((np.dtype(f"{kind}{size // 8}"), d) for kind in kinds for size in bits
                 for d in dimensions)


@dataclass(frozen=True)
class _Format:
    """What halide_image_io saves in a format (its save_query), and the channel counts its
    writer takes (a 2-D image has 1; None: any), with its words for another count."""

    kinds: tuple  # ((dtype, dimensions), ...)
    channels: tuple | None = None
    channels_error: str = "Wrong number of channels"


_TIFF = _Format(_kinds("iu", (8, 16, 32, 64), (1, 2, 3, 4)) + _kinds("f", (32, 64), (1, 2, 3, 4)))
_JPEG = _Format(_kinds("u", (8,), (2, 3)), (1, 3))

_FORMATS = {
    ".npy": _Format(_kinds("iu", (8, 16, 32, 64), (1, 2, 3, 4))
                    + _kinds("f", (16, 32, 64), (1, 2, 3, 4))),
    ".png": _Format(_kinds("u", (8, 16), (2, 3)), (1, 2, 3, 4),
                    "Can't write PNG files that have other than 1, 2, 3, or 4 channels"),
    ".jpg": _JPEG,
    ".jpeg": _JPEG,
    ".pgm": _Format(_kinds("u", (8, 16), (2,))),
    ".ppm": _Format(_kinds("u", (8, 16), (3,)), (3,)),
    ".tiff": _TIFF,
    ".tif": _TIFF,  # (the shim's name for it too)
    ".bmp": _JPEG,  # (the shim's, through Pillow: 8-bit gray or RGB)
}
SUFFIXES = tuple(_FORMATS)
# halide_image_io's formats, as its error lists them (built with PNG and JPEG); the shim
# neither reads nor writes the ImageStack and MATLAB ones (.tmp, .mat).
_HALIDE_EXTENSIONS = "jpeg jpg mat npy pgm png ppm tiff tmp"


def suffix_of(path: str) -> str:
    return os.path.splitext(path)[1].lower()


def is_supported(path: str) -> bool:
    return suffix_of(path) in SUFFIXES


def unsupported(argument: str, path: str) -> Exception:
    """RunGen's refusal of a file name (from its last "." on, as halide_image_io takes
    it), or the shim's, of a format RunGen has and the shim lacks."""
    extension = path.rpartition(".")[2].lower() if "." in path else ""
    if extension in ("tmp", "mat"):
        return ArgumentError(argument, f"{path}: the shim reads and writes no .{extension} "
                                       f"files (RunGen's ImageStack and MATLAB formats)")
    return Failure(f'Error in I/O: unsupported file extension "{extension}", supported are: '
                   f"{_HALIDE_EXTENSIONS}\n")


# --- reading ------------------------------------------------------------------------------------

# How a .npy file's shape is read and written: "numpy" (numpy's np.save / np.load: a W x H
# image is shape (H, W)) or "halide" (halide_image_io's, which RunGen reads and writes: the
# same bytes, the header's shape listed x first, (W, H)).
NPY_ORDERS = ("numpy", "halide")


def read(path: str, argument: str, npy_order: str = "numpy") -> np.ndarray:
    """The array a file holds, in numpy order over Halide's layout."""
    suffix = suffix_of(path)
    if suffix not in SUFFIXES:
        raise unsupported(argument, path)
    if not os.access(path, os.R_OK):  # (missing, or not the user's to read)
        raise Failure("Error in I/O: File could not be opened for reading")
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
    if pixels.ndim == 3 and suffix not in (".tif", ".tiff"):  # (_tiff_read's are already)
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


def conform(array: np.ndarray, dimensions: int, dtype: np.dtype, name: str,
            console) -> np.ndarray:
    """``array`` (read for the input ``name``) with ``dimensions`` dimensions and element
    type ``dtype``, changed as RunGen changes a file's contents to fit an argument, saying so
    as RunGen says it through ``console`` (its ``warn`` and ``info``)."""
    array = _with_dimensions(array, dimensions, "Input", name, console)
    if array.dtype != dtype:
        console.warn(type_warning(name, array.dtype, dtype))
        array = np.asarray(convert(array, dtype))  # (numpy's arithmetic makes 0-D a scalar)
    return array


def type_warning(name: str, loaded: np.dtype, dtype: np.dtype) -> str:
    """RunGen's warning for a file of type ``loaded`` given to the input ``name``."""
    return (f'Image loaded for argument "{name}" is type {type_name(loaded)} but this '
            f"argument expects type {type_name(dtype)}; data loss may have occurred.")


def _with_dimensions(array: np.ndarray, dimensions: int, title: str, name: str,
                     console) -> np.ndarray:
    """RunGen's adjust_buffer_dims: Halide dimensions are numpy axes from the last; missing
    ones are added outermost with extent 1, extra ones (the outermost) are sliced at their
    first coordinate. ``title``: "Input" or "Output"."""
    if array.ndim == dimensions:
        return array
    old = dense_shape(tuple((0, n) for n in reversed(array.shape)))
    if array.ndim < dimensions:
        console.warn(f'Image for {title} "{name}" has {array.ndim} dimensions, but this '
                     f"argument requires at least {dimensions} dimensions: adding dummy "
                     f"dimensions of extent 1.")
        # (reshape gives them real strides: np.newaxis's 0 breaks Halide's stride.0 == 1)
        changed = array.reshape((1,) * (dimensions - array.ndim) + array.shape)
        new = dense_shape(tuple((0, n) for n in reversed(changed.shape)))
    else:
        extra = array.ndim - dimensions
        if any(extent > 1 for extent in array.shape[:extra]):
            console.warn(f'Image for {title} "{name}" has {array.ndim} dimensions, but only '
                         f"the first {dimensions} were used; data loss may have occurred.")
        changed = array[(0,) * extra + (...,)]  # (the ... keeps a 0-D result an array)
        new = old[:dimensions]  # (a slice keeps the strides it had)
    console.info(f"Shape for {name} changed: {shape_text(old)} -> {shape_text(new)}")
    return changed


# --- writing ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SavePlan:
    """How an output is saved: the file, and the dimensions and element type it is saved
    with (RunGen's choice), chosen before any run so that a file that cannot hold it is
    refused first."""

    path: str
    dimensions: int
    dtype: np.dtype
    npy_order: str = "numpy"  # (for a .npy file: see NPY_ORDERS)


def plan_save(argument: str, path: str, shape: tuple, dtype: np.dtype,
              npy_order: str = "numpy", console=None) -> SavePlan:
    """The SavePlan for an output of numpy ``shape`` and ``dtype``: RunGen's best format
    (RunGen.h's best_save_format: the fewest dimensions added or dropped, then the nearest
    bit width, then the same kind of number; ties to the first in halide_image_io's order),
    after checking that it can be written there: RunGen's Failure where halide_image_io
    refuses it (a name it does not know, a channel count its writer does not take), the
    shim's ArgumentError where the file cannot be written at all. Before RunGen's failure,
    what RunGen says before it (it finds it when saving) goes to ``console``."""
    suffix = suffix_of(path)
    if suffix not in _FORMATS:
        raise unsupported(argument, path)
    check_writable(argument, path)
    image_format = _FORMATS[suffix]
    dims = len(shape)
    best_dtype, best_dims = min(image_format.kinds, key=lambda kind: (
        abs(kind[1] - dims) * 128 + abs(_bits(kind[0]) - _bits(dtype))
        + (_code(kind[0]) != _code(dtype))))
    # (The shape alone, over no memory: the output does not exist yet.)
    shaped = np.broadcast_to(np.empty((), dtype), shape)
    saved = _with_dimensions(shaped, best_dims, "", argument, _SILENT).shape
    channels = saved[0] if best_dims > 2 else 1
    if image_format.channels is not None and channels not in image_format.channels:
        if suffix == ".bmp":
            raise ArgumentError(argument, f"{path}: .bmp images have 1 or 3 channels; "
                                          f"{argument} has {channels}")
        if console is not None:
            _conformed(shaped, SavePlan(path, best_dims, best_dtype), argument, console)
        raise Failure(f"Error in I/O: {image_format.channels_error}")
    if suffix in (".jpg", ".jpeg", ".bmp"):
        _imageio(argument)  # (needed now, not after the runs)
    return SavePlan(path, best_dims, best_dtype, npy_order)


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


def save(plan: SavePlan, array: np.ndarray, argument: str, console) -> None:
    """Save the output ``argument`` (``array``) as ``plan`` says, changing its dimensions and
    type as RunGen changes them, with RunGen's words (through ``console``)."""
    array = _conformed(array, plan, argument, console)
    suffix = suffix_of(plan.path)
    try:
        # Into a file of our own: np.save would add .npy to a name in .NPY, and imageio's own
        # file, failing to close (a full disk), fails again when collected, with a traceback.
        with open(plan.path, "wb") as f:
            if suffix == ".npy" and plan.npy_order == "numpy":
                np.save(f, array)
            elif suffix == ".bmp":
                pixels = np.moveaxis(array, 0, 2) if array.ndim == 3 else array
                _imageio(argument).imwrite(f, np.ascontiguousarray(pixels), extension=suffix)
            else:
                image_writers.write(f, suffix, array)
    except (OSError, ValueError) as e:
        raise ArgumentError(argument, f"cannot write {plan.path}: {e}") from None


def _conformed(array: np.ndarray, plan: SavePlan, argument: str, console) -> np.ndarray:
    """The output ``argument`` in the dimensions and type ``plan`` saves it with, as RunGen
    changes it and says so."""
    console.info(f"Saving output {argument} to {plan.path} ...")
    array = _with_dimensions(array, plan.dimensions, "Output", argument, console)
    if array.dtype == plan.dtype:
        return array
    console.warn(f'Image for argument "{argument}" is of type {type_name(array.dtype)} but is '
                 f"being saved as type {type_name(plan.dtype)}; data loss may have occurred.")
    return convert(array, plan.dtype)


class _Silent:
    def warn(self, text: str) -> None:
        pass

    info = warn


_SILENT = _Silent()


def _bits(dtype: np.dtype) -> int:
    return 1 if dtype == np.bool_ else 8 * dtype.itemsize


def _code(dtype: np.dtype) -> int:
    """Halide's type code: int, uint (bool is a 1-bit uint), float."""
    return {"i": 0, "u": 1, "b": 1, "f": 2}[dtype.kind]


def type_name(dtype: np.dtype) -> str:
    """A numpy type by its Halide name, as RunGen writes it."""
    return "bool" if dtype == np.bool_ else str(dtype)


# --- Halide's type conversion -----------------------------------------------------------------

def convert(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """halide_image_io's ImageTypeConversion: integers are fixed-point fractions of their
    type's range (signed ones read as the unsigned of their width), floats are in [0, 1], and
    bools are 0 or 1. Widening an integer replicates its bits (0xAB -> 0xABAB), narrowing to
    8 bits rounds, and narrowing to wider types truncates. A float becomes an integer as
    Halide's C++ makes it: scaled, rounded half away from zero (lround), then cast, so that
    beyond [0, 1] it wraps around, and NaN, infinities and values beyond 64 bits become 0."""
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
        # Scaled in Halide's precision: float (float16 widened: its 65535 is infinity), double
        # for a double or for 32 bits.
        work = np.float64 if bits == 32 or array.dtype.itemsize == 8 else np.float32
        with np.errstate(all="ignore"):
            scaled = (array.astype(work) * work(2**bits - 1)).astype(np.float64)
            whole = np.trunc(scaled)
            rounded = whole + np.where(np.abs(scaled - whole) >= 0.5, np.sign(scaled), 0)
            # (lround's result where it has none: LONG_MIN, whose low bits are 0)
            rounded[~(np.abs(rounded) < 2.0**63)] = 0
        wrapped = rounded.astype(np.int64).astype(f"u{dtype.itemsize}")
        return wrapped.view(_same_width(dtype))
    unsigned = array.view(f"u{array.dtype.itemsize}")
    from_bits = array.dtype.itemsize * 8
    if array.dtype == np.int32 and (dtype.kind == "f" or dtype.itemsize == 8):
        # (there Halide takes an int32 as the uint64 it sign-extends to, not as a uint32)
        unsigned, from_bits = array.astype(np.int64).view(np.uint64), 64
    if dtype.kind == "f":
        if from_bits == 64:
            unsigned, from_bits = (unsigned >> np.uint64(32)).astype(np.uint32), 32
        if from_bits < 32:  # (in float, for a double too: in / 255.0f)
            return (unsigned.astype(np.float32) / np.float32(2**from_bits - 1)).astype(dtype)
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
    """A TIFF's first image in numpy order over Halide's layout, (c, y, x) for several
    channels: as halide_image_io writes them (planar, one strip per channel), or interleaved
    as most others do; a damaged file (tifffile logs it and finds no image) is refused."""
    tifffile = _tifffile(argument)
    logger = logging.getLogger("tifffile")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # (its complaints become this refusal)
    try:
        with tifffile.TiffFile(path) as tif:
            if not tif.pages:
                raise ValueError("no image in it")
            page = tif.pages[0]
            pixels = tif.asarray()
            if page.samplesperpixel > 1 and page.planarconfig == tifffile.PLANARCONFIG.CONTIG:
                pixels = np.moveaxis(pixels, -1, 0)  # (y, x, c) -> (c, y, x)
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
