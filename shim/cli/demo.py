"""``python -m shim demo``: build the sample pipelines if needed, run them through the shim,
check every result against numpy, and say what happened.

The 3x3 blur is also built with Halide's profiler (target feature ``profile``) and with its
tracing (``trace_realizations``), and run on a larger image: the profile at the end then has
a "Stages of blur3x3" table (Halide's per-Func figures) and a "Realizations of blur3x3" table,
and its timeline has the figures on each call of the first and the realize/produce slices of
the second."""

from __future__ import annotations

import json
import sys
import tempfile
import time

import numpy as np

import shim
from shim.profiling import halide_profiler
from shim.base import private_files
from shim.profiling import report as profile_report
from shim.pipelines.build import Build, MissingLibrary, build_all


def _timed(fn, repeat=20):
    """The result of ``fn()`` and its median time in milliseconds."""
    result = fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return result, 1e3 * float(np.median(times))


def _blur_reference(image: np.ndarray) -> np.ndarray:
    wide = image.astype(np.uint32)
    blur_x = ((wide[:, :-2] + wide[:, 1:-1] + wide[:, 2:]) // 3).astype(np.uint32)
    return ((blur_x[:-2] + blur_x[1:-1] + blur_x[2:]) // 3).astype(np.uint16)


# Builds of the blur with Halide's profiler and with its tracing. They run on a larger image:
# Halide's profiler samples every millisecond, and the small image's calls would mostly fall
# between two samples.
HALIDE_FEATURES = ("profile", "trace_realizations")
LARGE = (1922, 2562)


def run(say=print) -> int:
    # The summary's Stages tables show Halide's profiler figures: its own report at exit would
    # repeat them (it stays where the program or the environment sends it).
    halide_profiler.silence_exit_report_unless_chosen()
    try:
        return _demo(say)
    except MissingLibrary as e:
        # halide is an extra: a light install runs pipelines, but cannot build the demo's.
        print(f"demo: cannot build its pipelines: {e}", file=sys.stderr)
        return 1


def _demo(say) -> int:
    say("halide-shim demo: Halide AOT pipelines called from Python through the shim's runtime")
    specs = [Build(name, "host", runtime)
             for name in ("brighten", "blur3x3", "histogram", "sum_diff")
             for runtime in ("bundled", "no_runtime")]
    specs += [Build("blur3x3", "host", "bundled", (feature,)) for feature in HALIDE_FEATURES]
    say(f"building {len(specs)} pipeline libraries (cached after the first run) ...")
    paths = build_all(specs, progress=lambda line: say("  " + line))
    with shim.profile() as prof:
        failures = _run_all(say, specs, paths)
    say("")
    say("What the runtime did during the demo (shim.profile; the blur's -profile build adds "
        "Halide's per-Func figures, its -trace_realizations build Halide's realizations):")
    say(prof.summary())
    trace = _save_timeline(prof)
    if trace is None:
        say("timeline: not saved (the warning above says why)")
    else:
        say(f"timeline: {trace} (open it in https://ui.perfetto.dev; the -profile build's "
            "calls carry Halide's figures, the -trace_realizations build's calls hold realize "
            "and produce slices)")
    say("all results match numpy" if not failures else f"{failures} result(s) differ from numpy")
    return 1 if failures else 0


def _save_timeline(prof) -> str | None:
    """Write the profile's timeline into a new folder of its own (0700), and say where; None
    where that folder cannot be trusted (an UnsafeCacheWarning says why). A fixed name in the
    shared temporary folder is one another user can take first, as a link to a file of this
    user's that the demo would overwrite; and where $TMPDIR is a folder others can write
    without a sticky bit (a cluster's /scratch), they can rename the new folder away and put
    theirs in its place, holding such a link. So the folder is checked as the caches are and
    written through its descriptor (shim/base/private_files.py), never by path."""
    made = tempfile.mkdtemp(prefix="halide-shim-demo-")
    folder = private_files.open_folder(made, create=False,
                                       instead="The demo's timeline is not saved.")
    if folder is None:
        return None
    with folder:
        folder.write("trace.json", json.dumps(profile_report.chrome_trace(prof)).encode())
        return str(folder.path / "trace.json")


def _run_all(say, specs, paths) -> int:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 1 << 16, size=(482, 642), dtype=np.uint16)
    photo = rng.random((480, 640), dtype=np.float32)
    gray = rng.integers(0, 256, size=(480, 640), dtype=np.uint8)
    a = rng.integers(-1000, 1000, size=(480, 640), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(480, 640), dtype=np.int32)
    large = rng.integers(0, 1 << 16, size=LARGE, dtype=np.uint16)

    failures = 0
    width = max(len(_build_label(spec)) for spec in specs)
    for spec in specs:
        pipeline = shim.load(paths[spec])
        if spec.name == "blur3x3" and spec.features:
            # (into one array: a new 10 MB output each call would time the page faults)
            out = np.empty((large.shape[0] - 2, large.shape[1] - 2), np.uint16)
            _, ms = _timed(lambda: pipeline(large, output=out))
            ok = np.array_equal(out, _blur_reference(large))
            what = f"3x3 blur {large.shape[1]}x{large.shape[0]} -> {out.shape[1]}x{out.shape[0]} uint16"
        elif spec.name == "brighten":
            result, ms = _timed(lambda: pipeline(photo, scale=1.5, output=photo.shape))
            ok = np.allclose(result.numpy(), photo * 1.5 + 1.0)
            what = "brighten 640x480 float32 (scale=1.5)"
        elif spec.name == "blur3x3":
            result, ms = _timed(lambda: pipeline(image, output=(480, 640)))
            ok = np.array_equal(result.numpy(), _blur_reference(image))
            what = "3x3 blur 642x482 -> 640x480 uint16"
        elif spec.name == "histogram":
            result, ms = _timed(lambda: pipeline(gray))
            ok = np.array_equal(result.numpy(), np.bincount(gray.ravel(), minlength=256))
            what = "256-bin histogram of 640x480 uint8"
        else:
            (total, diff), ms = _timed(lambda: pipeline(a, b, sum=a.shape, diff=a.shape))
            ok = np.array_equal(total.numpy(), a + b) and np.array_equal(diff.numpy(), a - b)
            what = "sum and difference, two outputs"
        failures += not ok
        verdict = "matches numpy" if ok else "DIFFERS FROM NUMPY"
        say(f"  {what:<40} {_build_label(spec):<{width}} {ms:7.3f} ms/call  {verdict}")

    try:
        shim.load(paths[specs[0]])(photo, scale=20.0, output=photo.shape)
    except shim.ArgumentError as e:
        say(f"bad input is refused with a clear error: {type(e).__name__}: {e}")
    result = shim.load(paths[specs[0]])(photo, scale=1.5, output=photo.shape)
    view = np.from_dlpack(result)
    say(f"DLPack: np.from_dlpack(result) shares the Buffer's memory: "
        f"{np.shares_memory(view, result.numpy())}")
    return failures + _gpu_chain(say, photo)


def _build_label(spec: Build) -> str:
    """How the demo names a build: its runtime, and the Halide target features it adds."""
    return " ".join([spec.runtime, *(f"-{feature}" for feature in spec.features)])


def _gpu_chain(say, image: np.ndarray) -> int:
    """Two pipelines from two libraries (one with Halide's runtime bundled, one built
    no_runtime) chained on the default GPU device; the intermediate never leaves it."""
    try:
        device = shim.default_device()
    except shim.DeviceUnavailable as e:
        say(f"no GPU device, skipping the GPU part: {e}")
        return 0
    if device.kind == "host":
        say("no GPU device on this machine: skipping the GPU part")
        return 0
    say(f"GPU device: {device.name} ({device.kind})")
    specs = [Build("brighten", device.kind, runtime) for runtime in ("bundled", "no_runtime")]
    paths = build_all(specs, progress=lambda line: say("  " + line))
    first, second = (shim.load(paths[spec]) for spec in specs)
    start = time.perf_counter()
    middle = first(image, scale=2.0, offset=0.0, output=image.shape)
    say(f"  first call, kernels compiled: {1e3 * (time.perf_counter() - start):.0f} ms")
    before = (device.transfers.uploaded, device.transfers.downloaded)
    out = second(middle, scale=0.25, offset=1.0, output=image.shape)
    moved = (device.transfers.uploaded - before[0], device.transfers.downloaded - before[1])
    say(f"  {first.path.rsplit('/', 1)[-1]} -> {second.path.rsplit('/', 1)[-1]}: bytes uploaded "
        f"{moved[0]}, downloaded {moved[1]} between the two (the intermediate stayed on the device)")
    with second.prepare(middle, scale=0.25, offset=1.0, output=out) as call:
        _, ms = _timed(lambda: (call(), device.sync()))
    say(f"  steady state: {ms:.3f} ms per call, synchronized, data resident on the device")
    ok = np.allclose(out.numpy(), image * 0.5 + 1.0)
    say(f"  chained result {'matches numpy' if ok else 'DIFFERS FROM NUMPY'}")
    return 0 if ok else 1
