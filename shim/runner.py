"""Running any pipeline from text arguments, as Halide's RunGen does: ``python -m shim run``.

Values, by argument kind:

- input buffers: a ``.npy`` file, an image (``.png``, ``.jpg``, ... with Pillow installed),
  ``random:WxH[xC]`` or ``zero:WxH[xC]`` (extents in Halide order: x first);
- scalars: the value (``true``/``false`` for bools); the pipeline's default if not given;
- outputs: ``FILE[:WxH[xC]]`` (``.npy`` or an image) or ``:WxH[xC]`` to size without saving.
  Without extents an output is sized from the pipeline's estimates, else like the first input.

Images map to Halide's (x, y, c) layout: a W x H RGB image is a 3-D buffer of extents
(W, H, 3), and a grayscale one a 2-D buffer.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

from shim.buffer import check_memory
from shim.errors import ArgumentError
from shim.metadata import Argument, check_extents

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".pgm", ".ppm", ".webp")


@dataclass(frozen=True)
class OutputSpec:
    path: str | None
    extents: tuple | None  # Halide order


def input_value(arg: Argument, text: str, target: str) -> np.ndarray:
    """The array an input buffer argument's text names, for a pipeline built for ``target``."""
    dtype = arg.type.dtype
    if dtype is None:
        raise ArgumentError(arg.name, f"the command line cannot make {arg.type} buffers")
    kind, _, rest = text.partition(":")
    if kind in ("random", "zero") and rest:
        shape = _numpy_shape(arg, parse_extents(arg, rest))
        # Refused before making it: the pipeline could not take it, or the machine hold it.
        check_extents(arg, shape, target)
        check_memory(shape, dtype, arg.name)
        if kind == "zero":
            return np.zeros(shape, dtype)
        return _random(shape, dtype)
    if not os.path.exists(text):
        raise ArgumentError(arg.name, f"no such file: {text!r} (expected a .npy file, an image, "
                                      f"random:WxH[xC] or zero:WxH[xC])")
    if text.lower().endswith(".npy"):
        array = np.load(text)
    elif text.lower().endswith(IMAGE_SUFFIXES):
        array = _read_image(arg, text)
    else:
        raise ArgumentError(arg.name, f"cannot read {text!r}: expected a .npy file or an image "
                                      f"({', '.join(IMAGE_SUFFIXES)})")
    if array.ndim != arg.dimensions:
        raise ArgumentError(arg.name, f"{text} holds a {array.ndim}-D array; {arg.name} is "
                                      f"{arg.dimensions}-D")
    return array


def output_spec(arg: Argument, text: str) -> OutputSpec:
    path, _, extents = text.rpartition(":") if ":" in text else (text, "", "")
    if path.lower().endswith(".npy") or path.lower().endswith(IMAGE_SUFFIXES) or not path:
        return OutputSpec(path or None, parse_extents(arg, extents) if extents else None)
    raise ArgumentError(arg.name, f"expected FILE.npy or an image name, optionally followed by "
                                  f":WxH..., or :WxH... alone; got {text!r}")


def output_shape(arg: Argument, spec: OutputSpec | None, inputs: list[np.ndarray]) -> tuple:
    """The numpy shape of an output: given, else from the estimates, else like the first
    input (RunGen's rules)."""
    if spec is not None and spec.extents is not None:
        return _numpy_shape(arg, spec.extents)
    estimates = arg.buffer_estimates or ()
    if len(estimates) == arg.dimensions and all(e is not None for _, e in estimates):
        return _numpy_shape(arg, tuple(e for _, e in estimates))
    if inputs and inputs[0].ndim == arg.dimensions:
        return inputs[0].shape
    raise ArgumentError(arg.name, "cannot tell this output's size (no estimates, no input of "
                                  f"the same dimensionality): give --{arg.name}=FILE:WxH...")


def save_output(arg: Argument, array: np.ndarray, path: str) -> None:
    if path.lower().endswith(".npy"):
        np.save(path, array)
        return
    image = _pillow(arg).fromarray(_to_image_layout(arg, array))
    image.save(path)


def parse_extents(arg: Argument, text: str) -> tuple:
    try:
        extents = tuple(int(part) for part in text.lower().split("x"))
    except ValueError:
        extents = ()
    if not extents or any(e <= 0 for e in extents):
        raise ArgumentError(arg.name, f"expected extents like 640x480 or 640x480x3, got {text!r}")
    return extents


