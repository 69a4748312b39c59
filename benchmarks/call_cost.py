"""What a pipeline call costs beyond the pipeline's own work: the shim against Halide's own
Python bindings and against Halide's stock runtime, side by side in one run (issue 13).

    python benchmarks/call_cost.py [--repeats R] [--quick] [--no-opencl] [--no-first-call]
    python benchmarks/call_cost.py --profile N    # cProfile of N plain numpy calls (shim)

Rows (each the min over samples of us per call; the runtimes take turns sample by sample):

host, the near-empty pipeline: 4x4 float32, output(x, y) = input(x, y) * k, no schedule
(pipelines/generators/times_k.py, built no_runtime, through the shim) against the same
definition JIT-compiled by Halide's bindings (``Func.compile_to_callable``), in this process:
  - plain call, numpy in and out: ``p(a, k=k, output=o)`` vs ``c(a, k, o)``;
  - plain call, Buffers: ``p(b, k=k, output=ob)`` (shim.Buffer) vs ``c(hb, k, hob)``
    (halide.Buffer);
  - prepared call: ``run()`` from ``p.prepare(b, k=k, output=ob)`` (and from a prepare()
    given the numpy arrays) vs Halide's bindings with halide.Buffers;
  - a new output each call: the output given as a shape, ``p(a, k=k, output=(4, 4))``
    (a shim.Buffer returned), vs the plain call into an existing numpy array, into a new one
    (``output=np.zeros(...)``), and vs Halide's bindings given a new halide.Buffer each call;
  - crop output: the plain and the prepared call with Buffers writing a 4x4 crop at (1, 1) of
    a 6x6 Buffer vs the same call writing a whole 4x4 Buffer (input: a 6x6 Buffer for both).
OpenCL, a small pipeline with its data resident on the device (brighten, 64x64 float32, as the
"small" case of benchmarks/gpu_pipelines.py; calls back to back, one device sync at the end):
  - the shim's prepared and plain call (no_runtime build, shim.Buffers that live on the
    device) vs Halide's stock runtime (bundled build, in a child process without the shim,
    buffers bound once, called through brighten_argv), on the same platform and device: the
    child is told the shim's platform (HL_OCL_PLATFORM_NAME) and both sides report the ICD
    loader and driver they mapped and the context's platform and device;
  - crop output: the shim writing a 64x64 crop of a wider output Buffer at a byte offset that
    is not a multiple of the device's CL_DEVICE_MEM_BASE_ADDR_ALIGN / 8 (x = 1), and at one
    that is (x = that alignment in elements), vs writing a whole 64x64 Buffer, same input.
    The misaligned crop is the first of its family on the device, so the family's allocation
    is placed for it (a sub-buffer); "of a resident parent": the same crop of a parent that
    went to the device first, so the crop stays misaligned: launched at an element offset
    (native_stubs/backends/opencl_prototypes.c), no longer staged.
First call in a fresh process (OpenCL brighten, numpy in and out, one earlier process of each
runtime having built it): the first call's time, imports and library loading excluded, in new
processes of the shim and of the stock runtime, taking turns.

Targets are the issue's ratios, shim / reference; "met" compares the ratio of the mins.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sidebyside import ChildProcess, interleave

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

# The checkout's pipelines/ by the folder's own name, not as shim.pipelines: the stock runtime's
# child process runs this module too, and must not import the shim package.
from pipelines.build import Build, build  # noqa: E402

K = 2.0
HOST_SHAPE = (4, 4)         # numpy order (height, width)
HOST_CROP_PARENT = (6, 6)
HOST_CROP_MIN = (1, 1)      # Halide order (x, y)
GPU_SHAPE = (64, 64)
GPU_SCALARS = {"scale": 2.0, "offset": 1.0}

# Calls per sample (one sample: a timed loop of that many calls).
ITERATIONS = {"host": 1000, "opencl": 200}


@dataclass(frozen=True)
class Row:
    title: str
    shim: str       # the measurement in the shim column
    reference: str  # the one in the reference column
    target: float   # the ratio shim / reference (at most)


ROWS = [
    Row("host: plain call, numpy in and out (vs Halide bindings, numpy)", "host.shim.numpy",
        "host.halide.numpy", 1.0),
    Row("host: plain call, Buffers (vs Halide bindings, halide.Buffer)", "host.shim.buffers.buffer",
        "host.halide.buffer", 1.0),
    Row("host: prepared call, Buffers (vs Halide bindings, halide.Buffer)", "host.shim.prepared",
        "host.halide.buffer", 0.7),
    Row("host: prepared call, numpy (vs Halide bindings, halide.Buffer)",
        "host.shim.prepared_numpy", "host.halide.buffer", 0.7),
    Row("host: plain call, output as a shape / output array", "host.shim.shape", "host.shim.numpy",
        1.2),
    Row("host: plain call, output as a shape / a new numpy output", "host.shim.shape",
        "host.shim.new_numpy", 1.2),
    Row("host: plain call, output as a shape (vs Halide bindings, a new halide.Buffer)",
        "host.shim.shape", "host.halide.new_buffer", 1.0),
    Row("host: crop output / whole, plain call (Buffers)", "host.crop.plain", "host.whole.plain", 1.1),
    Row("host: crop output / whole, prepared call", "host.crop.prepared", "host.whole.prepared", 1.1),
    Row("opencl: prepared call, resident (vs stock runtime)", "opencl.shim.prepared",
        "opencl.stock", 0.8),
    Row("opencl: plain call, resident (vs stock runtime)", "opencl.shim.plain", "opencl.stock", 1.0),
    Row("opencl: misaligned crop / whole, prepared", "opencl.misaligned.prepared",
        "opencl.whole.prepared", 1.1),
    Row("opencl: misaligned crop / whole, plain call", "opencl.misaligned.plain",
        "opencl.whole.plain", 1.1),
    Row("opencl: misaligned crop of a resident parent / whole, prepared", "opencl.offset.prepared",
        "opencl.whole.prepared", 1.1),
    Row("opencl: misaligned crop of a resident parent / whole, plain call", "opencl.offset.plain",
        "opencl.whole.plain", 1.1),
    Row("opencl: aligned crop / whole, prepared", "opencl.aligned.prepared", "opencl.whole.prepared", 1.1),
    Row("opencl: aligned crop / whole, plain call", "opencl.aligned.plain", "opencl.whole.plain", 1.1),
    Row("opencl: first call in a fresh process (vs stock runtime)", "first.shim", "first.stock", 1.5),
]


def iterations_of(key: str) -> int:
    return ITERATIONS["host" if key.startswith("host.") else "opencl"]


def timed_loop(statement: str, after: str = "", **names):
    """A function ``loop(n) -> seconds`` that runs ``statement`` n times, then ``after``, with
    ``names`` as local variables: no closure or argument unpacking around the call (what
    timeit does, with the garbage collector left on)."""
    params = "".join(f", {name}=_names[{name!r}]" for name in names)
    source = (f"def loop(_n, _clock=_clock{params}):\n"
              f"    _start = _clock()\n"
              f"    for _ in range(_n):\n"
              f"        {statement}\n"
              + (f"    {after}\n" if after else "")
              + "    return _clock() - _start\n")
    scope = {"_names": names, "_clock": time.perf_counter}
    exec(source, scope)
    return scope["loop"]


def host_input(shape) -> np.ndarray:
    return np.random.default_rng(7).random(shape, dtype=np.float32) * 100


def gpu_input(shape) -> np.ndarray:
    return np.random.default_rng(7).integers(0, 1000, size=shape).astype(np.float32)


# --- which OpenCL each process uses ------------------------------------------------------------

_CL_CONTEXT_DEVICES, _CL_DEVICE_PLATFORM = 0x1081, 0x1031
_CL_DEVICE_NAME, _CL_DRIVER_VERSION, _CL_DEVICE_MEM_BASE_ADDR_ALIGN = 0x102B, 0x102D, 0x1019
_CL_PLATFORM_NAME, _CL_PLATFORM_VERSION = 0x0902, 0x0901
# OpenCL drivers (ICDs) by file name: PoCL, NVIDIA, AMD, Intel, Mesa's rusticl, clvk.
_ICD_DRIVERS = re.compile(r"lib(?:pocl|nvidia-opencl|amdocl|intelocl|igdrcl|rusticlopencl|openclon12|clvk)",
                          re.IGNORECASE)


def opencl_identity(context: int) -> dict:
    """The ICD loaders and drivers this process has mapped, and the platform and device of the
    OpenCL ``context`` (a cl_context address), asked through the loader."""
    with open("/proc/self/maps") as f:
        maps = f.read()
    loaders = sorted(set(re.findall(r"(/\S*libOpenCL\S*\.so\S*)", maps)))
    libraries = set(re.findall(r"(/\S*\.so[.\d]*)\s*$", maps, re.MULTILINE))
    drivers = sorted(path for path in libraries if _ICD_DRIVERS.match(os.path.basename(path)))
    identity = {"loaders": loaders, "drivers": drivers}
    if not loaders or not context:
        return identity
    cl = ctypes.CDLL(loaders[0])
    for fn in (cl.clGetContextInfo, cl.clGetDeviceInfo, cl.clGetPlatformInfo):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p,
                       ctypes.POINTER(ctypes.c_size_t)]

    def info(fn, obj, param) -> bytes:
        size = ctypes.c_size_t()
        if fn(obj, param, 0, None, ctypes.byref(size)) != 0:
            return b""
        out = ctypes.create_string_buffer(size.value)
        fn(obj, param, size.value, out, None)
        return out.raw

    devices = info(cl.clGetContextInfo, context, _CL_CONTEXT_DEVICES)
    device = ctypes.c_void_p.from_buffer_copy(devices[:8]).value
    platform = ctypes.c_void_p.from_buffer_copy(info(cl.clGetDeviceInfo, device, _CL_DEVICE_PLATFORM)).value
    text = lambda raw: raw.rstrip(b"\0").decode(errors="replace").strip()  # noqa: E731
    identity.update(
        platform=text(info(cl.clGetPlatformInfo, platform, _CL_PLATFORM_NAME)),
        platform_version=text(info(cl.clGetPlatformInfo, platform, _CL_PLATFORM_VERSION)),
        device=text(info(cl.clGetDeviceInfo, device, _CL_DEVICE_NAME)),
        driver_version=text(info(cl.clGetDeviceInfo, device, _CL_DRIVER_VERSION)),
        base_addr_align_bits=ctypes.c_uint.from_buffer_copy(
            info(cl.clGetDeviceInfo, device, _CL_DEVICE_MEM_BASE_ADDR_ALIGN)).value,
        devices_in_context=len(devices) // 8)
    return identity


def same_device(a: dict, b: dict) -> bool:
    keys = ("platform", "platform_version", "device", "driver_version")
    return all(a.get(k) for k in keys) and all(a.get(k) == b.get(k) for k in keys)


# --- the stock runtime (child process, without the shim) ---------------------------------------

def stock_library() -> Path:
    return build(Build("brighten", "opencl", "bundled"))


def stock_identity(library: Path) -> dict:
    """Which OpenCL the stock runtime in ``library`` (already initialized) uses."""
    runtime = ctypes.CDLL(str(library))
    acquire, release = runtime.halide_acquire_cl_context, runtime.halide_release_cl_context
    acquire.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                        ctypes.POINTER(ctypes.c_void_p), ctypes.c_bool]
    release.argtypes = [ctypes.c_void_p]
    ctx, queue = ctypes.c_void_p(), ctypes.c_void_p()
    if acquire(None, ctypes.byref(ctx), ctypes.byref(queue), False) != 0:
        return opencl_identity(0)
    try:
        return opencl_identity(ctx.value or 0)
    finally:
        release(None)


def stock_server() -> None:
    """Requests on stdin, one JSON line each: {"identity": true} -> the identity (JSON), or
    {"iterations": N} -> the seconds N calls on resident data took, one sync at the end."""
    from pipelines.stock import StockPipeline

    library = stock_library()
    pipeline = StockPipeline(str(library), "brighten")
    pipeline.bind({"input": gpu_input(GPU_SHAPE), **GPU_SCALARS, "output": np.zeros(GPU_SHAPE, np.float32)})
    pipeline.run()  # uploads the input: from here on the data stays resident
    pipeline.sync()
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("identity"):
            print(json.dumps(stock_identity(library)), flush=True)
        else:
            print(pipeline.seconds(request["iterations"], False), flush=True)


class StockChild(ChildProcess):
    def identity(self) -> dict:
        self._child.stdin.write(json.dumps({"identity": True}) + "\n")
        self._child.stdin.flush()
        return json.loads(self._child.stdout.readline())


def child_env(platform: str | None) -> dict:
    env = dict(os.environ)
    if platform:
        env["HL_OCL_PLATFORM_NAME"] = platform  # Halide's runtime picks the shim's platform
    return env


# --- first call in a fresh process -------------------------------------------------------------

def first_call(side: str) -> None:
    """In a new process: time the first call of OpenCL brighten (numpy in and out), after
    imports and library loading; print {"seconds": s, "identity": ...}."""
    values = {"input": gpu_input(GPU_SHAPE), **GPU_SCALARS, "output": np.zeros(GPU_SHAPE, np.float32)}
    if side == "stock":
        from pipelines.stock import StockPipeline

        library = stock_library()
        pipeline = StockPipeline(str(library), "brighten")
        pipeline.bind(values)
        start = time.perf_counter()
        pipeline.run()
        result = pipeline.fetch()["output"]
        seconds = time.perf_counter() - start
        identity = stock_identity(library)
    else:
        import pyopencl  # noqa: F401  (imported by the stock side before its timing too)

        import shim

        p = shim.load(build(Build("brighten", "opencl", "no_runtime")))
        start = time.perf_counter()
        result = p(values["input"], output=values["output"], **GPU_SCALARS)
        seconds = time.perf_counter() - start
        identity = opencl_identity(shim.device("opencl").context.int_ptr)
    expected = values["input"] * np.float32(GPU_SCALARS["scale"]) + np.float32(GPU_SCALARS["offset"])
    print(json.dumps({"seconds": seconds, "identity": identity,
                      "correct": bool(np.allclose(result, expected, rtol=1e-6))}), flush=True)


def fresh_first_call(side: str, platform: str | None) -> dict:
    done = subprocess.run([sys.executable, str(Path(__file__)), "--first-call-in-this-process", side],
                          capture_output=True, text=True, env=child_env(platform), timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"first call ({side}) failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def first_calls(samples: int, platform: str | None) -> dict:
    """{"first.shim": [seconds...], "first.stock": [...]} and the identities; one process of
    each side first builds what it caches, untimed."""
    results = {"first.shim": [], "first.stock": []}
    identities, correct = {}, True
    for side in ("shim", "stock"):
        fresh_first_call(side, platform)
    for _ in range(samples):
        for side in ("shim", "stock"):
            answer = fresh_first_call(side, platform)
            results[f"first.{side}"].append(answer["seconds"])
            identities[side] = answer["identity"]
            correct &= answer["correct"]
    return {"seconds": results, "identities": identities, "correct": correct}


# --- the measurements in this process ----------------------------------------------------------

class Bench:
    """Every measurement of this process and the stock child, by key: ``seconds(key,
    iterations)``. ``opencl=False``, or no OpenCL device, leaves the OpenCL ones out (then
    ``opencl_skipped`` says why)."""

    def __init__(self, opencl: bool = True):
        import shim  # before halide: the shim's runtime is loaded first, as it must be

        self.loops = {}
        self.checks = []          # (description, produce the result, expected)
        self.buffers = []         # device Buffers to free at close, crops first
        self.child = None
        self.identities = {}
        self.opencl_skipped = None
        self.alignment = None
        self._host(shim)
        if opencl:
            try:
                device = shim.device("opencl")
            except shim.DeviceUnavailable as e:
                self.opencl_skipped = f"no OpenCL device: {e}"
            else:
                self._opencl(shim, device)
        else:
            self.opencl_skipped = "--no-opencl"

    def seconds(self, key: str, iterations: int) -> float:
        return self.loops[key](iterations)

    def _host(self, shim) -> None:
        import halide as hl

        p = shim.load(build(Build("times_k", "host", "no_runtime")))
        x, y = hl.vars("x y")
        inp, k = hl.ImageParam(hl.Float(32), 2, "input"), hl.Param(hl.Float(32), "k")
        out = hl.Func("output")
        out[x, y] = inp[x, y] * k
        c = out.compile_to_callable([inp, k], hl.get_jit_target_from_environment())

        a = host_input(HOST_SHAPE)
        expected = a * np.float32(K)
        o_shim, o_hl = np.zeros(HOST_SHAPE, np.float32), np.zeros(HOST_SHAPE, np.float32)
        b, ob = shim.Buffer(a.copy()), shim.Buffer(np.zeros(HOST_SHAPE, np.float32))
        self._halide_arrays = (a.copy(), np.zeros(HOST_SHAPE, np.float32))  # what the Buffers view
        hb, hob = (hl.Buffer(array) for array in self._halide_arrays)
        a_prep, o_prep = a.copy(), np.zeros(HOST_SHAPE, np.float32)
        ob_prep = shim.Buffer(np.zeros(HOST_SHAPE, np.float32))
        prepared = p.prepare(b, k=K, output=ob_prep)
        prepared_numpy = p.prepare(a_prep, k=K, output=o_prep)
        self.loops.update({
            "host.shim.numpy": timed_loop("p(a, k=k, output=o)", p=p, a=a, k=K, o=o_shim),
            "host.halide.numpy": timed_loop("c(a, k, o)", c=c, a=a, k=K, o=o_hl),
            "host.shim.buffers.buffer": timed_loop("p(b, k=k, output=ob)", p=p, b=b, k=K, ob=ob),
            "host.halide.buffer": timed_loop("c(hb, k, hob)", c=c, hb=hb, k=K, hob=hob),
            "host.shim.prepared": timed_loop("run()", run=prepared),
            "host.shim.prepared_numpy": timed_loop("run()", run=prepared_numpy),
            # A new output each call: given as a shape (the shim returns a Buffer), as a new
            # numpy array, and as Halide's bindings take one, a new halide.Buffer.
            "host.shim.shape": timed_loop("p(a, k=k, output=s)", p=p, a=a, k=K, s=HOST_SHAPE),
            "host.shim.new_numpy": timed_loop("p(a, k=k, output=zeros(s, f32))", p=p, a=a, k=K,
                                              s=HOST_SHAPE, zeros=np.zeros, f32=np.float32),
            "host.halide.new_buffer": timed_loop("c(hb, k, Buffer(f32, xy))", c=c, hb=hb, k=K,
                                                 Buffer=hl.Buffer, f32=hl.Float(32),
                                                 xy=HOST_SHAPE[::-1]),
        })
        self.checks += [("host.shim.numpy", lambda: o_shim, expected),
                        ("host.halide.numpy", lambda: o_hl, expected),
                        ("host.shim.buffers.buffer", lambda: np.asarray(ob), expected),
                        ("host.halide.buffer", lambda: np.asarray(hob), expected),
                        ("host.shim.prepared", lambda: np.asarray(ob_prep), expected),
                        ("host.shim.prepared_numpy", lambda: o_prep, expected),
                        ("host.shim.shape", lambda: p(a, k=K, output=HOST_SHAPE).numpy(), expected)]

        # Crop output vs whole: same 6x6 input, 4x4 output either whole (mins 0) or a crop.
        a6 = host_input(HOST_CROP_PARENT)
        b6 = shim.Buffer(a6)
        whole = shim.Buffer(np.zeros(HOST_SHAPE, np.float32))
        parent = shim.Buffer(np.zeros(HOST_CROP_PARENT, np.float32))
        (x0, y0), (h, w) = HOST_CROP_MIN, HOST_SHAPE
        crop = parent.cropped([(x0, w), (y0, h)])
        whole_prep = shim.Buffer(np.zeros(HOST_SHAPE, np.float32))
        parent_prep = shim.Buffer(np.zeros(HOST_CROP_PARENT, np.float32))
        crop_prep = parent_prep.cropped([(x0, w), (y0, h)])
        self.loops.update({
            "host.whole.plain": timed_loop("p(b, k=k, output=o)", p=p, b=b6, k=K, o=whole),
            "host.crop.plain": timed_loop("p(b, k=k, output=o)", p=p, b=b6, k=K, o=crop),
            "host.whole.prepared": timed_loop("run()", run=p.prepare(b6, k=K, output=whole_prep)),
            "host.crop.prepared": timed_loop("run()", run=p.prepare(b6, k=K, output=crop_prep)),
        })
        in_crop = a6[y0:y0 + h, x0:x0 + w] * np.float32(K)
        self.checks += [("host.whole.plain", lambda: np.asarray(whole), a6[:h, :w] * np.float32(K)),
                        ("host.crop.plain", lambda: np.asarray(parent)[y0:y0 + h, x0:x0 + w], in_crop),
                        ("host.whole.prepared", lambda: np.asarray(whole_prep), a6[:h, :w] * np.float32(K)),
                        ("host.crop.prepared", lambda: np.asarray(parent_prep)[y0:y0 + h, x0:x0 + w],
                         in_crop)]

    def _opencl(self, shim, device) -> None:
        self.device = device
        identity = opencl_identity(device.context.int_ptr)
        self.identities["shim"] = identity
        self.child = StockChild([sys.executable, str(Path(__file__)), "--serve"],
                                env=child_env(identity.get("platform")))
        self.identities["stock"] = self.child.identity()
        child = self.child
        self.loops["opencl.stock"] = lambda n: child.seconds(iterations=n)

        p = shim.load(build(Build("brighten", "opencl", "no_runtime")))
        sync = "device.sync()"
        h, w = GPU_SHAPE
        a = gpu_input(GPU_SHAPE)
        b = shim.Buffer(a)
        o_prep, o_plain = (shim.Buffer(np.zeros(GPU_SHAPE, np.float32)) for _ in range(2))
        prepared = p.prepare(b, output=o_prep, **GPU_SCALARS)
        self.loops.update({
            "opencl.shim.prepared": timed_loop("run()", sync, run=prepared, device=device),
            "opencl.shim.plain": timed_loop("p(b, scale=s, offset=f, output=o)", sync, p=p, b=b, o=o_plain,
                                            s=GPU_SCALARS["scale"], f=GPU_SCALARS["offset"],
                                            device=device),
        })
        expected = a * np.float32(GPU_SCALARS["scale"]) + np.float32(GPU_SCALARS["offset"])
        self.checks += [("opencl.shim.prepared", lambda: np.asarray(o_prep), expected),
                        ("opencl.shim.plain", lambda: np.asarray(o_plain), expected)]
        self.buffers += [b, o_prep, o_plain]

        # Crops: 64x64 outputs at x = 1 (misaligned) and x = the base alignment in elements,
        # of a parent as wide as that needs; the input is as wide, the whole output 64x64.
        itemsize = np.dtype(np.float32).itemsize
        self.alignment = align = max(identity.get("base_addr_align_bits", device.alignment * 8) // 8, 1)
        aligned_x = max(align // itemsize, 1)
        offsets = {"aligned": aligned_x}
        if align > itemsize:
            offsets["misaligned"] = offsets["offset"] = 1
        wide = (h, w + aligned_x)
        a_wide = gpu_input(wide)
        b_wide = shim.Buffer(a_wide)
        self.buffers.insert(0, b_wide)
        scalars = {"s": GPU_SCALARS["scale"], "f": GPU_SCALARS["offset"]}
        for name, x0 in [("whole", None), *offsets.items()]:
            for mode in ("prepared", "plain"):
                if x0 is None:
                    out = parent = shim.Buffer(np.zeros(GPU_SHAPE, np.float32))
                    region = (slice(0, h), slice(0, w))
                else:
                    assert (x0 * itemsize % align == 0) == (name == "aligned")
                    parent = shim.Buffer(np.zeros(wide, np.float32))
                    if name == "offset":
                        parent.copy_to_device(device)  # the allocation is placed for the parent
                    out = parent.cropped([(x0, w), (0, h)])
                    region = (slice(0, h), slice(x0, x0 + w))
                    self.buffers.insert(0, out)
                self.buffers.append(parent)
                key = f"opencl.{name}.{mode}"
                if mode == "prepared":
                    self.loops[key] = timed_loop("run()", sync, device=device,
                                                 run=p.prepare(b_wide, output=out, **GPU_SCALARS))
                else:
                    self.loops[key] = timed_loop("p(b, scale=s, offset=f, output=o)", sync, p=p,
                                                 b=b_wide, o=out, device=device, **scalars)
                want = a_wide[region] * np.float32(GPU_SCALARS["scale"]) + np.float32(GPU_SCALARS["offset"])
                self.checks.append((key, lambda parent=parent, region=region: np.asarray(parent)[region],
                                    want))

    def check(self) -> list[str]:
        """Run every measurement once, then compare its output with numpy's: the failures."""
        for loop in self.loops.values():
            loop(1)
        failures = []
        for key, result, expected in self.checks:
            got = np.asarray(result())
            if not np.allclose(got, expected, rtol=1e-6):
                failures.append(f"{key}: got {got.ravel()[:4]}..., expected {expected.ravel()[:4]}...")
        return failures

    def close(self) -> None:
        for buf in self.buffers:
            buf.device_free()  # results come home first: nothing is dropped unread
        self.buffers.clear()
        if self.child is not None:
            self.child.close()
            self.child = None


