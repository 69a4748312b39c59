"""The command line, as a user runs it."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpu_cases import blur_reference
from support.summary_tables import table
from shim.pipelines.build import Build, build


def run(*args):
    return subprocess.run([sys.executable, "-m", "shim", *args], capture_output=True, text=True)


def test_info_prints_name_target_and_arguments(host_pipelines):
    done = run("info", str(host_pipelines["mix", "no_runtime"]))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("mix  (")
    assert lines[1].startswith("target: ") and "no_runtime" in lines[1]
    assert "  alpha: float32 scalar, default 0.5, min 0.0, max 1.0" in lines
    assert "  output: output buffer of float32, 2-D" in lines


def test_info_shows_estimates(host_pipelines):
    done = run("info", str(host_pipelines["brighten", "bundled"]))
    assert "estimated min+extent x=0+640 y=0+480" in done.stdout


def test_info_on_a_file_that_is_not_a_pipeline_is_a_clear_error(tmp_path):
    bogus = tmp_path / "bogus.so"
    bogus.write_bytes(b"\x00" * 64)
    done = run("info", str(bogus))
    assert done.returncode == 2
    assert "error: path:" in done.stderr and "not a Halide pipeline" in done.stderr
    assert "Traceback" not in done.stderr


def test_unknown_command_is_an_argparse_error():
    done = run("frobnicate")
    assert done.returncode == 2 and "invalid choice" in done.stderr


def test_demo_runs_checks_its_results_and_ends_with_a_profile():
    done = run("demo")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all results match numpy" in done.stdout
    assert "Runtime calls" in done.stdout and "Pipeline calls" in done.stdout
    lines = done.stdout.splitlines()
    # the blur built with Halide's profiler and with its tracing, checked against numpy too
    for feature in ("-profile", "-trace_realizations"):
        assert any(f"bundled {feature} " in line and line.endswith("matches numpy") for line in lines)
    # their tables: the Stages of the -profile build's 21 calls (blur_x and the output, each
    # sampled), the realizations of the -trace_realizations build's
    title, stages = table(done.stdout, "Stages of blur3x3 ")
    assert "(Halide's profiler: 21 calls, " in title
    stages = {row["func"]: row for row in stages}
    assert {"blur_x", "output"} <= set(stages)
    assert all(float(stages[f]["total ms"]) > 0 for f in ("blur_x", "output")), stages
    assert stages["blur_x"]["allocs"] == "21"
    _, realizations = table(done.stdout, "Realizations of blur3x3 (Halide's tracing)")
    assert {(r["func"], r["realizations"], r["productions"]) for r in realizations} == \
        {("blur_x", "21", "21"), ("output", "21", "21")}
    # Halide's profiler report at exit would repeat the Stages table: the demo leaves it out
    assert "total time:" not in done.stderr, done.stderr
    trace = next(line.split()[1] for line in lines if line.startswith("timeline: "))
    # In a new private folder: a fixed name in /tmp is one another user could take first.
    folder = Path(trace).parent
    assert folder.name.startswith("halide-shim-demo-") and folder.stat().st_uid == os.geteuid()
    assert folder.stat().st_mode & 0o777 == 0o700
    events = json.loads(Path(trace).read_text())["traceEvents"]
    shutil.rmtree(folder)  # (left for the user to open; not by the test suite)
    blur = [e for e in events if e["ph"] == "X" and e["name"] == "blur3x3"]
    profiled = [e["args"]["halide profiler"] for e in blur if "halide profiler" in e["args"]]
    assert len(profiled) == 21
    assert all({"blur_x", "output"} <= set(p["stages"]) for p in profiled)
    for slice_name in ("realize blur_x", "produce blur_x", "realize output", "produce output"):
        assert sum(e["ph"] == "X" and e["name"] == slice_name for e in events) == 21


# --- run and profile ------------------------------------------------------------------------


def test_run_reads_npy_inputs_and_writes_npy_outputs(host_pipelines, tmp_path):
    image = np.random.default_rng(0).random((30, 40), dtype=np.float32)
    np.save(tmp_path / "in.npy", image)
    done = run("run", str(host_pipelines["brighten", "bundled"]), f"--input={tmp_path / 'in.npy'}",
               "--scale=2", "offset=0.5", f"--output={tmp_path / 'out.npy'}:40x30")
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), image * np.float32(2) + np.float32(0.5))
    assert done.stdout == "" and done.stderr == ""  # (RunGen says nothing of a run that went well)


def test_run_sizes_outputs_like_the_first_input_without_estimates(host_pipelines, tmp_path):
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    np.save(tmp_path / "a.npy", a)
    done = run("run", str(host_pipelines["sum_diff", "no_runtime"]), f"--a={tmp_path / 'a.npy'}",
               f"--b={tmp_path / 'a.npy'}", f"--sum={tmp_path / 'sum.npy'}", "--diff=:4x3")
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "sum.npy"), a * 2)
    assert "diff: int32 4x3, min 0, max 0" in done.stdout


def test_run_sizes_inputs_and_outputs_from_the_estimates(host_pipelines, tmp_path):
    done = run("run", str(host_pipelines["brighten", "bundled"]), "input=random:0:estimate",
               "--default_input_scalars", f"output={tmp_path / 'o.npy'}", "--verbose")
    assert done.returncode == 0, done.stderr
    assert "Input input: Shape is [[0,640,1],[0,480,640]]" in done.stderr
    assert np.load(tmp_path / "o.npy").shape == (480, 640)


def test_run_reads_and_writes_images(host_pipelines, tmp_path):
    iio = pytest.importorskip("imageio.v3")
    gray = np.random.default_rng(1).integers(0, 256, size=(34, 50), dtype=np.uint8)
    iio.imwrite(tmp_path / "in.png", gray)
    done = run("run", str(host_pipelines["blur3x3", "bundled"]), f"--input={tmp_path / 'in.png'}",
               f"--output={tmp_path / 'out.png'}:48x32")
    assert done.returncode == 0, done.stderr
    # The 8-bit image is scaled to the uint16 input as Halide's image loader scales it.
    assert done.stderr == ('Warning: Image loaded for argument "input" is type uint8 but this '
                           'argument expects type uint16; data loss may have occurred.\n')
    written = iio.imread(tmp_path / "out.png")
    np.testing.assert_array_equal(written, blur_reference(gray.astype(np.uint16) * 257))


def test_run_times_iterations_and_profile_summarizes_a_gpu_pipeline(opencl, tmp_path):
    library = build(Build("brighten", "opencl", "no_runtime"))
    trace = tmp_path / "trace.json"
    done = run("profile", str(library), "--iterations", "4", "--input=random:64x48",
               "--default_input_scalars", "--output=:64x48", "--profile", str(trace))
    assert done.returncode == 0, done.stderr
    assert "brighten: 4 iterations: min " in done.stdout and "(inputs on opencl)" in done.stdout
    assert "Kernel launches" in done.stdout and "Pipeline calls" in done.stdout
    launches = [line.split() for line in done.stdout.splitlines() if line.startswith("_kernel")]
    assert launches and launches[0][2] == "4"  # one launch per timed iteration
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(1 for e in events if e["ph"] == "X" and e["name"] == "brighten") == 4


@pytest.mark.parametrize("arguments, message", [
    (["--input=random:64x48", "offset=0", "output=o.npy"], "Argument value missing for: scale\n"),
    (["--input=random:64x48", "--scale=abc", "offset=0", "output=o.npy"],
     "Argument value for: scale could not be parsed as type float32: abc\n"),
    (["--input=random:64x48", "--scale=30", "offset=0", "output=o.npy"],
     "halide_error: Parameter scale is 3.000000e+01 but must be at most 1.000000e+01\n"),
    (["--input=random:64x48", "--bogus=1"], "Unknown flag: bogus\n"),
    (["--input=random:64x48", "bogus=3", "scale=1", "offset=0", "output=o.npy"],
     "Unknown argument name: bogus\n"),
    (["--input=missing.npy", "scale=1", "offset=0", "output=o.npy"],
     "Error in I/O: File could not be opened for reading\n"),
    (["--input=random:64", "scale=1", "offset=0", "output=o.npy"],
     "Invalid format for extents: 64\n"),
    (["input=random:0:[64,48", "scale=1", "offset=0", "output=o.npy"],
     "Invalid format for extents: [64,48\n"),
    (["input=random:x:[64,48]", "scale=1", "offset=0", "output=o.npy"],
     "Invalid value for seed\n"),
    (["input=constant:[64,48]", "scale=1", "offset=0", "output=o.npy"],
     "Invalid syntax: constant:[64,48]\n"),
    (["input=zero:estimate", "scale=estimate", "offset=0", "output=o.npy"],
     "Argument value for: scale was specified as 'estimate', but no default and/or estimate "
     "was found in the metadata.\n"),
    (["--input=random:64x48", "scale=1", "offset=0", "--output=out.txt"],
     'Error in I/O: unsupported file extension "txt", supported are: jpeg jpg mat npy pgm png '
     'ppm tiff tmp\n'),
    (["--input=random:64x48", "--quiet=maybe"], "Invalid value for flag: quiet\n"),
    (["--input=random:64x48", "scale=1", "offset=0", "--benchmarks=some"],
     "The only valid value for --benchmarks is 'all'\n"),
    # The shim's refusal of what RunGen would guess (an output of extents 64 x 1000)
    (["--input=random:64x48", "scale=1", "offset=0", "output=o.npy", "--output_extents=[64]"],
     "python -m shim run: error: output: --output_extents gives 1 extents; output is 2-D\n"),
])
def test_run_argument_errors_as_runGen_reports_them(host_pipelines, arguments, message):
    library = host_pipelines["brighten", "bundled"]
    done = run("run", str(library), *arguments)
    assert done.returncode == -signal.SIGABRT  # (RunGen's abort())
    assert done.stderr == message
    if message.startswith("Unknown flag"):  # (RunGen's usage first)
        assert done.stdout.startswith(f"\nUsage: python -m shim run {library} argument=value")
    else:
        assert done.stdout == ""


@pytest.mark.parametrize("arguments, message", [
    (["--iterations", "0", "--input=random:64x48"], "--iterations: expected a positive integer"),
    (["--input=random:64x48", "--benchmarks", "--iterations", "3"],
     "--iterations and --benchmarks=all both choose the timed runs"),
    (["--input=random:64x48", "scale=1", "offset=0", "--device=nonesuch"],
     "--device: invalid choice: 'nonesuch'"),
])
def test_the_shims_own_options_are_refused_in_argparse_style(host_pipelines, arguments,
                                                             message):
    done = run("run", str(host_pipelines["brighten", "bundled"]), *arguments)
    assert done.returncode == 2
    assert message in done.stderr and "error:" in done.stderr
    assert "Traceback" not in done.stderr


# --- the command line itself ----------------------------------------------------------------


def test_usage_as_runGen_and_more_with_verbose(host_pipelines):
    library = host_pipelines["brighten", "bundled"]
    usage = run("run", str(library)).stdout  # (no arguments: RunGen's usage)
    assert usage.startswith(f"\nUsage: python -m shim run {library} argument=value")
    assert "--skip_bad_environement:" in usage  # (RunGen's text, word for word)
    done = run("run", str(library), "--help")
    assert done.returncode == 0 and done.stdout == usage and done.stderr == ""
    # Without a pipeline, the shim's own help; after RunGen's usage with --verbose.
    assert run("run").stdout.startswith("usage: python -m shim run PIPELINE.so")
    done = run("run", str(library), "--help", "--verbose")
    assert done.stdout.startswith(usage) and "the shim's options" in done.stdout
    arguments = done.stdout.split("Arguments of brighten")[1]
    assert "scale: float32 scalar, default 2.0, min 0.0, max 10.0" in arguments
    assert "offset: float32 scalar, default 1.0" in arguments
    assert "input: input buffer of float32, 2-D, estimated min+extent x=0+640 y=0+480" \
        in " ".join(arguments.split())


def test_version_and_the_programs_own_name():
    import shim

    done = run("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"halide-shim {shim.__version__}"
    assert run("--help").stdout.startswith("usage: python -m shim ")
    # As the console script: its own name.
    as_script = subprocess.run(
        [sys.executable, "-c", "import sys; sys.argv[0] = '/venv/bin/halide-shim'; "
                               "from shim.cli.main import main; main(['run', '--help'])"],
        capture_output=True, text=True)
    assert as_script.stdout.startswith("usage: halide-shim run PIPELINE.so"), as_script.stderr


def test_rungen_switches_take_true_false_and_one_dash(host_pipelines):
    library = str(host_pipelines["brighten", "bundled"])
    described = run("run", library, "-describe")
    assert described.returncode == 0 and described.stdout.startswith('Filter name: "brighten"')
    done = run("run", library, "input=zero:[8,4]", "scale=1", "offset=0", "output=:[8,4]",
               "--describe=false", "-success")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "Success!"


def test_quiet_drops_what_the_pipeline_prints(host_pipelines):
    library = str(host_pipelines["checked_sqrt", "bundled"])
    loud = run("run", library, "input=constant:4:[8,3]", "verbose=true", "output=:[8,3]")
    assert loud.returncode == 0, loud.stderr
    # (as RunGen prints them: on stdout, each line after "halide_print: ")
    assert sorted(loud.stdout.splitlines()[:3]) == [f"halide_print: 2.000000 row {y}"
                                                    for y in range(3)]
    quiet = run("run", library, "input=constant:4:[8,3]", "verbose=true", "output=:[8,3]",
                "--quiet")
    assert quiet.returncode == 0, quiet.stderr
    assert "row" not in quiet.stdout + quiet.stderr
    # (an output sized and not saved, the shim's: its values summed up)
    assert quiet.stdout == "output: float32 8x3, min 2.0, max 2.0, mean 2\n"


def test_iterations_with_parsable_output(host_pipelines):
    done = run("run", str(host_pipelines["brighten", "bundled"]), "input=zero:[16,8]",
               "--default_input_scalars", "--iterations", "3", "--parsable_output")
    assert done.returncode == 0, done.stderr
    rows = dict(line.split(None, 2)[1:] for line in done.stdout.splitlines())
    assert rows["ITERATIONS"] == "3" and float(rows["BEST_TIME_MSEC_PER_ITER"]) > 0
    assert set(rows) >= {"MEDIAN_TIME_MSEC_PER_ITER", "THROUGHPUT_MPIX_PER_SEC", "HALIDE_TARGET"}


def test_skip_bad_environment_skips_only_where_the_device_is_missing():
    from shim.backends import cuda as cuda_backend

    library = build(Build("brighten", "cuda", "no_runtime"))
    done = run("run", str(library), "input=zero:[16,8]", "scale=1", "offset=0",
               "output=:[16,8]", "--skip_bad_environment")
    assert done.returncode == 0, done.stderr
    if cuda_backend.unavailable_reason():  # (RunGen's words)
        assert done.stdout == "[SKIP] This system requires Cuda, which is not available.\n"
    else:
        assert done.stdout.startswith("output: float32 16x8, ")


def test_the_readme_command_line_example(tmp_path):
    iio = pytest.importorskip("imageio.v3")
    gray = np.random.default_rng(2).integers(0, 256, size=(30, 40), dtype=np.uint8)
    iio.imwrite(tmp_path / "in.png", gray)
    # README.md, "Command line" (tests/test_readme_examples.py runs it too; here its values
    # are checked): brighten.so is the path the build prints.
    built = subprocess.run([sys.executable, "-m", "shim.pipelines.build", "brighten"],
                           capture_output=True, text=True, check=True)
    (tmp_path / "brighten.so").symlink_to(built.stdout.splitlines()[-1])
    done = subprocess.run([sys.executable, "-m", "shim", "run", "brighten.so", "input=in.png",
                           "scale=0.5", "offset=0.25", "output=out.png"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    written = iio.imread(tmp_path / "out.png")
    expected = (gray / 255 * np.float32(0.5) + np.float32(0.25)) * 65535
    assert written.dtype == np.uint16 and np.abs(written - expected).max() <= 1
