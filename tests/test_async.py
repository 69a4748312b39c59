"""Async pipelines (Halide tutorial lesson 24), GPU work overlapped with CPU work, many Python
threads at once, arrangements that could deadlock, the thread pool, and exiting with live
state. Every multi-threaded test runs under a watchdog."""

import faulthandler
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import shim
from shim.pipelines.build import RUNTIMES, Build, build, build_all
from shim.memory import families

WATCHDOG_SECONDS = 120
LESSON = ["async_producer", "async_two_producers", "async_fold_storage", "async_ring_buffer",
          "async_ring_buffer_tiled"]
OVERLAP = ["async_gpu_to_cpu", "async_cpu_to_gpu"]
FRAMES = 16


def run_threads(targets):
    """Run each callable on its own thread; fail on an exception or on a deadlock."""
    errors = []

    def body(target):
        try:
            target()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(t,), daemon=True) for t in targets]
    for t in threads:
        t.start()
    join_all(threads)
    if errors:
        raise errors[0]


def join_all(threads):
    deadline = time.monotonic() + WATCHDOG_SECONDS
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        pytest.fail(f"deadlock: threads still running after {WATCHDOG_SECONDS}s (stacks on stderr)")


@pytest.fixture(scope="module")
def overlap(opencl):
    specs = [Build(name, "opencl", runtime) for name in OVERLAP + ["cpu_heavy"] for runtime in RUNTIMES]
    return {(s.name, s.runtime): p for s, p in build_all(specs, progress=None).items()}


def frames_reference(image):
    return image * sum(range(1, FRAMES + 1))


# --- lesson 24 ------------------------------------------------------------------------------

def lesson_reference(name, shape):
    """The lesson's definitions, evaluated with numpy."""
    if name in ("async_producer", "async_two_producers"):
        ys, xs = np.mgrid[0:shape[0], 0:shape[1]]
        producer = lambda x, y: x + y  # noqa: E731
        return producer(xs - 1, ys - 1) + producer(xs, ys) + producer(xs + 1, ys + 1)
    cs, ys, xs = np.mgrid[0:shape[0], 0:shape[1], 0:shape[2]]
    producer = lambda x, y, c: (x + y) * (c + 1)  # noqa: E731
    return producer(xs - 1, ys - 1, cs) + producer(xs, ys, cs) + producer(xs + 1, ys + 1, cs)


@pytest.mark.parametrize("name", LESSON)
def test_lesson_24_schedules(host_pipelines, runtime, name):
    pipeline = shim.load(host_pipelines[name, runtime])
    shape = (128, 128) if pipeline.outputs[0].dimensions == 2 else (4, 128, 128)
    for _ in range(20):  # producers and consumers race on semaphores: run it more than once
        out = pipeline(output=shape)
        np.testing.assert_array_equal(out.numpy(), lesson_reference(name, shape))


# --- GPU work overlapped with CPU work ---------------------------------------------------------

@pytest.mark.parametrize("name", OVERLAP)
def test_gpu_and_cpu_stages_overlap_correctly(overlap, opencl, name, runtime):
    pipeline = shim.load(overlap[name, runtime])
    image = (np.arange(64 * 70) % 997).astype(np.int32).reshape(64, 70)
    shared = shim.Buffer(image)  # one input, on the device, used by two threads at once
    shared.copy_to_device(opencl)
    threads_seen = set()
    original = {op: getattr(opencl, op) for op in ("read", "write")}

    def recording(op):
        def call(*args):
            threads_seen.add(threading.get_ident())
            return original[op](*args)
        return call

    failures = []

    def caller():
        for _ in range(100):
            out = pipeline(shared, output=image.shape)
            if not np.array_equal(out.numpy(), frames_reference(image)):
                failures.append(1)

    def bystander():  # reads the shared input while the pipelines run
        for _ in range(200):
            assert np.array_equal(shared.numpy(), image)

    for op in original:
        setattr(opencl, op, recording(op))
    try:
        run_threads([caller, caller, bystander])
    finally:
        for op, function in original.items():
            setattr(opencl, op, function)
    assert not failures, f"{len(failures)} of 200 runs were wrong"
    callers = {t.ident for t in threading.enumerate()}
    assert threads_seen - callers, "no device copy came from one of Halide's worker threads"