# --- the report --------------------------------------------------------------------------------

def measure(bench: Bench, repeats: int, scale: float = 1.0) -> dict:
    """{key: {"min": us, "median": us}} over ``repeats`` samples taken in turns."""
    requests = {}
    for row in ROWS:
        for key in (row.shim, row.reference):
            if key in bench.loops and key not in requests:
                requests[key] = {"key": key, "iterations": max(1, int(iterations_of(key) * scale))}
    results = interleave({"all": bench}, requests, repeats, per_sample=lambda r: r["iterations"])["all"]
    return {key: {stat: 1e6 * v for stat, v in r.items()} for key, r in results.items()}


def report(results: dict) -> str:
    lines = [f"{'row':<66}{'shim us':>10}{'ref us':>10}{'ratio':>8}{'median':>8}{'target':>8}  met",
             "  (min over samples of us per call; ratio = shim min / reference min; 'median': "
             "ratio of the medians; crop rows: reference = the same call on a whole buffer)"]
    for row in ROWS:
        ours, ref = results.get(row.shim), results.get(row.reference)
        if ours is None or ref is None:
            lines.append(f"{row.title:<66}{'(not measured)':>20}")
            continue
        ratio, median = ours["min"] / ref["min"], ours["median"] / ref["median"]
        lines.append(f"{row.title:<66}{ours['min']:>10.2f}{ref['min']:>10.2f}{ratio:>7.2f}x"
                     f"{median:>7.2f}x{row.target:>7.1f}x  {'yes' if ratio <= row.target else 'NO'}")
    return "\n".join(lines)


