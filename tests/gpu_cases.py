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


def cases():
    rng = np.random.default_rng(42)
    image = rng.random((48, 64), dtype=np.float32)
    pixels = rng.integers(0, 1 << 16, size=(66, 70), dtype=np.uint16)
    a8 = rng.integers(0, 256, size=(20, 30), dtype=np.uint8)
    bf = rng.random((20, 30), dtype=np.float32)
    ai = rng.integers(-10**6, 10**6, size=(17, 23), dtype=np.int32)
    bi = rng.integers(-10**6, 10**6, size=(17, 23), dtype=np.int32)
    gray = rng.integers(0, 256, size=(50, 70), dtype=np.uint8)
    ys, xs = np.mgrid[0:12, 0:9]
    return {
        "brighten": ({"input": image, "scale": 1.5, "offset": 0.25},
                     {"output": ((48, 64), np.float32)},
                     lambda v: {"output": v["input"] * np.float32(1.5) + np.float32(0.25)}),
        "blur3x3": ({"input": pixels}, {"output": ((64, 68), np.uint16)},
                    lambda v: {"output": blur_reference(v["input"])}),
        "mix": ({"a": a8, "b": bf, "alpha": 0.25, "offset": -3},
                {"output": ((20, 30), np.float32)},
                lambda v: {"output": v["a"].astype(np.float32) * np.float32(0.25)
                           + v["b"] * np.float32(0.75) + np.float32(-3)}),
        "sum_diff": ({"a": ai, "b": bi}, {"sum": ((17, 23), np.int32), "diff": ((17, 23), np.int32)},
                     lambda v: {"sum": v["a"] + v["b"], "diff": v["a"] - v["b"]}),
        "histogram": ({"input": gray}, {"output": ((256,), np.uint32)},
                      lambda v: {"output": np.bincount(v["input"].ravel(), minlength=256)}),
        "crop_fill": ({"param": 3}, {"f": ((12, 9), np.int32)},
                      lambda v: {"f": xs * 100 + ys + 3 * 10000}),
    }


def build_libraries(kind: str) -> dict:
    """{(name, runtime): path}: every case built for device kind ``kind``, with each runtime."""
    specs = [Build(name, kind, runtime) for name in cases() for runtime in RUNTIMES]
    return {(s.name, s.runtime): path for s, path in build_all(specs, progress=None).items()}


def assert_matches_reference(actual, expected):
    """Integers exactly; floats within one rounding (a GPU compiler may fuse multiply-add)."""
    if np.issubdtype(actual.dtype, np.floating):
        np.testing.assert_allclose(actual, expected, rtol=2e-7, atol=0)
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


def check_against_stock(libraries, name, work, runtimes):
    """Run case ``name`` through the shim (each of ``runtimes``) and through the stock runtime:
    bit-for-bit equal, and equal to the numpy reference."""
    import shim

    values, outputs, reference = cases()[name]
    stock = run_stock(libraries[name, "bundled"], name, values, outputs, work)
    expected = reference(values)
    for runtime in runtimes:
        pipeline = shim.load(libraries[name, runtime])
        results = pipeline(**values, **{k: shape for k, (shape, _) in outputs.items()})
        results = results if isinstance(results, tuple) else (results,)
        for key, result in zip(outputs, results):
            assert result.device_dirty()  # the result stays on the device until someone reads it
            np.testing.assert_array_equal(result.numpy(), stock[key])  # bit for bit
            assert_matches_reference(result.numpy(), expected[key])