def _numpy_shape(arg: Argument, extents: tuple) -> tuple:
    if len(extents) != arg.dimensions:
        raise ArgumentError(arg.name, f"{len(extents)} extents given; {arg.name} is "
                                      f"{arg.dimensions}-D")
    return tuple(reversed(extents))


def _random(shape: tuple, dtype: np.dtype) -> np.ndarray:
    rng = np.random.default_rng(0)  # the same inputs every run, for comparable timings
    if dtype.kind == "f":
        # Made in the element type where numpy can, so that no larger array is needed on the way.
        made = np.float64 if dtype.itemsize == 8 else np.float32
        return rng.random(shape, dtype=made).astype(dtype, copy=False)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape, dtype=np.uint8).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -(1 << 15)), min(info.max, 1 << 15), shape, dtype=dtype,
                        endpoint=True)


# --- images ----------------------------------------------------------------------------------

def _pillow(arg: Argument):
    try:
        from PIL import Image
    except ImportError:
        raise ArgumentError(arg.name, "reading and writing images needs Pillow "
                                      "(pip install pillow); .npy files work without it") from None
    return Image


def _read_image(arg: Argument, path: str) -> np.ndarray:
    pixels = np.asarray(_pillow(arg).open(path))
    if pixels.ndim == 3 and arg.dimensions == 3:
        pixels = np.ascontiguousarray(np.moveaxis(pixels, 2, 0))  # (y, x, c) -> (c, y, x)
    elif pixels.ndim == 3 and arg.dimensions == 2:
        raise ArgumentError(arg.name, f"{path} has {pixels.shape[2]} channels; {arg.name} is 2-D")
    elif pixels.ndim == 2 and arg.dimensions == 3:
        pixels = pixels[np.newaxis]
    dtype = arg.type.dtype
    if dtype.kind == "f" and pixels.dtype.kind in "ui":
        return (pixels / np.iinfo(pixels.dtype).max).astype(dtype)
    if not np.can_cast(pixels.dtype, dtype):
        raise ArgumentError(arg.name, f"{path} holds {pixels.dtype} pixels; {arg.name} is {dtype}")
    return pixels.astype(dtype)


def _to_image_layout(arg: Argument, array: np.ndarray) -> np.ndarray:
    if array.ndim == 3:
        array = np.moveaxis(array, 0, 2)  # (c, y, x) -> (y, x, c)
        if array.shape[2] == 1:
            array = array[:, :, 0]
    if array.ndim not in (2, 3) or array.dtype not in (np.uint8, np.uint16):
        raise ArgumentError(arg.name, f"only 2-D or 3-D uint8/uint16 outputs can be saved as "
                                      f"images ({arg.name} is {array.ndim}-D {array.dtype}); "
                                      f"use .npy")
    return np.ascontiguousarray(array)


# --- timing ----------------------------------------------------------------------------------

class Progress:
    """A progress bar on stderr, drawn only where someone watches (a terminal)."""

    def __init__(self, total: int, label: str, stream=None):
        self.total, self.label = total, label
        self.stream = stream or sys.stderr
        self.visible = total > 1 and self.stream.isatty()

    def update(self, done: int) -> None:
        if self.visible:
            width = 30
            filled = width * done // self.total
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] "
                              f"{done}/{self.total}")
            self.stream.flush()

    def finish(self) -> None:
        if self.visible:
            self.stream.write("\n")
            self.stream.flush()


@dataclass(frozen=True)
class Timings:
    seconds: list

    def describe(self) -> str:
        ms = [s * 1e3 for s in self.seconds]
        return (f"{len(ms)} iteration{'s' if len(ms) != 1 else ''}: min {min(ms):.3f} ms, "
                f"median {statistics.median(ms):.3f} ms, mean {statistics.fmean(ms):.3f} ms")


def time_iterations(run, sync, iterations: int, progress: Progress) -> Timings:
    """Call ``run`` ``iterations`` times, each followed by ``sync`` (the device finishing its
    work, without which a GPU iteration would only time the enqueueing)."""
    samples = []
    for i in range(iterations):
        start = time.perf_counter()
        result = run()
        sync(result)
        samples.append(time.perf_counter() - start)
        progress.update(i + 1)
    progress.finish()
    return Timings(samples)