def describe(identity: dict) -> str:
    if "device" not in identity:
        return f"no context found; loaders {identity.get('loaders')}, drivers {identity.get('drivers')}"
    return (f"{identity['device']} on {identity['platform']} ({identity['platform_version']}, driver "
            f"{identity['driver_version']}); ICD loader {', '.join(identity['loaders'])}; "
            f"driver library {', '.join(identity['drivers']) or '?'}")


def profile(calls: int) -> None:
    """cProfile of ``calls`` plain numpy calls of the near-empty pipeline through the shim."""
    import cProfile
    import pstats

    import shim

    p = shim.load(build(Build("times_k", "host", "no_runtime")))
    a, o = host_input(HOST_SHAPE), np.zeros(HOST_SHAPE, np.float32)
    for _ in range(100):
        p(a, k=K, output=o)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        p(a, k=K, output=o)
    profiler.disable()
    stats = pstats.Stats(profiler)
    print(f"{stats.total_calls / calls:.0f} Python function calls per pipeline call "
          f"({stats.prim_calls / calls:.0f} primitive)")
    stats.sort_stats("tottime").print_stats(20)
    stats.sort_stats("cumulative").print_stats(20)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, help="samples per measurement (default 15, --quick 3)")
    parser.add_argument("--quick", action="store_true",
                        help="few samples of few calls, one first-call process per side")
    parser.add_argument("--no-opencl", action="store_true", help="host rows only")
    parser.add_argument("--no-first-call", action="store_true", help="skip the fresh-process rows")
    parser.add_argument("--first-call-samples", type=int, help="fresh processes per side (default 3, --quick 1)")
    parser.add_argument("--profile", type=int, metavar="CALLS",
                        help="instead: cProfile CALLS plain numpy calls through the shim")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--first-call-in-this-process", choices=["shim", "stock"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        stock_server()
        return 0
    if args.first_call_in_this_process:
        first_call(args.first_call_in_this_process)
        return 0
    if args.profile:
        profile(args.profile)
        return 0
    repeats = args.repeats or (3 if args.quick else 15)
    samples = args.first_call_samples or (1 if args.quick else 3)
    bench = Bench(opencl=not args.no_opencl)
    try:
        failures = bench.check()
        results = measure(bench, repeats, scale=0.2 if args.quick else 1.0)
        failures += bench.check()
    finally:
        bench.close()
    print(f"{repeats} samples per measurement; calls per sample: host {ITERATIONS['host']}, "
          f"opencl {ITERATIONS['opencl']}"
          + (" (x0.2, --quick)" if args.quick else ""))
    if bench.opencl_skipped:
        print(f"OpenCL rows skipped: {bench.opencl_skipped}")
    else:
        same = same_device(bench.identities["shim"], bench.identities["stock"])
        print(f"OpenCL, shim:  {describe(bench.identities['shim'])}")
        print(f"OpenCL, stock: {describe(bench.identities['stock'])}")
        print(f"same platform and device: {'yes' if same else 'NO'}; base address alignment "
              f"{bench.alignment} bytes (misaligned crop at byte offset 4, aligned at {bench.alignment})")
        if not args.no_first_call:
            first = first_calls(samples, bench.identities["shim"].get("platform"))
            for key, values in first["seconds"].items():
                results[key] = {"min": 1e6 * min(values), "median": 1e6 * statistics.median(values)}
            print(f"first calls ({samples} fresh process(es) per side, seconds): " + "; ".join(
                f"{key.split('.')[1]} " + " ".join(f"{v:.3f}" for v in values)
                for key, values in first["seconds"].items()))
            ids = first["identities"]
            if not same_device(ids.get("shim", {}), ids.get("stock", {})):
                print(f"first calls: NOT the same OpenCL device: shim {describe(ids.get('shim', {}))}; "
                      f"stock {describe(ids.get('stock', {}))}")
            if not first["correct"]:
                failures.append("first call: an output differs from numpy")
    print(report(results))
    print("outputs checked against numpy: " + ("ok" if not failures else "FAILED: " + "; ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
