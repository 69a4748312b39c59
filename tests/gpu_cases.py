"""The sample GPU pipelines with inputs and numpy references, shared by the GPU suites
(test_gpu_backends.py, test_opencl.py, test_cuda.py, test_crops.py): name -> (inputs and
scalars, {output: (shape, dtype)}, reference(inputs) -> outputs)."""

import subprocess
import sys

import numpy as np

from shim.pipelines.build import RUNTIMES, Build, build_all


def blur_reference(image):
    wide = image.astype(np.uint32)
    blur_x = (wide[:, :-2] + wide[:, 1:-1] + wide[:, 2:]) // 3
    return ((blur_x[:-2] + blur_x[1:-1] + blur_x[2:]) // 3).astype(np.uint16)


# Shapes for Vulkan, where every buffer's size is a multiple of 64 bytes: Halide 21's stock
# Vulkan runtime moves only whole multiples of the device's nonCoherentAtomSize between host and
# device (64 bytes on lavapipe), silently leaving the rest of a buffer behind, so only such
# shapes can be compared with it bit for bit (test_vulkan.py shows the loss, and the shim
# without it, on the default shapes).
STOCK_VULKAN_SHAPES = {"image": (48, 64), "pixels": (66, 96), "small": (20, 32), "ints": (16, 23),
                       "gray": (50, 64), "fill": (12, 16)}
DEFAULT_SHAPES = {"image": (48, 64), "pixels": (66, 70), "small": (20, 30), "ints": (17, 23),
                  "gray": (50, 70), "fill": (12, 9)}


def cases(kind: str | None = None):
    """The cases, with shapes the stock runtime of device kind ``kind`` handles (the default
    shapes, except for Vulkan: see STOCK_VULKAN_SHAPES)."""
    shapes = STOCK_VULKAN_SHAPES if kind == "vulkan" else DEFAULT_SHAPES
    rng = np.random.default_rng(42)
    image = rng.random(shapes["image"], dtype=np.float32)
    pixels = rng.integers(0, 1 << 16, size=shapes["pixels"], dtype=np.uint16)
    a8 = rng.integers(0, 256, size=shapes["small"], dtype=np.uint8)
    bf = rng.random(shapes["small"], dtype=np.float32)
    ai = rng.integers(-10**6, 10**6, size=shapes["ints"], dtype=np.int32)
    bi = rng.integers(-10**6, 10**6, size=shapes["ints"], dtype=np.int32)
    gray = rng.integers(0, 256, size=shapes["gray"], dtype=np.uint8)
    ys, xs = np.mgrid[0:shapes["fill"][0], 0:shapes["fill"][1]]
    blurred = (shapes["pixels"][0] - 2, shapes["pixels"][1] - 2)
    return {
        "brighten": ({"input": image, "scale": 1.5, "offset": 0.25},
                     {"output": (shapes["image"], np.float32)},
                     lambda v: {"output": v["input"] * np.float32(1.5) + np.float32(0.25)}),
        "blur3x3": ({"input": pixels}, {"output": (blurred, np.uint16)},
                    lambda v: {"output": blur_reference(v["input"])}),
        "mix": ({"a": a8, "b": bf, "alpha": 0.25, "offset": -3},
                {"output": (shapes["small"], np.float32)},
                lambda v: {"output": v["a"].astype(np.float32) * np.float32(0.25)
                           + v["b"] * np.float32(0.75) + np.float32(-3)}),
        "sum_diff": ({"a": ai, "b": bi}, {"sum": (shapes["ints"], np.int32), "diff": (shapes["ints"], np.int32)},
                     lambda v: {"sum": v["a"] + v["b"], "diff": v["a"] - v["b"]}),
        "histogram": ({"input": gray}, {"output": ((256,), np.uint32)},
                      lambda v: {"output": np.bincount(v["input"].ravel(), minlength=256)}),
        "crop_fill": ({"param": 3}, {"f": (shapes["fill"], np.int32)},
                      lambda v: {"f": xs * 100 + ys + 3 * 10000}),
    }


def build_libraries(kind: str) -> dict:
    """{(name, runtime): path}: every case built for device kind ``kind``, with each runtime."""
    specs = [Build(name, kind, runtime) for name in cases() for runtime in RUNTIMES]
    return {(s.name, s.runtime): path for s, path in build_all(specs, progress=None).items()}


def assert_matches_reference(actual, expected):
    """Integers exactly; floats within one rounding, of the value or of the largest value (a
    GPU compiler may fuse a multiply-add, whose one rounding differs from numpy's two, the
    most where terms cancel: lavapipe's Vulkan does)."""
    if np.issubdtype(actual.dtype, np.floating):
        largest = float(np.max(np.abs(expected))) if expected.size else 0.0
        np.testing.assert_allclose(actual, expected, rtol=2e-7,
                                   atol=np.finfo(expected.dtype).eps * largest)
    else:
        np.testing.assert_array_equal(actual, expected)


def run_stock(library, name, values, outputs, work):
    """Run a bundled-runtime library with Halide's own runtime, in a child process without
    the shim; the outputs as numpy arrays."""
    args = []
    for key, value in values.items():
        if isinstance(value, np.ndarray):
            np.save(work / f"in_{key}.npy", value)
            args.append(f"{key}={work / f'in_{key}.npy'}")
        else:
            args.append(f"{key}={value}")
    for key, (shape, dtype) in outputs.items():
        args.append(f"{key}={'x'.join(map(str, shape))}:{np.dtype(dtype).name}")
    done = subprocess.run([sys.executable, "-m", "pipelines.stock", str(library), name, str(work), *args],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return {key: np.load(work / f"{key}.npy") for key in outputs}


# (kind, case) -> (the device name it was seen on, what Halide 21's stock runtime gets wrong
# there): on that device the shim is checked against numpy, and the stock runtime is checked
# to still be wrong, so that the day it is fixed, the case goes back to the bit-for-bit
# comparison. (Elsewhere, the comparison as for every case.)
STOCK_WRONG = {
    ("vulkan", "blur3x3"): ("llvmpipe", "on lavapipe, Halide 21's Vulkan runtime returns all "
                                        "zeros for this two-stage pipeline (66x96) or fails "
                                        "with -16 (66x70)"),
}


def check_against_stock(libraries, name, work, runtimes, kind=None):
    """Run case ``name`` (with device kind ``kind``'s shapes) through the shim (each of
    ``runtimes``) and through the stock runtime: bit-for-bit equal, and equal to the numpy
    reference (where STOCK_WRONG names the case: the stock runtime still wrong, and the shim
    equal to numpy)."""
    import shim

    values, outputs, reference = cases(kind)[name]
    stock = run_stock(libraries[name, "bundled"], name, values, outputs, work)
    expected = reference(values)
    seen_on, wrong = STOCK_WRONG.get((kind, name), (None, None))
    if seen_on is not None and seen_on in shim.device(kind).name:
        assert any(not np.array_equal(stock[key], expected[key]) for key in outputs), \
            f"the stock runtime is right now: {wrong} no longer holds"
        stock = expected
    for runtime in runtimes:
        pipeline = shim.load(libraries[name, runtime])
        results = pipeline(**values, **{k: shape for k, (shape, _) in outputs.items()})
        results = results if isinstance(results, tuple) else (results,)
        for key, result in zip(outputs, results):
            assert result.device_dirty()  # the result stays on the device until someone reads it
            np.testing.assert_array_equal(result.numpy(), stock[key])  # bit for bit
            assert_matches_reference(result.numpy(), expected[key])
