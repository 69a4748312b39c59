"""shim.profile: what it records from real pipelines (on PoCL's OpenCL device and the simulated
host device), its counts against counts made independently of it, and the structure of the
Chrome trace it writes."""

import json
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import shim
from shim.pipelines.build import Build, build
from shim.native import ffi, lib


@pytest.fixture(scope="module")
def gpu(opencl):
    """name -> an OpenCL pipeline (built once)."""
    names = ["brighten", "blur3x3", "async_gpu_to_cpu"]
    return {name: shim.load(build(Build(name, "opencl", "no_runtime"))) for name in names}


@pytest.fixture
def host_device():
    device = shim.device("host")
    yield device
    device.clear_faults()


def test_a_gpu_pipeline_call_is_recorded_with_its_runtime_calls_and_launches(gpu):
    image = np.random.default_rng(0).random((48, 64), dtype=np.float32)
    gpu["brighten"](image, scale=2.0, offset=0.0, output=image.shape).numpy()  # compiled
    with shim.profile() as prof:
        out = gpu["brighten"](image, scale=2.0, offset=0.0, output=image.shape)
        out.numpy()
    [call] = prof.calls("brighten")
    assert call.kind == "pipeline" and call.thread == threading.get_native_id()
    [launch] = [r for r in prof.records if r.kind == "launch"]
    assert launch.parent == call.id and launch.call == call.id
    assert launch.name.startswith("_kernel_output")
    blocks, threads = launch.launch["blocks"], launch.launch["threads"]
    assert blocks[0] * threads[0] >= 64 and blocks[1] * threads[1] >= 48
    assert launch.device_ns is not None and launch.device_ns >= 0
    assert launch.device_track.startswith("OpenCL queue")
    [upload] = [r for r in prof.calls("copy_to_device") if r.bytes]
    assert upload.bytes == image.nbytes and upload.buffer.shape == image.shape
    assert upload.buffer.dtype == "float32" and upload.parent == call.id
    [download] = prof.calls("copy_to_host")
    assert download.bytes == image.nbytes and download.parent is None  # out.numpy(), after
    for record in prof.records:  # children lie inside their parents
        if record.parent is not None:
            parent = next(r for r in prof.records if r.id == record.parent)
            assert parent.start_ns <= record.start_ns
            assert record.start_ns + record.duration_ns <= parent.start_ns + parent.duration_ns


def test_a_second_call_makes_no_uploads(gpu, opencl):
    image = shim.Buffer(np.ones((48, 64), np.float32))
    image.copy_to_device(opencl)
    with gpu["brighten"].prepare(image, scale=2.0, offset=0.0, output=(48, 64)) as call:
        call().numpy()
        with shim.profile() as prof:
            result = call()
    result.numpy()
    assert sum(r.bytes for r in prof.records if r.name == "upload") == 0
    assert prof.decided_in_c["copy_to_device"]["noop"] >= 1  # the input, decided in C
    assert len([r for r in prof.records if r.kind == "launch"]) == 1


def test_counts_match_an_independent_count(host_device):
    buf = shim.Buffer(np.zeros((8, 8), np.int32))
    buf.copy_to_device(host_device)
    interface = lib.shim_backend_interface(host_device.index)
    noops, uploads = 25, 4
    with shim.profile() as prof:
        for _ in range(noops):  # already there and current: decided in C
            assert lib.halide_copy_to_device(ffi.NULL, buf.raw, interface) == 0
        for _ in range(uploads):
            buf.set_host_dirty()
            buf.copy_to_device()
    assert prof.decided_in_c["copy_to_device"] == {"noop": noops, "foreign": 0, "refused": 0,
                                                   "served": 0}
    assert len(prof.calls("copy_to_device")) == uploads
    assert prof.count("copy_to_device") == noops + uploads
    assert sum(r.bytes for r in prof.calls("copy_to_device")) == uploads * buf.numpy().nbytes
    row = next(line.split() for line in prof.summary().splitlines()
               if line.startswith("copy_to_device "))
    assert row[1:4] == [str(noops + uploads), str(noops), "0"]


def test_refused_and_failed_calls_count_as_errors(host_device):
    buf = shim.Buffer(np.zeros(4, np.float32))
    with shim.profile() as prof:
        host_device.set_faults(fail_copy=1)
        with pytest.raises(shim.DeviceError):
            buf.copy_to_device(host_device)
        lib.shim_flags_assign(buf.raw, lib.halide_buffer_flag_device_dirty, True)  # both dirty
        assert lib.halide_copy_to_host(ffi.NULL, buf.raw) != 0
        lib.shim_flags_assign(buf.raw, lib.halide_buffer_flag_device_dirty, False)
    [failed] = prof.calls("copy_to_device")
    assert failed.result == lib.halide_error_code_copy_to_device_failed
    assert prof.decided_in_c["copy_to_host"]["refused"] == 1
    row = next(line.split() for line in prof.summary().splitlines()
               if line.startswith("copy_to_device "))
    assert row[-1] == "1"


