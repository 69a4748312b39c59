"""The shim's Vulkan backend against Halide 21's stock Vulkan runtime, on the same device
(Mesa's lavapipe where there is no GPU), both sides in one run.

    python benchmarks/vulkan.py [--repeats 9] [--first-call-runs 3]

Cases, each timed per call (min and median over samples; the sides take turns, sample by
sample, so a noisy moment hits both):

- "small, resident": brighten on 64x64 float32 whose input and output stay on the device
  (the launch's own cost dominates). The shim runs a prepared call (buffers bound once); the
  stock runtime its argv entry point with the buffers bound once.
- "large, resident": the same, 1024x1024.
- "fresh arrays": brighten on 256x256, the input changed on the host before every call and the
  output read back after it. The shim: a plain call with numpy arrays (its device memory is
  allocated and freed around each call, through the pool); the stock runtime: its buffers keep
  their device allocations, the input is marked host-dirty and the output copied to the host.
- "misaligned crop": crop_fill realized into a 100x100 crop of a 256x256 int32 buffer resident
  on the device, at x = 1 (4 bytes: not a multiple of minStorageBufferOffsetAlignment), through
  a prepared call. The shim stages it around the launch; Halide 21 binds the crop at its offset, which the Vulkan
  specification does not allow (GPUs fail it, Halide issue 8944) and lavapipe, which does not
  check, happens to run right.
- "first call": a fresh process's first call of brighten (64x64): device setup, module, upload,
  kernel, download; the library loaded and its arguments bound untimed (one process a figure).

The stock runtime runs the bundled build in a child process without the shim; the shim the
no_runtime build. Sizes are multiples of 64 bytes: the stock runtime moves only whole multiples
of lavapipe's nonCoherentAtomSize (see tests/test_vulkan.py), and each side's results are
checked against numpy before timing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from sidebyside import ChildProcess, interleave, serve  # noqa: E402

# The checkout's pipelines/ by the folder's own name: the stock side must not import the shim.
from pipelines.build import Build, build  # noqa: E402

RESIDENT = {"small, resident": (64, 64), "large, resident": (1024, 1024)}
FRESH = (256, 256)
PARENT, CROP, CROP_X, CROP_PARAM = (256, 256), (100, 100), 1, 7
ITERATIONS = {"small, resident": 200, "large, resident": 20, "fresh arrays": 50,
              "misaligned crop": 100}


def image(shape):
    return (np.arange(shape[0] * shape[1]) % 251).astype(np.float32).reshape(shape)


def crop_expected(param):
    ys, xs = np.mgrid[0:CROP[0], CROP_X:CROP_X + CROP[1]]
    return xs * 100 + ys + param * 10000


# --- the stock runtime (child process) ---------------------------------------------------------

def stock_server() -> None:
    from pipelines.stock import StockPipeline

    brighten = str(build(Build("brighten", "vulkan", "bundled")))
    resident = {}
    for case, shape in RESIDENT.items():
        p = StockPipeline(brighten, "brighten")
        p.bind({"input": image(shape), "scale": 2.0, "offset": 1.0, "output": np.zeros(shape, np.float32)})
        p.run()
        assert np.array_equal(p.fetch()["output"], image(shape) * 2 + 1), case
        resident[case] = p
    fresh = StockPipeline(brighten, "brighten")
    source = image(FRESH)
    fresh.bind({"input": source, "scale": 2.0, "offset": 1.0, "output": np.zeros(FRESH, np.float32)})
    crop = StockCrop(str(build(Build("crop_fill", "vulkan", "bundled"))))

    def seconds(case, iterations, sync_each):
        if case in resident:
            return resident[case].seconds(iterations, sync_each)
        start = time.perf_counter()
        if case == "fresh arrays":
            raw = next(k for k in fresh._keep if isinstance(k, fresh.ffi.CData)
                       and fresh.ffi.typeof(k).cname == "halide_buffer_t *"
                       and int(fresh.ffi.cast("uintptr_t", k.host)) == source.ctypes.data)
            for i in range(iterations):
                source[0, 0] = i
                raw.flags |= 1  # host-dirty
                fresh.run()
                out = fresh.fetch()["output"]
            assert out[0, 0] == source[0, 0] * 2 + 1
        else:
            for _ in range(iterations):
                crop.run(CROP_PARAM)
            assert np.array_equal(crop.result(), crop_expected(CROP_PARAM))
        return time.perf_counter() - start

    serve(seconds)


class StockCrop:
    """crop_fill into a crop of a device-resident buffer, through Halide's own
    halide_device_crop."""

    def __init__(self, library):
        from pipelines.stock import StockRuntime

        self.stock = stock = StockRuntime(
            library, "const struct halide_device_interface_t *halide_vulkan_device_interface(void);"
                     "int crop_fill_argv(void **);")
        ffi, lib = stock.ffi, stock.lib
        self.data = np.zeros(PARENT, np.int32)
        self.parent, self._pd = self._buffer(self.data.ctypes.data, (0, 0), PARENT[::-1])
        self.parent.flags = 1
        assert lib.halide_copy_to_device(ffi.NULL, self.parent, lib.halide_vulkan_device_interface()) == 0
        self.host = np.zeros(CROP, np.int32)
        self.crop, self._cd = self._buffer(self.data.ctypes.data + CROP_X * 4, (CROP_X, 0), CROP[::-1])
        assert lib.halide_device_crop(ffi.NULL, self.parent, self.crop) == 0
        self.param = ffi.new("struct halide_scalar_value_t *")
        self.argv = ffi.new("void *[]", [self.param, self.crop])

    def _buffer(self, host, mins, extents):
        ffi = self.stock.ffi
        dim = ffi.new("halide_dimension_t[2]", [(mins[0], extents[0], 1, 0),
                                                (mins[1], extents[1], PARENT[1], 0)])
        raw = ffi.new("halide_buffer_t *")
        raw.host = ffi.cast("uint8_t *", host)
        raw.type.code, raw.type.bits, raw.type.lanes = 0, 32, 1
        raw.dimensions, raw.dim = 2, dim
        return raw, dim

    def run(self, param):
        self.param.u.i32 = param
        result = self.stock.lib.crop_fill_argv(self.argv)
        if result != 0:
            raise RuntimeError(f"stock crop_fill failed ({result}): {self.stock.errors}")

    def result(self):
        # Through the parent: Halide 21's copy of the crop itself fails on lavapipe (-14, "Failed
        # to allocate device memory!" for its 40000-byte staging region), and its crop's dirty
        # bit does not reach the parent, so the parent is marked by hand.
        self.parent.flags = 2
        assert self.stock.lib.halide_copy_to_host(self.stock.ffi.NULL, self.parent) == 0
        return self.data[:CROP[0], CROP_X:CROP_X + CROP[1]].copy()


# --- the shim ----------------------------------------------------------------------------------

class ShimRunner:
    def __init__(self):
        import shim

        self.shim = shim
        self.device = shim.device("vulkan")
        brighten = shim.load(build(Build("brighten", "vulkan", "no_runtime")))
        self.brighten = brighten
        self.resident = {}
        for case, shape in RESIDENT.items():
            source, out = shim.Buffer(image(shape)), shim.Buffer(np.zeros(shape, np.float32))
            call = brighten.prepare(source, scale=2.0, offset=1.0, output=out)
            call()
            np.testing.assert_array_equal(out.numpy(), image(shape) * 2 + 1)
            self.resident[case] = (call, source, out)
        self.source, self.out = image(FRESH), np.zeros(FRESH, np.float32)
        crop_fill = shim.load(build(Build("crop_fill", "vulkan", "no_runtime")))
        self.parent = shim.Buffer(np.zeros(PARENT, np.int32))
        self.parent.copy_to_device(self.device)
        self.crop = self.parent.cropped([(CROP_X, CROP[1]), (0, CROP[0])])
        self.crop_fill = crop_fill.prepare(param=CROP_PARAM, f=self.crop)

    def seconds(self, case, iterations, sync_each):
        start = time.perf_counter()
        if case in self.resident:
            call = self.resident[case][0]
            for _ in range(iterations):
                call()
            self.device.sync()  # (as the stock side: its launches are waited for at the end)
        elif case == "fresh arrays":
            for i in range(iterations):
                self.source[0, 0] = i
                self.brighten(self.source, 2.0, 1.0, self.out)
            assert self.out[0, 0] == self.source[0, 0] * 2 + 1
        else:
            for _ in range(iterations):
                self.crop_fill()
            self.device.sync()
            self.crop.copy_to_host()
            np.testing.assert_array_equal(self.crop.numpy(), crop_expected(CROP_PARAM))
        return time.perf_counter() - start

    def close(self):
        for _, source, out in self.resident.values():
            source.device_free()
            out.device_free()
        self.crop_fill.close()
        self.crop = None
        self.parent.device_free()


# --- first calls ------------------------------------------------------------------------------

FIRST_STOCK = """
import sys, time, numpy as np
sys.path.insert(0, sys.argv[2])
from pipelines.stock import StockPipeline
p = StockPipeline(sys.argv[1], "brighten")
x = (np.arange(64 * 64) % 251).astype(np.float32).reshape(64, 64)
p.bind({"input": x, "scale": 2.0, "offset": 1.0, "output": np.zeros((64, 64), np.float32)})
start = time.perf_counter()
p.run()
out = p.fetch()["output"]
took = time.perf_counter() - start
assert np.array_equal(out, x * 2 + 1)
print(took)
"""

FIRST_SHIM = """
import sys, time, numpy as np
import shim
p = shim.load(sys.argv[1])
x = (np.arange(64 * 64) % 251).astype(np.float32).reshape(64, 64)
out = np.zeros((64, 64), np.float32)
start = time.perf_counter()
p(x, 2.0, 1.0, out)
took = time.perf_counter() - start
assert np.array_equal(out, x * 2 + 1)
print(took)
"""


def first_calls(runs: int) -> dict:
    libraries = {"stock": build(Build("brighten", "vulkan", "bundled")),
                 "shim": build(Build("brighten", "vulkan", "no_runtime"))}
    times = {"stock": [], "shim": []}
    for _ in range(runs):
        for side, script in (("stock", FIRST_STOCK), ("shim", FIRST_SHIM)):
            done = subprocess.run([sys.executable, "-c", script, str(libraries[side]), str(HERE.parent)],
                                  capture_output=True, text=True, cwd=HERE.parent, check=True)
            times[side].append(float(done.stdout.strip().splitlines()[-1]))
    return {side: {"min": min(t), "median": statistics.median(t)} for side, t in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=9, help="samples per side and case")
    parser.add_argument("--first-call-runs", type=int, default=3)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        stock_server()
        return 0
    requests = {case: {"case": case, "iterations": n, "sync_each": False}
                for case, n in ITERATIONS.items()}
    child = ChildProcess([sys.executable, str(Path(__file__)), "--serve"])
    shim_runner = None
    try:
        shim_runner = ShimRunner()
        results = interleave({"stock": child, "shim": shim_runner}, requests, args.repeats,
                             per_sample=lambda request: request["iterations"])
    finally:
        child.close()
        if shim_runner is not None:
            shim_runner.close()
    first = first_calls(args.first_call_runs)
    print(f"device: {shim_runner.device.name}")
    print(f"{'case':<18}{'stock us/call':>15}{'shim us/call':>14}{'shim/stock':>12}"
          f"{'stock median':>14}{'shim median':>13}")
    for case in ITERATIONS:
        stock, ours = results["stock"][case], results["shim"][case]
        print(f"{case:<18}{1e6 * stock['min']:>15.1f}{1e6 * ours['min']:>14.1f}"
              f"{ours['min'] / stock['min']:>12.2f}{1e6 * stock['median']:>14.1f}"
              f"{1e6 * ours['median']:>13.1f}")
    stock, ours = first["stock"], first["shim"]
    print(f"{'first call':<18}{1e6 * stock['min']:>15.1f}{1e6 * ours['min']:>14.1f}"
          f"{ours['min'] / stock['min']:>12.2f}{1e6 * stock['median']:>14.1f}"
          f"{1e6 * ours['median']:>13.1f}")
    print("(min over samples, per call; first call: one fresh process a sample, "
          f"{args.first_call_runs} each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
