"""Regression tests for the holes an adversarial pass found in the device layer (issue 11):
frees racing kernels, results lost between threads, spurious conflicts, Buffers moved between
devices, Ctrl-C inside the layer, leaks when Buffers are dropped. Each test reproduces the
situation as it was reported; what would have killed the interpreter runs in a subprocess.
Expected values come from numpy or from the pipeline's definition, never from the shim."""

import ctypes
import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
import weakref

import numpy as np
import pytest

import shim
from shim.pipelines.build import Build, build_all
from shim.native import lib, regions
from support.hooks import OnEntry
from support.threads import run_threads

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBPROCESS_SECONDS = 120  # a hang fails the test instead of the suite


@pytest.fixture(scope="module")
def gpu_paths(opencl):
    """{name: path} of the OpenCL builds the tests use."""
    paths = build_all([Build(name, "opencl", "bundled") for name in ("brighten", "crop_fill")],
                      progress=None)
    return {spec.name: str(path) for spec, path in paths.items()}


@pytest.fixture(scope="module")
def gpu(gpu_paths):
    return {name: shim.load(path) for name, path in gpu_paths.items()}


@pytest.fixture
def host_device():
    device = shim.device("host")
    device.clear_faults()
    yield device
    device.clear_faults()


def crop_fill_values(box, param):
    """crop_fill's definition, f(x, y) = x * 100 + y + param * 10000, over ``box`` (x first),
    in numpy order."""
    (x0, w), (y0, h) = box
    y, x = np.mgrid[y0:y0 + h, x0:x0 + w]
    return (x * 100 + y + param * 10000).astype(np.int32)


def run_script(source: str, *args) -> subprocess.CompletedProcess:
    """Run ``source`` in a fresh interpreter (crashes and hangs stay there)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source), *map(str, args)],
                          capture_output=True, text=True, timeout=SUBPROCESS_SECONDS, cwd=ROOT)


# --- 1. device_free while another thread's OpenCL pipeline uses the buffer ----------------------

class MixInFlight:
    """An OpenCL mix call on ``a`` and ``b`` held in flight: after uploading its first input
    and then its second, the call runs ``hold()`` (opencl.write patched) before its kernel."""

    def __init__(self, opencl, monkeypatch, hold):
        self.mix = shim.load(build_all([Build("mix", "opencl", "bundled")], progress=None).popitem()[1])
        self.a = shim.Buffer(np.arange(64 * 64, dtype=np.uint8).reshape(64, 64))
        self.b = shim.Buffer(np.full((64, 64), 3, np.float32))
        self.uploads, self.second_upload = [], threading.Event()
        original = opencl.write

        def slow_second_upload(memory, plan, host_address):
            original(memory, plan, host_address)
            self.uploads.append(plan.nbytes)
            if len(self.uploads) == 2:
                self.second_upload.set()
                hold()

        monkeypatch.setattr(opencl, "write", slow_second_upload)

    def call(self) -> bool:
        """Run the call; whether its result is mix's definition."""
        out = self.mix(self.a, self.b, alpha=0.5, offset=0, output=(64, 64))
        return np.array_equal(out.numpy(), self.a.numpy() * 0.5 + 3 * 0.5)

    def first_input(self) -> shim.Buffer:
        """The input uploaded first (once the second upload began)."""
        assert self.second_upload.wait(10)
        return self.a if self.uploads[0] == self.a.numpy().nbytes else self.b


def test_device_free_waits_for_the_pipeline_call_using_the_buffer(gpu_paths, opencl, monkeypatch):
    """The call uploads its first input, then (slowly) its second; meanwhile another thread
    frees the first. The free must wait for the call to end: its kernel uses that memory."""
    order = []

    def hold():
        threading.Event().wait(0.3)  # the call is in flight, its first input uploaded
        order.append("second input uploaded")

    held = MixInFlight(opencl, monkeypatch, hold)

    def free():
        held.first_input().device_free()
        order.append("freed")

    def call_or_free(i):
        if i == 0:
            assert held.call()
        else:
            free()

    run_threads(2, call_or_free)
    assert order == ["second input uploaded", "freed"]


