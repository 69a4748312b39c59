"""An adversarial pass over the C fast paths of a pipeline call (native_stubs/fast/fastcall.c, a
plain call; native_stubs/fast/prepared_call.c, a prepared call's run; native_stubs/fast/call_records.c,
their records in the Buffers' families). They must behave exactly as the Python general path
does, except for speed, also when they are attacked: Ctrl-C landing in the Python they call
back, calls made from inside their bookkeeping (a finalizer), objects initialized twice,
prints past the cap, reference counts over many calls, subclasses, aliasing arguments,
threads changing the Buffers a call uses."""

import gc
import signal
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import shim
from shim.pipelines.build import Build, build_all
from shim.core import call_uses
from shim.memory import families
from shim.native import interrupts
from shim.core import runtime
from shim.native import PreparedRun
from support.budget import scaled
from support.hooks import OnEntry


def general(pipeline, args, kwargs):
    """The general path: what the fast path must match."""
    with pipeline.prepare(*args, **kwargs) as call:
        return call._run_in_python()


class Counting:
    """Counts the plain calls of ``pipeline`` the fast path declined (the general path took)."""

    def __init__(self, pipeline):
        self.pipeline, self.declined = pipeline, 0
        self._general = pipeline._call_in_python
        pipeline._call_in_python = self._declining

    def _declining(self, *args, **kwargs):
        self.declined += 1
        return self._general(*args, **kwargs)


# --- contention: a call whose end goes through call_uses.end_call --------------------------------

class Contender:
    """A thread that waits until a pipeline call uses ``buf`` and then marks it host-dirty,
    which waits for the call writing it: the call's end then finds a thread waiting on the
    family (or holding its lock) and ends its use through call_uses.end_call, in Python."""

    def __init__(self, buf):
        self.buf, self.stop, self.marked = buf, threading.Event(), False
        self.errors = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        family = self.buf.family
        try:
            while not family.uses and not self.stop.is_set():
                time.sleep(0.0001)
            if not self.stop.is_set():
                self.buf.set_host_dirty(True)
                self.marked = True
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.errors.append(e)

    def join(self, timeout=10.0):
        self.stop.set()
        self.thread.join(timeout)
        return not self.thread.is_alive()


def release_leftover_uses(*buffers):
    """Test hygiene after a failure: uses a broken call left would make threads wait forever."""
    for buf in buffers:
        family = buf.family
        with family.lock:
            family.uses.clear()
            family.lock.notify_all()


def slow_sqrt_image(rows=1500, columns=1500, negative_row=None):
    image = np.full((rows, columns), 4.0, np.float32)
    if negative_row is not None:
        image[negative_row, 7] = -1.0
    return image


# --- Ctrl-C inside the fast paths' callbacks -----------------------------------------------

@pytest.fixture
def shim_sigint():
    if not interrupts.defers(signal.SIGINT):
        pytest.fail("the shim does not hold SIGINT's handler inside the device layer")
    if threading.current_thread() is not threading.main_thread():
        pytest.fail("signals land on the main thread: run this test there")


@pytest.mark.parametrize("prepared", [False, True], ids=["plain", "prepared"])
def test_ctrl_c_as_end_call_starts_leaves_no_use_behind(load, shim_sigint, prepared):
    """SIGINT landing as the fast path's call of call_uses.end_call begins (before its
    ``interrupts.deferred()``) must not leave the call's use recorded: every later operation
    on the Buffer would wait for it forever. The Python run ends its uses with Ctrl-C
    deferred; the C runs must too, and raise KeyboardInterrupt once the call is over."""
    cpu_heavy = load("cpu_heavy")
    image = np.random.default_rng(5).random((64, 64), dtype=np.float32)
    inp, out = shim.Buffer(image), shim.Buffer(np.zeros_like(image))
    cpu_heavy(inp, rounds=2000, output=out)  # the shape is known: the calls below are fast
    run = cpu_heavy.prepare(inp, rounds=2000, output=out) if prepared else None
    try:
        for _ in range(20):
            contender = Contender(out)
            hook = OnEntry(call_uses.end_call.__code__, lambda: signal.raise_signal(signal.SIGINT))
            interrupted = False
            try:
                with hook:
                    if prepared:
                        run()
                    else:
                        cpu_heavy(inp, rounds=2000, output=out)
                if hook.fired:
                    time.sleep(1.0)  # (where a Ctrl-C held for the end of the call lands)
            except KeyboardInterrupt:
                interrupted = True
            stuck = out.family.uses[:]
            if stuck:
                release_leftover_uses(out)
            assert contender.join(), "a thread waited forever on a use nobody ends"
            assert stuck == []
            assert not contender.errors, contender.errors
            assert interrupted == hook.fired
            if hook.fired:
                break
        else:
            pytest.skip("the contender never caught the call in flight")
    finally:
        if run is not None:
            run.close()
    np.testing.assert_array_equal(out.numpy(), general(cpu_heavy, (inp, 2000, out), {}).numpy())


