"""Running prebuilt pipelines needs neither pyopencl nor halide: people who only load .so
files (or run on CUDA) need not install them, and halide is an extra (setup.cfg). Checked in a
fresh interpreter where importing either fails, as if they were not installed: pipelines run,
and what does need halide (the demo, the pipeline builder) says how to get it."""

import os
import subprocess
import sys
import textwrap


def test_prebuilt_pipelines_run_without_pyopencl_or_halide(host_pipelines):
    script = textwrap.dedent("""
        import sys
        sys.modules["pyopencl"] = None  # import pyopencl / halide now raise ImportError
        sys.modules["halide"] = None
        import numpy as np
        import shim
        kinds = [kind for kind, _ in shim.devices()]
        assert "host" in kinds and "opencl" not in kinds, kinds  # (CUDA, where there is a GPU)
        brighten = shim.load(sys.argv[1])
        out = brighten(np.ones((480, 640), np.float32), scale=2.0, offset=1.0)
        assert (out.numpy() == 3).all()
        try:
            shim.device("opencl")
        except shim.DeviceUnavailable as e:
            assert "pyopencl" in str(e), e
        else:
            raise AssertionError("an OpenCL device without pyopencl")
        print("ok")
        """)
    done = subprocess.run([sys.executable, "-c", script, str(host_pipelines["brighten", "bundled"])],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


def run_without_halide(module: str, *args, env=None):
    """``python -m module args`` in a fresh interpreter where importing halide fails."""
    script = textwrap.dedent("""
        import runpy, sys
        sys.modules["halide"] = None
        sys.argv = sys.argv[1:]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
        """)
    return subprocess.run([sys.executable, "-c", script, module, *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_demo_and_builder_without_halide_say_how_to_get_it(tmp_path):
    # An empty library directory: nothing prebuilt to fall back on.
    env = dict(os.environ, HALIDE_SHIM_PIPELINES=str(tmp_path))
    for command, opening in ((["shim", "demo"], "demo: cannot build its pipelines: "),
                             (["shim.pipelines.build", "brighten"], "")):
        done = run_without_halide(*command, env=env)
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith(opening) and "halide is not installed" in done.stderr, done.stderr
        assert 'pip install halide==21.0.0 (the extra: pip install "halide-shim[pipelines]")' in done.stderr


def test_the_builder_lists_the_pipelines_without_halide():
    done = run_without_halide("shim.pipelines.build", "--list")
    assert done.returncode == 0 and "brighten" in done.stdout.split(), done.stderr