def test_device_free_racing_pipeline_calls_never_crashes(gpu_paths):
    done = run_script("""
        import sys, threading, time
        import numpy as np
        import shim
        brighten = shim.load(sys.argv[1])
        image = np.random.default_rng(0).random((256, 256), dtype=np.float32)
        x = shim.Buffer(image.copy())
        y = shim.Buffer(shape=image.shape, dtype=np.float32)
        stop = time.monotonic() + 2.0
        wrong = []

        def caller():
            while time.monotonic() < stop:
                brighten(x, scale=2.0, offset=1.0, output=y)
                if not np.array_equal(y.numpy(), image * 2 + 1):
                    wrong.append(1)

        def freer():
            while time.monotonic() < stop:
                x.device_free()
                y.device_free()

        threads = [threading.Thread(target=caller), threading.Thread(target=freer)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print("wrong", len(wrong))
        """, gpu_paths["brighten"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "wrong 0" in done.stdout


# --- 5. copy_to_host of crops while other threads realize into their own crops -----------------

def test_no_results_lost_while_other_threads_copy_crops_home(gpu):
    fill = gpu["crop_fill"]
    parent = shim.Buffer(np.zeros((8 * 8, 16), np.int32))
    crops = [parent.cropped([(0, 16), (8 * i, 8)]) for i in range(8)]
    lost = []
    stop = threading.Event()

    def writer(i):
        box = ((0, 16), (8 * i, 8))
        for n in range(60):
            param = i * 1000 + n
            fill(param=param, f=crops[i])
            if not np.array_equal(crops[i].numpy(), crop_fill_values(box, param)):
                lost.append((i, n))
        stop.set()

    def copier(i):
        rng = np.random.default_rng(i)
        while not stop.is_set():
            crops[rng.integers(len(crops))].copy_to_host()

    run_threads(10, lambda i: writer(i) if i < 8 else copier(i))
    assert lost == []


# --- 6. device_free keeps device-only results; a freed input is uploaded again ------------------

def test_device_free_of_an_output_given_as_a_shape_keeps_its_results(gpu):
    out = gpu["crop_fill"](param=3, f=(8, 16))
    out.device_free()
    assert not out.has_device_allocation()
    np.testing.assert_array_equal(out.numpy(), crop_fill_values(((0, 16), (0, 8)), 3))


def test_a_freed_input_is_uploaded_again(gpu):
    image = np.arange(32 * 32, dtype=np.float32).reshape(32, 32)
    x = shim.Buffer(image.copy())
    first = gpu["brighten"](x, scale=2.0, offset=0.0, output=image.shape)
    np.testing.assert_array_equal(first.numpy(), image * 2)
    x.copy_to_host()  # current on both sides: neither bit set
    x.device_free()
    second = gpu["brighten"](x, scale=2.0, offset=0.0, output=image.shape)
    np.testing.assert_array_equal(second.numpy(), image * 2)


def test_marking_the_host_newer_over_device_results_is_refused(gpu):
    buf = shim.Buffer(np.zeros((8, 8), np.int32))
    gpu["crop_fill"](param=1, f=buf)  # results on the device only
    with pytest.raises(shim.DeviceError) as e:
        buf.set_host_dirty()
    assert e.value.code == -37 and "copy_to_host" in str(e.value)
    np.testing.assert_array_equal(buf.numpy(), crop_fill_values(((0, 8), (0, 8)), 1))
    buf.numpy()[...] = 5
    buf.set_host_dirty()  # fine once they are home; and a pipeline's output replaces both
    gpu["crop_fill"](param=2, f=buf)
    np.testing.assert_array_equal(buf.numpy(), crop_fill_values(((0, 8), (0, 8)), 2))


# --- 8. set_host_dirty + copy_to_device of a parent while a crop is realized -------------------

def test_parent_uploads_never_overwrite_a_crops_results_silently(gpu):
    fill = gpu["crop_fill"]
    parent = shim.Buffer(np.zeros((16, 32), np.int32))
    crop = parent.cropped([(8, 8), (4, 8)])
    stale, refused = [], []
    stop = threading.Event()

    def realizer():
        for n in range(150):
            fill(param=n, f=crop)
            if not np.array_equal(crop.numpy(), crop_fill_values(((8, 8), (4, 8)), n)):
                stale.append(n)
        stop.set()

    def uploader():
        while not stop.is_set():
            try:
                parent.set_host_dirty()
                parent.copy_to_device()
            except shim.DeviceError as e:  # the documented refusal: device changes not copied
                assert e.code == -37, e
                refused.append(e)

    run_threads(2, lambda i: realizer() if i == 0 else uploader())
    assert stale == []


# --- 9. disjoint crops dirty on different sides are no conflict ---------------------------------

def test_parent_reads_a_device_dirty_crop_beside_a_host_dirty_one(gpu):
    parent = shim.Buffer(np.full((8, 16), -1, np.int32))
    on_device, on_host = parent.cropped([(0, 8), (0, 8)]), parent.cropped([(8, 8), (0, 8)])
    on_host.numpy()[...] = 7
    on_host.set_host_dirty()
    gpu["crop_fill"](param=2, f=on_device)
    parent.copy_to_host()  # downloads the one, keeps the other
    expected = np.full((8, 16), 7, np.int32)
    expected[:, :8] = crop_fill_values(((0, 8), (0, 8)), 2)
    np.testing.assert_array_equal(parent.numpy(), expected)
    parent.copy_to_device()  # the host-dirty crop goes up: the device is current everywhere
    parent.set_device_dirty()  # so reading downloads: the device copy is what we compare
    np.testing.assert_array_equal(parent.numpy(), expected)


def test_threads_marking_their_own_crops_host_dirty_cause_no_conflict(gpu):
    fill = gpu["crop_fill"]
    parent = shim.Buffer(np.zeros((4 * 8, 16), np.int32))
    crops = [parent.cropped([(0, 16), (8 * i, 8)]) for i in range(4)]

    def worker(i):
        box = ((0, 16), (8 * i, 8))
        for n in range(30):
            crops[i].numpy()[...] = -n
            crops[i].set_host_dirty()
            fill(param=n, f=crops[i])
            np.testing.assert_array_equal(crops[i].numpy(), crop_fill_values(box, n))
            parent.copy_to_host()  # never -37: every crop's changes are on one side only

    run_threads(4, worker)


# --- 10. Buffers moved between devices; proxy crops copied to the default device ---------------

def test_a_buffer_moved_to_the_host_device_and_back_computes_right(gpu, host_device):
    image = np.arange(16 * 16, dtype=np.float32).reshape(16, 16)
    x = shim.Buffer(image.copy())
    x.copy_to_device(host_device)
    out = gpu["brighten"](x, scale=2.0, offset=0.0, output=image.shape)
    np.testing.assert_array_equal(out.numpy(), image * 2)
    x.copy_to_device(shim.device("opencl"))
    x.copy_to_device(host_device)  # moves: the data comes along
    assert x.device is host_device
    out = gpu["brighten"](x, scale=2.0, offset=0.0, output=image.shape)
    np.testing.assert_array_equal(out.numpy(), image * 2)


def test_device_results_move_with_the_buffer(gpu, host_device):
    out = gpu["crop_fill"](param=5, f=(8, 8))  # results on OpenCL only
    out.copy_to_device(host_device)
    assert out.device is host_device
    np.testing.assert_array_equal(out.numpy(), crop_fill_values(((0, 8), (0, 8)), 5))


def test_copy_to_device_of_a_proxy_crop_allocates_the_family(host_device):
    parent = shim.Buffer(np.arange(64, dtype=np.int32).reshape(8, 8))
    parent.set_host_dirty(False)  # clean, and so is the crop
    crop = parent.cropped([(2, 4), (2, 4)])
    crop.copy_to_device()  # no device named: the parent's default one
    assert crop.has_device_allocation() and parent.has_device_allocation()
    crop.set_device_dirty()
    np.testing.assert_array_equal(crop.numpy(), np.arange(64).reshape(8, 8)[2:6, 2:6])


# --- 11. Ctrl-C, and any signal handler's exception, inside the device layer ------------------

# (signal, when the program sets its handler: "before" or "after" import shim, None for
# Python's own SIGINT handler; the exception the handler raises)
HANDLERS = {
    "python's SIGINT handler": ("SIGINT", None, "KeyboardInterrupt"),
    "a program's SIGINT handler": ("SIGINT", "after", "Stop"),
    "a SIGALRM timeout set before import": ("SIGALRM", "before", "TimeoutError"),
    "a SIGUSR1 handler raising a BaseException": ("SIGUSR1", "after", "Abandon"),
}


@pytest.mark.parametrize("handler", HANDLERS)
def test_a_signal_handlers_exception_surfaces_as_itself_with_nothing_left_locked(handler):
    """Python runs a signal's handler on the main thread between any two bytecodes. Landing
    inside the device layer's bookkeeping, the exception it raises once left a family lock
    held (other threads' operations then waited forever) or a Buffer inconsistent ('device
    handle ... was not made by this runtime' [-22], -1 errors); it was held only for SIGINT
    under Python's default handler. Whatever handler raises, and whatever it raises, it comes
    out of the operation as itself, with every lock released and every Buffer consistent."""
    signum, when, exception = HANDLERS[handler]
    done = run_script("""
        import signal, sys, threading, time
        import numpy as np

        SIGNUM, WHEN, EXCEPTION = getattr(signal, sys.argv[1]), sys.argv[2], sys.argv[3]

        class Stop(Exception):
            pass

        class Abandon(BaseException):
            pass

        raised = {"Stop": Stop, "Abandon": Abandon, "TimeoutError": TimeoutError,
                  "KeyboardInterrupt": KeyboardInterrupt}[EXCEPTION]

        def handler(signum, frame):
            raise raised(f"signal {signum}")

        if WHEN == "before":
            signal.signal(SIGNUM, handler)
        import shim
        from shim.native import close_calls
        if WHEN == "after":
            signal.signal(SIGNUM, handler)
        if WHEN != "None":
            assert signal.getsignal(SIGNUM) is handler  # (the program sees its own handler)

        device = shim.device("host")
        device.set_faults(delay=0.0002)  # every copy takes a while: signals land inside
        parent = shim.Buffer(np.zeros((64, 64), np.int32))
        crops = [parent.cropped([(0, 64), (16 * i, 16)]) for i in range(4)]
        main = threading.main_thread().ident
        stop = threading.Event()
        counts = {"raised": 0, "swallowed": 0, "steps": 0}

        go = threading.Event()

        def sender():
            rng = np.random.default_rng(0)
            go.wait()  # (not before the main thread is inside the try below)
            while not stop.is_set():
                time.sleep(rng.uniform(0, 0.003))
                signal.pthread_kill(main, SIGNUM)

        def step(n):
            crop = crops[n % 4]
            try:
                crop.numpy()[...] = n
                crop.set_host_dirty()
                crop.copy_to_device(device)
                crop.set_device_dirty()
                parent.copy_to_host()
                if n % 7 == 0:
                    parent.device_free()
            except shim.ShimError as e:
                if isinstance(e.__cause__, raised):
                    counts["swallowed"] += 1
                else:
                    raise

        def steps(deadline):
            while time.monotonic() < deadline:
                try:
                    counts["steps"] += 1
                    step(counts["steps"])
                except raised:
                    counts["raised"] += 1

        thread = threading.Thread(target=sender, daemon=True)
        thread.start()
        deadline = time.monotonic() + 3
        while not stop.is_set():
            try:  # (a signal may also land in the test's own code)
                go.set()
                steps(deadline)
                stop.set()
                thread.join()
                time.sleep(0.05)  # the last signal sent
            except raised:
                counts["raised"] += 1
        result = []

        def other_thread():  # every family lock is free, every Buffer consistent
            for i, crop in enumerate(crops):
                crop.numpy()[...] = -i
                crop.set_host_dirty()
                crop.copy_to_device(device)
                crop.set_device_dirty()
            expected = np.repeat(-np.arange(4), 16)[:, None] * np.ones((1, 64), np.int32)
            result.append(bool((parent.numpy() == expected).all()))
            for buf in crops + [parent]:
                buf.device_free()
            result.append(device.live_allocations)

        t = threading.Thread(target=other_thread)
        t.start()
        t.join(30)
        print(counts["raised"], counts["swallowed"], result, close_calls(1.0))
        """, signum, when, exception)
    assert done.returncode == 0, done.stderr[-3000:]
    raised, swallowed, rest = done.stdout.split(maxsplit=2)
    assert int(raised) > 0, "no handler's exception ever landed"
    assert swallowed == "0", f"the handler's {exception} came back as a ShimError"
    assert rest.split() == ["[True,", "0]", "True"], \
        f"after the signals: [consistent, live allocations], no call left open: {rest}"


@pytest.mark.parametrize("uses_the_buffer", [False, True], ids=["quiet handler", "handler using the buffer"])
def test_a_handler_runs_where_an_operation_waits_for_a_call(gpu_paths, opencl, monkeypatch,
                                                             uses_the_buffer):
    """An operation waiting for another thread's pipeline call on its Buffer is a safe point:
    signal handlers run there (so that a Ctrl-C or a timeout ends the wait), and one that does
    not raise lets the wait go on. A handler that uses the very Buffer the waiting operation
    holds gets a ShimError, instead of waiting for itself forever."""
    if threading.current_thread() is not threading.main_thread():
        pytest.fail("signals land on the main thread: run this test there")
    release = threading.Event()
    held = MixInFlight(opencl, monkeypatch, lambda: release.wait(5))  # (until the handler ran)
    results, handled = [], []

    def call():
        results.append(held.call())

    def handler(signum, frame):
        handled.append(not release.is_set())  # (it runs while the call is still in flight)
        if uses_the_buffer:
            first.set_host_dirty()  # (takes the family's lock: not a no-op decided in C)

    def signal_then_release():
        time.sleep(0.1)  # (the main thread is waiting in device_free by then)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
        time.sleep(0.2)
        release.set()

    previous = signal.signal(signal.SIGUSR1, handler)
    caller = threading.Thread(target=call)
    caller.start()
    try:
        first = held.first_input()
        threading.Thread(target=signal_then_release).start()
        if uses_the_buffer:
            with pytest.raises(shim.ShimError, match="wait for itself forever"):
                first.device_free()
        else:
            first.device_free()
    finally:
        release.set()
        caller.join(10)
        signal.signal(signal.SIGUSR1, previous)
    assert handled == [True] and results == [True]
    assert not first.has_device_allocation() or uses_the_buffer
    first.device_free()


class Stop(Exception):
    """What a program's own signal handler raises in these tests."""


def raise_stop(signum, frame):
    raise Stop(f"signal {signum}")


@pytest.mark.parametrize("prepared", [False, True], ids=["plain", "prepared"])
def test_a_handlers_exception_in_a_fast_calls_device_work_comes_after_the_call(gpu, opencl,
                                                                              prepared):
    """The fast paths run a call from C, and its device work calls back into Python on the
    calling thread: a program's handler ran there and its exception failed the call
    (generic_error, -1; found by tests/test_stateful.py). The call completes, then the
    exception comes out of it."""
    if threading.current_thread() is not threading.main_thread():
        pytest.fail("signals land on the main thread: run this test there")
    from shim.core import runtime

    brighten = gpu["brighten"]
    x = shim.Buffer(np.full((8, 8), 3, np.float32))
    out = shim.Buffer(np.zeros((8, 8), np.float32))
    brighten(x, scale=2.0, offset=0.0, output=out)  # (the shapes are known: calls run from C)
    run = brighten.prepare(x, scale=2.0, offset=1.0, output=out) if prepared else \
        (lambda: brighten(x, scale=2.0, offset=1.0, output=out))
    x.numpy()[...] = 5
    x.set_host_dirty()  # (the call's device work: an upload)
    hook = OnEntry(runtime.copy_to_device.__code__, lambda: signal.raise_signal(signal.SIGUSR1))
    previous = signal.signal(signal.SIGUSR1, raise_stop)
    # (The native layer serves the upload of an idle Buffer with no Python: switched off, the
    # upload is the Python core's, where a handler can run.)
    lib.shim_serve_allocations(lib.SHIM_BACKEND_OPENCL, False)
    try:
        with pytest.raises(Stop), hook:
            run()
    finally:
        lib.shim_serve_allocations(lib.SHIM_BACKEND_OPENCL, True)
        signal.signal(signal.SIGUSR1, previous)
    assert hook.fired
    np.testing.assert_array_equal(out.numpy(), np.full((8, 8), 11, np.float32))


def interrupt_on_drop():
    """An object whose destruction trips SIGINT from C (a capsule whose destructor is
    PyErr_SetInterrupt), as a Ctrl-C arriving then would: dropped by a ``del``, which runs no
    check for signals of its own, Python runs the handler at the next bytecode."""
    capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                                    ctypes.c_void_p)(("PyCapsule_New", ctypes.pythonapi))
    set_interrupt = ctypes.cast(ctypes.pythonapi.PyErr_SetInterrupt, ctypes.c_void_p).value
    return capsule_new(1, None, set_interrupt)


@pytest.mark.parametrize("manager", ["profile", "stream", "prepared call"])
def test_ctrl_c_as_a_with_statement_leaves_does_not_cut_the_leaving_short(gpu, opencl, manager):
    """A Ctrl-C arriving as a with block ends lands at the first bytecode of a Python __exit__,
    before it does anything: the with statement then ended with the profile still recording
    (every later shim.profile() refused), the thread left on the block's stream, the prepared
    call's device memory kept. The shim's context managers leave their blocks with signal
    handlers held (HeldContext): the KeyboardInterrupt comes once they have."""
    if threading.current_thread() is not threading.main_thread():
        pytest.fail("signals land on the main thread: run this test there")
    from shim.native import streams

    signal.signal(signal.SIGINT, signal.getsignal(signal.SIGINT))  # (in front of pocl's)
    brighten = gpu["brighten"]
    image, result = np.ones((8, 8), np.float32), np.zeros((8, 8), np.float32)
    stream, live = streams.current(), opencl.live_allocations
    made = {"profile": shim.profile,
            "stream": lambda: shim.stream(0x5EED),
            "prepared call": lambda: brighten.prepare(image, scale=2.0, offset=0.0, output=result)}
    context = made[manager]()
    with pytest.raises(KeyboardInterrupt):
        trip = interrupt_on_drop()
        with context as entered:
            if manager == "prepared call":
                entered()
            else:
                brighten(image, scale=2.0, offset=0.0, output=result)
            del trip  # (the last thing in the block: the Ctrl-C comes as it ends)
        time.sleep(0.1)  # (where a Ctrl-C held for the leaving lands)
    np.testing.assert_array_equal(result, 2 * image)
    assert shim.profile().start().stop().records == []  # (refused if one was left recording)
    assert streams.current() == stream
    assert opencl.live_allocations == live  # (the prepared call's upload of image freed)


# --- 13, 14. dropped Buffers never leak device memory ------------------------------------------

def test_crops_dropped_while_the_family_allocates_leak_nothing(host_device, monkeypatch):
    original = host_device.handle

    def slow_handle(memory, offset, nbytes):  # the allocation gives each crop a handle slowly
        time.sleep(0.0002)
        return original(memory, offset, nbytes)

    monkeypatch.setattr(host_device, "handle", slow_handle)
    gc.collect()
    before = host_device.live_allocations
    for _ in range(20):
        parent = shim.Buffer(np.zeros((32, 32), np.int32))
        crops = [parent.cropped([(0, 32), (i, 1)]) for i in range(32)]
        start = threading.Barrier(2)

        def allocate(buf):
            start.wait()
            buf.copy_to_device(host_device)

        def drop():
            start.wait()
            while crops:
                crops.pop()
                time.sleep(0.0002)  # interleaved with the allocation's handles

        run_threads(2, lambda i, buf=parent: allocate(buf) if i == 0 else drop())
        del parent
        gc.collect()
        assert host_device.live_allocations == before


def test_many_buffers_dropped_inside_a_section_are_all_freed_as_it_ends(host_device):
    """Finalizers that find their thread inside one of the device layer's critical sections
    leave their work until it leaves the outermost (shim/base/sections.py). That work takes
    the layer's locks too, so leaving their sections once ran the next queued release inside the
    one before: a thread that had a few hundred Buffers dropped there (a benchmark's fixture
    torn down inside a call) hit Python's recursion limit, and the rest kept their memory."""
    from shim.base import sections

    gc.collect()
    before = host_device.live_allocations
    bufs = [shim.Buffer(np.zeros(4, np.float32)) for _ in range(500)]
    for buf in bufs:
        buf.copy_to_device(host_device)
    del buf
    assert host_device.live_allocations == before + len(bufs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with sections.Lock():
            bufs.clear()  # (each finalizer finds the thread inside: its release waits)
            assert host_device.live_allocations == before + 500
    assert [str(w.message) for w in caught] == []
    assert host_device.live_allocations == before


def test_a_dropped_buffer_whose_copy_back_fails_still_frees_its_memory(host_device):
    gc.collect()
    before = host_device.live_allocations
    buf = shim.Buffer(np.zeros((8, 8), np.int32))
    buf.copy_to_device(host_device)
    buf.set_device_dirty()
    host_device.set_faults(fail_copy=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del buf
        gc.collect()
    assert any("failed" in str(w.message) for w in caught)
    assert host_device.live_allocations == before


def test_an_explicit_free_whose_copy_back_fails_keeps_the_data(host_device):
    buf = shim.Buffer(np.zeros((8, 8), np.int32))
    buf.copy_to_device(host_device)
    host_device.set_faults(fail_copy=1)
    buf.set_device_dirty()
    with pytest.raises(shim.DeviceError):
        buf.device_free()
    assert buf.has_device_allocation()  # the only copy of the results is still there
    host_device.clear_faults()
    buf.device_free()
    assert not buf.has_device_allocation()


# --- 16. making crops is linear in the number of crops ------------------------------------------

def test_creating_crops_costs_the_same_per_crop_however_many_exist(monkeypatch):
    calls = [0]
    original = regions.intersect

    def counting(a, b):
        calls[0] += 1
        return original(a, b)

    monkeypatch.setattr(regions, "intersect", counting)

    def cost(n):
        parent = shim.Buffer(np.zeros((n, 4), np.int32))
        calls[0] = 0
        crops = [parent.cropped([(0, 4), (i, 1)]) for i in range(n)]
        assert len(crops) == n
        return calls[0]

    small, large = cost(250), cost(1000)
    assert large <= 4 * small + 100  # linear (quadratic would be 16x)


# --- found by an adversarial pass over the fixes ------------------------------------------------

def test_two_calls_preparing_one_buffer_never_wait_for_each_other(gpu_paths):
    """Both calls find their input on the `host` device, which an OpenCL pipeline cannot use:
    each prepares it (brings it home, frees it) while the other's call holds it too."""
    done = run_script("""
        import sys, threading
        import numpy as np
        import shim
        brighten = shim.load(sys.argv[1])
        host = shim.device("host")
        host.set_faults(delay=0.01)
        image = np.ones((64, 64), np.float32)
        wrong = 0
        for _ in range(30):
            x = shim.Buffer(image.copy())
            x.copy_to_device(host)
            x.set_device_dirty()
            start = threading.Barrier(2)
            outs = []

            def call():
                start.wait()
                outs.append(brighten(x, scale=2.0, offset=1.0, output=(64, 64)).numpy())

            threads = [threading.Thread(target=call) for _ in range(2)]
            [t.start() for t in threads]
            [t.join() for t in threads]
            wrong += sum(not np.array_equal(out, image * 2 + 1) for out in outs) + 2 - len(outs)
        print("wrong", wrong)
        """, gpu_paths["brighten"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "wrong 0" in done.stdout


def test_a_buffer_that_is_input_and_output_of_one_call(gpu, opencl):
    five = np.full((8, 8), 5.0, np.float32)
    x = shim.Buffer(np.ones((8, 8), np.float32))
    x.copy_to_device(opencl)
    x.numpy()[...] = five
    x.set_host_dirty()
    gpu["brighten"](x, scale=2.0, offset=0.0, output=x)  # in place: reads the new host data
    np.testing.assert_array_equal(np.asarray(x), five * 2)

    parent = shim.Buffer(np.zeros((8, 16), np.float32))
    crop = parent.cropped([(0, 8), (0, 8)])
    twin = parent.cropped([(0, 8), (0, 8)])  # another Buffer over the same elements
    parent.copy_to_device(opencl)
    crop.numpy()[...] = five
    crop.set_host_dirty()
    gpu["brighten"](crop, scale=2.0, offset=0.0, output=crop)
    np.testing.assert_array_equal(np.asarray(parent)[:, :8], five * 2)
    twin.numpy()[...] = five
    twin.set_host_dirty()
    gpu["brighten"](twin, scale=2.0, offset=0.0, output=crop)
    np.testing.assert_array_equal(np.asarray(parent)[:, :8], five * 2)
    np.testing.assert_array_equal(np.asarray(parent)[:, 8:], 0)


def test_exported_memory_outlives_a_free_and_a_move(opencl, host_device):
    gc.collect()
    before = opencl.live_allocations
    x = shim.Buffer(np.arange(64, dtype=np.float32).reshape(8, 8))
    x.copy_to_device(opencl)
    capsule = x.__dlpack__(max_version=(1, 0), dl_device=(4, 0))  # kDLOpenCL: the device
    x.device_free()  # the capsule keeps the old memory
    x.copy_to_device(opencl)  # new memory for the Buffer
    x.copy_to_device(host_device)  # and a move, with the export still alive
    del capsule
    gc.collect()
    assert opencl.live_allocations == before
    np.testing.assert_array_equal(x.numpy(), np.arange(64).reshape(8, 8))


def test_exports_racing_device_free_raise_only_buffer_errors(opencl):
    x = shim.Buffer(np.zeros((16, 16), np.float32))
    x.copy_to_device(opencl)
    stop = threading.Event()
    exports = []
    outcomes = {"exported": 0, "refused": 0}

    def freer():
        while not stop.is_set():
            x.device_free()
            x.copy_to_device(opencl)

    def exporter():
        try:
            for _ in range(2000):
                try:
                    exports.append(x.__dlpack__(max_version=(1, 0), dl_device=(4, 0)))
                    outcomes["exported"] += 1
                except BufferError:
                    outcomes["refused"] += 1  # freed meanwhile: the standard's error
                exports.clear()
        finally:
            stop.set()

    run_threads(2, lambda i: exporter() if i == 0 else freer())
    # Every attempt ended one way or the other. An export that always failed would pass the
    # loop above too, and how many won their race depends on the scheduling: once the race
    # is over, an export succeeds.
    assert sum(outcomes.values()) == 2000
    exports.append(x.__dlpack__(max_version=(1, 0), dl_device=(4, 0)))
    exports.clear()


def test_ctrl_c_during_dlpack_exports_leaks_no_pins(opencl):
    done = run_script("""
        import _signal, gc, random, signal, threading, time
        import numpy as np
        import shim
        device = shim.device("opencl")
        before = device.live_allocations
        x = shim.Buffer(np.zeros((8, 8), np.float32))
        x.copy_to_device(device)
        # Starting pocl's device, LLVM put its own one-shot SIGINT handler (SA_RESETHAND) in
        # front of Python's: the first SIGINT uninstalls it and is passed on, but a second one
        # arriving meanwhile meets SIG_DFL and kills the process, silently. Python's again:
        signal.signal(signal.SIGINT, signal.getsignal(signal.SIGINT))
        main, stop = threading.main_thread().ident, threading.Event()

        def interrupter():
            while not stop.is_set():
                time.sleep(random.uniform(0, 0.0005))
                signal.pthread_kill(main, signal.SIGINT)

        # SIGINT reaches the main thread only inside the try, around the export and the
        # capsule's drop: a KeyboardInterrupt in this loop's own steps (its condition, the
        # except clause, starting or joining the sender) would end the script, not test the
        # shim. One sent meanwhile waits in the kernel until the next unblocking, which raises
        # it inside the try. (_signal's, not signal's: that one is a Python function, which
        # can take a KeyboardInterrupt on entry, before its mask is set.)
        held = {signal.SIGINT}
        _signal.pthread_sigmask(signal.SIG_BLOCK, held)
        sender = threading.Thread(target=interrupter, daemon=True)
        sender.start()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                try:
                    _signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
                    capsule = x.__dlpack__(max_version=(1, 0), dl_device=(4, 0))
                    del capsule
                finally:
                    _signal.pthread_sigmask(signal.SIG_BLOCK, held)  # (then runs the handler)
            except KeyboardInterrupt:
                pass
        stop.set()
        sender.join()
        gc.collect()
        x.device_free()
        del x
        gc.collect()
        print("leaked", device.live_allocations - before)
        """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "leaked 0" in done.stdout


def test_ctrl_c_at_the_start_of_a_dlpack_deleter_is_raised_after_it(opencl):
    """A deleter is Python called from C (here by a dropped capsule's destructor): Ctrl-C at its
    first bytecode, before any deferred() inside could be entered, once went to cffi, which
    printed and swallowed it, and left the tensor's pin for good. It waits until the deleter
    returns, and is raised there, in the code that dropped the capsule."""
    done = run_script("""
        import ctypes, gc
        import numpy as np
        import shim
        device = shim.device("opencl")
        before = device.live_allocations
        x = shim.Buffer(np.zeros((8, 8), np.float32))
        x.copy_to_device(device)
        capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                                        ctypes.c_void_p)(("PyCapsule_New", ctypes.pythonapi))
        set_interrupt = ctypes.cast(ctypes.pythonapi.PyErr_SetInterrupt, ctypes.c_void_p).value
        outcomes = []
        for version in [(1, 0), None] * 2:  # versioned and legacy capsules
            # A list drops its items last to first, all in C: the destructor of the last one
            # trips SIGINT (as a Ctrl-C arriving then would), so Python's handler runs at the
            # next bytecode: the first of the deleter that the capsule's destructor calls.
            items = [x.__dlpack__(max_version=version, dl_device=(4, 0)),
                     capsule_new(1, None, set_interrupt)]
            try:
                items.clear()
                outcomes.append("lost")
            except KeyboardInterrupt:
                outcomes.append("raised")
        gc.collect()
        print("interrupts", outcomes)
        x.device_free()
        del x
        gc.collect()
        print("leaked", device.live_allocations - before)
        """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "interrupts ['raised', 'raised', 'raised', 'raised']" in done.stdout, done.stderr[-3000:]
    assert "leaked 0" in done.stdout
    assert "cffi callback" not in done.stderr


@pytest.mark.parametrize("what", ["buffer", "crop", "dlpack import"])
def test_ctrl_c_at_a_finalizers_first_bytecode_is_raised_after_it(what, host_device):
    """A finalizer Ctrl-C cut short at its start would leave a dropped Buffer registered (and
    its device memory held), or an imported producer's tensor held, for good. The shim's
    finalizers run with Ctrl-C held from C: the KeyboardInterrupt comes after the finalizer."""
    if threading.current_thread() is not threading.main_thread():
        pytest.fail("signals land on the main thread: run this test there")
    from shim.exchange import dlpack_capsules
    from shim.memory import families
    from shim.buffers.buffer import Buffer

    signal.signal(signal.SIGINT, signal.getsignal(signal.SIGINT))  # (in front of pocl's)
    before = families.live_counts()
    array = np.arange(64, dtype=np.float32).reshape(8, 8)
    alive = weakref.ref(array)
    if what == "dlpack import":
        buf = shim.from_dlpack(array)
        code = dlpack_capsules.ImportedTensor._finalize.__code__
    else:
        buf = Buffer(array)
        if what == "crop":
            buf = buf.cropped([(2, 4), (2, 4)])  # (its parent goes now, the crop keeps its memory)
        code = Buffer._finalize.__code__
    buf.copy_to_device(host_device)  # device memory that must go
    buf.set_device_dirty(True)
    del array
    hook = OnEntry(code, lambda: signal.raise_signal(signal.SIGINT))
    interrupted = False
    try:
        with hook, warnings.catch_warnings():
            warnings.simplefilter("ignore", shim.DirtyBufferWarning)  # (the results go home)
            del buf
            gc.collect()
        time.sleep(0.1)  # (where a Ctrl-C held past the finalizer lands)
    except KeyboardInterrupt:
        interrupted = True
    assert hook.fired and interrupted
    gc.collect()
    assert families.live_counts() == before
    assert alive() is None  # the producer's tensor (or the Buffer's array) was let go


def test_a_child_forked_from_another_thread_holds_signal_handlers_on_its_main_thread():
    """In a child forked from a thread other than the main one, that thread is the child's main
    thread, where Python runs the handlers: the shim held them on the parent's main thread,
    which the child does not have, and a handler's exception could land inside the layer."""
    done = run_script("""
        import os, threading
        import shim
        from shim.native import interrupts

        def fork_here():
            pid = os.fork()
            if pid == 0:
                with interrupts.deferred():
                    inside = interrupts.held()
                os._exit(0 if inside and not interrupts.held() else 1)
            _, status = os.waitpid(pid, 0)
            print("child", os.waitstatus_to_exitcode(status))

        thread = threading.Thread(target=fork_here)
        thread.start()
        thread.join()
        """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "child 0" in done.stdout, done.stdout


@pytest.mark.parametrize("made", ["buffer", "crop"])
def test_a_buffer_whose_making_a_handler_interrupts_leaves_nothing_behind(made):
    """A handler's exception landing at any line of making a Buffer (or a crop) outside the
    layer's sections: once, between the struct joining its family and the Buffer getting the
    rest of what its finalizer reads, the finalizer failed ("Exception ignored ... has no
    attribute '_keepalive'") and the family's registry kept the struct for good."""
    if threading.current_thread() is not threading.main_thread():
        pytest.fail("signals land on the main thread: run this test there")
    from shim.memory import families
    from shim.buffers.buffer import Buffer

    parent = shim.Buffer(np.zeros((6, 8), np.int32))
    codes = {Buffer._init_from_array.__code__, Buffer._init_as_view.__code__}
    before, unraisable, interrupted = families.live_counts(), [], 0
    previous_signal = signal.signal(signal.SIGUSR1, raise_stop)
    previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        for nth in range(1, 60):
            lines = [0]

            def trace(frame, event, arg):
                if frame.f_code in codes:
                    if event == "line":
                        lines[0] += 1
                        if lines[0] == nth:
                            signal.raise_signal(signal.SIGUSR1)  # (its handler runs here)
                    return trace
                return None

            sys.settrace(trace)
            try:
                made_one = parent.cropped(0, 2, 4) if made == "crop" else \
                    Buffer(np.zeros((3, 5), np.float32))
                del made_one
            except Stop:
                interrupted += 1
            finally:
                sys.settrace(None)
            if lines[0] < nth:
                break  # (every line has been tried)
            gc.collect()
            assert families.live_counts() == before, f"interrupted at line {nth}"
    finally:
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGUSR1, previous_signal)
    assert interrupted > 5
    assert not unraisable, [str(u.exc_value) for u in unraisable]


def test_signals_a_handler_delivered_itself_are_not_delivered_again():
    """A section left with signals waiting delivers them; a signal landing just before (outside
    every section, so its handler runs at once) whose handler leaves a section of its own
    delivers them first. The outer delivery then finds none: found by an adversarial pass as
    a TypeError out of a result's first use under a 20 us timer."""
    from shim.native import interrupts

    ran = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: ran.append(signum))
    try:
        with interrupts.deferred():
            signal.raise_signal(signal.SIGUSR1)  # noted: the section holds it
            assert ran == []
            with interrupts.deferred():
                pass  # (inner: nothing delivered yet)
        assert ran == [signal.SIGUSR1]  # delivered as the section was left
        interrupts._deliver(sys._getframe())  # the caller who looked first, delivering after
        assert ran == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)
