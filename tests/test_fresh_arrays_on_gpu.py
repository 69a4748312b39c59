"""numpy arrays on a GPU pipeline, on the fast path (native_stubs/fast/fastcall.c, run.c): each
array becomes a struct on the stack, inputs are uploaded by the pipeline, outputs allocated,
and once it has run the outputs' results come back to the arrays and every struct's device
memory is freed, in C; where the backend serves allocations (devices/served.c) no Python
runs at all.

The general path (Pipeline._call_in_python: a temporary shim.Buffer per array, copied back,
then freed) is the implementation of record: results, exceptions and the driver's accounting
are compared with it, and with numpy, under faults, threads, Ctrl-C and fork.
"""

import gc
import shutil
import signal
import threading
import time
import warnings
import weakref

import numpy as np
import pytest

import shim
from shim.backends.base import BackendError
from shim.native import lib
from shim.pipelines.build import Build, build
from support.served import accounting, python_calls_during, served_live
from support.threads import run_threads

OPENCL = lib.SHIM_BACKEND_OPENCL


@pytest.fixture(scope="module")
def brighten(opencl):
    return shim.load(build(Build("brighten", "opencl", "no_runtime")))


@pytest.fixture
def serve(opencl):
    def switch(on: bool) -> None:
        lib.shim_serve_allocations(OPENCL, on)

    yield switch
    switch(True)


class Unchanged:
    """The device state a call on fresh arrays must leave as it found: nothing live, the
    driver's accounting constant."""

    def __init__(self, opencl):
        self.opencl = opencl
        self.live, self.served, self.accounting = (opencl.live_allocations, served_live(),
                                                   accounting(opencl))

    def check(self):
        assert self.opencl.live_allocations == self.live
        assert served_live() == self.served
        assert accounting(self.opencl) == self.accounting


def test_fresh_arrays_run_with_no_python_where_allocations_are_served(opencl, brighten, serve):
    rng = np.random.default_rng(1)
    for shape in ((64, 64), (1024, 1024), (3, 5)):
        image = rng.random(shape, dtype=np.float32)
        brighten(image, 2.0, 0.5, np.empty_like(image))  # the bounds query, once per shape
        unchanged = Unchanged(opencl)
        uploaded = opencl.transfers.uploaded
        for on in (True, False):
            serve(on)
            out = np.full_like(image, -1)
            ran = python_calls_during(lambda: brighten(image, 2.0, 0.5, out), "shim")
            np.testing.assert_allclose(out, image * 2 + 0.5, rtol=1e-6)
            if on:
                assert ran == set(), ran
            else:  # the Python core did the device work, for structs it never saw before
                assert "shim.core.runtime.copy_to_device" in ran, ran
                assert "shim.core.runtime.copy_to_host" in ran, ran
            unchanged.check()
        assert opencl.transfers.uploaded - uploaded == 2 * image.nbytes


@pytest.mark.parametrize("layout", ["strided input", "fortran input", "strided output",
                                    "in place", "keywords"])
def test_fresh_arrays_in_any_layout_give_numpys_result(opencl, brighten, serve, layout):
    """Layouts whose copies the served paths decline (gaps, another axis order) go through the
    Python core in the same call; the results are numpy's and nothing is left allocated."""
    rng = np.random.default_rng(2)
    wide = rng.random((40, 96), dtype=np.float32)
    image = {"strided input": wide[:, ::2], "fortran input": np.asfortranarray(wide[:, :48])}.get(
        layout, wide[:, :48].copy())
    expected = image * 3 + 1
    for attempt in range(3):  # the first call runs the bounds query on the general path
        unchanged = Unchanged(opencl)
        if layout == "strided output":
            target = np.zeros((40, 96), np.float32)
            out = target[:, 1::2]
            brighten(image, 3.0, 1.0, out)
            np.testing.assert_array_equal(target[:, ::2], 0)  # the gaps are untouched
        elif layout == "in place":
            out = image.copy()
            brighten(out, 3.0, 1.0, out)
        elif layout == "keywords":
            out = np.empty_like(image)
            assert brighten(input=image, output=out, offset=1.0, scale=3.0) is out
        else:
            out = np.empty(image.shape, np.float32)
            assert brighten(image, 3.0, 1.0, out) is out
        np.testing.assert_allclose(out, expected, rtol=1e-6)
        unchanged.check()


