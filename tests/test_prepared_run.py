"""A prepared call's run in C (native_stubs/fast/prepared_call.c). It must do what the Python run
(PreparedCall._run_in_python) does, on the same family records, in everything but speed:
the same outputs, uses recorded while the pipeline runs and gone after it (also when it
fails), array inputs re-read, waiting threads woken, and, for whatever it declines, the Python
run taking the call. Results are checked against numpy."""

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shim
from shim.pipelines.build import Build, build_all
from shim.calls.running import PreparedCall


@pytest.fixture
def python_runs(monkeypatch):
    """How many calls the Python run took (the rest ran in C)."""
    counted = []
    original = PreparedCall._run_in_python

    def counting(self):
        counted.append(None)  # (not the call: it would keep its Buffers alive)
        return original(self)

    monkeypatch.setattr(PreparedCall, "_run_in_python", counting)
    return counted


def family_of(buffer: shim.Buffer):
    return buffer.family


@pytest.fixture(scope="module")
def opencl_brighten(opencl):
    path = build_all([Build("brighten", "opencl", "no_runtime")], progress=None).popitem()[1]
    return shim.load(path)


def test_the_c_run_computes_and_leaves_no_use_behind(load, python_runs):
    times_k = load("times_k")
    rng = np.random.default_rng(1)
    a = rng.random((5, 7), dtype=np.float32)
    b, out = shim.Buffer(a), shim.Buffer(np.zeros((5, 7), np.float32))
    with times_k.prepare(b, k=3.0, output=out) as run:
        for i in range(5):
            a[...] = rng.random((5, 7), dtype=np.float32)  # a Buffer over the array: same memory
            assert run() is out
            np.testing.assert_array_equal(out.numpy(), a * np.float32(3.0))
    assert python_runs == []
    assert family_of(b).uses == [] and family_of(out).uses == []


def test_several_outputs_and_array_arguments(load, python_runs):
    sum_diff = load("sum_diff")
    a = np.arange(24, dtype=np.int32).reshape(6, 4)
    b = np.full((6, 4), 7, np.int32)
    total, difference = np.zeros_like(a), np.zeros_like(a)
    with sum_diff.prepare(a, b, sum=total, diff=difference) as run:
        first = run()
        b[...] = -3  # array inputs are read again by every run
        second = run()
    assert python_runs == []
    assert first == second and first[0] is total and first[1] is difference
    np.testing.assert_array_equal(total, a + b)
    np.testing.assert_array_equal(difference, a - b)


def test_a_failing_pipeline_raises_its_error_and_ends_its_uses(load, python_runs):
    checked_sqrt = load("checked_sqrt")
    values = np.ones((4, 8), np.float32)
    inp, out = shim.Buffer(values), shim.Buffer(np.zeros((4, 8), np.float32))
    with checked_sqrt.prepare(inp, output=out) as run:
        run()
        values[2, 3] = -1.0
        with pytest.raises(shim.PipelineError) as failure:
            run()
        assert "negative input" in str(failure.value)
        assert failure.value.code != 0
        values[2, 3] = 4.0
        run()
    assert python_runs == []
    np.testing.assert_array_equal(out.numpy(), np.sqrt(values))
    assert family_of(inp).uses == [] and family_of(out).uses == []


def test_what_the_c_run_declines_the_python_run_takes(load, python_runs):
    times_k = load("times_k")
    a = np.arange(36, dtype=np.float32).reshape(6, 6)
    b = shim.Buffer(a)
    parent = shim.Buffer(np.zeros((6, 6), np.float32))
    crop = parent.cropped([(1, 4), (1, 4)])  # a shared family: its plans are made in Python
    with times_k.prepare(b, k=2.0, output=crop) as run:
        run()
        run()
    assert python_runs == []
    np.testing.assert_array_equal(np.asarray(parent)[1:5, 1:5], a[1:5, 1:5] * 2)

    b = shim.Buffer(a[:4, :4].copy())
    out = shim.Buffer(np.zeros((4, 4), np.float32))
    with times_k.prepare(b, k=2.0, output=out) as run:
        with shim.profile():
            run()  # profiled calls are Python's
        assert len(python_runs) == 1
        run()
        assert len(python_runs) == 1
    with pytest.raises(TypeError, match="takes no arguments"):
        times_k.prepare(b, k=2.0, output=out)(1)