# --- a call made from inside another's bookkeeping ------------------------------------------

@pytest.mark.parametrize("prepared", [False, True], ids=["plain", "prepared"])
def test_a_call_nested_in_the_end_of_a_call_keeps_its_report(load, prepared):
    """Python code running while a fast call ends its uses (a finalizer, collected then) may
    call a pipeline on the same thread. The outer call's errors and prints must still be its
    own: the general path gives a nested call its own call context."""
    checked_sqrt, brighten = load("checked_sqrt"), load("brighten")
    small = np.ones((4, 4), np.float32)
    small_out = np.empty_like(small)
    brighten(small, 2.0, 1.0, small_out)  # known: the nested call is a fast one

    def nested():
        brighten(small, 2.0, 1.0, small_out)

    image = slow_sqrt_image(negative_row=1234)
    inp, out = shim.Buffer(image), shim.Buffer(np.zeros_like(image))
    with pytest.raises(shim.PipelineError) as expected:
        general(checked_sqrt, (inp, False, out), {})
    run = checked_sqrt.prepare(inp, False, out) if prepared else None
    try:
        for _ in range(20):
            contender = Contender(out)
            hook = OnEntry(call_uses.end_call.__code__, nested)
            with pytest.raises(shim.PipelineError) as failure:
                with hook:
                    if prepared:
                        run()
                    else:
                        checked_sqrt(inp, False, out)
            assert contender.join()
            assert (failure.value.code, str(failure.value)) == (expected.value.code,
                                                                 str(expected.value))
            if hook.fired:
                break
        else:
            pytest.skip("the contender never caught the call in flight")
    finally:
        if run is not None:
            run.close()
    assert out.family.uses == []


def test_a_call_nested_in_the_end_of_a_call_keeps_its_prints(load, capfd):
    checked_sqrt, brighten = load("checked_sqrt"), load("brighten")
    small = np.ones((4, 4), np.float32)
    small_out = np.empty_like(small)
    brighten(small, 2.0, 1.0, small_out)
    image = slow_sqrt_image(rows=1000)
    inp, out = shim.Buffer(image), shim.Buffer(np.zeros_like(image))
    checked_sqrt(inp, True, out)
    capfd.readouterr()
    for _ in range(20):
        contender = Contender(out)
        hook = OnEntry(call_uses.end_call.__code__, lambda: brighten(small, 2.0, 1.0, small_out))
        with hook:
            checked_sqrt(inp, True, out)
        assert contender.join()
        printed = capfd.readouterr().err
        assert printed.count("row") == 1000
        if hook.fired:
            break
    else:
        pytest.skip("the contender never caught the call in flight")


def test_a_call_nested_in_a_device_callback_of_a_fast_call(load, opencl_brighten):
    """An OpenCL pipeline's device callbacks are Python, run on the calling thread while the
    pipeline runs; a call made there (by a finalizer, say) must get its own call context, as
    on the general path. Sharing the outer call's context, it ended the outer call's 'inside a
    pipeline' state, and the outer call's next device callback waited for the outer call
    itself: a hang."""
    times_k = load("times_k")
    small = np.ones((4, 4), np.float32)
    small_out = np.empty_like(small)
    times_k(small, 2.0, small_out)
    image = np.random.default_rng(6).random((16, 16), dtype=np.float32)
    opencl_brighten(image, 2.0, 0.5, shim.Buffer(np.zeros_like(image))).numpy()
    inp, out = shim.Buffer(image), shim.Buffer(np.zeros_like(image))
    outcome = []

    def outer():
        try:
            with OnEntry(runtime.copy_to_device.__code__, lambda: times_k(small, 2.0, small_out)) as hook:
                opencl_brighten(inp, 2.0, 0.5, out)
            outcome.append(hook.fired)
        except BaseException as e:  # noqa: BLE001 - reported below
            outcome.append(e)

    thread = threading.Thread(target=outer, daemon=True)
    thread.start()
    thread.join(20)
    hung = thread.is_alive()
    if hung:
        release_leftover_uses(inp, out)
        thread.join(20)
    assert not hung, "the outer call waited for itself"
    assert outcome == [True]
    np.testing.assert_array_equal(out.numpy(), image * np.float32(2) + np.float32(0.5))
    np.testing.assert_array_equal(small_out, small * 2)


