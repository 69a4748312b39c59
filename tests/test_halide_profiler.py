"""Halide's own profiler (-profile, -profile_by_timer) read per call inside shim.profile():
shim/profiling/halide_profiler.py."""

import json
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

import shim
from shim.profiling import halide_profiler
from shim.native import ffi, lib

NAME = "hp_stages"
FUNCS = ("blur_x", "blur_y", "out")
# A child process that hangs fails its test after this long: a hang guard, as the suite's other
# child processes have, never a check of speed (they take a second or two).
HANG_GUARD_S = 300
SOURCE = """
import subprocess, sys
import halide as hl
x, y = hl.Var("x"), hl.Var("y")
inp = hl.ImageParam(hl.Float(32), 2, "inp")
blur_x, blur_y, out = hl.Func("blur_x"), hl.Func("blur_y"), hl.Func("out")
blur_x[x, y] = (inp[x, y] + inp[x + 1, y] + inp[x + 2, y]) / 3
blur_y[x, y] = (blur_x[x, y] + blur_x[x, y + 1] + blur_x[x, y + 2]) / 3
out[x, y] = hl.sqrt(hl.abs(blur_y[x, y])) + 1
blur_x.compute_root()
blur_y.compute_root()
obj, lib, feature = sys.argv[1:]
out.compile_to({hl.OutputFileType.object: obj}, [inp], "%s", hl.Target("host-" + feature))
subprocess.run(["cc", "-shared", "-o", lib, obj, "-lpthread", "-ldl"], check=True)
""" % NAME


@pytest.fixture(scope="module", params=["profile", "profile_by_timer"])
def built(request, tmp_path_factory):
    """(path of the .so, Pipeline): blur_x (compute_root, W x (H+2) floats), blur_y
    (compute_root, W x H floats), out; the input is (W+2) x (H+2). Compiled in a subprocess
    (halide's compiler stays out of this process)."""
    pytest.importorskip("halide", reason="compiling test pipelines needs halide")
    work = tmp_path_factory.mktemp(f"hp_{request.param}")
    path = work / f"{NAME}.so"
    subprocess.run([sys.executable, "-c", SOURCE, str(work / f"{NAME}.o"), str(path),
                    request.param], check=True)
    return path, shim.load(path)


def _run(pipeline, width, height):
    inp = np.random.default_rng(0).random((height + 2, width + 2), dtype=np.float32)
    return pipeline(inp, out=np.empty((height, width), np.float32))


def _halide_entry():
    state = lib.halide_profiler_get_state()
    p = state.pipelines
    while p != ffi.NULL:
        if ffi.string(p.name) == NAME.encode():
            return p
        p = ffi.cast("struct halide_profiler_pipeline_stats *", p.next)
    return None


def _check_memory(stages, width, height):
    bx, by, out = (stages.stage(n) for n in FUNCS)
    assert (bx.memory_peak, bx.memory_total, bx.num_allocs) == (width * (height + 2) * 4,) * 2 + (1,)
    assert (by.memory_peak, by.memory_total, by.num_allocs) == (width * height * 4,) * 2 + (1,)
    assert (out.memory_peak, out.memory_total, out.num_allocs) == (0, 0, 0)
    assert stages.num_allocs == 2
    assert stages.memory_total == bx.memory_total + by.memory_total
    # blur_x is still alive while blur_y is computed from it
    assert stages.memory_peak == bx.memory_total + by.memory_total


def test_the_target_feature_marks_the_pipeline(built):
    _, pipeline = built
    assert halide_profiler.builds_profile(pipeline.target)
    assert not halide_profiler.builds_profile("x86-64-linux-avx2")


def test_one_call_reports_every_func_its_times_and_memory(built):
    _, pipeline = built
    width, height = 2000, 1500
    with shim.profile() as prof:
        _run(pipeline, width, height)
    [(record, stages)] = prof.stages
    assert record.name == NAME and record.stages is stages
    names = [s.name for s in stages.funcs()]
    assert set(FUNCS) <= set(names)
    assert stages.pipeline == NAME
    # Halide's measured duration of the call fits inside the shim's record of it, up to the
    # clocks' disagreement: Halide times it with CLOCK_REALTIME (src/runtime/linux_clock.cpp),
    # which the system's time service may step or slew meanwhile (seen: 2 % over, once)
    assert 0 < stages.time_ns <= record.duration_ns * 1.05
    assert stages.samples >= 1
    # Halide scales the sampled times to the measured duration: they add up to it (up to a
    # rounding per Func; generous for the sampling)
    total = sum(s.time_ns for s in stages.stages)
    assert abs(total - stages.time_ns) <= max(len(stages.stages), 0.05 * stages.time_ns)
    assert sum(stages.share(s) for s in stages.stages) == pytest.approx(1, abs=0.05)
    assert all(s.threads is None or s.threads >= 0 for s in stages.stages)
    _check_memory(stages, width, height)


