"""A process forked after the OpenCL device was used gets a copy of the parent's driver state
but none of its threads: any OpenCL call there may wait forever. The child must get
shim.DeviceError for every device use, from Python and from kernel launches in C, while host
pipelines and the simulated host device keep working.

The scenario runs in a subprocess (a hang or crash must not take the test session with it),
in its own process group so that a hung forked child is killed with it."""

import os
import signal
import subprocess
import sys

import pytest

from shim.pipelines.build import Build, build

TIMEOUT = 120  # seconds for the whole scenario; it takes a few when nothing hangs

SCENARIO = r"""
import os, sys
import numpy as np
import shim

brighten_cl, fill_cl, brighten_cpu = (shim.load(path) for path in sys.argv[1:4])
opencl = shim.device("opencl")
image = np.arange(48, dtype=np.float32).reshape(6, 8)
resident = brighten_cl(image, scale=2.0, offset=0.0, output=image.shape)  # device-dirty
np.testing.assert_array_equal(resident.numpy(), image * 2)
resident.set_device_dirty()  # its current data is on the device again


def refused(what, action):
    try:
        action()
    except shim.DeviceError as e:
        if "parent process" not in str(e) or "fork" not in str(e):
            raise AssertionError(f"{what}: the message does not say why: {e}") from None
        print(f"{what}: refused", flush=True)
        return
    raise AssertionError(f"{what}: no DeviceError")


def child():
    # A kernel whose module the parent compiled (launched from C), one compiled in the child
    # (through Python), uploads, downloads and a DLPack export that must synchronize.
    refused("launch", lambda: brighten_cl(image, scale=2.0, offset=0.0, output=image.shape))
    refused("compile", lambda: fill_cl(param=1, f=(4, 4)))
    refused("upload", lambda: shim.Buffer(image.copy()).copy_to_device(opencl))
    refused("download", resident.copy_to_host)
    refused("export", lambda: resident.__dlpack__(stream=None, dl_device=(4, 0)))  # kDLOpenCL
    np.testing.assert_array_equal(brighten_cpu(image, scale=3.0, offset=1.0, output=image.shape)
                                  .numpy(), image * 3 + 1)
    host = shim.Buffer(image.copy())
    host.copy_to_device(shim.device("host"))
    host.set_device_dirty()
    host.copy_to_host()
    np.testing.assert_array_equal(host.numpy(), image)
    print("host: works", flush=True)


pid = os.fork()
if pid == 0:
    child()
    sys.exit(0)  # a normal exit: the shim's exit handler runs in the child too
_, status = os.waitpid(pid, 0)
np.testing.assert_array_equal(resident.numpy(), image * 2)  # the parent's device is intact
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.fixture(scope="module")
def libraries(opencl):
    specs = [Build("brighten", "opencl", "no_runtime"), Build("crop_fill", "opencl", "bundled"),
             Build("brighten", "host", "no_runtime")]
    return [str(build(spec)) for spec in specs]


def run_isolated(script: str, *args: str) -> subprocess.CompletedProcess:
    process = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the forked child too
        out, err = process.communicate()
        pytest.fail(f"hung for {TIMEOUT} s; output so far:\n{out}\n{err}")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_a_forked_child_gets_device_errors_and_keeps_host_pipelines(libraries):
    done = run_isolated(SCENARIO, *libraries)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split("\n")[:6] == [
        "launch: refused", "compile: refused", "upload: refused", "download: refused",
        "export: refused", "host: works"]