# --- prints past the cap --------------------------------------------------------------------

def test_prints_past_the_cap_say_so_on_the_fast_path_too(load, capfd):
    """A call printing more than the call context keeps (8 MiB) ends its prints with a note
    of what was dropped, on the general path; the fast path must say the same."""
    checked_sqrt = load("checked_sqrt")
    image = np.full((600_000, 1), 4.0, np.float32)  # one "2.000000 row N" line a row: > 8 MiB
    out = np.empty_like(image)
    general(checked_sqrt, (image, True, out), {})
    slow = capfd.readouterr().err
    counting = Counting(checked_sqrt)
    checked_sqrt(image, True, out)
    fast = capfd.readouterr().err
    assert counting.declined == 0
    assert "more bytes of print output were dropped" in slow
    assert fast.splitlines()[-1] == slow.splitlines()[-1]
    assert len(fast) == len(slow)


# --- objects made twice ----------------------------------------------------------------------

def test_a_prepared_call_made_twice_keeps_its_arguments(load):
    """PreparedCall.__init__ called again (with another call's arguments) is refused, and
    leaves the call as it was: its C run and its Python run still run the same arguments
    (the C run holds pointers into the first arguments' memory)."""
    times_k = load("times_k")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    out1, out2 = shim.Buffer(np.zeros_like(a)), shim.Buffer(np.zeros_like(a))
    call = times_k.prepare(a, 2.0, out1)
    other = times_k.prepare(a, 5.0, out2)
    with pytest.raises(TypeError, match="made once"):
        call.__init__(other._runner, other._call)
    other.close()
    del other
    gc.collect()
    with call:
        assert call() is out1
        np.testing.assert_array_equal(out1.numpy(), a * 2)
        assert call._run_in_python() is out1
        np.testing.assert_array_equal(out1.numpy(), a * 2)
    np.testing.assert_array_equal(out2.numpy(), 0)


def test_a_pipeline_made_twice_stays_the_first_pipeline(host_pipelines):
    """Pipeline.__init__ called again (with another library) is refused before it changes
    anything: the fast path (the CallPlan, made once) and the general path (the Pipeline's
    Python state) must keep running the same pipeline, with the same bounds cache."""
    times_k = shim.load(host_pipelines["times_k", "bundled"])
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    times_k(a, 2.0, np.empty_like(a))
    with pytest.raises(TypeError, match="made once"):
        times_k.__init__(host_pipelines["checked_sqrt", "bundled"])
    assert times_k.name == "times_k"
    fast, slow = np.empty_like(a), np.empty_like(a)
    times_k(a, 2.0, fast)
    general(times_k, (a, 2.0, slow), {})
    np.testing.assert_array_equal(fast, a * 2)
    np.testing.assert_array_equal(slow, a * 2)


def test_a_prepared_run_whose_making_failed_is_not_made_again(load):
    """PreparedRun.__init__ failing halfway (a malformed member) and called again would
    overwrite the members it took references to: a second making is refused."""
    times_k = load("times_k")
    a = np.ones((3, 4), np.float32)
    out = shim.Buffer(np.zeros_like(a))
    with times_k.prepare(a, 2.0, out) as call:
        arguments = call._native_run()
    run = PreparedRun.__new__(PreparedRun)
    members = list(arguments[5])
    bad = members + [("not a buffer", "not a record", False, False, False, False)]
    before = sys.getrefcount(out)
    with pytest.raises(TypeError):
        run.__init__(*arguments[:5], bad, *arguments[6:])
    with pytest.raises(TypeError, match="made once"):
        run.__init__(*arguments)
    del run
    gc.collect()
    assert sys.getrefcount(out) == before


