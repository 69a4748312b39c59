"""The kinds of builds and schedules Halide's own AOT tests exercise (test/generator at
v21.0.0) that the rest of the suite does not, each as a pipeline of the tests' own
(tests/support/flavors/generators.py), built as a user builds it (Halide's generator command
line, ``cc -shared``; bundled runtime and no_runtime) and checked against Halide's stock
runtime, run side by side in a child process (tests/support/flavors/stock_child.py), and
against numpy: the metadata of every argument type, generator params, nested extern stages,
an extern stage writing the output, async producers inside parallel loops, a call failing
midway, user_context, Halide's memory profiler, and copy stages on the shim's simulated host
device. What needs OpenCL is in test_build_flavors_opencl.py."""

import ctypes
import subprocess
import sys
import threading

import numpy as np
import pytest

import shim
import shim._native
from shim.native import ffi, lib
from support.flavors.build import run_stock, shared_builds
from support.threads import run_threads

pytest.importorskip("halide", reason="building the flavor pipelines needs halide")

RUNTIMES = ("bundled", "no_runtime")
METADATA_PARAMS = {"planes.type": "uint8", "planes.dim": "3", "chosen.type": "uint16"}
RPN_B = {"expression": "x 5 * y - 2 /", "kind": "int16", "scale": "3",
         "rows_in_parallel": "true"}
NEST = ["flv_nest_root", "flv_nest_inner", "flv_nest_combine"]


def target(base: str, runtime: str) -> str:
    return f"{base}-no_runtime" if runtime == "no_runtime" else base


def _specs():
    """{(case, runtime): (library name, [(generator, target[, params])...])}."""
    specs = {}
    for runtime in RUNTIMES:
        specs["metadata", runtime] = [("flv_metadata", target("host", runtime), METADATA_PARAMS)]
        specs["rpn_b", runtime] = [("flv_rpn", target("host", runtime), RPN_B)]
        # The root with the runtime (bundled) or not; the pipelines it calls never carry one.
        specs["nest", runtime] = [("flv_nest_root", target("host-user_context", runtime))] + \
            [(g, "host-user_context-no_runtime") for g in NEST[1:]]
        for case, generator, base in (("extern_output", "flv_extern_output", "host"),
                                      ("async_parallel", "flv_async_parallel", "host"),
                                      ("cleanup", "flv_cleanup", "host"),
                                      ("tagged", "flv_tagged", "host-user_context"),
                                      ("orbits", "flv_orbits", "host-profile"),
                                      ("copy_stages", "flv_copy_stages", "host"),
                                      ("copy_frames", "flv_copy_frames", "host")):
            specs[case, runtime] = [(generator, target(base, runtime))]
    specs["rpn_a", "bundled"] = [("flv_rpn", "host")]
    return {key: (f"{key[0]}-{key[1]}", objects) for key, objects in specs.items()}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    return shared_builds(tmp_path_factory)


@pytest.fixture(scope="module")
def libs(builds):
    """{(case, runtime): path of the library}, built once for the module."""
    return builds.libraries(_specs())


# --- nested externs ----------------------------------------------------------------------------

def test_a_0d_input_an_extern_stage_reads_survives_the_bounds_query(libs):
    """The shim's bounds query (before every new shape, on the general and the fast path)
    once passed a 0-D input in the query's form, without memory, and the extern stage's
    argument level[()] was loaded from it: a segmentation fault. In a child, so that a
    regression fails this test alone."""
    program = (
        "import numpy as np, shim\n"
        f"root = shim.load({str(libs['nest', 'no_runtime'])!r}, name='flv_nest_root')\n"
        "level = np.array(1.0, np.float32)\n"
        "for run in range(3):\n"
        "    out = shim.Buffer.make_interleaved(np.float32, 7 + run, 5, 3)\n"
        "    root(level, root=out)\n"
        "    assert (out.numpy() == 10 * 13 + 24).all()\n"
        "print('survived')\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "survived"
