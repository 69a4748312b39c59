"""A forked child never reads the bytes of a Buffer another thread of the parent was using at
the fork (its family is abandoned: shim/memory/families.py): every read raises ShimError,
whatever its dirty bits say.

Found by an adversarial pass: a thread calling a GPU pipeline into ``out`` in a loop, a fork,
and in the child ``np.asarray(out)`` returned the host's old contents without a word (OpenCL 5
children of 6, Vulkan 8 of 26). A call's beginning clears the dirty bits of an output it
replaces (its results replace what either side held: shim/memory/aliasing.py's begin plan,
carried out in native_stubs/fast/shared_records.c, and the plain families' in call_records.c),
so the child found nothing to copy, and the read looked at abandonment only when it copied.
A CPU pipeline reading such a Buffer in the child is refused too (the C fast path took it).

Each scenario runs in a subprocess (a hang or crash must not take the test session with it)."""

import pytest

from shim.pipelines.build import Build, build

from test_fork import HANG_GUARD_S, run_isolated

KINDS = ["host", "opencl", "vulkan"]
READS = ("numpy", "asarray", "element", "memoryview", "copy", "copy_to_host", "pipeline")


def cpu_brighten() -> str:
    return str(build(Build("brighten", "host", "no_runtime")))


# What a child tries on `out`, each expected to raise ShimError saying why.
CHILD_READS = r"""
def reads_in_child(out, cpu_pipeline):
    # Prints "<what>: refused" or what happened instead; exit code 0 when all were refused.
    # (The last one is a CPU pipeline reading it: its call, numpy arrays and a Buffer only,
    # takes the C fast path.)
    code = 0
    result = np.empty(out.shape, out.dtype)
    for what, read in [("numpy", out.numpy), ("asarray", lambda: np.asarray(out)),
                       ("element", lambda: out[0, 0]), ("memoryview", lambda: memoryview(out)),
                       ("copy", out.copy), ("copy_to_host", out.copy_to_host),
                       ("pipeline", lambda: cpu_pipeline(out, 2.0, 0.0, result))]:
        try:
            read()
        except shim.ShimError as e:
            refused = "another thread of the parent process" in str(e)
            print(f"{what}: refused" if refused else f"{what}: {type(e).__name__} {e}",
                  flush=True)
            code = code or (0 if refused else 2)
        else:
            print(f"{what}: read", flush=True)
            code = code or 3
    return code
"""

# The family state a call's beginning leaves, staged on this thread: `out` (with a crop, or
# not) on the device of kind argv[1], its results there (device-dirty), then a call's use
# recorded as a call records it, which clears the output's bits. The child must refuse every
# read, though nothing marks `out` dirty there.
STAGED = r"""
import os, signal, sys
import numpy as np
import shim
from shim.core import call_uses
""" + CHILD_READS + r"""
kind, form, cpu_path = sys.argv[1:4]
cpu_pipeline = shim.load(cpu_path)
out = shim.Buffer(np.zeros((16, 16), np.float32))
crop = out.cropped([(2, 4), (2, 4)]) if form == "crop" else None
out.copy_to_device(kind)
out.set_device_dirty()
uses = call_uses.begin_call(1, [(out.raw, out.family, True)], host_write=False)
assert not out.device_dirty() and not out.host_dirty(), "the test stages something else now"
pid = os.fork()
if pid == 0:
    signal.alarm(int(sys.argv[4]))  # (a hang guard)
    os._exit(reads_in_child(out, cpu_pipeline))
call_uses.end_call(1, uses)
_, status = os.waitpid(pid, 0)
out.copy_to_host()  # (the parent's own use goes on)
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.parametrize("form", ["crop", "plain"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_child_refuses_reads_of_a_buffer_whose_call_had_cleared_its_bits(kind, form,
                                                                          request):
    if kind != "host":
        request.getfixturevalue(kind)  # (skips, saying why, where there is no such device)
    done = run_isolated(STAGED, kind, form, cpu_brighten(), str(HANG_GUARD_S))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [f"{what}: refused" for what in READS], done.stdout


# A real call in flight at the fork, on a GPU device: a thread calls the pipeline (argv[2])
# into `out` (with a crop, or not), and the main thread forks while that call's upload of its
# input is held (the device's write, in Python for a family with crops, waits for the fork):
# the call has begun, `out`'s bits are clear, and its results are not there yet.
IN_FLIGHT = r"""
import os, signal, sys, threading
import numpy as np
import shim
""" + CHILD_READS + r"""
kind, path, form, cpu_path = sys.argv[1:5]
p, cpu_pipeline = shim.load(path), shim.load(cpu_path)
device = shim.device(kind)
image = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
inp = shim.Buffer(image.copy())
inp_crop = inp.cropped([(0, 8), (0, 8)])  # (its uploads go through Python: see above)
out = shim.Buffer(np.zeros((64, 64), np.float32))
out_crop = out.cropped([(8, 8), (8, 8)]) if form == "crop" else None
p(inp, 2.0, 0.0, out)  # (the fast paths' plans for these states are made)
np.testing.assert_array_equal(out.numpy(), image * 2)
entered, go_on = threading.Event(), threading.Event()
write = device.write


def held_write(*args):
    entered.set()
    go_on.wait()
    write(*args)