ROUNDS_UNTIL_A_WORKER_CALLS = 20


def test_calls_from_worker_threads_belong_to_their_pipeline_call(gpu, opencl):
    image = (np.arange(64 * 70) % 997).astype(np.int32).reshape(64, 70)
    shared = shim.Buffer(image)
    shared.copy_to_device(opencl)
    gpu["async_gpu_to_cpu"](shared, output=image.shape).numpy()

    def profiled_round():
        """(The callers' thread ids, the profile of 20 calls from two threads at once.)"""
        callers = set()

        def caller():  # two callers keep the pool busy enough to hand stages to workers
            callers.add(threading.get_native_id())
            for _ in range(10):
                gpu["async_gpu_to_cpu"](shared, output=image.shape).numpy()

        with shim.profile() as prof:
            threads = [threading.Thread(target=caller) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        return callers, prof

    # Whether Halide hands a stage to a worker at all is the scheduler's choice (on a loaded
    # machine the callers can run every task themselves): rounds until one did, each checked.
    for _ in range(ROUNDS_UNTIL_A_WORKER_CALLS):
        callers, prof = profiled_round()
        calls = {r.id: r for r in prof.records if r.kind == "pipeline"}
        assert len(calls) == 20
        work = [r for r in prof.records if r.kind != "pipeline" and r.name != "device_free"]
        for record in work:  # (device_free: the shim's temporaries, after the call returned)
            # Any thread may work for a call (a caller waiting on its own call runs the
            # other's tasks too); what it worked for happened while that call ran.
            call = calls[record.call]
            assert call.start_ns <= record.start_ns
            assert record.start_ns + record.duration_ns <= call.start_ns + call.duration_ns
        if any(r.thread not in callers for r in work):
            break
    else:
        pytest.fail(f"no call from Halide's worker threads in {ROUNDS_UNTIL_A_WORKER_CALLS} rounds")


def test_nothing_is_recorded_outside_a_profile(gpu, host_device):
    prof = shim.profile().start()
    with pytest.raises(shim.ShimError, match="another profile"):
        shim.profile().start()
    prof.stop()
    with pytest.raises(shim.ShimError, match="not recording"):
        prof.stop()
    recorded = len(prof.records)
    buf = shim.Buffer(np.zeros(4, np.float32))
    buf.copy_to_device(host_device)
    buf.copy_to_device(host_device)
    assert len(prof.records) == recorded
    assert lib.shim_profile_count(lib.SHIM_FN_COPY_TO_DEVICE, lib.SHIM_OUTCOME_NOOP) == 0


# --- the Chrome trace -------------------------------------------------------------------------

def check_nesting(events):
    """Slices on one track must nest: each starts after the enclosing one and ends inside it."""
    by_track = {}
    for e in events:
        if e["ph"] == "X":
            by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    for track, slices in by_track.items():
        stack = []
        for e in sorted(slices, key=lambda e: (e["ts"], -e["dur"])):
            end = e["ts"] + e["dur"]
            while stack and stack[-1] <= e["ts"] + 1e-6:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-6, f"partial overlap on {track}: {e}"
            stack.append(end)
    return by_track


def test_the_trace_of_a_multi_stage_gpu_run_is_well_formed(gpu, opencl, tmp_path):
    pixels = np.random.default_rng(1).integers(0, 1 << 16, size=(66, 70), dtype=np.uint16)
    frames = (np.arange(64 * 70) % 997).astype(np.int32).reshape(64, 70)
    with shim.profile() as prof:
        blurred = gpu["blur3x3"](pixels, output=(64, 68))
        gpu["async_gpu_to_cpu"](frames, output=frames.shape)
        blurred.numpy()
    path = prof.save_trace(tmp_path / "trace.json")
    trace = json.loads(open(path).read())
    events = trace["traceEvents"]
    assert trace["displayTimeUnit"] == "ns"
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    by_track = check_nesting(events)
    for track in by_track:
        assert track in names, f"track {track} has no name"
    host = [e for e in events if e["ph"] == "X" and e["pid"] == 1]
    assert sorted(e["args"]["record"] for e in host) == [r.id for r in prof.records]
    device = [e for e in events if e["ph"] == "X" and e["pid"] == 2]
    assert {e["name"] for e in device} >= {r.name for r in prof.records if r.kind == "launch"}
    assert any(names[e["pid"], e["tid"]].startswith("OpenCL queue") for e in device)
    for e in host:
        record = next(r for r in prof.records if r.id == e["args"]["record"])
        if record.kind == "copy":
            assert e["args"]["bytes"] == record.bytes > 0
    starts = {e["id"] for e in events if e["ph"] == "s"}
    assert starts and starts == {e["id"] for e in events if e["ph"] == "f"}
    counters = [e for e in events if e["ph"] == "C"]
    assert counters and all(e["args"]["bytes"] >= 0 for e in counters)
    assert any(e["args"]["bytes"] > 0 for e in counters)


def test_calls_without_a_buffer_are_recorded(host_device):
    buf = shim.Buffer(np.zeros(4, np.float32))
    buf.copy_to_device(host_device)
    with shim.profile() as prof:
        buf.device_sync()  # halide_device_sync_global: the backend's sync, no buffer
    [sync] = prof.calls("device_sync")
    assert sync.buffer is None and sync.backend == "host" and sync.result == 0


@pytest.fixture(scope="module")
def traced_blur():
    """The sample 3x3 blur built with Halide's trace_realizations feature."""
    return shim.load(build(Build("blur3x3", features=("trace_realizations",))))


def _blur_once(pipeline):
    return pipeline(np.zeros((18, 18), np.uint16), output=(16, 16))


def test_a_start_that_fails_leaves_halides_tracing_as_it_was(traced_blur, monkeypatch, capfd):
    from shim.profiling import profiler

    class Failing:
        """The native library, but resetting the profile's counts fails."""

        def __getattr__(self, name):
            return getattr(lib, name)

        def shim_profile_reset(self):
            raise KeyboardInterrupt

    monkeypatch.setattr(profiler, "lib", Failing())
    failed = shim.profile()
    with pytest.raises(KeyboardInterrupt):
        failed.start()
    monkeypatch.undo()
    capfd.readouterr()
    _blur_once(traced_blur)  # outside any profile: Halide prints its trace, as before
    printed = capfd.readouterr().err
    assert "Begin realization blur_x" in printed and "End realization blur_x" in printed
    with shim.profile() as prof:  # and the next profile starts and records
        _blur_once(traced_blur)
    assert [r.name for r in prof.records if r.kind == "realization"].count("blur_x") == 1
    with pytest.raises(shim.ShimError):
        failed.stop()  # (it never recorded)


def test_a_child_forked_while_another_thread_stops_a_profile_can_profile(traced_blur):
    import os

    from shim.profiling import profiler

    held = threading.Event()
    release = threading.Event()

    def hold_the_start_lock():
        with profiler._start_lock:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold_the_start_lock)
    holder.start()
    held.wait()
    pid = os.fork()
    if pid == 0:  # the child: the lock's holder does not exist here
        try:
            with shim.profile() as prof:
                _blur_once(traced_blur)
            os._exit(0 if any(r.kind == "realization" for r in prof.records) else 1)
        except BaseException:
            os._exit(2)
    release.set()
    holder.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_ctrl_c_during_the_start_of_a_profile_leaves_nothing_recording(traced_blur, monkeypatch):
    """A Ctrl-C arriving while ``with shim.profile():`` starts the profile is held until the
    start's section ends, once the profile records: raised there, out of __enter__, it left
    the profile recording for the rest of the process (``with`` never runs __exit__), every
    later shim.profile() refused and every call recorded without bound."""
    if threading.current_thread() is not threading.main_thread():
        pytest.fail("signals land on the main thread: run this test there")
    from shim.profiling import halide_trace

    start = halide_trace.start

    def start_then_ctrl_c(*args):
        start(*args)
        signal.raise_signal(signal.SIGINT)  # (its handler runs at the next bytecode)

    monkeypatch.setattr(halide_trace, "start", start_then_ctrl_c)
    interrupted = shim.profile()
    with pytest.raises(KeyboardInterrupt):
        with interrupted:
            pytest.fail("the body ran")
    monkeypatch.undo()
    _blur_once(traced_blur)
    assert interrupted.records == []
    with shim.profile() as prof:  # another profile starts, and records
        _blur_once(traced_blur)
    assert [r.name for r in prof.records if r.kind == "pipeline"] == ["blur3x3"]