@pytest.mark.parametrize("name", OVERLAP)
def test_async_pipelines_with_host_device_stress(host_pipelines, name, runtime):
    """The CPU builds of the same pipelines, their input on the simulated device with delays
    in every copy, and other threads hammering the device meanwhile."""
    device = shim.device("host")
    device.set_faults(delay=0.001)
    pipeline = shim.load(host_pipelines[name, runtime])
    image = (np.arange(32 * 40) % 101).astype(np.int32).reshape(32, 40)
    failures = []

    def caller():
        source = shim.Buffer(image.copy())
        for _ in range(100):
            source.copy_to_device(device)
            source.set_host_dirty(False)
            source.set_device_dirty()  # its data lives on the device: each call copies it home
            out = pipeline(source, output=image.shape)
            if not np.array_equal(out.numpy(), frames_reference(image)):
                failures.append(1)

    def stress():
        others = [shim.Buffer(np.zeros(256, np.float32)) for _ in range(4)]
        for i in range(200):
            buf = others[i % 4]
            buf.set_host_dirty()
            buf.copy_to_device(device)
            buf.set_device_dirty()
            buf.copy_to_host()

    try:
        run_threads([caller, caller, stress])
    finally:
        device.clear_faults()
    assert not failures


# --- many Python threads ---------------------------------------------------------------------

def test_python_threads_share_device_resident_inputs(overlap, opencl):
    pipeline = shim.load(overlap["cpu_heavy", "no_runtime"])
    image = np.random.default_rng(3).random((16, 64), dtype=np.float32)
    shared = shim.Buffer(image)
    shared.copy_to_device(opencl)
    expected = pipeline(image, output=image.shape).numpy()
    before = (opencl.transfers.uploaded, opencl.transfers.downloaded)
    failures = []

    def caller():
        out = shim.Buffer(shape=image.shape, dtype=np.float32)
        with pipeline.prepare(shared, output=out) as run:
            for _ in range(25):
                run()
                if not np.array_equal(out.numpy(), expected):
                    failures.append(1)

    run_threads([caller] * 4)
    assert not failures
    # Every copy of the shared input was a no-op: nothing moved.
    assert (opencl.transfers.uploaded, opencl.transfers.downloaded) == before


# --- arrangements that could deadlock ----------------------------------------------------------

def test_main_thread_busy_in_python_while_workers_call_back(overlap, opencl):
    pipeline = shim.load(overlap["async_gpu_to_cpu", "no_runtime"])
    image = np.ones((64, 64), np.int32)
    done = []
    worker = threading.Thread(target=lambda: done.append(pipeline(image, output=image.shape)),
                              daemon=True)
    worker.start()
    deadline = time.monotonic() + WATCHDOG_SECONDS
    spins = 0
    while worker.is_alive() and time.monotonic() < deadline:
        spins += 1  # pure Python: the callbacks must still get the GIL
    join_all([worker])
    np.testing.assert_array_equal(done[0].numpy(), frames_reference(image))


def test_main_thread_holding_a_buffers_lock(overlap, opencl):
    pipeline = shim.load(overlap["async_gpu_to_cpu", "no_runtime"])  # its GPU stage reads the input
    source = shim.Buffer(np.full((32, 32), 2, np.int32))  # host-dirty: its upload needs the lock
    results = []
    with families.locked(source.raw):
        worker = threading.Thread(target=lambda: results.append(pipeline(source, output=(32, 32))),
                                  daemon=True)
        worker.start()
        time.sleep(0.3)  # the pipeline waits for the lock meanwhile, without the GIL
        assert worker.is_alive() and not results
    join_all([worker])
    np.testing.assert_array_equal(results[0].numpy(), frames_reference(np.full((32, 32), 2)))


def test_main_thread_waiting_on_a_pipeline_while_another_thread_spins(overlap, opencl):
    pipeline = shim.load(overlap["async_gpu_to_cpu", "bundled"])
    stop = threading.Event()

    def spin():  # holds the GIL as much as Python lets it
        while not stop.is_set():
            sum(range(1000))

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        image = np.full((64, 64), 3, np.int32)
        out = pipeline(image, output=image.shape)  # its workers' callbacks compete for the GIL
        np.testing.assert_array_equal(out.numpy(), frames_reference(image))
    finally:
        stop.set()
        join_all([spinner])


