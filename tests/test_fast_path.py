"""The fast path of a plain call (native_stubs/fast/fastcall.c): a pipeline called with shim.Buffers,
numbers and (on the CPU) numpy arrays runs from C. It must be indistinguishable from the general path (the one a
prepared call takes) in everything but speed: the same outputs, bit for bit, and for anything
it declines, the general path's own result or exception. Checked against the general path on
generated calls, good and bad, and for the calls it must take, that it takes them."""

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shim
from shim.calls.pipeline import Pipeline

# Derandomized: how many generated calls are valid varies a lot from seed to seed, and the
# fixture below checks that both paths were exercised.
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def outcome(function):
    """("ok", outputs as (dtype, shape, bytes)) or ("error", exception type, message)."""
    try:
        results = function()
    except Exception as e:  # noqa: BLE001 - the exception is the outcome being compared
        return ("error", type(e).__name__, str(e))
    results = results if isinstance(results, tuple) else (results,)
    arrays = [r.numpy() if isinstance(r, shim.Buffer) else np.asarray(r) for r in results]
    return ("ok", [(a.dtype.str, a.shape, a.tobytes()) for a in arrays])


def general(pipeline, args, kwargs):
    with pipeline.prepare(*args, **kwargs) as call:
        return call()


def mostly(draw, good, bad):
    """``good`` 19 times in 20, else one of ``bad``: a call makes a dozen such choices, and
    most generated calls must be valid for the fast path to run at all."""
    return good if draw(st.integers(0, 19)) else draw(st.sampled_from(bad))


@st.composite
def arrays(draw, dtype, bad_dtypes, dims=2, like=None):
    """Arrays of the right kind mostly, in every layout Halide takes or a copy must make;
    of the shape ``like`` mostly, where given."""
    dtype = mostly(draw, dtype, bad_dtypes)
    ndim = mostly(draw, dims, [dims - 1, dims + 1])
    shape = tuple(mostly(draw, draw(st.integers(1, 7)), [0]) for _ in range(ndim))
    if like is not None:
        shape = mostly(draw, like, [shape])
    size = int(np.prod(shape, dtype=np.int64))
    base = (np.arange(2 * size) % 251).astype(dtype)
    array = base[:size].reshape(shape)
    layout = mostly(draw, "c", ["fortran", "strided", "reversed", "readonly", "swapped"])
    if layout == "fortran":
        array = np.asfortranarray(array)
    elif layout == "strided" and ndim:
        array = base[:2 * size].reshape(shape[:-1] + (shape[-1] * 2,))[..., ::2]
    elif layout == "reversed" and ndim:
        array = array[::-1]
    elif layout == "readonly":
        array = array.copy()
        array.flags.writeable = False
    elif layout == "swapped":
        array = array.astype(array.dtype.newbyteorder())
    return array


@st.composite
def scalars(draw, good):
    return mostly(draw, draw(good), [draw(st.floats(allow_nan=True, allow_infinity=True)),
                                     draw(st.integers(-2**70, 2**70)), True, 1e39, 40000,
                                     -40000, "x", 1j, None])


