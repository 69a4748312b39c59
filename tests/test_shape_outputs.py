"""Outputs given as a shape on a CPU pipeline's fast path (native_stubs/fast/fastcall.c): the
pipeline writes a new numpy array, and the call returns a PipelineResult over it, whose struct
and family are made only when something asks for them (shim/buffers/pipeline_result.py). Such a Buffer must be the general path's Buffer in everything
anyone can observe, whatever is asked of it first, from any number of threads, and must
leave nothing registered behind it."""

import gc
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest

import shim
from shim.buffers.pipeline_result import PipelineResult
from shim.memory import families
from support.forks import exit_code_of_child_forked_while_held


def blur_reference(image: np.ndarray) -> np.ndarray:
    a = image.astype(np.uint32)
    across = ((a[:, :-2] + a[:, 1:-1] + a[:, 2:]) // 3).astype(np.uint16).astype(np.uint32)
    return ((across[:-2] + across[1:-1] + across[2:]) // 3).astype(np.uint16)


IMAGE = (np.arange(12 * 14) * 37 % 4099).astype(np.uint16).reshape(12, 14)


@pytest.fixture
def blur(host_pipelines):
    return shim.load(host_pipelines["blur3x3", "no_runtime"])


def fast_and_general(blur, shape=(10, 12)):
    """The same call's result from the fast path and from the general path."""
    fast = blur(IMAGE, shape)
    general = blur._call_in_python(IMAGE, shape)
    assert type(fast) is PipelineResult and type(general) is shim.Buffer  # (what is compared)
    return fast, general


def state(buf: shim.Buffer) -> dict:
    """What a user can observe of a Buffer, without its data."""
    return {
        "type": buf.type(), "dtype": buf.dtype, "shape": buf.shape,
        "dimensions": buf.dimensions(),
        "dims": [(d.min(), d.extent(), d.stride()) for d in (buf.dim(i) for i in range(buf.dimensions()))],
        "host_dirty": buf.host_dirty(), "device_dirty": buf.device_dirty(),
        "device allocation": buf.has_device_allocation(), "repr": repr(buf),
        "name": buf.name() if not buf.name().startswith("b") else "b<n>",  # (a counter's)
        "writeable": buf.writeable, "defined": buf.defined(),
    }


# Each operation, applied first to a result, gives what can be compared between the paths.
FIRST_OPERATIONS = {
    "numpy": lambda b: b.numpy().tobytes(),
    "asarray": lambda b: np.asarray(b).tobytes(),
    "state": state,
    "element": lambda b: (b[0, 0], b[11, 9]),
    "raw struct": lambda b: (b.raw.dimensions, b.raw.dim[0].extent, b.raw.dim[1].stride),
    "cropped": lambda b: b.cropped(0, 2, 5).numpy().tobytes(),
    "sliced": lambda b: state(b.sliced(1, 3)),
    "in-place crop": lambda b: (b.crop(1, 1, 4), state(b), b.numpy().tobytes()),
    "set_min": lambda b: (b.set_min([5, 6]), state(b), b[5, 6]),
    "fill": lambda b: (b.fill(3), b.numpy().tobytes(), state(b)),
    "setitem": lambda b: (b.__setitem__((1, 2), 99), b[1, 2], b.numpy().tobytes()),
    "copy": lambda b: (state(b.copy()), b.copy().numpy().tobytes()),
    "pickle": lambda b: (state(pickle.loads(pickle.dumps(b))), pickle.loads(pickle.dumps(b)).numpy().tobytes()),
    "view": lambda b: (shim.Buffer(b).fill(5), b.numpy().tobytes()),
    "set_name": lambda b: (b.set_name("out"), state(b)),
    "dirty bits": lambda b: (b.set_host_dirty(False), b.host_dirty(), b.device_dirty()),
    "transposed": lambda b: state(b.transposed(0, 1)),
    "memoryless": lambda b: b.raw_buffer() != 0,
    "isinstance": lambda b: isinstance(b, shim.Buffer),
    "missing attribute": lambda b: attribute_error(b, "no_such_thing"),
    "cuda array interface": lambda b: attribute_error(b, "__cuda_array_interface__"),
}


def attribute_error(buf, name):
    try:
        getattr(buf, name)
    except AttributeError as e:
        return str(e).replace("PipelineResult", "Buffer")  # (a class name in the text is fine)
    return "no error"


@pytest.mark.parametrize("first", sorted(FIRST_OPERATIONS))
def test_whatever_is_asked_first_answers_as_the_general_paths_buffer(blur, first):
    fast, general = fast_and_general(blur)
    operation = FIRST_OPERATIONS[first]
    assert operation(fast) == operation(general)
    # and then everything else, on the Buffer that answered first
    assert state(fast) == state(general)
    np.testing.assert_array_equal(fast.numpy(), general.numpy())


def test_the_result_is_right_and_reads_need_no_struct(blur):
    """The values are numpy's; reading them through numpy() makes no struct (the point of
    deferring it), and the struct is host-dirty when made, as the general path's is after a
    CPU pipeline wrote it (Halide's code marks its outputs so)."""
    fast, general = fast_and_general(blur)
    np.testing.assert_array_equal(fast.numpy(), blur_reference(IMAGE))
    assert type(fast) is PipelineResult
    assert general.host_dirty() and fast.host_dirty()
    assert type(fast) is shim.Buffer  # (once made, a plain Buffer)


def test_a_result_passed_to_another_call_runs_as_a_buffer(blur, host_pipelines):
    """A result given back to a pipeline (its struct is made then, by the fast path's read of
    its record: native_stubs/fast/call_records.c) as input and as output."""
    bigger = np.pad(IMAGE, 1, mode="reflect")
    first = blur(bigger, (12, 14))
    assert type(first) is PipelineResult
    again = blur(first, (10, 12))
    np.testing.assert_array_equal(again.numpy(), blur_reference(blur_reference(bigger)))
    into = blur(IMAGE, (10, 12))
    other = (IMAGE * 7 % 1013).astype(np.uint16)
    assert blur(other, into) is into
    np.testing.assert_array_equal(into.numpy(), blur_reference(other))


def test_a_result_goes_to_a_device_and_back(blur, opencl):
    fast, _ = fast_and_general(blur)
    expected = fast.numpy().copy()
    fast.copy_to_device("opencl")
    assert fast.has_device_allocation() and not fast.host_dirty()
    fast.numpy()[:] = 0
    fast.set_device_dirty(True)
    fast.copy_to_host()
    np.testing.assert_array_equal(fast.numpy(), expected)


def test_threads_that_ask_at_once_share_one_struct(blur):
    """Many threads touch a new result's struct at the same moment: one struct is made,
    every thread sees it, and exactly one entry joins the registry."""
    for _ in range(20):
        fast = blur(IMAGE, (10, 12))
        before = families.live_counts()["owned"]
        start = threading.Barrier(8)
        seen = {}

        def touch(k, how):
            start.wait()
            seen[k] = how(fast)

        hows = ["raw", "family", "raw", "dimensions", "record", "raw", "family", "box"]
        asks = {"raw": lambda b: b.raw_buffer(), "family": lambda b: id(b.family),
                "dimensions": lambda b: b.dimensions(), "record": lambda b: b.call_record[0],
                "box": lambda b: b.box}
        threads = [threading.Thread(target=touch, args=(k, asks[how])) for k, how in enumerate(hows)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert families.live_counts()["owned"] == before + 1
        expected = {"raw": fast.raw_buffer(), "family": id(fast.family), "dimensions": 2,
                    "record": fast.raw_buffer(), "box": ((0, 12), (0, 10))}
        assert seen == {k: expected[how] for k, how in enumerate(hows)}
        assert fast.raw_buffer() == families.address_of(fast.raw)


def test_results_leave_nothing_registered(blur):
    """Results dropped untouched, after a read, and after their struct was made: the
    registries are as they were."""
    before = families.live_counts()
    for k in range(300):
        result = blur(IMAGE, (10, 12))
        if k % 3 == 1:
            result.numpy()
        elif k % 3 == 2:
            result.host_dirty()
        del result
    assert families.live_counts() == before


def test_two_outputs_as_shapes(host_pipelines):
    sum_diff = shim.load(host_pipelines["sum_diff", "no_runtime"])
    a = np.arange(20, dtype=np.int32).reshape(4, 5)
    b = (a * 3 - 7).astype(np.int32)
    fast = sum_diff(a, b, (4, 5), [4, 5])
    general = sum_diff._call_in_python(a, b, (4, 5), [4, 5])
    for f, g, expected in zip(fast, general, (a + b, a - b)):
        assert type(f) is PipelineResult
        np.testing.assert_array_equal(f.numpy(), expected)
        assert state(f) == state(g)


# Shapes the fast path leaves to the general path, which accepts or refuses them.
ODD_SHAPES = [(0, 12), (-1, 12), (np.int64(10), 12), (True, 12), (10.0, 12), ("10", 12),
              (10,), (10, 12, 1), (2**31, 1), (2**20, 2**12), (10, None)]


@pytest.mark.parametrize("shape", ODD_SHAPES, ids=repr)
def test_odd_shapes_get_the_general_paths_answer(blur, shape):
    def outcome(call):
        try:
            result = call(IMAGE, shape)
        except Exception as e:  # noqa: BLE001 - the exception is what is compared
            return type(e).__name__, str(e)
        return state(result), result.numpy().tobytes()

    assert outcome(blur) == outcome(blur._call_in_python)


FORK_SETUP = """
import sys
import numpy as np
import shim
from shim.buffers import pipeline_result

blur = shim.load(sys.argv[1])
image = (np.arange(12 * 14) * 37 % 4099).astype(np.uint16).reshape(12, 14)
result = blur(image, (10, 12))
"""
FORK_USE = "assert result.host_dirty() and result.raw_buffer() and blur(image, (10, 12)).dimensions() == 2"


def test_a_forked_child_makes_the_struct_even_if_a_thread_was_making_one(host_pipelines):
    """Another thread held the lock a result makes its struct under at the fork."""
    assert exit_code_of_child_forked_while_held(FORK_SETUP, "pipeline_result._publishing_lock", FORK_USE,
                                                str(host_pipelines["blur3x3", "no_runtime"])) == 0


def test_something_run_while_a_struct_is_made_may_use_another_result(blur, monkeypatch):
    """A finalizer the collector runs, or a signal handler, while one result's struct is being
    made, that uses another untouched result: each is made (a lock held around the making
    would have this thread wait for itself)."""
    other = blur(IMAGE, (10, 12))
    first = blur(IMAGE, (10, 12))
    used = []
    original = families.register_owned

    def register_and_use_the_other(raw, family):
        original(raw, family)
        if not used:
            used.append(None)
            used[0] = other.host_dirty()  # (made now, inside the first one's making)

    monkeypatch.setattr(families, "register_owned", register_and_use_the_other)
    worker = threading.Thread(target=first.host_dirty, daemon=True)
    worker.start()
    worker.join(60)  # (a hang guard: the old lock had this thread wait for itself forever)
    assert not worker.is_alive(), "making a result's struct waited for itself"
    assert used == [True] and type(other) is shim.Buffer and type(first) is shim.Buffer
    assert first.raw_buffer() != other.raw_buffer()


def test_a_result_used_after_its_finalizer_ran_is_left_unregistered(blur):
    """The collector finalizes a dying cycle's objects in any order: a __del__ of the cycle may
    use a result whose finalizer has run (and found nothing to release). Its struct is then
    made out of the registry, as a dropped Buffer's is: nothing would release it again."""
    before = families.live_counts()
    result = blur(IMAGE, (10, 12))
    result._finalize()  # (what the collector runs first)
    assert result.host_dirty() and result.numpy()[0, 0] == blur_reference(IMAGE)[0, 0]
    assert families.live_counts() == before
    del result
    assert families.live_counts() == before


def test_a_dying_cycle_whose_other_finalizer_uses_the_result_in_either_order(blur):
    """The same, through the collector itself: a result and an object whose __del__ reads it
    (making its struct) die in one cycle. Whichever finalizer the collector runs first, the
    __del__ reads the pipeline's values and the struct is left unregistered. (The finalizer
    skips its Python work only for a result nothing else references: signals_held.c.)"""
    import gc

    reads = []

    class Reader:
        def __del__(self):
            result = self.cycle[0]
            reads.append((result.host_dirty(), result.numpy()[0, 0]))

    before = families.live_counts()
    gc.disable()  # (the cycles die in the collect below, not at a collection of the loop's)
    try:
        for reader_first in (False, True, False, True):
            # (the collector finalizes in the order the objects came into its list)
            if reader_first:
                reader = Reader()
                result = blur(IMAGE, (10, 12))
            else:
                result = blur(IMAGE, (10, 12))
                reader = Reader()
            assert type(result) is PipelineResult
            reader.cycle = [result, reader]
            del result, reader
            gc.collect()
            assert families.live_counts() == before, f"reader first: {reader_first}"
    finally:
        gc.enable()
    assert reads == [(True, blur_reference(IMAGE)[0, 0])] * 4


def test_a_result_whose_class_made_a_whole_buffer(blur, opencl):
    """A constructor reached through a result's class (type(result)(array), or a Buffer
    method that makes its copy as type(self)) gives a whole Buffer, never one that waits for a
    struct it already has."""
    result = blur(IMAGE, (10, 12))
    made = type(result)(np.zeros((3, 4), np.uint16))
    assert not hasattr(made, "no_such_attribute") and type(made) is shim.Buffer
    assert made.dimensions() == 2 and made.shape == (3, 4)
    copy = blur(IMAGE, (10, 12)).copy_on_device(opencl)
    assert not hasattr(copy, "no_such_attribute") and type(copy) is shim.Buffer
    np.testing.assert_array_equal(copy.numpy(), blur_reference(IMAGE))


@pytest.mark.parametrize("kind", ["host", "opencl", "vulkan"])
def test_whole_buffers_of_the_result_class_give_their_memory_back(blur, kind, request):
    """A Buffer made whole while its class is still PipelineResult (type(result)(array),
    result.make_with_shape_of(result), its crops, made as type(self)) holds a struct and
    device memory like any Buffer, and gives them back when dropped: its finalizer is not
    skipped as an untouched result's is (before: 20 of 20 leaked, on every device)."""
    if kind != "host":
        request.getfixturevalue(kind)  # (skips, saying why, where there is no such device)
    device = shim.device(kind)
    gc.collect()
    before = families.live_counts(), device.live_allocations
    for _ in range(20):
        result = blur(IMAGE, (10, 12))
        made = [PipelineResult(IMAGE.copy()), result.make_with_shape_of(result)]
        made.append(made[0].cropped([(1, 4), (2, 5)]))
        for buf in made:
            assert type(buf) is PipelineResult  # (what the test is about)
            buf.copy_to_device(kind)
        assert device.live_allocations > before[1]
        del result, made, buf
    gc.collect()
    assert (families.live_counts(), device.live_allocations) == before


def test_an_untouched_result_given_to_a_call_takes_the_fast_path(blur, monkeypatch):
    """blur(blur(image, s1), s2): the first result is made a Buffer by the fast path, which
    then takes the call as it takes any Buffer's."""
    from shim.calls.pipeline import Pipeline

    bigger = np.pad(IMAGE, 1, mode="reflect")
    first = blur(bigger, (12, 14))
    general_calls = []
    original = Pipeline.prepare
    monkeypatch.setattr(Pipeline, "prepare", lambda self, *a, **k: general_calls.append(self)
                        or original(self, *a, **k))
    again = blur(first, (10, 12))
    assert general_calls == [] and type(first) is shim.Buffer
    np.testing.assert_array_equal(again.numpy(), blur_reference(blur_reference(bigger)))


HALF_SET_FORK = FORK_SETUP + """
import os, threading
from shim.buffers import pipeline_result
from shim.memory import families
# The thread making the result's struct stops halfway through setting its slots; the process
# forks then.
reached, never = threading.Event(), threading.Event()
def paused_setattr(obj, name, value):
    setattr(obj, name, value)
    if name == "_family" and threading.current_thread().name == "maker":
        reached.set()
        never.wait()
pipeline_result.setattr = paused_setattr
threading.Thread(target=result.host_dirty, name="maker", daemon=True).start()
reached.wait()
pid = os.fork()
if pid == 0:
    before = (result.raw_buffer(), id(result.family))  # (made again in the child)
    result.box
    same = (result.raw_buffer(), id(result.family)) == before
    os._exit(0 if same and type(result) is shim.Buffer and result.host_dirty() else 3)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


def test_a_child_forked_while_a_result_was_half_set_sees_one_struct(host_pipelines):
    """In the child, the result's slots go back to none set and are made once, whole: its
    struct and family never change under it."""
    done = subprocess.run([sys.executable, "-c", HALF_SET_FORK,
                           str(host_pipelines["blur3x3", "no_runtime"])],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("child 0"), done.stdout + done.stderr[-3000:]