def call():
    inp.set_host_dirty()
    p(inp, 3.0, 0.0, out)


device.write = held_write
caller = threading.Thread(target=call)
caller.start()
while not entered.wait(0.01):
    if not caller.is_alive():  # (the call never went through the write: nothing to fork in)
        print("the call's upload no longer goes through the device's write", flush=True)
        sys.exit(6)
pid = os.fork()
if pid == 0:
    signal.alarm(int(sys.argv[5]))  # (a hang guard)
    if out.device_dirty() or out.host_dirty():
        print("the test no longer stages clear bits", flush=True)
        os._exit(5)
    os._exit(reads_in_child(out, cpu_pipeline))
go_on.set()
caller.join()
device.write = write
_, status = os.waitpid(pid, 0)
np.testing.assert_array_equal(out.numpy(), image * 3)  # the parent's call went on
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.parametrize("form", ["crop", "plain"])
@pytest.mark.parametrize("kind", ["opencl", "vulkan"])
def test_a_child_forked_during_a_gpu_call_into_a_buffer_refuses_to_read_it(kind, form,
                                                                            request):
    request.getfixturevalue(kind)
    path = str(build(Build("brighten", kind, "no_runtime")))
    done = run_isolated(IN_FLIGHT, kind, path, form, cpu_brighten(), str(HANG_GUARD_S))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [f"{what}: refused" for what in READS], done.stdout


# The race as it was found, looped: CALLERS threads call a pipeline (argv[2], for the device
# of kind argv[1]; a CPU one for "host", whose `out` has a host-device allocation) back to back,
# each into its own half of `out`, a crop (as a GPU pipeline's results, they stay on the
# device), while the main thread forks FORKS children. Each child reads `out` and both halves:
# a read of a Buffer whose family is abandoned must raise; any other read either raises
# (a GPU device is refused in a child) or gives what one whole call wrote.
CALLERS, FORKS = 2, 24
RACE = r"""
import os, signal, sys, threading
import numpy as np
import shim

kind, path, callers, forks, guard = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
p = shim.load(path)
image = np.arange(32 * 64, dtype=np.float32).reshape(32, 64)
out = shim.Buffer(np.zeros((32, 64), np.float32))
if kind == "host":
    out.copy_to_device("host")
halves = [out.cropped([(0, 64), (16 * i, 16)]) for i in range(callers)]
stop = threading.Event()
calls, errors = [0] * callers, []


def caller(i):
    try:
        while not stop.is_set():
            p(image, 2.0 + calls[i] %% 7, 0.0, halves[i])
            calls[i] += 1
    except BaseException as e:
        errors.append(repr(e))
        raise


def consistent(array, rows):
    # every element from the same call: image * k for one scale k
    k = array[0, 1] / rows[0, 1]
    return np.array_equal(array, rows * k)


def child():
    signal.alarm(guard)
    for buf, rows in [(out, image)] + [(h, image[16 * i:16 * (i + 1)])
                                        for i, h in enumerate(halves)]:
        abandoned = buf.family.lock.abandoned
        try:
            array = np.asarray(buf).copy()
        except shim.ShimError:
            continue
        if abandoned:
            return 3  # read a Buffer another thread was using at the fork
        if buf is not out and not consistent(array, rows):
            return 4
    return 0


threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
for t in threads:
    t.start()
while not all(calls) and all(t.is_alive() for t in threads):
    pass
failures = []
for n in range(forks):
    pid = os.fork()
    if pid == 0:
        os._exit(child())
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        failures.append(os.waitstatus_to_exitcode(status))
stop.set()
for t in threads:
    t.join()
print("failures", failures, "callers", errors, flush=True)
"""


@pytest.mark.parametrize("kind", KINDS)
def test_children_forked_while_threads_call_pipelines_into_crops_never_read_them_silently(
        kind, request):
    path = cpu_brighten() if kind == "host" else str(build(Build("brighten", kind, "no_runtime")))
    if kind != "host":
        request.getfixturevalue(kind)
    done = run_isolated(RACE.replace("%%", "%"), kind, path, str(CALLERS), str(FORKS),
                        str(HANG_GUARD_S))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "failures [] callers []" in done.stdout, done.stdout + done.stderr


# A DLPack export of `out` (its pin: shim/core/buffer_operations.py), made before the fork, let
# go in the child while `out`'s family is abandoned there (a call's use staged, as above).
EXPORT_LET_GO = r"""
import gc, os, sys
import numpy as np
import shim
from shim.core import call_uses

out = shim.Buffer(np.zeros((8, 8), np.float32))
out.copy_to_device("opencl")
capsule = out.__dlpack__(dl_device=(4, 0))  # kDLOpenCL: a pin on the device memory
uses = call_uses.begin_call(1, [(out.raw, out.family, True)], host_write=False)
pid = os.fork()
if pid == 0:
    del capsule
    gc.collect()
    sys.stderr.flush()
    os._exit(0)
call_uses.end_call(1, uses)
_, status = os.waitpid(pid, 0)
del capsule
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_an_export_let_go_in_a_child_gives_nothing_back_quietly(opencl):
    """As the abandoned family's Buffers' finalizers do (the memory goes with the process):
    no warning that releasing it failed."""
    done = run_isolated(EXPORT_LET_GO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stderr, done.stderr
