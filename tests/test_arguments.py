"""The general path of a call's arguments (shim/calls/arguments.py), followed frame by frame:
for each kind of argument, from ``Pipeline.prepare`` to the ``halide_buffer_t`` a run passes,
every call between the shim's modules goes to the same layer or a lower one
(tests/test_architecture.py's LAYERS), no module is entered again below a module it called
(an argument never climbs back into one it came from), a DLPack producer is asked where its
data is once, and the prepared call computes what numpy does."""

import gc
import sys

import numpy as np
import pytest

import shim
from shim.pipelines.build import Build, build
from test_architecture import layer_of

SCALE, OFFSET = 2.0, 1.0
DATA = np.arange(48, dtype=np.float32).reshape(6, 8)
EXPECTED = DATA * np.float32(SCALE) + np.float32(OFFSET)


class Producer:
    """A DLPack producer that is nothing else (no buffer protocol, not numpy), counting the
    times it is asked where its data is."""

    def __init__(self, exporter, device):
        self.exporter, self.device, self.asked = exporter, device, 0

    def __dlpack_device__(self):
        self.asked += 1
        return self.device

    def __dlpack__(self, **kwargs):
        kwargs.pop("dl_device", None)
        return self.exporter(dl_device=self.device, **kwargs)


class Path:
    """The shim modules' calls while it is on: (caller, callee) module pairs, and every chain
    of modules on the stack (consecutive frames of one module counted once)."""

    def __init__(self):
        self.edges, self.reentered = set(), set()

    def __enter__(self):
        gc.disable()  # (a finalizer can run at any frame: it is not the argument's path)
        sys.setprofile(self._event)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        gc.enable()

    def _event(self, frame, event, arg):
        if event != "call":
            return
        frames = []
        f = frame
        while f is not None:
            frames.append(f)
            f = f.f_back
        chain = []
        for f in reversed(frames):  # outermost first
            name = f.f_globals.get("__name__", "")
            if not name.startswith("shim") or chain and chain[-1] == name:
                continue
            if name in chain and "<locals>" in f.f_code.co_qualname:
                # A function the module made and handed down (bridge.run_for_python runs the
                # operation it is given): it runs as part of that module's step.
                del chain[chain.index(name) + 1:]
                continue
            chain.append(name)
        if len(chain) >= 2:
            self.edges.add((chain[-2], chain[-1]))
        if len(set(chain)) != len(chain):
            self.reentered.add(tuple(chain))

    def upward(self) -> set:
        return {(a, b) for a, b in self.edges if layer_of(b) > layer_of(a)}


@pytest.fixture(scope="module")
def brighten(host_pipelines):
    return shim.load(host_pipelines["brighten", "no_runtime"])


@pytest.fixture(scope="module")
def brighten_opencl(opencl):
    return shim.load(build(Build("brighten", "opencl", "no_runtime")))


def followed(pipeline, input, output):
    """(The Path of ``pipeline.prepare`` for these arguments, the prepared call's result.)"""
    with Path() as path:
        prepared = pipeline.prepare(input, scale=SCALE, offset=OFFSET, output=output)
    with prepared as call:
        result = call()
    return path, np.asarray(result if not isinstance(result, shim.Buffer) else result.numpy())


def check(path: Path):
    assert path.upward() == set()
    assert path.reentered == set()


HOST_INPUTS = {
    "numpy array": lambda: DATA.copy(),
    "numpy array Halide cannot address (x reversed)": lambda: DATA[:, ::-1].copy()[:, ::-1],
    "numpy array in the other byte order": lambda: DATA.astype(DATA.dtype.newbyteorder()),
    "shim.Buffer": lambda: shim.Buffer(DATA.copy()),
    "buffer protocol (memoryview)": lambda: memoryview(DATA.copy()),
}


@pytest.mark.parametrize("kind", sorted(HOST_INPUTS))
def test_each_host_input_kind_goes_only_down(brighten, kind):
    path, result = followed(brighten, HOST_INPUTS[kind](), DATA.shape)
    check(path)
    np.testing.assert_array_equal(result, EXPECTED)


@pytest.mark.parametrize("output", ["shape", "numpy array", "shim.Buffer"])
def test_each_output_kind_goes_only_down(brighten, output):
    given = {"shape": DATA.shape, "numpy array": np.zeros_like(DATA),
             "shim.Buffer": shim.Buffer(np.zeros_like(DATA))}[output]
    path, result = followed(brighten, DATA.copy(), given)
    check(path)
    np.testing.assert_array_equal(result, EXPECTED)


def test_a_dlpack_producer_on_the_cpu_is_asked_once_and_goes_only_down(brighten):
    source = DATA.copy()
    producer = Producer(lambda dl_device, **kwargs: source.__dlpack__(**kwargs), (1, 0))
    path, result = followed(brighten, producer, DATA.shape)
    check(path)
    assert producer.asked == 1
    np.testing.assert_array_equal(result, EXPECTED)


def test_a_dlpack_producer_on_opencl_is_asked_once_and_goes_only_down(brighten_opencl):
    # (The capsule is made first: the producer's own work, a shim.Buffer's export here, is
    # not the argument's path.)
    source = shim.Buffer(DATA.copy())
    source.copy_to_device("opencl")
    capsule = source.__dlpack__(dl_device=(4, 0), max_version=(1, 0))
    producer = Producer(lambda **kwargs: capsule, (4, 0))
    path, result = followed(brighten_opencl, producer, DATA.shape)
    check(path)
    assert producer.asked == 1
    np.testing.assert_array_equal(result, EXPECTED)


def test_a_pyopencl_array_goes_only_down(brighten_opencl):
    pytest.importorskip("pyopencl.array")
    import pyopencl.array as cl_array

    array = cl_array.to_device(shim.device("opencl").queue, DATA.copy())
    path, result = followed(brighten_opencl, array, DATA.shape)
    check(path)
    np.testing.assert_array_equal(result, EXPECTED)


def test_the_follower_sees_an_upward_call_and_a_return_into_a_module():
    # What the checks above would miss if Path saw nothing: a core function calling a
    # function of the calls layer by name (not one it was handed), from a call that came
    # down from that layer.
    core, api = {"__name__": "shim.core.planted"}, {"__name__": "shim.calls.planted"}
    exec("def up():\n    return 1\n\n\ndef start():\n    return down()\n", api)
    exec("def down():\n    return up()\n", core)
    core["up"], api["down"] = api["up"], core["down"]
    with Path() as path:
        api["start"]()
    assert ("shim.core.planted", "shim.calls.planted") in path.upward()
    assert ("shim.calls.planted", "shim.core.planted", "shim.calls.planted") in path.reentered


def test_the_follower_lets_a_module_run_what_it_handed_down():
    core, api = {"__name__": "shim.core.planted"}, {"__name__": "shim.calls.planted"}
    exec("def run(operation):\n    return operation()\n", core)
    exec("def start(run):\n    return run(lambda: 1)\n", api)
    with Path() as path:
        api["start"](core["run"])
    assert path.upward() == set() and path.reentered == set()


@pytest.mark.parametrize("kind", ["numpy array", "shim.Buffer"])
def test_host_memory_for_a_gpu_pipeline_goes_only_down(brighten_opencl, kind):
    path, result = followed(brighten_opencl, HOST_INPUTS[kind](), DATA.shape)
    check(path)
    np.testing.assert_array_equal(result, EXPECTED)