def test_ctrl_c_at_random_around_profiles_leaves_none_recording():
    """The same, with real Ctrl-Cs landing anywhere around ``with shim.profile():``."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import random, signal, threading, time
        import numpy as np
        import shim
        from shim.pipelines.build import Build, build

        blur = shim.load(build(Build("blur3x3", "host", "bundled")))
        image = np.zeros((18, 18), np.uint16)
        # Once before the Ctrl-Cs: the output's shape is then known, and the last profile holds
        # the call alone, even where a slow machine let no call finish between two signals
        # (a new shape's bounds query is a record of its own).
        blur(image, output=(16, 16))
        main, stop, landed = threading.main_thread().ident, threading.Event(), 0
        go = threading.Event()

        def sender():
            go.wait()  # (not before the main thread is inside the try below)
            while not stop.is_set():
                time.sleep(random.uniform(0, 0.0005))
                signal.pthread_kill(main, signal.SIGINT)

        thread = threading.Thread(target=sender, daemon=True)
        thread.start()
        deadline = time.monotonic() + 2
        while True:
            try:
                go.set()
                while time.monotonic() < deadline:
                    try:
                        with shim.profile():
                            blur(image, output=(16, 16))
                    except KeyboardInterrupt:
                        landed += 1
                stop.set()
                thread.join()
                time.sleep(0.05)  # (the last one sent)
                break
            except KeyboardInterrupt:
                landed += 1
        with shim.profile() as prof:  # refused if one was left recording
            blur(image, output=(16, 16))
        print("landed", landed, "recorded", len([r for r in prof.records if r.kind == "pipeline"]))
        """)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    landed, recorded = done.stdout.split()[1::2]
    assert int(landed) > 0 and recorded == "1", done.stdout


