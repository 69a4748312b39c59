"""What the tests of staged crops (test_vulkan_staging.py, test_opencl_staging.py) share: a
pipeline compiled at test time for any number of dimensions, and the checks against numpy of
what comes back from a launch and of crops of many dimensions.

The pipeline: out(x, y, ...) = zin(x, y, ...) * 2 + 1 in int32, x and y on GPU blocks and
threads, the other dimensions a loop of launches. Halide gives a kernel its buffers in the
order of their names, so the output ("out") is the kernel's first buffer and the input ("zin")
its second: a launch that copied a staged input back after the output would put the input's
old values over the output's new ones where the two are crops of the same elements.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

import shim
from shim.pipelines.build import TARGETS

SENTINEL = -7


def build_doubling(directory: Path, dims: int, kind: str, vector_casts: bool = False) -> Path:
    """The pipeline of ``dims`` dimensions, for device kind ``kind`` (no runtime), in
    ``directory``. ``vector_casts``: x vectorized by 4 in tiles of 16 x 4, with every buffer's
    x from 0 and its rows a multiple of 4 elements apart, so that Halide proves the vectors
    aligned and reads and writes them through pointers cast to int4 (extents must be
    multiples of 16 and 4)."""
    import halide as hl

    coords = [hl.Var(f"d{i}") for i in range(dims)]
    source = hl.ImageParam(hl.Int(32), dims, "zin")
    out = hl.Func("out")
    out[coords] = source[coords] * 2 + 1
    xo, yo, xi, yi = hl.vars("xo yo xi yi")
    if vector_casts:
        out.gpu_tile(coords[0], coords[1], xo, yo, xi, yi, 16, 4,
                     hl.TailStrategy.RoundUp).vectorize(xi, 4)
        for buffer in (out.output_buffer(), source):
            buffer.dim(0).set_min(0)
            buffer.dim(1).set_stride(buffer.dim(1).stride() // 4 * 4)
        output = out.output_buffer()
        output.dim(0).set_extent(output.dim(0).extent() // 16 * 16)
        output.dim(1).set_extent(output.dim(1).extent() // 4 * 4)
    else:
        out.gpu_tile(coords[0], coords[1], xo, yo, xi, yi, 4, 4, hl.TailStrategy.GuardWithIf)
    name = f"doubling{dims}_{kind}{'_vector' if vector_casts else ''}"
    obj, library = directory / f"{name}.o", directory / f"{name}.so"
    out.compile_to({hl.OutputFileType.object: str(obj)}, [source], name,
                   hl.Target(f"{TARGETS[kind]}-no_runtime"))
    subprocess.run(["cc", "-shared", "-o", str(library), str(obj)], check=True)
    return library


def device_contents(parent: shim.Buffer) -> np.ndarray:
    """The parent's bytes as the device holds them, all of them."""
    parent.set_device_dirty()
    parent.copy_to_host()
    return np.asarray(parent).copy()


def many_dimensions(dims: int, permuted: bool):
    """A parent's values, in numpy's order (x last), and a box in Halide's order, [(min,
    extent)] per dimension: every dimension of more than one element cropped from 1 (x from 1
    or 2, so that the crop starts off every multiple of 16 bytes), the rest whole.
    ``permuted``: the parent's outer dimensions lie in memory in another order than their
    numbering (strides not increasing)."""
    extents = [9, 5] + [3 if d < 5 else 2 if d % 4 == 0 else 1 for d in range(2, dims)]
    shape = tuple(reversed(extents))
    values = np.arange(np.prod(shape), dtype=np.int32)
    if permuted:
        order = list(reversed(range(len(shape) - 1)))  # the outer axes reversed, x still last
        inverse = np.argsort(order + [len(shape) - 1])
        values = values.reshape([shape[a] for a in order] + [shape[-1]]).transpose(inverse)
    else:
        values = values.reshape(shape)
    box = [(1, extent - 1) if extent > 1 else (0, 1) for extent in extents]
    strides = [stride // values.itemsize for stride in reversed(values.strides)]
    start = sum(lo * stride for (lo, _), stride in zip(box[1:], strides[1:]))
    box[0] = (1, 7) if (start + 1) % 4 else (2, 7)
    return values, box


def check_many_dimensions(double, device, dims: int, permuted: bool) -> None:
    """A misaligned crop of a many-dimensional buffer read by the pipeline, the results written
    to the same crop of another: the results in the crop, the sentinel everywhere else."""
    values, box = many_dimensions(dims, permuted)
    reference = values.copy()
    source = shim.Buffer(values)  # (its strides as they are: a permuted parent stays permuted)
    results = shim.Buffer(np.full(values.shape, SENTINEL, np.int32))
    for buf in (source, results):
        buf.copy_to_device(device)
    crops = source.cropped(box), results.cropped(box)
    start = np.asarray(crops[0]).ctypes.data - values.ctypes.data  # (as on the device)
    assert device.alignment <= 4 or start % device.alignment != 0  # staged
    double(*crops)
    where = tuple(slice(lo, lo + n) for lo, n in reversed(box))
    expected = np.full(values.shape, SENTINEL, np.int32)
    expected[where] = reference[where] * 2 + 1
    np.testing.assert_array_equal(device_contents(results), expected)
    np.testing.assert_array_equal(device_contents(source), reference)


# Where the output goes, for check_input_not_copied_back: its x, and whether it is the input.
OUTPUTS = {"its twin, staged": (1, False), "an aligned crop, in place": (32, False),
           "the same crop": (1, True)}


def check_input_not_copied_back(double, device, output: str, width: int = 40) -> None:
    """The 2-D pipeline reads a misaligned crop and writes the same elements, or some of
    them: through a second crop at the same place (staged too, and the kernel's first buffer:
    copied back before the input would be), or through a crop at an aligned place (bound in
    place: written before any copy back). Had the input been copied back after the launch,
    its old values would be back over the results. Given as both, the crop is written, and
    copied back."""
    x, same = OUTPUTS[output]
    data = np.arange(8 * 80, dtype=np.int32).reshape(8, 80)
    parent = shim.Buffer(data.copy())
    parent.copy_to_device(device)
    source = parent.cropped([(1, width), (0, 8)])  # (columns from 1: past 32)
    out = source if same else parent.cropped([(x, width), (0, 8)])
    for crop in {id(source): source, id(out): out}.values():
        crop.set_min([0, 0])  # (one coordinate space for both)
    # (x = 1: staged on every device that aligns to more than an int32; x = 32, 128 bytes: in
    # place on lavapipe's 16 and PoCL's 128, staged as its twin where a device aligns to more)
    double(source, out)
    expected = data.copy()
    expected[:, x:x + width] = data[:, 1:width + 1] * 2 + 1
    np.testing.assert_array_equal(device_contents(parent), expected)
