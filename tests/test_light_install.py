"""Running prebuilt pipelines needs neither pyopencl nor halide: people who only load .so
files (or run on CUDA) need not install them. Checked in a fresh interpreter where importing
either fails, as if they were not installed."""

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