def test_stopping_profiles_on_one_thread_never_fails_a_call_on_another(opencl):
    """A stop reads every record's device markers and closes their clocks while other
    threads' copies and launches are still making theirs: a copy failed with DeviceError
    (-14, -15: "'NoneType' object has no attribute 'after'") and the launch hook's exception
    was printed by cffi. (A short switch interval makes the threads trade places often.)"""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import random, sys, threading, time
        import numpy as np
        import shim
        from shim.pipelines.build import Build, build

        sys.setswitchinterval(1e-5)
        device = shim.device("opencl")
        brighten = shim.load(build(Build("brighten", "opencl", "no_runtime")))
        errors, stop = [], threading.Event()

        def worker(seed):
            buf = shim.Buffer(np.full((64, 64), seed, np.float32))
            while not stop.is_set():
                try:
                    buf.set_host_dirty()
                    buf.copy_to_device(device)
                    buf.set_device_dirty()
                    buf.copy_to_host()
                    out = brighten(buf, scale=2.0, offset=0.0, output=(64, 64))
                    if not (out.numpy() == 2.0 * seed).all():
                        errors.append("wrong result")
                except Exception as e:
                    errors.append(repr(e))
                    stop.set()

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        deadline, rounds = time.monotonic() + 3, 0
        while time.monotonic() < deadline and not stop.is_set():
            prof = shim.profile().start()
            time.sleep(random.uniform(0, 0.002))
            prof.stop()
            rounds += 1
        stop.set()
        for thread in threads:
            thread.join()
        print("rounds", rounds, "errors", errors[:3])
        """)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "errors []" in done.stdout, done.stdout
    assert "Exception ignored" not in done.stderr, done.stderr[-3000:]


def test_a_buffer_dropped_inside_the_recording_of_a_call_is_released_after_it():
    """A dropped Buffer's finalizer runs wherever its thread is when the last reference goes:
    the collector can run it inside a profile's lock, held while a call is recorded, and its
    release is recorded too. The soak hung so: that thread waited for the lock it held, and
    every other thread for it. Here the last reference goes at that very point."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import numpy as np
        import shim
        from shim.profiling import profiler

        device = shim.device("host")
        before = device.live_allocations
        victim = [shim.Buffer(np.zeros((4, 4), np.float32))]
        victim[0].copy_to_device(device)
        recording = profiler.Profile._buffer_info

        def dropping_the_victim(self, raw):  # (runs with the profile's lock held)
            if victim:
                victim.pop()
                print("dropped inside the lock, allocations", device.live_allocations - before)
            return recording(self, raw)

        profiler.Profile._buffer_info = dropping_the_victim
        other = shim.Buffer(np.ones((4, 4), np.float32))
        with shim.profile() as prof:
            other.copy_to_device(device)
        print("allocations after", device.live_allocations - before)
        print("device frees recorded", prof.count("device_free"))
        """)], capture_output=True, text=True, timeout=120)  # (a hang guard)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    # The victim's memory is given back once the recording thread is out of the lock, and the
    # other Buffer's is what is left.
    assert lines == ["dropped inside the lock, allocations 1", "allocations after 1",
                     "device frees recorded 1"], done.stdout