def test_a_held_family_lock_sends_the_call_to_python_which_waits(load, python_runs):
    times_k = load("times_k")
    b = shim.Buffer(np.ones((4, 4), np.float32))
    out = shim.Buffer(np.zeros((4, 4), np.float32))
    order, held = [], threading.Event()

    def holder():
        with family_of(out).lock:
            held.set()
            threading.Event().wait(0.3)
            order.append("released")

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait()
    with times_k.prepare(b, k=2.0, output=out) as run:
        run()
        order.append("ran")
    thread.join()
    assert order == ["released", "ran"]
    assert len(python_runs) == 1
    np.testing.assert_array_equal(out.numpy(), np.full((4, 4), 2, np.float32))


def test_operations_wait_for_a_c_run_and_are_woken(load, python_runs):
    """A thread marking the output dirty waits for the call writing it (Buffer.set_host_dirty
    waits for writers): it must see the call's use while the pipeline runs, and the use gone
    once it may go on; the C run ends the call and wakes it."""
    cpu_heavy = load("cpu_heavy")
    image = np.random.default_rng(2).random((256, 256), dtype=np.float32)
    inp, out = shim.Buffer(image), shim.Buffer(np.zeros_like(image))
    seen, finished = [], threading.Event()
    run = cpu_heavy.prepare(inp, rounds=3000, output=out)

    def marker():
        while not family_of(out).uses and not finished.is_set():
            pass
        seen.append(("during", len(family_of(out).uses)))
        out.set_host_dirty(True)
        seen.append(("after", len(family_of(out).uses)))

    thread = threading.Thread(target=marker)
    thread.start()
    run()
    finished.set()
    thread.join()
    assert seen == [("during", 1), ("after", 0)]
    assert python_runs == []


def test_many_threads_on_shared_inputs(load, python_runs):
    times_k = load("times_k")
    rng = np.random.default_rng(3)
    shared = shim.Buffer(rng.random((16, 16), dtype=np.float32))
    expected = shared.numpy().copy()
    wrong, failures = [], []

    def worker(k):
        out = shim.Buffer(np.zeros((16, 16), np.float32))
        try:
            with times_k.prepare(shared, k=float(k), output=out) as run:
                for _ in range(300):
                    run()
                    if not np.array_equal(out.numpy(), expected * np.float32(k)):
                        wrong.append(k)
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures and not wrong
    assert family_of(shared).uses == []


def test_opencl_array_inputs_are_uploaded_again_each_run(opencl_brighten, python_runs):
    """An array input may have been written since the last run: the C run marks it
    host-dirty, so that the pipeline uploads it again."""
    image = np.random.default_rng(4).random((32, 32), dtype=np.float32)
    out = shim.Buffer(np.zeros_like(image))
    with opencl_brighten.prepare(image, scale=2.0, offset=1.0, output=out) as run:
        for _ in range(3):
            run()
            np.testing.assert_array_equal(out.numpy(), image * np.float32(2) + np.float32(1))
            image += 1
    assert python_runs == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.sampled_from(["write", "run", "read", "to_device", "free", "mark"]),
                      min_size=1, max_size=12))
def test_opencl_resident_runs_follow_a_numpy_model(opencl_brighten, steps):
    """Device-resident Buffers, run in C, moved and marked between runs: every read shows
    what numpy says the pipeline computed from the input's latest contents."""
    rng = np.random.default_rng(len(steps))
    host = rng.random((8, 8), dtype=np.float32)
    inp = shim.Buffer(host.copy())
    out = shim.Buffer(np.zeros_like(host))
    model = None
    with opencl_brighten.prepare(inp, scale=3.0, offset=0.5, output=out) as run:
        for step in steps:
            if step == "write":
                inp.copy_to_host()
                inp.numpy()[...] += 1
                inp.set_host_dirty()
                host = inp.numpy().copy()
            elif step == "run":
                run()
                model = host * np.float32(3.0) + np.float32(0.5)
            elif step == "read" and model is not None:
                np.testing.assert_array_equal(out.numpy(), model)
            elif step == "to_device":
                inp.copy_to_device(opencl_brighten_device())
            elif step == "free":
                out.copy_to_host()
                out.device_free()
            elif step == "mark" and model is not None:
                out.copy_to_host()
                out.set_host_dirty()
    if model is not None:
        np.testing.assert_array_equal(out.numpy(), model)
    assert family_of(inp).uses == [] and family_of(out).uses == []


def opencl_brighten_device():
    return shim.device("opencl")
