"""The command line, as a user runs it."""

import subprocess
import sys


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


def test_demo_runs_and_checks_its_results():
    done = run("demo")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all results match numpy" in done.stdout