class Counting:
    """Counts the calls of a pipeline that the fast path took and those it declined (the
    general path, the Pipeline's _call_in_python, took them)."""

    def __init__(self, pipeline):
        self.pipeline, self.calls, self.declined = pipeline, 0, 0
        self._general = pipeline._call_in_python
        pipeline._call_in_python = self._declining  # (looked up on the instance first)

    def _declining(self, *args, **kwargs):
        self.declined += 1
        return self._general(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.pipeline(*args, **kwargs)

    @property
    def taken(self) -> int:
        return self.calls - self.declined

    def __getattr__(self, name):  # prepare() and the rest: the pipeline's
        return getattr(self.pipeline, name)


@pytest.fixture(scope="module")
def mix(host_pipelines):
    """The mix pipeline, called through a Counting."""
    counting = Counting(shim.load(host_pipelines["mix", "no_runtime"]))
    yield counting
    # The generated calls exercised both: the fast path's work and its refusals.
    assert counting.taken > 10 and counting.declined > 10, vars(counting)


@SETTINGS
@given(data=st.data())
def test_mix_calls_have_the_general_paths_outcome(mix, data):
    a = data.draw(arrays(np.uint8, [np.int8, np.float32]))
    b = data.draw(arrays(np.float32, [np.float64, np.int32], like=a.shape))
    shape = mostly(data.draw, a.shape, [b.shape, (3, 4), (9, 9)])
    out_dtype = mostly(data.draw, np.float32, [np.float64])
    alpha = data.draw(scalars(st.floats(-100, 100, width=32)))
    offset = data.draw(scalars(st.integers(-2**15, 2**15 - 1)))
    positional = data.draw(st.integers(0, 5))
    extra = mostly(data.draw, {}, [{"bogus": 1}])
    read_only = mostly(data.draw, False, [True])
    # Each buffer as it is, or as a shim.Buffer over it (the fast path takes Buffers too).
    wrapped = [data.draw(st.booleans()) for _ in range(3)]

    def as_given(array, wrap):
        if not wrap:
            return array
        try:
            return shim.Buffer(array)
        except shim.ShimError:
            return array  # (an array no Buffer takes: byte-swapped, say)

    def call(path):
        out = np.full(shape, -1, out_dtype)
        out.flags.writeable = not read_only
        values = [as_given(a, wrapped[0]), as_given(b, wrapped[1]), alpha, offset,
                  as_given(out, wrapped[2])]
        names = ["a", "b", "alpha", "offset", "output"]
        args = tuple(values[:positional])
        kwargs = dict(zip(names[positional:], values[positional:]), **extra)
        return outcome(lambda: path(args, kwargs)), out

    # The general path first: a call it accepts leaves its shapes known, so that the fast
    # path does not decline this one for want of a bounds check.
    slow, slow_out = call(lambda a_, k: general(mix, a_, k))
    fast, fast_out = call(lambda a_, k: mix(*a_, **k))
    assert fast == slow
    np.testing.assert_array_equal(fast_out, slow_out)


def test_a_good_call_takes_the_fast_path(mix, host_pipelines, monkeypatch):
    sum_diff = shim.load(host_pipelines["sum_diff", "bundled"])
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    b = np.ones((3, 4), np.int32)
    calls = [(mix, (np.zeros((3, 4), np.uint8), np.ones((3, 4), np.float32)),
              {"alpha": 0.25, "offset": 2, "output": np.empty((3, 4), np.float32)}),
             (sum_diff, (a, b), {"sum": np.empty((3, 4), np.int32), "diff": np.empty((3, 4), np.int32)})]
    for pipeline, args, kwargs in calls:
        pipeline(*args, **kwargs)  # the first call of a shape runs the bounds query
    general_calls = []
    original = Pipeline.prepare
    monkeypatch.setattr(Pipeline, "prepare", lambda self, *a, **k: general_calls.append(self)
                        or original(self, *a, **k))
    out = mix(*calls[0][1], **calls[0][2])
    np.testing.assert_array_equal(out, np.float32(0.75) + np.float32(2))
    assert out is calls[0][2]["output"]  # the caller's array, written in place
    total, difference = sum_diff(a, b, **calls[1][2])
    np.testing.assert_array_equal(total, a + b)
    np.testing.assert_array_equal(difference, a - b)
    assert general_calls == []


def test_pipeline_errors_and_prints_come_through(host_pipelines, capfd):
    checked_sqrt = shim.load(host_pipelines["checked_sqrt", "no_runtime"])
    good = np.full((4, 8), 4.0, np.float32)
    out = np.empty_like(good)
    checked_sqrt(good, False, out)  # remembered shapes: the calls below take the fast path
    checked_sqrt(good, True, out)
    np.testing.assert_array_equal(out, 2.0)
    assert "row" in capfd.readouterr().err  # halide_print from the worker threads
    bad = good.copy()
    bad[2, 3] = -1.0
    with pytest.raises(shim.PipelineError) as fast:
        checked_sqrt(bad, False, out)
    with pytest.raises(shim.PipelineError) as slow:
        general(checked_sqrt, (bad, False, out), {})
    assert (fast.value.code, str(fast.value)) == (slow.value.code, str(slow.value))


def test_many_threads_many_shapes(host_pipelines):
    brighten = shim.load(host_pipelines["brighten", "bundled"])
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(200):
                shape = tuple(rng.integers(1, 9, 2))
                image = rng.integers(0, 1000, shape).astype(np.float32)  # exact, fused or not
                scale = float(rng.integers(0, 10))
                out = brighten(image, scale=scale, offset=0.5, output=np.empty(shape, np.float32))
                np.testing.assert_array_equal(out, image * np.float32(scale) + np.float32(0.5))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_exit_waits_for_fast_calls_in_flight(host_pipelines):
    script = textwrap.dedent("""
        import sys, threading
        import numpy as np
        import shim
        p = shim.load(sys.argv[1])
        image = np.ones((2048, 2048), np.float32)
        out = np.empty_like(image)
        p(image, scale=2.0, offset=1.0, output=out)   # known shape: the calls below are fast
        started = threading.Event()
        def loop():
            started.set()
            try:
                while True:
                    p(image, scale=2.0, offset=1.0, output=out)
            except shim.ShimError as e:   # refused once the interpreter exits
                assert "exiting" in str(e), e
        threading.Thread(target=loop, daemon=True).start()
        started.wait()
        print("exiting", flush=True)
        """)
    done = subprocess.run([sys.executable, "-c", script, str(host_pipelines["brighten", "bundled"])],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "exiting" in done.stdout and "Traceback" not in done.stderr


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(input_shape=st.tuples(st.integers(1, 12), st.integers(1, 12)),
       output_shape=st.tuples(st.integers(1, 12), st.integers(1, 12)),
       runtime=st.sampled_from(["no_runtime", "bundled"]),
       given_as=st.sampled_from(["array", "tuple", "list"]))
def test_a_new_shape_is_checked_in_c_as_the_general_path_checks_it(host_pipelines, input_shape,
                                                                  output_shape, runtime, given_as):
    """The first call with a shape: the fast path runs the bounds query itself and accepts
    exactly what the general path's check accepts (blur3x3 reads one pixel around each
    output pixel), each on a pipeline whose cache of known shapes is empty. An output given
    as a shape gets the general path's Buffer (shim/calls/arguments.py, output_of_shape)."""
    path = host_pipelines["blur3x3", runtime]
    image = (np.arange(int(np.prod(input_shape))) * 37 % 4099).astype(np.uint16).reshape(input_shape)

    def call(pipeline, entry):
        out = np.full(output_shape, 7, np.uint16)
        given = {"array": out, "tuple": output_shape, "list": list(output_shape)}[given_as]
        return outcome(lambda: entry(pipeline)(image, given)), out

    fast, fast_out = call(shim.load(path), lambda p: p)
    slow, slow_out = call(shim.load(path), lambda p: p._call_in_python)
    assert fast == slow
    np.testing.assert_array_equal(fast_out, slow_out)


def test_a_new_shape_runs_with_no_python_when_the_query_accepts_it(host_pipelines):
    """A fresh pipeline's first call with a shape takes the fast path whole (no frame of the
    shim's runs); one the query refuses goes to the general path, which says why."""
    blur = shim.load(host_pipelines["blur3x3", "no_runtime"])
    image = (np.arange(10 * 12) * 37 % 4099).astype(np.uint16).reshape(10, 12)
    out = np.empty((8, 10), np.uint16)
    seen = []

    def profiler(frame, event, arg):
        if event == "call" and frame.f_globals.get("__name__", "").startswith("shim"):
            seen.append(frame.f_code.co_name)

    sys.setprofile(profiler)
    try:
        blur(image, out)
    finally:
        sys.setprofile(None)
    assert seen == []
    a = image.astype(np.uint32)
    across = ((a[:, :-2] + a[:, 1:-1] + a[:, 2:]) // 3).astype(np.uint16).astype(np.uint32)
    np.testing.assert_array_equal(out, ((across[:-2] + across[1:-1] + across[2:]) // 3))
    with pytest.raises(shim.BoundsError, match="too small"):
        blur(image, np.empty((9, 10), np.uint16))


def test_an_output_given_as_a_shape_takes_the_fast_path(host_pipelines, opencl, monkeypatch):
    """A shape for an output: the Buffer the general path would make, filled on the fast path
    (the general path's prepare() never runs), on the CPU and, left on the device as the
    general path leaves it, on a GPU."""
    from shim.pipelines.build import Build, build

    blur = shim.load(host_pipelines["blur3x3", "no_runtime"])
    brighten = shim.load(build(Build("brighten", "opencl", "no_runtime")))
    image = (np.arange(10 * 12) * 37 % 4099).astype(np.uint16).reshape(10, 12)
    floats = np.random.default_rng(3).random((8, 8), dtype=np.float32)
    general_calls = []
    original = Pipeline.prepare
    monkeypatch.setattr(Pipeline, "prepare", lambda self, *a, **k: general_calls.append(self)
                        or original(self, *a, **k))
    expected = shim.load(host_pipelines["blur3x3", "no_runtime"])._call_in_python(image, (8, 10))
    assert len(general_calls) == 1  # (the general path, for the reference)
    general_calls.clear()
    blurred = blur(image, [8, 10])
    brightened = brighten(floats, 2.0, 1.0, output=(8, 8))
    assert general_calls == []
    assert isinstance(blurred, shim.Buffer) and isinstance(brightened, shim.Buffer)
    np.testing.assert_array_equal(blurred.numpy(), expected.numpy())
    assert brightened.device_dirty()  # its results stay on the device until read
    np.testing.assert_allclose(brightened.numpy(), floats * 2 + 1, rtol=1e-6)
