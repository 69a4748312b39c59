"""An adversarial pass over the C fast paths' calls on crops and slices (members of a shared
family: native_stubs/shared_records.c, carrying out plans that shim/aliasing.py makes once per
state of the family). They must leave every family exactly as the Python run does
(runtime.begin_call / end_call), also when attacked: CPU and GPU pipelines taking turns on one
member, one PreparedCall run by several threads while its Buffers join a shared family,
threads making and dropping crops and moving the family between host and device while calls
run, crops dropped by the collector while plans are made, Ctrl-C while plans are made, a
fork, and families that keep reaching new states."""

import gc
import threading

import numpy as np
import pytest

import shim
from pipelines.build import Build, build_all

_pipelines = {}

JOIN_SECONDS = 120  # a thread still running after this is stuck: the test fails


def pipeline(name: str, target: str = "host") -> shim.Pipeline:
    if (name, target) not in _pipelines:
        path = build_all([Build(name, target, "no_runtime")], progress=None).popitem()[1]
        _pipelines[name, target] = shim.load(path)
    return _pipelines[name, target]


def in_python(p: shim.Pipeline, **arguments) -> None:
    """The call as the Python run makes it: what the fast paths must match."""
    with p.prepare(**arguments) as prepared:
        prepared._run_in_python()


def state(*bufs) -> list:
    """What must be the same after the fast paths as after the Python run: each Buffer's dirty
    bits, its family's regions and recorded uses."""
    return [(buf.host_dirty, buf.device_dirty, buf._family.regions, list(buf._family.uses))
            for buf in bufs]


def join_all(threads) -> None:
    for t in threads:
        t.join(JOIN_SECONDS)
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"threads stuck (a hang): {stuck}"


# --- a beginning planned for a GPU call is not a CPU call's ------------------------------------

@pytest.mark.parametrize("prepared", [False, True], ids=["plain", "prepared"])
def test_a_cpu_call_on_a_crop_the_gpu_wrote_before_brings_the_device_changes_home(opencl,
                                                                                  prepared):
    """A CPU call writing a member first brings the family's device-side changes home
    (runtime.begin_call): the family is never newer on both sides. The beginning the GPU build
    of the same pipeline planned for the member in that state (nothing to bring home) must not
    be taken for the CPU call's: the fast paths left the parent newer on the host (the CPU
    crop) and on the device (its GPU-written sibling) at once."""
    gpu, cpu = pipeline("crop_fill", "opencl"), pipeline("crop_fill", "host")
    worlds = {}
    for world in ("fast", "python"):
        parent = shim.Buffer(np.zeros((4, 8), np.int32))
        left, right = parent.cropped([(0, 4), (0, 4)]), parent.cropped([(4, 4), (0, 4)])
        in_python(gpu, param=1, f=left)
        for _ in range(3):  # the GPU build's plans for `right`, in the states it cycles through
            if world == "fast":
                gpu(param=2, f=right)
            else:
                in_python(gpu, param=2, f=right)
        if world == "python":
            in_python(cpu, param=3, f=right)
        elif prepared:
            with cpu.prepare(param=3, f=right) as run:
                run()
        else:
            cpu(param=3, f=right)
        worlds[world] = (parent, left, right)
    fast, python = worlds["fast"], worlds["python"]
    assert not (fast[0].host_dirty and fast[0].device_dirty)
    assert state(*fast) == state(*python)
    for parent in (fast[0], python[0]):
        expected = np.zeros((4, 8), np.int32)
        xs, ys = np.meshgrid(np.arange(8), np.arange(4))
        expected[:, :4] = (xs * 100 + ys + 10000)[:, :4]
        expected[:, 4:] = (xs * 100 + ys + 30000)[:, 4:]
        np.testing.assert_array_equal(np.asarray(parent), expected)


# --- one PreparedCall, several threads -----------------------------------------------------

def test_threads_running_one_prepared_call_while_its_input_gets_a_crop():
    """Two threads run the same PreparedCall; while the first runs, its input gets a crop (its
    family becomes shared), so the second records a shared family's use. Each call must end
    its own use: the run kept the Use a call recorded in the PreparedCall, shared by every
    thread, so the first call ended the second's (its own, a plain family's Use, stayed
    recorded for good: every later operation on the input waited forever) and the second
    failed (list.remove(x): x not in list)."""
    cpu_heavy = pipeline("cpu_heavy")
    image = np.random.default_rng(1).random((256, 256), dtype=np.float32)
    source, out = shim.Buffer(image), shim.Buffer(np.zeros_like(image))
    run = cpu_heavy.prepare(source, rounds=3000, output=out)
    run()
    expected = out.numpy().copy()
    errors = []

    def first():
        try:
            run()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    thread = threading.Thread(target=first, daemon=True)
    thread.start()
    while not source._family.uses and thread.is_alive():
        pass
    crop = source.cropped([(0, 8), (0, 8)])
    try:
        run()
    except BaseException as e:  # noqa: BLE001 - reported below
        errors.append(e)
    join_all([thread])
    assert errors == []
    assert source._family.uses == [] and out._family.uses == []
    np.testing.assert_array_equal(out.numpy(), expected)
    crop.set_host_dirty(True)  # (waits for no call)
    del crop
    gc.collect()