def fail_second(monkeypatch, backend, method: str):
    """The backend's ``method`` (write or read) fails from its second use on (as a driver
    that runs out of memory partway would); returns the count of failures."""
    original = getattr(backend, method)
    calls = []

    def failing(*args):
        calls.append(1)
        if len(calls) > 1:
            raise BackendError(f"injected {method} failure")
        return original(*args)

    monkeypatch.setattr(backend, method, failing)
    return calls


@pytest.mark.parametrize("method", ["write", "read"])
def test_a_failing_copy_fails_the_call_as_the_general_path_does_and_frees_everything(
        opencl, brighten, serve, monkeypatch, method):
    """With the Python core making the copies (serving off), an upload or a download that
    fails: the fast call and the general path raise the same DeviceError (type, code), the
    output keeps what it held where the download failed, and every allocation is freed (by
    the fast call at once: its structs die with it)."""
    image = np.random.default_rng(3).random((16, 24), dtype=np.float32)
    brighten(image, 2.0, 0.0, np.empty_like(image))
    serve(False)
    outcomes = []
    for call in ("fast", "general"):
        unchanged = Unchanged(opencl)
        calls = fail_second(monkeypatch, opencl, method)
        if method == "read":
            calls.append(1)  # the download is the first read: fail it
        else:
            brighten(image, 2.0, 0.0, np.empty_like(image))  # one upload: the second fails
        out = np.full_like(image, 7)
        entry = brighten if call == "fast" else brighten._call_in_python
        with pytest.raises(shim.DeviceError) as failure:
            entry(image, 2.0, 0.0, out)
        outcomes.append((type(failure.value), failure.value.code))
        assert f"injected {method} failure" in str(failure.value)
        if method == "read":
            np.testing.assert_array_equal(out, 7)
        monkeypatch.undo()
        # The general path's temporary Buffer, whose free failed to bring the results home
        # too, keeps the memory until it is collected (the traceback holds it), and says so.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            del failure
            gc.collect()
        unchanged.check()
        again = np.empty_like(image)
        brighten(image, 2.0, 0.0, again)  # and the next call works
        np.testing.assert_allclose(again, image * 2, rtol=1e-6)
    assert outcomes[0] == outcomes[1], outcomes


def test_threads_calling_with_fresh_arrays_get_their_own_results(opencl, brighten, serve):
    """Threads each calling with new arrays of their own (two shapes, so that served and pooled
    memory keeps changing hands), one of them switching serving on and off: every result is
    its own input's, and nothing is left allocated."""
    shapes = [(32, 48), (48, 32)]
    for shape in shapes:
        brighten(np.zeros(shape, np.float32), 1.0, 0.0, np.empty(shape, np.float32))
    unchanged = Unchanged(opencl)
    stop = threading.Event()

    def caller(k):
        rng = np.random.default_rng(10 + k)
        for i in range(60):
            image = rng.random(shapes[(i + k) % 2], dtype=np.float32)
            out = np.empty_like(image)
            brighten(image, 1.5, float(k), out)
            np.testing.assert_allclose(out, image * 1.5 + k, rtol=1e-6)

    def switcher():
        on = True
        while not stop.is_set():
            on = not on
            serve(on)
            time.sleep(0.001)
        serve(True)

    run_threads(4, caller)
    switch_thread = threading.Thread(target=switcher)
    switch_thread.start()
    try:
        run_threads(3, caller)
    finally:
        stop.set()
        switch_thread.join()
    unchanged.check()