def test_exception_in_a_callback_on_a_worker_thread(overlap, opencl):
    pipeline = shim.load(overlap["async_gpu_to_cpu", "no_runtime"])
    original = opencl.read
    elsewhere = threading.Event()  # a failure happened on a thread other than the caller's
    local = threading.local()

    def failing_on_workers(*args):
        if getattr(local, "caller", False):
            return original(*args)
        elsewhere.set()
        raise RuntimeError("backend failure inside a callback")

    def caller():
        local.caller = True
        image = np.ones((64, 64), np.int32)
        for _ in range(100):  # which thread runs each async copy is the pool's choice
            try:
                out = pipeline(image, output=image.shape)
            except shim.DeviceError as e:
                assert isinstance(e.__cause__, RuntimeError)
                assert "backend failure inside a callback" in str(e)
                return
            np.testing.assert_array_equal(out.numpy(), frames_reference(image))

    live = opencl.live_allocations
    opencl.read = failing_on_workers
    try:
        run_threads([caller, caller])
    finally:
        opencl.read = original
    assert elsewhere.is_set(), "no failing copy ever ran on a worker thread"
    gc_collect()
    assert opencl.live_allocations == live  # the failed calls left nothing allocated
    image = np.ones((64, 64), np.int32)
    np.testing.assert_array_equal(pipeline(image, output=image.shape).numpy(), frames_reference(image))


def gc_collect():
    import gc

    gc.collect()


# --- the thread pool and exit -----------------------------------------------------------------

def test_set_num_threads(host_pipelines):
    previous = shim.set_num_threads(1)
    try:
        assert shim.num_threads() == 1
        pipeline = shim.load(host_pipelines["async_fold_storage", "no_runtime"])
        out = pipeline(output=(4, 32, 32))  # async stages still complete with one thread
        np.testing.assert_array_equal(out.numpy(), lesson_reference("async_fold_storage", (4, 32, 32)))
    finally:
        shim.set_num_threads(previous)
    with pytest.raises(shim.ArgumentError, match="positive number of threads"):
        shim.set_num_threads(0)


def test_hl_num_threads_sets_the_initial_pool_size():
    done = subprocess.run([sys.executable, "-c", "import shim; print(shim.num_threads())"],
                          env={**_environment(), "HL_NUM_THREADS": "5"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "5"


def _environment():
    import os

    return dict(os.environ)


EXIT_SCRIPT = textwrap.dedent('''
    import sys, threading, time
    import numpy as np
    import shim
    from shim.pipelines.build import Build, build

    gpu = shim.load(build(Build("brighten", "opencl", "bundled")))
    overlap = shim.load(build(Build("async_gpu_to_cpu", "opencl", "no_runtime")))
    x = shim.Buffer(np.ones((64, 64), np.float32))
    x.copy_to_device("opencl")
    unread = gpu(x, output=(64, 64))                 # device-dirty, never read
    h = shim.Buffer(np.ones((8, 8), np.int32))
    h.copy_to_device("host")
    h.set_device_dirty()
    crop = shim.Buffer(np.zeros((16, 16), np.int32)).cropped(0, 1, 5)
    if sys.argv[1] == "in-flight":
        image = np.ones((256, 256), np.int32)
        def forever():
            while True:
                overlap(image, output=image.shape)
        threading.Thread(target=forever, daemon=True).start()
        time.sleep(0.3)
    print("exiting", flush=True)
''')


@pytest.mark.parametrize("mode", ["idle", "in-flight"])
def test_interpreter_exit_with_live_state(opencl, mode):
    build(Build("brighten", "opencl", "bundled"))
    build(Build("async_gpu_to_cpu", "opencl", "no_runtime"))
    for _ in range(3):  # exit races with the work in flight: try it more than once
        done = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, mode], capture_output=True,
                              text=True, timeout=WATCHDOG_SECONDS)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "exiting"
        for sign in ("terminate called", "Fatal Python error", "Segmentation", "Aborted"):
            assert sign not in done.stderr, done.stderr