def test_each_call_gets_its_own_figures_not_the_running_totals(built):
    _, pipeline = built
    _run(pipeline, 400, 300)  # outside the profile: counted by Halide only
    sizes = [(1200, 900), (400, 300), (800, 600)]
    with shim.profile() as prof:
        for width, height in sizes:
            _run(pipeline, width, height)
    assert len(prof.stages) == 3
    for (_, stages), (width, height) in zip(prof.stages, sizes):
        _check_memory(stages, width, height)


def test_two_threads_calling_at_once_get_their_own_figures(built):
    _, pipeline = built
    sizes = [(1200, 900), (300, 200)] * 3
    barrier = threading.Barrier(2)

    def work(my_sizes):
        barrier.wait()
        for width, height in my_sizes:
            _run(pipeline, width, height)

    with shim.profile() as prof:
        threads = [threading.Thread(target=work, args=(sizes[i::2],)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(prof.stages) == len(sizes)
    for record, stages in prof.stages:
        width = 1200 if stages.stage("blur_y").memory_total > 300 * 200 * 4 else 300
        height = 900 if width == 1200 else 200
        _check_memory(stages, width, height)
        if stages.samples:  # (a call between two samples has no times: Halide's own way)
            total = sum(s.time_ns for s in stages.stages)
            assert abs(total - stages.time_ns) <= max(len(stages.stages), 0.05 * stages.time_ns)
    # the profiled calls of one such pipeline take turns: their records do not overlap
    calls = sorted((r.start_ns, r.start_ns + r.duration_ns) for r, _ in prof.stages)
    assert all(end <= start for (_, end), (start, _) in zip(calls, calls[1:]))


def test_halides_own_totals_stay_as_without_the_shim(built):
    _, pipeline = built
    _run(pipeline, 100, 100)
    entry = _halide_entry()
    runs, peak = entry.runs, entry.memory_peak
    blur_x_peak = [entry.funcs[i].memory_peak for i in range(entry.num_funcs)
                   if ffi.string(entry.funcs[i].name) == b"blur_x"][0]
    with shim.profile():
        _run(pipeline, 50, 50)  # smaller: the peaks Halide keeps are the earlier ones
    entry = _halide_entry()
    assert entry.runs == runs + 1
    assert entry.memory_peak == peak
    assert [entry.funcs[i].memory_peak for i in range(entry.num_funcs)
            if ffi.string(entry.funcs[i].name) == b"blur_x"][0] == blur_x_peak


def test_summary_has_a_stages_table_and_the_trace_has_them_as_args(built, tmp_path):
    _, pipeline = built
    with shim.profile() as prof:
        _run(pipeline, 600, 400)
        _run(pipeline, 600, 400)
    text = prof.summary()
    assert f"Stages of {NAME} (Halide's profiler: 2 calls" in text
    table = text.split(f"Stages of {NAME}")[1].split("\n\n")[0]
    for name in FUNCS:
        assert f"\n{name} " in table
    trace = json.loads(open(prof.save_trace(tmp_path / "t.json")).read())
    [call] = [e for e in trace["traceEvents"] if e.get("name") == NAME][:1]
    stages = call["args"]["halide profiler"]["stages"]
    assert set(FUNCS) <= set(stages)
    assert stages["blur_y"]["memory peak"] == 600 * 400 * 4


def test_calls_of_other_pipelines_have_no_stages(built):
    with shim.profile() as prof:
        pass
    assert prof.stages == []


EXIT_SCRIPT = """
import sys
import numpy as np
import shim
p = shim.load(sys.argv[1])
p(np.ones((52, 52), np.float32), out=np.empty((50, 50), np.float32))
"""


@pytest.mark.parametrize("setting", [None, "off", "file"])
def test_the_report_at_exit_can_be_silenced_or_sent_to_a_file(built, tmp_path, setting):
    path, _ = built
    env = dict(os.environ)
    env.pop(halide_profiler.ENV_VAR, None)
    report = tmp_path / "report.txt"
    if setting is not None:
        env[halide_profiler.ENV_VAR] = str(report) if setting == "file" else setting
    done = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(path)], env=env,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr
    if setting is None:  # Halide's own behaviour: its report on stderr
        assert f"{NAME}\n total time:" in done.stderr
        assert "blur_y" in done.stderr
    else:
        assert "total time" not in done.stderr, done.stderr
    if setting == "file":
        text = report.read_text()
        assert f"{NAME}\n total time:" in text and "runs: 1" in text and "blur_x" in text
    else:
        assert not report.exists()


GPU_NAME = "hp_gpu_stages"
GPU_SOURCE = """
import subprocess, sys
import halide as hl
x, y = hl.Var("x"), hl.Var("y")
xo, yo, xi, yi = hl.Var("xo"), hl.Var("yo"), hl.Var("xi"), hl.Var("yi")
inp = hl.ImageParam(hl.Float(32), 2, "inp")
blur_x, blur_y, out = hl.Func("blur_x"), hl.Func("blur_y"), hl.Func("out")
blur_x[x, y] = (inp[x, y] + inp[x + 1, y] + inp[x + 2, y]) / 3
blur_y[x, y] = (blur_x[x, y] + blur_x[x, y + 1] + blur_x[x, y + 2]) / 3
out[x, y] = blur_y[x, y] + 1
for f in (blur_x, blur_y, out):
    if f is not out:
        f.compute_root()
    f.gpu_tile(x, y, xo, yo, xi, yi, 8, 8)
obj, lib, features = sys.argv[1:]
out.compile_to({hl.OutputFileType.object: obj}, [inp], "%s", hl.Target("host-opencl-" + features))
subprocess.run(["cc", "-shared", "-o", lib, obj, "-lpthread", "-ldl"], check=True)
""" % GPU_NAME
GPU_FUNCS = ("blur_x", "blur_y", "out")


@pytest.fixture(scope="module", params=["profile", "profile-trace_realizations"])
def gpu_built(request, opencl, tmp_path_factory):
    """An OpenCL build of the blur, every Func a kernel, with Halide's profiler (and, in the
    second, its tracing too)."""
    pytest.importorskip("halide", reason="compiling test pipelines needs halide")
    work = tmp_path_factory.mktemp("hp_gpu")
    path = work / f"{GPU_NAME}.so"
    subprocess.run([sys.executable, "-c", GPU_SOURCE, str(work / "p.o"), str(path),
                    request.param], check=True)
    return request.param, shim.load(path)


def _inside(inner: dict, outer: dict) -> bool:
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


def test_an_opencl_build_shows_device_stages_and_their_launches_on_one_timeline(gpu_built,
                                                                               tmp_path):
    features, pipeline = gpu_built
    width, height = 256, 128
    inp = np.random.default_rng(1).random((height + 2, width + 2), dtype=np.float32)
    blur_x = (inp[:, :-2] + inp[:, 1:-1] + inp[:, 2:]) / 3
    expected = (blur_x[:-2] + blur_x[1:-1] + blur_x[2:]) / 3 + 1
    pipeline(inp, out=np.empty((height, width), np.float32))  # (kernels compiled)
    with shim.profile() as prof:
        results = [pipeline(inp, out=np.empty((height, width), np.float32)) for _ in range(2)]
    for result in results:
        np.testing.assert_allclose(result, expected, rtol=1e-5)
    assert len(prof.stages) == 2
    for record, stages in prof.stages:
        assert set(GPU_FUNCS) <= {s.name for s in stages.funcs()}
        launches = [r for r in prof.records if r.kind == "launch" and r.call == record.id]
        # one kernel per Func per call, each named after the Func it computes
        assert sorted(r.stage for r in launches) == sorted(GPU_FUNCS)
        for launch in launches:
            assert launch.name.startswith(f"_kernel_{launch.stage}_s0")
            assert launch.device_ns is not None and launch.device_ns > 0
            assert record.start_ns <= launch.start_ns
            assert launch.start_ns + launch.duration_ns <= record.start_ns + record.duration_ns
    table = prof.summary().split(f"Stages of {GPU_NAME}")[1].split("\n\n")[0]
    assert "launches" in table.splitlines()[1] and "device ms" in table.splitlines()[1]
    for name in GPU_FUNCS:
        [row] = [line for line in table.splitlines() if line.split("  ")[0] == name]
        assert row.split()[-2] == "2"  # launches: one per call

    events = json.loads(open(prof.save_trace(tmp_path / "gpu.json")).read())["traceEvents"]
    calls = [e for e in events if e.get("cat") == "pipeline" and e["name"] == GPU_NAME]
    assert len(calls) == 2
    for call in calls:
        assert set(GPU_FUNCS) <= set(call["args"]["halide profiler"]["stages"])
        host = [e for e in events if e.get("cat") == "launch" and e["pid"] == call["pid"]
                and e["args"].get("call") == call["args"]["record"]]
        device = [e for e in events if e.get("cat") == "launch" and e["pid"] != call["pid"]
                  and e["args"].get("call") == call["args"]["record"]]
        assert sorted(e["args"]["stage"] for e in host) == sorted(GPU_FUNCS)
        assert sorted(e["args"]["stage"] for e in device) == sorted(GPU_FUNCS)
        assert all(e["tid"] == call["tid"] and _inside(e, call) for e in host)
        if "trace_realizations" in features:
            # each kernel runs inside its Func's production, on the calling thread
            produce = {e["name"]: e for e in events if e.get("cat") == "production"
                       and e["args"].get("call") == call["args"]["record"]}
            for launch in host:
                assert _inside(launch, produce[f"produce {launch['args']['stage']}"])


KERNELS_SOURCE = """
import sys
import halide as hl
x, y = hl.Var("x"), hl.Var("y")
xo, yo, xi, yi = hl.Var("xo"), hl.Var("yo"), hl.Var("xi"), hl.Var("yi")
inp = hl.ImageParam(hl.Float(32), 2, "inp")
k = hl.Param(hl.Int(32), "k", 0)
names = sys.argv[2:]
prev = inp
for name in names:
    f = hl.Func(name)
    f[x, y] = prev[x, y] + 1
    f.compute_root().gpu_tile(x, y, xo, yo, xi, yi, 8, 8)
    if name == "f":  # an update stage: a kernel of stage 1
        f[x, y] += 2
        f.update().gpu_tile(x, y, xo, yo, xi, yi, 8, 8)
    if name == "a$b":  # a second kernel of the same loop
        f.specialize(k == 1)
    prev = f
out = hl.Func("out")
out[x, y] = prev[x, y]
out.gpu_tile(x, y, xo, yo, xi, yi, 8, 8)
out.compile_to({hl.OutputFileType.stmt: sys.argv[1]}, [inp, k], "kernels",
               hl.Target("host-opencl-profile"))
"""
# Funcs whose names are prefixes of others', with "$", non-ASCII letters, a space
KERNEL_FUNCS = ("blur", "blur_x", "f", "f_s1", "a$b", "naïve", "p q")


def _kernels_by_func(stmt: str) -> list:
    """[(kernel name, the Func whose production launches it)], from Halide's lowered code."""
    found, producing = [], None
    for line in stmt.splitlines():
        produce = re.match(r"\s*produce (.+) \{$", line)
        if produce:
            producing = produce.group(1)
        for kernel in re.findall(r'halide_opencl_run\([^,]*, "([^"]+)"', line):
            found.append((kernel, producing))
    return found


def test_stage_of_kernel_names_the_func_of_each_kernel_halide_compiles(tmp_path):
    """Kernel names as Halide 21 writes them, read from its lowered code (compiled only: no
    device needed)."""
    pytest.importorskip("halide", reason="compiling test pipelines needs halide")
    stmt = tmp_path / "kernels.stmt"
    subprocess.run([sys.executable, "-c", KERNELS_SOURCE, str(stmt), *KERNEL_FUNCS], check=True)
    kernels = _kernels_by_func(stmt.read_text(encoding="utf-8"))
    funcs = KERNEL_FUNCS + ("out",)
    # every Func a kernel, f two (its update), a$b two (its specialization)
    assert sorted(func for _, func in kernels) == sorted(funcs + ("f", "a$b"))
    for kernel, func in kernels:
        assert halide_profiler.stage_of_kernel(kernel, funcs) == func, kernel
    # (the names it was written against)
    names = {kernel for kernel, _ in kernels}
    assert {"_kernel_a__b_s0_y_yo_block_id_y", "_kernel_na______ve_s0_y_yo_block_id_y",
            "_kernel_p___q_s0_y_yo_block_id_y"} <= names, names


def test_stage_of_kernel_takes_the_longest_func_that_fits():
    names = ["blur", "blur_x", "f", "f_s1"]
    assert halide_profiler.stage_of_kernel("_kernel_blur_x_s0_y_yo_block_id_y", names) == "blur_x"
    assert halide_profiler.stage_of_kernel("_kernel_blur_s0_y_yo_block_id_y", names) == "blur"
    assert halide_profiler.stage_of_kernel("_kernel_f_s1_s0_y_yo_block_id_y", names) == "f_s1"
    assert halide_profiler.stage_of_kernel("_kernel_f_s1_y_yo_block_id_y", names) == "f"
    # a Func's name followed by "_s" and no stage number is another Func's
    assert halide_profiler.stage_of_kernel("_kernel_blur_sharp_s0_y", ["blur"]) is None
    assert halide_profiler.stage_of_kernel("not_a_kernel", names) is None