def test_a_call_plan_whose_making_failed_is_not_made_again(host_pipelines):
    """CallPlan.__init__ failing halfway and called again (Pipeline.__init__ on the same
    object) counted the outputs twice: a one-output pipeline's fast call returned a tuple with
    a NULL in it, and the interpreter crashed. A second making is refused."""
    script = textwrap.dedent("""
        import numpy as np
        import shim
        from shim.native import CallPlan
        from shim.calls.pipeline import Pipeline
        import sys
        good = shim.load(sys.argv[1])
        entries = good._signature.plan_entries()
        p = Pipeline.__new__(Pipeline)
        args = [good._library.argv_address, entries[::-1] + [("bad",)], True, True, 0,
                np.ndarray, shim.Buffer, shim.memory.families.FamilyLock, good._runner.finish_fast,
                shim.core.call_uses.end_call]
        try:
            CallPlan.__init__(p, *args)
        except TypeError:
            pass
        try:
            Pipeline.__init__(p, sys.argv[1])
        except TypeError as e:
            assert "made once" in str(e), e
            print("refused")
            sys.exit(0)
        a = np.ones((3, 4), np.float32)
        out = np.empty_like(a)
        p(a, 2.0, out)
        result = p(a, 2.0, out)
        print(type(result).__name__, repr(result)[:20])
        """)
    done = subprocess.run([sys.executable, "-c", script, str(host_pipelines["times_k", "bundled"])],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[0] in ("refused", "ndarray"), done.stdout


def test_fast_calls_in_a_thread_with_the_smallest_stack(host_pipelines):
    """threading.stack_size(32 KiB), the least Python allows: the general path runs there, and
    so must the fast path, whose per-call arrays were sized for 64 arguments of 16 dimensions
    (over 30 KiB of stack: the thread crashed)."""
    script = textwrap.dedent("""
        import sys, threading
        import numpy as np
        import shim
        p = shim.load(sys.argv[1])
        a = np.ones((4, 4), np.float32)
        out = np.empty_like(a)
        b, ob = shim.Buffer(a), shim.Buffer(np.empty_like(a))
        p(a, 2.0, out)  # the shape: known
        threading.stack_size(32 * 1024)
        done = []
        def work():
            p(a, 2.0, out)
            p(b, 2.0, ob)
            with p.prepare(b, 3.0, ob) as call:
                call()
            done.append(float(out[0, 0]) + float(ob.numpy()[0, 0]))
        t = threading.Thread(target=work)
        t.start()
        t.join()
        print(done)
        """)
    ran = subprocess.run([sys.executable, "-c", script, str(host_pipelines["times_k", "bundled"])],
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, (ran.returncode, ran.stderr[-3000:])
    assert ran.stdout.strip() == "[5.0]"


# --- reference counts over many calls -------------------------------------------------------

def _refcounts(*objects):
    return [sys.getrefcount(o) for o in objects]


@pytest.mark.parametrize("runtime", ["no_runtime"])
def test_many_fast_calls_leak_nothing(load):
    """10^5 fast calls with Buffers, arrays and scalars, prepared runs, failing calls and
    declined calls: the arguments' reference counts, the family registries, the families'
    uses and Python's allocated memory stay where they were."""
    times_k, checked_sqrt, sum_diff = load("times_k"), load("checked_sqrt"), load("sum_diff")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    buf, out_buf = shim.Buffer(a.copy()), shim.Buffer(np.zeros_like(a))
    out = np.zeros_like(a)
    bad = np.full((3, 4), -1.0, np.float32)
    ia, ib = np.ones((3, 4), np.int32), np.full((3, 4), 2, np.int32)
    total, difference = shim.Buffer(np.zeros_like(ia)), np.zeros_like(ia)
    k = 2.5
    a64, rows = a.astype(np.float64), memoryview(a)
    times_k(buf, k, out_buf)
    times_k(a, k, out)
    checked_sqrt(a, False, out)
    sum_diff(ia, ib, total, difference)
    prepared = times_k.prepare(buf, k, out_buf)

    def batch(n):
        for _ in range(n):
            times_k(buf, k, out_buf)
            times_k(a, k, output=out)
            prepared()
            sum_diff(ia, ib, total, difference)
        for _ in range(n // 20):
            try:
                checked_sqrt(bad, False, out)
            except shim.PipelineError:
                pass
            try:
                times_k(a64, k, out)  # declined: the general path's error
            except shim.ArgumentError:
                pass
            times_k(rows, k, out)  # declined: another array-like

    objects = (buf, out_buf, out, a, bad, ia, ib, total, difference, k, prepared, a64, rows)
    batch(2000)  # warm: caches, the bounds cache, interned objects
    gc.collect()
    counts = _refcounts(*objects)
    registries = families.live_counts()
    tracemalloc.start()
    try:
        batch(1000)
        gc.collect()
        start, _ = tracemalloc.get_traced_memory()
        batch(25_000)
        gc.collect()
        end, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert _refcounts(*objects) == counts
    assert families.live_counts() == registries
    assert end - start < 256 * 1024, f"{end - start} bytes more after 10^5 calls"
    for b in (buf, out_buf, total):
        assert b.family.uses == []
    prepared.close()
    np.testing.assert_array_equal(out_buf.numpy(), a * np.float32(k))


def test_buffers_dropped_right_after_fast_calls_are_released(load):
    """Buffers made for one call and dropped: each leaves the registries as it goes."""
    times_k = load("times_k")
    a = np.ones((3, 4), np.float32)
    times_k(shim.Buffer(a), 2.0, shim.Buffer(np.zeros_like(a)))
    gc.collect()
    registries = families.live_counts()
    for _ in range(2000):
        result = times_k(shim.Buffer(a), 2.0, shim.Buffer(np.zeros_like(a)))
        assert result.numpy()[0, 0] == 2.0
    del result
    gc.collect()
    assert families.live_counts() == registries


# --- arguments that alias, subclasses ------------------------------------------------------

class BufferSubclass(shim.Buffer):
    __slots__ = ()


class ArraySubclass(np.ndarray):
    pass


def test_the_same_buffer_as_input_and_output(load):
    times_k = load("times_k")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    fast_buf, slow_buf = shim.Buffer(a.copy()), shim.Buffer(a.copy())
    times_k(shim.Buffer(a.copy()), 3.0, shim.Buffer(a.copy()))  # the shape: known
    counting = Counting(times_k)
    for _ in range(3):
        assert times_k(fast_buf, 3.0, fast_buf) is fast_buf
        general(times_k, (slow_buf, 3.0, slow_buf), {})
        np.testing.assert_array_equal(fast_buf.numpy(), slow_buf.numpy())
    assert counting.declined == 0
    assert fast_buf.family.uses == []
    # The same array as input and output: two Buffers over one memory on either path.
    fast_array, slow_array = a.copy(), a.copy()
    times_k(fast_array, 3.0, fast_array)
    general(times_k, (slow_array, 3.0, slow_array), {})
    np.testing.assert_array_equal(fast_array, slow_array)


def test_the_same_buffer_as_both_outputs(load):
    sum_diff = load("sum_diff")
    a, b = np.arange(12, dtype=np.int32).reshape(3, 4), np.full((3, 4), 5, np.int32)
    sum_diff(a, b, np.empty_like(a), np.empty_like(a))
    fast, slow = shim.Buffer(np.zeros_like(a)), shim.Buffer(np.zeros_like(a))
    assert sum_diff(a, b, fast, fast) == (fast, fast)
    general(sum_diff, (a, b, slow, slow), {})
    np.testing.assert_array_equal(fast.numpy(), slow.numpy())
    both = shim.Buffer(a.copy())
    sum_diff(both, b, both, both)  # the input as both outputs too
    other = shim.Buffer(a.copy())
    general(sum_diff, (other, b, other, other), {})
    np.testing.assert_array_equal(both.numpy(), other.numpy())


def test_subclasses_take_the_general_path_with_the_same_results(load):
    times_k = load("times_k")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    times_k(a, 2.0, np.empty_like(a))
    counting = Counting(times_k)
    sub_in = BufferSubclass(a)
    sub_out = BufferSubclass(np.zeros_like(a))
    assert times_k(sub_in, 2.0, sub_out) is sub_out
    np.testing.assert_array_equal(sub_out.numpy(), a * 2)
    view = a.view(ArraySubclass)
    out = np.zeros_like(a).view(ArraySubclass)
    result = times_k(view, 2.0, out)
    assert result is out
    np.testing.assert_array_equal(out, a * 2)
    assert counting.declined == 2
    for b in (sub_in, sub_out):
        assert b.family.uses == []


def test_numpy_scalars_and_bools_as_scalars_match_the_general_path(load):
    times_k = load("times_k")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    times_k(a, 2.0, np.empty_like(a))
    for k in [np.float32(2.5), np.float64(1e39), np.int64(3), True, 3, 2**80, float("nan"),
              float("inf"), -0.0, 1e39, "2"]:
        fast_out, slow_out = np.zeros_like(a), np.zeros_like(a)
        try:
            fast = ("ok", times_k(a, k, fast_out) is fast_out)
        except Exception as e:  # noqa: BLE001 - compared below
            fast = ("error", type(e), str(e))
        try:
            slow = ("ok", general(times_k, (a, k, slow_out), {}) is slow_out)
        except Exception as e:  # noqa: BLE001
            slow = ("error", type(e), str(e))
        assert fast == slow, k
        np.testing.assert_array_equal(fast_out, slow_out)


# --- threads changing what calls use ------------------------------------------------------

def run_for_a_while(work, stop: threading.Event, errors: list, seconds: float = 3) -> None:
    """Run ``function(argument)`` on a thread of its own for each (function, arguments) of
    ``work`` for ``seconds``, then stop them: none may hang, none may have failed."""
    threads = [threading.Thread(target=function, args=(argument,))
               for function, arguments in work for argument in arguments]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a thread hung"
    assert not errors, errors[0]


def test_threads_crop_mark_and_free_buffers_fast_calls_use(load):
    """Calling threads and threads cropping (which makes a family shared in the middle of a
    call), marking and freeing the same Buffers: no hang, no error, the uses all gone, and
    the last results right."""
    times_k = load("times_k")
    rng = np.random.default_rng(7)
    a = rng.random((32, 32), dtype=np.float32)
    inputs = [shim.Buffer(a.copy()) for _ in range(2)]
    outputs = [shim.Buffer(np.zeros_like(a)) for _ in range(2)]
    times_k(inputs[0], 2.0, outputs[0])
    stop, errors = threading.Event(), []

    def caller(i):
        try:
            while not stop.is_set():
                times_k(inputs[i % 2], 2.0, outputs[i % 2])
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def meddler(seed):
        r = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                buf = [*inputs, *outputs][r.integers(4)]
                action = r.integers(4)
                if action == 0:
                    crop = buf.cropped([(1, 8), (2, 8)])
                    crop.numpy()
                    del crop
                elif action == 1:
                    buf.set_host_dirty(True)
                elif action == 2:
                    buf.device_free()
                else:
                    buf.numpy()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    run_for_a_while([(caller, range(3)), (meddler, range(2))], stop, errors)
    for buf in inputs + outputs:
        assert buf.family.uses == []
    for i in range(2):
        times_k(inputs[i], 2.0, outputs[i])
        np.testing.assert_array_equal(outputs[i].numpy(), a * np.float32(2))


def test_threads_move_buffers_of_cpu_fast_calls_to_opencl_and_back(load, opencl):
    """CPU fast calls on Buffers that other threads keep uploading to OpenCL, marking newer on
    the device, downloading and freeing: a call whose Buffer holds device-side changes goes
    to the general path, which brings them home first. No hang, no lost results, no use
    left; the only errors are the refusals of marks that conflict with a call's results."""
    times_k = load("times_k")
    a = np.random.default_rng(8).random((16, 16), dtype=np.float32)
    inp = shim.Buffer(a.copy())
    outputs = [shim.Buffer(np.zeros_like(a)) for _ in range(2)]
    times_k(inp, 2.0, outputs[0])
    stop, errors = threading.Event(), []

    def caller(i):
        try:
            while not stop.is_set():
                times_k(inp, 2.0, outputs[i])
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def mover(seed):
        r = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                buf = [inp, *outputs][r.integers(3)]
                action = r.integers(4)
                try:
                    if action == 0:
                        buf.copy_to_device(opencl)
                    elif action == 1:
                        buf.copy_to_device(opencl)
                        buf.set_device_dirty(True)
                    elif action == 2:
                        buf.copy_to_host()
                    else:
                        buf.device_free()
                except (shim.ArgumentError, shim.DeviceError) as e:
                    # another thread freed it, or a call's results landed on the host since
                    if "holds changes" not in str(e) and "no device allocation" not in str(e):
                        raise
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    run_for_a_while([(caller, range(2)), (mover, range(2))], stop, errors)
    for buf in (inp, *outputs):
        assert buf.family.uses == []
    np.testing.assert_array_equal(inp.numpy(), a)
    for out in outputs:
        times_k(inp, 2.0, out)
        np.testing.assert_array_equal(out.numpy(), a * np.float32(2))
        out.device_free()
    inp.device_free()


# --- OpenCL: Buffers on a device, moved and freed between fast calls ---------------------------

@pytest.fixture(scope="module")
def opencl_brighten(opencl):
    path = build_all([Build("brighten", "opencl", "no_runtime")], progress=None).popitem()[1]
    return shim.load(path)


def test_a_prepared_opencl_call_run_after_close(opencl_brighten, opencl):
    """close() frees the device memory of the Buffers made for the caller's arrays; a run after
    it (in C) allocates again, computes right, and what it allocated goes with the call (the
    leak check after every test counts live allocations)."""
    image = np.random.default_rng(11).random((8, 8), dtype=np.float32)
    out = shim.Buffer(np.zeros_like(image))
    before = opencl.live_allocations
    call = opencl_brighten.prepare(image, 2.0, 0.5, out)
    for _ in range(3):
        assert call() is out
        np.testing.assert_array_equal(out.numpy(), image * np.float32(2) + np.float32(0.5))
        call.close()
        image += 1
    del call
    gc.collect()
    out.device_free()
    assert opencl.live_allocations == before


class OpenCLModel(RuleBasedStateMachine):
    """Plain and prepared fast calls of an OpenCL pipeline on Buffers that are written, read,
    moved to the device, freed, marked and cropped between calls, against numpy."""

    pipeline = None

    def __init__(self):
        super().__init__()
        self.host = np.random.default_rng(0).random((8, 8), dtype=np.float32)
        self.inp = shim.Buffer(self.host.copy())
        self.out = shim.Buffer(np.zeros_like(self.host))
        self.model = np.zeros_like(self.host)
        self.prepared = self.pipeline.prepare(self.inp, 2.0, 0.5, self.out)

    def expected(self):
        return self.host * np.float32(2.0) + np.float32(0.5)

    @rule()
    def plain_call(self):
        assert self.pipeline(self.inp, 2.0, 0.5, self.out) is self.out
        self.model = self.expected()

    @rule()
    def prepared_call(self):
        assert self.prepared() is self.out
        self.model = self.expected()

    @rule(delta=st.floats(-4, 4, width=32))
    def write_input(self, delta):
        self.inp.copy_to_host()
        self.inp.numpy()[...] += np.float32(delta)
        self.inp.set_host_dirty()
        self.host = self.inp.numpy().copy()

    @rule(which=st.sampled_from(["inp", "out"]))
    def to_device(self, which):
        getattr(self, which).copy_to_device(shim.device("opencl"))

    @rule(which=st.sampled_from(["inp", "out"]))
    def free(self, which):
        getattr(self, which).device_free()

    @rule()
    def read(self):
        np.testing.assert_array_equal(self.out.numpy(), self.model)

    @rule()
    def crop_and_read(self):
        crop = self.out.cropped([(2, 3), (1, 4)])
        np.testing.assert_array_equal(crop.numpy(), self.model[1:5, 2:5])

    @precondition(lambda self: True)
    @rule()
    def crop_input_and_call(self):
        crop = self.inp.cropped([(0, 8), (0, 8)])
        out = shim.Buffer(np.zeros_like(self.host))
        self.pipeline(crop, 2.0, 0.5, out)
        np.testing.assert_array_equal(out.numpy(), self.expected())

    @invariant()
    def no_uses(self):
        assert self.inp.family.uses == [] and self.out.family.uses == []

    def teardown(self):
        self.prepared.close()
        self.out.numpy()


def test_opencl_fast_calls_follow_a_numpy_model(opencl_brighten):
    OpenCLModel.pipeline = opencl_brighten
    opencl_brighten(np.ones((8, 8), np.float32), 2.0, 0.5, np.zeros((8, 8), np.float32))
    run = OpenCLModel.TestCase
    run.settings = settings(max_examples=scaled(30, 150), stateful_step_count=15, deadline=None,
                            suppress_health_check=[HealthCheck.function_scoped_fixture])
    run("runTest").runTest()


class HostModel(RuleBasedStateMachine):
    """Fast plain and prepared calls of a CPU pipeline on Buffers and arrays, interleaved with
    crops (a family becomes shared), marks, in-place writes and aliasing, against numpy."""

    pipeline = None

    def __init__(self):
        super().__init__()
        self.array = np.random.default_rng(1).random((6, 6), dtype=np.float32)
        self.inp = shim.Buffer(self.array)  # over the caller's array: writes show through
        self.out = shim.Buffer(np.zeros_like(self.array))
        self.model = np.zeros_like(self.array)
        self.prepared = self.pipeline.prepare(self.inp, 3.0, self.out)
        self.crops = []

    @rule(k=st.sampled_from([1.0, 3.0, -2.0]))
    def plain(self, k):
        self.pipeline(self.inp, k, self.out)
        self.model = self.array * np.float32(k)

    @rule()
    def prepared_run(self):
        self.prepared()
        self.model = self.array * np.float32(3.0)

    @rule()
    def in_place(self):
        self.pipeline(self.out, 2.0, self.out)
        self.model = self.model * np.float32(2.0)

    @rule()
    def array_output(self):
        target = np.zeros_like(self.array)
        assert self.pipeline(self.array, 2.0, target) is target
        np.testing.assert_array_equal(target, self.array * np.float32(2.0))

    @rule(value=st.floats(-3, 3, width=32))
    def write(self, value):
        self.array[1, 2] = value
        self.inp.set_host_dirty()

    @rule()
    def crop(self):
        self.crops.append(self.out.cropped([(1, 3), (2, 2)]))

    @rule()
    def drop_crops(self):
        self.crops.clear()

    @rule()
    def read(self):
        np.testing.assert_array_equal(self.out.numpy(), self.model)
        for crop in self.crops:
            np.testing.assert_array_equal(crop.numpy(), self.model[2:4, 1:4])

    @invariant()
    def no_uses(self):
        assert self.inp.family.uses == [] and self.out.family.uses == []

    def teardown(self):
        self.prepared.close()


def test_host_fast_calls_follow_a_numpy_model(load):
    HostModel.pipeline = load("times_k")
    HostModel.pipeline(np.ones((6, 6), np.float32), 1.0, np.zeros((6, 6), np.float32))
    run = HostModel.TestCase
    run.settings = settings(max_examples=scaled(40, 200), stateful_step_count=20, deadline=None,
                            suppress_health_check=[HealthCheck.function_scoped_fixture])
    run("runTest").runTest()


# --- Ctrl-C at random during fast calls ------------------------------------------------------

def test_ctrl_c_at_random_during_contended_fast_calls(load, shim_sigint):
    """SIGINT at random moments while the main thread makes fast calls whose Buffers other
    threads keep marking (so that their ends often go through Python): every interrupt comes
    through as KeyboardInterrupt, and afterwards no use is left and nothing hangs."""
    times_k = load("times_k")
    a = np.random.default_rng(9).random((64, 64), dtype=np.float32)
    inp, out = shim.Buffer(a), shim.Buffer(np.zeros_like(a))
    times_k(inp, 2.0, out)
    prepared = times_k.prepare(inp, 2.0, out)
    stop = threading.Event()
    main = threading.main_thread().ident
    errors = []

    def marker():
        try:
            while not stop.is_set():
                out.set_host_dirty(True)
                time.sleep(0.0002)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    go = threading.Event()

    def interrupter():
        r = np.random.default_rng(10)
        go.wait()  # (not before the main thread is inside the try below)
        while not stop.is_set():
            time.sleep(float(r.uniform(0.0005, 0.005)))
            signal.pthread_kill(main, signal.SIGINT)

    threads = [threading.Thread(target=marker), threading.Thread(target=interrupter)]
    for t in threads:
        t.start()
    interrupted = 0
    deadline = time.monotonic() + 4
    try:
        go.set()
        while time.monotonic() < deadline:
            try:
                for _ in range(100):
                    times_k(inp, 2.0, out)
                    prepared()
            except KeyboardInterrupt:
                interrupted += 1
    finally:
        stop.set()
        go.set()  # (an interrupter still waiting for it sees the stop)
        for t in threads:
            while t.is_alive():
                try:
                    t.join(10)
                    break
                except KeyboardInterrupt:
                    continue
        # (an interrupt still on its way lands here)
        for _ in range(50):
            try:
                time.sleep(0.01)
            except KeyboardInterrupt:
                pass
    prepared.close()
    stuck = out.family.uses[:] + inp.family.uses[:]
    release_leftover_uses(inp, out)
    assert not any(t.is_alive() for t in threads)
    assert stuck == [], (len(stuck), errors)
    assert not errors, errors
    assert interrupted > 0
    times_k(inp, 2.0, out)
    np.testing.assert_array_equal(out.numpy(), a * np.float32(2))