def test_ctrl_c_at_random_during_fresh_array_calls_leaves_nothing_allocated(opencl, brighten):
    """SIGINT at random moments during calls on fresh arrays: every interrupt comes through as
    KeyboardInterrupt after a call that ran has written its output (signal handlers wait
    for the call: calls/signals_held.h), and no device memory is left behind."""
    image = np.random.default_rng(4).random((64, 64), dtype=np.float32)
    brighten(image, 2.0, 0.0, np.empty_like(image))
    unchanged = Unchanged(opencl)
    main = threading.main_thread().ident
    stop, go = threading.Event(), threading.Event()

    def interrupter():
        r = np.random.default_rng(5)
        go.wait()
        while not stop.is_set():
            time.sleep(float(r.uniform(0.0005, 0.004)))
            signal.pthread_kill(main, signal.SIGINT)

    thread = threading.Thread(target=interrupter)
    thread.start()
    interrupted, outputs = 0, []
    deadline = time.monotonic() + 3
    try:
        go.set()
        while time.monotonic() < deadline and len(outputs) < 3000:
            try:  # (the interrupt may land anywhere here)
                outputs.append(np.zeros_like(image))
                brighten(image, 2.0, 0.0, outputs[-1])
            except KeyboardInterrupt:
                interrupted += 1
    finally:
        stop.set()
        go.set()
        while thread.is_alive():
            try:
                thread.join(10)
            except KeyboardInterrupt:
                continue
        for _ in range(50):  # (an interrupt still on its way lands here)
            try:
                time.sleep(0.01)
            except KeyboardInterrupt:
                pass
    # Each output is whole: untouched (interrupted before the call began), or the call's result.
    ran = [out[0, 0] != 0 for out in outputs]
    for out, whole in zip(outputs, ran):
        np.testing.assert_allclose(out, image * 2 if whole else 0, rtol=1e-6)
    assert interrupted > 0 and sum(ran) > 0
    unchanged.check()


def test_a_first_call_whose_kernel_compile_fails_raises_and_keeps_nothing(opencl, monkeypatch,
                                                                         tmp_path):
    """Generated code initializes its GPU kernels before it answers a bounds query, so the
    fast path's query of a new shape can fail in a device callback. It raises what the general
    path raises, and the failure keeps nothing alive: no exception left waiting for a call that
    would take it (its traceback would hold the call's frames, and their Buffers' device
    memory, for good). Found by benchmarks/soak.py."""
    path = build(Build("brighten", "opencl", "no_runtime"))
    image = np.random.default_rng(6).random((24, 40), dtype=np.float32)

    def failing(source):
        raise BackendError("injected compile failure")

    monkeypatch.setattr(opencl, "module", failing)

    def first_call(entry):
        """The call in a frame of its own, which ends holding the Buffer (as a caller's frame
        would): whatever keeps the frame keeps the Buffer."""
        # A copy of the library: its kernels not initialized in this process yet, and its own
        # cache of shapes, to which this one is new.
        copy = tmp_path / f"{entry}.so"
        shutil.copyfile(path, copy)
        pipeline = shim.load(copy)
        source = shim.Buffer(image.copy())
        source.copy_to_device(opencl)
        call = pipeline if entry == "fast" else pipeline._call_in_python
        try:
            call(source, 2.0, 0.0, np.empty_like(image))
        except shim.DeviceError as e:
            return (type(e), e.code, str(e)), weakref.ref(source)
        raise AssertionError(f"{entry}: no DeviceError")

    outcomes = []
    for entry in ("fast", "general"):
        outcome, kept = first_call(entry)
        outcomes.append(outcome)
        gc.collect()
        assert kept() is None, f"{entry}: the failed call's Buffer is still referenced"
    assert "injected compile failure" in outcomes[0][2]
    assert outcomes[0] == outcomes[1]
