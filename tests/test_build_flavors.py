"""The kinds of builds and schedules Halide's own AOT tests exercise (test/generator at
v21.0.0) that the rest of the suite does not, each as a pipeline of the tests' own
(tests/support/flavors/generators.py), built as a user builds it (Halide's generator command
line, ``cc -shared``; in a library that carries Halide's runtime, and in one built with
no_runtime, several pipelines a library) and checked against Halide's stock
runtime, run side by side in a child process (tests/support/flavors/stock_child.py), and
against numpy: the metadata of every argument type, generator params, nested extern stages,
an extern stage writing the output, async producers inside parallel loops, a call failing
midway, user_context, Halide's memory profiler, and copy stages on the shim's simulated host
device. What needs OpenCL is in test_build_flavors_opencl.py."""

import ctypes
import subprocess
import sys
import threading

import numpy as np
import pytest

import shim
from shim.native import ffi, lib
from support.flavors.build import run_stock, shared_builds
from support.flavors.hooks import (DEFAULT_FREE, DEFAULT_MALLOC, DO_PAR_FOR, FREE, MALLOC, MESSAGE,
                                   TRACE, FailingSecondMalloc, Hooks, runtime_function)
from support.threads import run_threads

pytest.importorskip("halide", reason="building the flavor pipelines needs halide")

RUNTIMES = ("bundled", "no_runtime")
METADATA_PARAMS = {"planes.type": "uint8", "planes.dim": "3", "chosen.type": "uint16"}
RPN_B = {"expression": "x 5 * y - 2 /", "kind": "int16", "scale": "3",
         "rows_in_parallel": "true"}
NEST = ["flv_nest_root", "flv_nest_inner", "flv_nest_combine"]


def target(base: str, runtime: str) -> str:
    return f"{base}-no_runtime" if runtime == "no_runtime" else base


def _specs():
    """{(library, runtime): (file name, [(generator, target[, params[, function]])...])}.
    One library holds every CPU flavor but the profiled one (whose runtime differs), as a
    program's libraries often hold several pipelines: "bundled", it carries Halide's runtime
    (the metadata tester is built with it, the others with no_runtime, as one runtime is
    enough for all), "no_runtime", none; each object is compiled once for both."""
    others = [("flv_rpn", "host-no_runtime", None, "flv_rpn_a"),
              ("flv_rpn", "host-no_runtime", RPN_B, "flv_rpn_b")] + \
        [(g, "host-user_context-no_runtime") for g in NEST + ["flv_tagged"]] + \
        [(g, "host-no_runtime") for g in ("flv_extern_output", "flv_async_parallel",
                                          "flv_cleanup", "flv_copy_stages", "flv_copy_frames")]
    specs = {}
    for runtime in RUNTIMES:
        specs["host", runtime] = [("flv_metadata", target("host", runtime), METADATA_PARAMS)] + others
        specs["orbits", runtime] = [("flv_orbits", target("host-profile", runtime))]
    return {key: (f"{key[0]}-{key[1]}", objects) for key, objects in specs.items()}


def load(libs, runtime: str, name: str):
    """Pipeline ``name`` of the CPU flavors' library of ``runtime``."""
    return shim.load(libs["host", runtime], name=name)


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    return shared_builds(tmp_path_factory)


@pytest.fixture(scope="module")
def libs(builds):
    """{(case, runtime): path of the library}, built once for the module."""
    return builds.libraries(_specs())


# --- what the stock runtime does, asked once for the module -----------------------------------

def metadata_values():
    rng = np.random.default_rng(11)
    return {
        "pixels": rng.integers(0, 256, (3, 4, 5), dtype=np.uint8),
        "planes": rng.integers(0, 256, (3, 4, 5), dtype=np.uint8),
        "halves": np.array([0.5, 1.25, -2.0, 3.5, 0.75], np.float16),
        "no_default": 7, "flag": False, "i8": -3, "i16": 16, "i32": 32, "i64": -64, "u8": 80,
        "u16": 160, "u32": 2000, "u64": 1000, "f16": 2.5, "f32": np.float32(32.1234),
        "f64": 64.25, "pointer": 0x1234,
    }


METADATA_OUTPUTS = {"plain": ((3, 4, 5), np.float32), "pair.0": ((3, 4, 5), np.float32),
                    "pair.1": ((3, 4, 5), np.int32), "chosen": ((4, 5), np.uint16),
                    "total": ((), np.float64)}
NEST_SHAPE = (3, 20, 30)  # (c, y, x), interleaved: c innermost
TAG_CALLS, TAG_BAD = 24, {i: i % 6 for i in range(24) if i % 3 == 0}
ORBIT_CALLS, ORBIT_SCALARS, ORBIT_SHAPE = 6, {"cx": 0.3, "cy": 0.5, "steps": 20}, (30, 100)


def interleaved(shape, dtype):
    """A numpy array of ``shape`` (c, y, x) with c innermost in memory."""
    c, h, w = shape
    return np.zeros((h, w, c), dtype).transpose(2, 0, 1)


def extern_input():
    return np.random.default_rng(5).integers(0, 256, (48, 70), dtype=np.int32)


def frames_input():
    return (np.arange(5 * 30 * 40) % 251).astype(np.int32).reshape(5, 30, 40)


@pytest.fixture(scope="module")
def stock(libs, builds):
    """{case: what Halide's stock runtime did}: every case of this module in one child."""
    requests = {
        "metadata": ("metadata", dict(library=libs["host", "bundled"], name="flv_metadata")),
        "metadata_call": ("run", dict(library=libs["host", "bundled"], name="flv_metadata",
                                      values={**metadata_values(),
                                              **{k: np.zeros(s, t)
                                                 for k, (s, t) in METADATA_OUTPUTS.items()}})),
        "rpn_a": ("run", dict(library=libs["host", "bundled"], name="flv_rpn_a",
                              values={"offset": 2, "output": np.zeros((6, 9), np.int32)})),
        "rpn_b": ("run", dict(library=libs["host", "bundled"], name="flv_rpn_b",
                              values={"offset": -4, "output": np.zeros((6, 9), np.int16)})),
        "nest": ("run", dict(library=libs["host", "bundled"], name="flv_nest_root",
                             values={"level": np.array(38.5, np.float32),
                                     "root": ("interleaved", NEST_SHAPE, np.float32)})),
        "nest_error": ("run", dict(library=libs["host", "bundled"], name="flv_nest_root",
                                   values={"level": np.array(-5, np.float32),
                                           "root": ("interleaved", NEST_SHAPE, np.float32)})),
        "extern_output": ("run", dict(library=libs["host", "bundled"],
                                      name="flv_extern_output",
                                      values={"input": extern_input(), "addend": 20,
                                              "output": np.zeros((48, 70), np.int32)})),
        "async_parallel": ("run", dict(library=libs["host", "bundled"],
                                       name="flv_async_parallel",
                                       values={"output": np.zeros((6, 16, 12), np.int32)})),
        "cleanup": ("failing_malloc", dict(library=libs["host", "bundled"],
                                           name="flv_cleanup", size=64)),
        "tagged": ("tagged_threads", dict(library=libs["host", "bundled"], name="flv_tagged",
                                          calls=TAG_CALLS, threads=6,
                                          bad_rows=[TAG_BAD.get(i) for i in range(TAG_CALLS)])),
        "orbits": ("profiled_calls", dict(library=libs["orbits", "bundled"], name="flv_orbits",
                                          calls=ORBIT_CALLS, threads=3, scalars=ORBIT_SCALARS,
                                          shape=ORBIT_SHAPE)),
        "copy_stages": ("run", dict(library=libs["host", "bundled"], name="flv_copy_stages",
                                    values={"input": copy_input(),
                                            "output": np.zeros((70, 100), np.float32)})),
        "copy_frames": ("run", dict(library=libs["host", "bundled"], name="flv_copy_frames",
                                    values={"input": frames_input(),
                                            "output": np.zeros((30, 40), np.int32)})),
    }
    answers = run_stock(builds.folder, list(requests.values()))
    return dict(zip(requests, answers))


def copy_input():
    return np.random.default_rng(3).random((70, 100), dtype=np.float32)


# --- metadata: every scalar type, defaults, ranges, estimates ----------------------------------

_NUMPY = {(0, 8): "i1", (0, 16): "i2", (0, 32): "i4", (0, 64): "i8", (1, 1): "?", (1, 8): "u1",
          (1, 16): "u2", (1, 32): "u4", (1, 64): "u8", (2, 16): "f2", (2, 32): "f4",
          (2, 64): "f8"}


def decoded(type_triple, raw):
    """A scalar's value from the bytes of its halide_scalar_value_t (as Halide's metadata
    holds it), decoded here without the shim: None where the metadata has none."""
    if raw is None:
        return None
    code, bits, _ = type_triple
    if code == 3:
        return int.from_bytes(raw[:8], "little")
    dtype = np.dtype(_NUMPY[code, bits])
    return np.frombuffer(raw[:dtype.itemsize], dtype)[0].item()


# (default, min, max, estimate) the generator gives each scalar
SCALARS = {
    "no_default": (None, None, None, None), "flag": (True, None, None, False),
    "i8": (8, -8, 127, 3), "i16": (16, -16, 127, None), "i32": (32, -32, 127, None),
    "i64": (64, -64, 127, None), "u8": (80, 8, 255, None), "u16": (160, 16, 2550, None),
    "u32": (320, 32, 2550, None), "u64": (640, 64, 2550, None), "f16": (1.5, -4.0, 1024.0, None),
    "f32": (float(np.float32(32.1234)), float(np.float32(-3200.1234)),
            float(np.float32(3200.1234)), 48.5),
    "f64": (64.25, -6400.25, 6400.25, None), "pointer": (None, None, None, None),
}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_metadata_of_every_argument_type_reads_as_halides_own(libs, stock, runtime):
    """Each argument as shim.load reads the metadata: names in order, kinds, dimensions,
    types (a Tuple output is two buffers, a 0-D output one; types and dimensions given on the
    generator command line), scalar defaults, ranges and estimates, buffer estimates (whole,
    partial, absent): equal to the metadata read in the stock runtime's process, and to what
    the generator says."""
    pipeline = load(libs, runtime, "flv_metadata")
    theirs = stock["metadata"]
    assert pipeline.name == theirs["name"] == "flv_metadata"
    assert ("no_runtime" in pipeline.target.split("-")) == (runtime == "no_runtime")
    assert [a.name for a in pipeline.arguments] == [a["name"] for a in theirs["arguments"]]
    for mine, their in zip(pipeline.arguments, theirs["arguments"]):
        assert int(mine.kind) == their["kind"], mine.name
        assert mine.dimensions == their["dimensions"], mine.name
        assert (mine.type.code, mine.type.bits, mine.type.lanes) == their["type"], mine.name
        values = tuple(decoded(their["type"], their[f]) for f in
                       ("scalar_def", "scalar_min", "scalar_max", "scalar_estimate"))
        assert (mine.default, mine.min, mine.max, mine.estimate) == values, mine.name
        if mine.is_buffer:
            estimates = their["buffer_estimates"]
            expected = None if estimates is None else tuple(zip(estimates[0::2], estimates[1::2]))
            assert mine.buffer_estimates == expected, mine.name
        else:
            assert values == SCALARS[mine.name], mine.name
    kinds = {a.name: (str(a.type), a.dimensions, a.is_output) for a in pipeline.arguments
             if a.is_buffer}
    assert kinds == {"pixels": ("uint8", 3, False), "planes": ("uint8", 3, False),
                     "halves": ("float16", 1, False), "plain": ("float32", 3, True),
                     "pair.0": ("float32", 3, True), "pair.1": ("int32", 3, True),
                     "chosen": ("uint16", 2, True), "total": ("float64", 0, True)}
    estimates = {a.name: a.buffer_estimates for a in pipeline.arguments if a.is_buffer}
    assert estimates["pixels"] == ((0, 2592), (42, 1968), (0, 3))
    assert estimates["planes"] == ((None, None), (7, 99), (None, None))
    assert estimates["plain"] == ((10, 2592), (20, 1968), (0, 3))
    assert estimates["chosen"] == ((None, None), (5, 50))


def test_python_m_shim_info_shows_every_argument(libs):
    done = subprocess.run([sys.executable, "-m", "shim", "info", str(libs["host", "no_runtime"]),
                           "--name", "flv_metadata"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    for expected in (
            "pixels: input buffer of uint8, 3-D, estimated min+extent x=0+2592 y=42+1968 z=0+3",
            "planes: input buffer of uint8, 3-D, estimated min+extent x=?+? y=7+99 z=?+?",
            "halves: input buffer of float16, 1-D",
            "no_default: int32 scalar",
            "flag: bool scalar, default True, estimate False",
            "i8: int8 scalar, default 8, min -8, max 127, estimate 3",
            "u64: uint64 scalar, default 640, min 64, max 2550",
            "f32: float32 scalar, default 32.1234, min -3200.1233, max 3200.1233, estimate 48.5",
            "f64: float64 scalar, default 64.25, min -6400.25, max 6400.25",
            "pointer: handle scalar",
            "pair.0: output buffer of float32, 3-D",
            "pair.1: output buffer of int32, 3-D",
            "chosen: output buffer of uint16, 2-D, estimated min+extent x=?+? y=5+50",
            "total: output buffer of float64, 0-D"):
        assert expected in lines, f"{expected!r} not in:\n{done.stdout}"
    assert "no_runtime" in done.stdout


def metadata_reference(v):
    """flv_metadata's outputs, in numpy (the generator's order of operations)."""
    ints = float(v["i8"] + v["i16"] + v["i32"] + v["i64"] + v["no_default"])
    unsigned = float(v["u8"] + v["u16"] + v["u32"] + v["u64"])
    floats = float(np.float16(v["f16"])) + float(np.float32(v["f32"])) + v["f64"]
    sums = ints * 1000 + unsigned + floats + (0.5 if v["flag"] else 0.0)
    value = (v["pixels"].astype(np.float32) * np.float32(2) + v["planes"].astype(np.float32)
             + v["halves"].astype(np.float32)[None, None, :] + np.float32(sums))
    c = np.arange(3)[:, None, None]
    halves_sum = np.float16(0)
    for h in v["halves"][:4]:
        halves_sum = np.float16(halves_sum + h)
    return {"plain": value, "pair.0": value + np.float32(1),
            "pair.1": v["pixels"].astype(np.int32) - c,
            "chosen": (v["pixels"][0].astype(np.int32) + np.arange(5)).astype(np.uint16),
            "total": np.float64(sums + float(halves_sum))}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_call_with_every_argument_type_gives_what_the_stock_runtime_gives(libs, stock, runtime):
    pipeline = load(libs, runtime, "flv_metadata")
    values = metadata_values()
    outputs = pipeline(**values, **{k: s for k, (s, _) in METADATA_OUTPUTS.items()})
    assert len(outputs) == len(METADATA_OUTPUTS)
    theirs = stock["metadata_call"]
    assert theirs["result"] == 0, theirs["errors"]
    reference = metadata_reference(values)
    for name, out in zip(METADATA_OUTPUTS, outputs):
        assert out.dtype == METADATA_OUTPUTS[name][1] and out.shape == METADATA_OUTPUTS[name][0]
        np.testing.assert_array_equal(out.numpy(), theirs["outputs"][name], err_msg=name)
        np.testing.assert_allclose(out.numpy(), reference[name], rtol=1e-6, err_msg=name)
    # Defaults fill what is left out; no_default has none to fill.
    with pytest.raises(shim.ArgumentError, match="no_default: missing int32 scalar"):
        pipeline(**{k: values[k] for k in ("pixels", "planes", "halves")})
    # The declared ranges are checked, as the pipeline would.
    with pytest.raises(shim.ArgumentError, match="i8"):
        pipeline(**{**values, "i8": -9}, **{k: s for k, (s, _) in METADATA_OUTPUTS.items()})


# --- generator params that change the pipeline -------------------------------------------------

def rpn_reference(expression, dtype, scale, offset, shape):
    ys, xs = np.mgrid[0:shape[0], 0:shape[1]].astype(dtype)
    stack = []
    for token in expression.split():
        if token in ("x", "y"):
            stack.append(xs if token == "x" else ys)
        elif token in "+-*/":
            right, left = stack.pop(), stack.pop()
            operation = {"+": np.add, "-": np.subtract, "*": np.multiply,
                         "/": np.floor_divide}[token]
            stack.append(operation(left, right))
        else:
            stack.append(dtype.type(int(token)))
    return (stack[0] * dtype.type(scale) + dtype.type(offset)).astype(dtype)


def test_generator_params_make_different_pipelines_of_one_generator(libs, stock):
    """One generator, two sets of generator params on the command line (a string with spaces,
    a type name, an int, a bool): two pipelines of different argument types, results and
    schedules (the bool makes the rows a parallel loop: one halide_do_par_for a call)."""
    loops = []
    default_do_par_for = runtime_function("halide_default_do_par_for", ctypes.c_int,
                                          [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                           ctypes.c_int, ctypes.c_void_p])

    def counting(uc, task, lo, size, closure):
        loops.append(size)
        return default_do_par_for(uc, task, lo, size, closure)

    default = load(libs, "bundled", "flv_rpn_a")
    assert [(a.name, str(a.type)) for a in default.arguments] == [("offset", "int32"),
                                                                ("output", "int32")]
    with Hooks(halide_set_custom_do_par_for=(DO_PAR_FOR, counting)):
        out = default(offset=2, output=(6, 9))
    assert loops == []
    expected = rpn_reference("x y +", np.dtype(np.int32), 1, 2, (6, 9))
    np.testing.assert_array_equal(out.numpy(), expected)
    np.testing.assert_array_equal(out.numpy(), stock["rpn_a"]["outputs"]["output"])
    for runtime in RUNTIMES:
        other = load(libs, runtime, "flv_rpn_b")
        assert [(a.name, str(a.type)) for a in other.arguments] == [("offset", "int16"),
                                                                  ("output", "int16")]
        with Hooks(halide_set_custom_do_par_for=(DO_PAR_FOR, counting)):
            out = other(offset=-4, output=(6, 9))
        assert loops.pop() == 6 and not loops
        assert out.dtype == np.int16
        expected = rpn_reference(RPN_B["expression"], np.dtype(np.int16), 3, -4, (6, 9))
        np.testing.assert_array_equal(out.numpy(), expected)
        np.testing.assert_array_equal(out.numpy(), stock["rpn_b"]["outputs"]["output"])
        with pytest.raises(shim.ArgumentError, match="offset"):
            other(offset=40000, output=(6, 9))  # (int16 now)


# --- nested externs ----------------------------------------------------------------------------

def nest_value(level):
    """flv_nest_root's every element: inner(l) = 10 l + (l + 2); root = 10 inner(level) +
    inner(level + 1)."""
    def inner(v):
        return 10 * v + (v + 2)
    return 10 * inner(level) + inner(level + 1)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_nested_extern_stages_give_what_the_stock_runtime_gives(libs, stock, runtime):
    """Extern stages in C (the tests' own library) inside a Halide pipeline called as an
    extern stage by another, per row of a parallel loop, user_context passed down; the level
    a 0-D input read at a constant index for an extern stage's argument, the output
    interleaved (x stride 3) as the root requires."""
    root = load(libs, runtime, "flv_nest_root")
    assert [a.name for a in root.arguments] == ["level", "root"]  # (no __user_context)
    theirs = stock["nest"]
    assert theirs["result"] == 0, theirs["errors"]
    c, h, w = NEST_SHAPE
    for level in (38.5, 38.5, 2.75):
        out = shim.Buffer.make_interleaved(np.float32, w, h, c)
        assert root(np.array(level, np.float32), root=out) is out
        np.testing.assert_array_equal(out.numpy(), np.full(NEST_SHAPE, nest_value(level), np.float32))
    out = shim.Buffer.make_interleaved(np.float32, w, h, c)
    root(np.array(38.5, np.float32), root=out)
    np.testing.assert_array_equal(out.numpy(), theirs["outputs"]["root"])
    np.testing.assert_array_equal(theirs["outputs"]["root"], nest_value(38.5))


@pytest.mark.xfail(strict=True, reason="an interleaved numpy array (x stride 3) given for an "
                   "output whose pipeline requires x stride 3 is computed into a dense copy "
                   "(shim/calls/arguments.py's _halide_can_address assumes Halide's default "
                   "stride constraint), which the pipeline refuses: constraint_violated, where "
                   "the stock runtime, given the same array, computes into it")
def test_an_interleaved_numpy_array_is_an_interleaved_output(libs, stock):
    root = load(libs, "no_runtime", "flv_nest_root")
    out = interleaved(NEST_SHAPE, np.float32)
    try:
        root(np.array(38.5, np.float32), root=out)
        code = 0
    except shim.PipelineError as e:  # (its traceback would keep the call's Buffers alive)
        code = e.code
    assert code == 0
    np.testing.assert_array_equal(out, stock["nest"]["outputs"]["root"])


def test_a_0d_input_an_extern_stage_reads_survives_the_bounds_query(libs):
    """The shim's bounds query (before every new shape, on the general and the fast path)
    once passed a 0-D input in the query's form, without memory, and the extern stage's
    argument level[()] was loaded from it: a segmentation fault. In a child, so that a
    regression fails this test alone."""
    program = (
        "import numpy as np, shim\n"
        f"root = shim.load({str(libs['host', 'no_runtime'])!r}, name='flv_nest_root')\n"
        "level = np.array(1.0, np.float32)\n"
        "for run in range(3):\n"
        "    out = shim.Buffer.make_interleaved(np.float32, 7 + run, 5, 3)\n"
        "    root(level, root=out)\n"
        "    assert (out.numpy() == 10 * 13 + 24).all()\n"
        "print('survived')\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "survived"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_error_in_a_nested_extern_stage_reaches_its_own_call(libs, stock, runtime):
    """A leaf fails (a negative level) inside the pipelines the root calls as extern stages:
    the root's call raises with the stock runtime's code and messages (the leaf's, through
    halide_error with the user_context it was given, then each enclosing stage's); with
    several Python threads calling, each failing call raises with its own leaf's message
    only, and the others are right."""
    root = load(libs, runtime, "flv_nest_root")
    theirs = stock["nest_error"]
    assert theirs["result"] != 0
    assert theirs["errors"][0].startswith("flv_leaf: negative level ")
    c, h, w = NEST_SHAPE
    with pytest.raises(shim.PipelineError) as e:
        root(np.array(-5, np.float32), root=shim.Buffer.make_interleaved(np.float32, w, h, c))
    assert e.value.code == theirs["result"]
    assert e.value.message.split() == " ".join(theirs["errors"]).split()

    def leaves(level):  # the levels of the four leaves a root call of ``level`` runs
        return {level, level + 2, level + 1, level + 3}

    def call(index):
        for attempt in range(4):
            level = -10.0 * (index + 1) if (index + attempt) % 2 else 1.0 + index
            out = shim.Buffer.make_interleaved(np.float32, w, h, c)
            if level < 0:
                with pytest.raises(shim.PipelineError) as e:
                    root(np.array(level, np.float32), root=out)
                assert e.value.code == theirs["result"]
                said = {float(t.split()[-1]) for t in str(e.value).split("\n")
                        if "flv_leaf: negative level" in t}
                assert said and said <= leaves(level), (level, str(e.value))
            else:
                root(np.array(level, np.float32), root=out)
                np.testing.assert_array_equal(out.numpy(), nest_value(level))

    run_threads(4, call)


# --- an extern stage writing the output ----------------------------------------------------------

def _extern_calls(path):
    library = ctypes.CDLL(str(path))
    library.flv_add_calls.restype = ctypes.c_int
    return library.flv_add_calls


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_extern_stage_writes_the_pipelines_output(libs, stock, runtime):
    """The output is an extern stage in C, tile by tile in a parallel loop, each tile's input
    computed per tile: equal to the stock runtime's, the extern called once per tile; an
    output left out is sized by the extern stage's answer to the bounds query; an output
    with mins elsewhere is written at its own coordinates."""
    pipeline = load(libs, runtime, "flv_extern_output")
    calls = _extern_calls(libs["host", runtime])
    image = extern_input()
    calls()
    out = pipeline(image, 20, output=image.shape)
    assert calls() == -(-70 // 16) * (48 // 8)
    np.testing.assert_array_equal(out.numpy(), stock["extern_output"]["outputs"]["output"])
    np.testing.assert_array_equal(out.numpy(), image * 3 + 20)
    sized = pipeline(image, -1)  # (omitted: as large as the input covers)
    assert sized.shape == image.shape
    np.testing.assert_array_equal(sized.numpy(), image * 3 - 1)
    placed = shim.Buffer(np.int32, [40, 25])
    placed.set_min([10, 20])
    assert pipeline(image, 5, output=placed) is placed
    np.testing.assert_array_equal(placed.numpy(), image[20:45, 10:50] * 3 + 5)


# --- async producers inside parallel loops ---------------------------------------------------------

def async_reference(shape):
    zs, _, xs = np.mgrid[0:shape[0], 0:shape[1], 0:shape[2]]
    return (4 * zs - 72 + xs).astype(np.int32)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_async_producers_inside_parallel_loops(libs, stock, runtime):
    """Async producers at three levels inside nested parallel loops, the innermost an extern
    stage that sleeps where a seed says: right, as under the stock runtime, for many seeds,
    and with the thread pool cut to two threads (each call needs more at once: Halide's pool
    must grow for the async tasks). A hang fails the test (support.threads' watchdog)."""
    pipeline = load(libs, runtime, "flv_async_parallel")
    library = ctypes.CDLL(str(libs["host", runtime]))
    library.flv_jitter_seed.argtypes = [ctypes.c_uint64]
    shape = (6, 16, 12)
    np.testing.assert_array_equal(stock["async_parallel"]["outputs"]["output"],
                                  async_reference(shape))
    for seed in range(6):
        library.flv_jitter_seed(seed)
        np.testing.assert_array_equal(pipeline(output=shape).numpy(), async_reference(shape))
    assert library.flv_jitter_calls() > 0 and library.flv_jitter_sleeps() > 0
    previous = shim.set_num_threads(2)
    try:
        def calls(index):
            for seed in range(3):
                library.flv_jitter_seed(seed)
                out = pipeline(output=(5, 9, 10))
                np.testing.assert_array_equal(out.numpy(), async_reference((5, 9, 10)))

        run_threads(1, calls)
    finally:
        shim.set_num_threads(previous)


ASYNC_FROM_THREADS = """
import sys, threading
import numpy as np
import shim
pipeline = shim.load(sys.argv[1], name="flv_async_parallel")
def calls(index):
    zs, _, xs = np.mgrid[0:3 + index, 0:9, 0:10]
    for _ in range(150):
        out = pipeline(output=(3 + index, 9, 10))
        assert (out.numpy() == 4 * zs - 72 + xs).all()
threads = [threading.Thread(target=calls, args=(i,)) for i in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("survived")
"""


def test_async_producers_inside_parallel_loops_called_from_several_threads_at_once(libs):
    """Three Python threads calling the pipeline at once, 150 times each: in a child, whose
    abort fails this test alone. Halide 21's thread pool aborts the process here ("Logic
    error: thread over commit", thread_pool_common.h:572; a bundled library under its own
    runtime aborted 4 runs of 4 with three threads calling it 30 times each); the shim's pool
    (native_stubs/calls/thread_pool.c) runs every call."""
    done = subprocess.run([sys.executable, "-c", ASYNC_FROM_THREADS,
                           str(libs["host", "no_runtime"])],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "survived"


# --- a call failing midway frees what it allocated -------------------------------------------------

@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_call_failing_midway_frees_what_it_allocated(libs, stock, runtime):
    """Two heap allocations, the second refused by the application's halide_malloc: the call
    fails with the stock runtime's code and message, the first allocation freed, one error
    reported, as under the stock runtime; and the next call (hooks put back) is right."""
    pipeline = load(libs, runtime, "flv_cleanup")
    theirs = stock["cleanup"]
    counting = FailingSecondMalloc()
    with counting.hooks():
        with pytest.raises(shim.PipelineError) as e:
            pipeline(output=np.zeros(64, np.int32))
    assert e.value.code == theirs["result"] == lib.halide_error_code_out_of_memory
    assert (counting.mallocs, counting.failed, counting.frees) == \
        (theirs["mallocs"], theirs["failed"], theirs["frees"]) == (1, 1, 1)
    assert not counting.live and theirs["live"] == 0
    assert counting.errors == theirs["errors"]
    assert theirs["errors"][0].strip() in str(e.value)
    xs = np.arange(64)
    np.testing.assert_array_equal(pipeline(output=np.zeros(64, np.int32)), -7 + 1 + 0 * xs)


# --- user_context: many calls, each with its own ----------------------------------------------------

def _addresses(*cdata):
    return [int(ffi.cast("uintptr_t", c)) for c in cdata]


def test_many_threads_each_passing_its_own_user_context(libs, stock):
    """Halide's user_context insanity test's situation under the shim: a program calls a
    user_context pipeline directly, from many threads at once, each call with its own
    user_context; the program's print, error, trace, malloc and free hooks must each get the
    context of the call they serve, from Halide's worker threads too. Per call, what each
    hook saw is what it saw under the stock runtime (which the child ran the same way), and
    no hook ever saw a context that was not its call's."""
    pipeline = load(libs, "no_runtime", "flv_tagged")  # (the shim's runtime, globally first)
    assert [a.name for a in pipeline.arguments] == ["input", "tag", "output"]
    function = getattr(ctypes.CDLL(str(libs["host", "no_runtime"])), "flv_tagged_argv")
    function.restype, function.argtypes = ctypes.c_int, [ctypes.c_void_p]
    slots = (ctypes.c_int * TAG_CALLS)()
    base, size = ctypes.addressof(slots), ctypes.sizeof(ctypes.c_int)
    seen = {"print": [], "error": [], "trace": [], "malloc": [], "free": []}
    lock = threading.Lock()

    def index_of(uc):
        offset = (uc or 0) - base
        return offset // size if 0 <= offset < TAG_CALLS * size else -1

    def note(kind, uc, text=""):
        with lock:
            seen[kind].append((index_of(uc), text))

    def on_malloc(uc, n):
        note("malloc", uc)
        return DEFAULT_MALLOC(uc, n)

    def on_free(uc, pointer):
        note("free", uc)
        DEFAULT_FREE(uc, pointer)

    calls = []
    for i in range(TAG_CALLS):
        image = np.full((6, 5), float(i), np.float32)
        if i in TAG_BAD:
            image[TAG_BAD[i], 1] = -1
        source, out = shim.Buffer(image), shim.Buffer(np.zeros_like(image))
        context = ctypes.c_void_p(base + i * size)
        tag = ffi.new("struct halide_scalar_value_t *")
        tag.u.i32 = i
        argv = (ctypes.c_void_p * 4)(ctypes.addressof(context), *_addresses(source.raw, tag, out.raw))
        calls.append((argv, context, tag, source, out, image))
    results = [None] * TAG_CALLS

    def worker(k):
        for i in range(k, TAG_CALLS, 6):
            argv, _, _, _, out, image = calls[i]
            code = function(argv)
            results[i] = (code, bool(code != 0 or np.array_equal(out.numpy(), image * 2)))

    with Hooks(halide_set_custom_print=(MESSAGE, lambda uc, m: note("print", uc, m.decode())),
               halide_set_error_handler=(MESSAGE, lambda uc, m: note("error", uc, m.decode())),
               halide_set_custom_trace=(TRACE, lambda uc, e: note("trace", uc) or 0),
               halide_set_custom_malloc=(MALLOC, on_malloc),
               halide_set_custom_free=(FREE, on_free)):
        run_threads(6, worker)
    theirs = stock["tagged"]
    assert results == [tuple(r) for r in theirs["results"]]
    assert [code != 0 for code, _ in results] == [i in TAG_BAD for i in range(TAG_CALLS)]
    for kind in seen:
        assert all(index >= 0 for index, _ in seen[kind]), f"{kind} saw another context"
        # (A failing call's other rows may run or not, under either runtime: what they
        # printed and stored is compared for the calls that succeed.)
        compared = [i for i in range(TAG_CALLS)
                    if kind in ("error", "malloc", "free") or i not in TAG_BAD]
        mine = [sorted(t for j, t in seen[kind] if j == i) for i in compared]
        stocks = [sorted(t for j, t in theirs["seen"][kind] if j == i) for i in compared]
        assert mine == stocks, kind
    for index, text in seen["print"] + seen["error"]:
        assert f"call {index} " in text
    assert all(seen[k] for k in seen)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_calls_on_many_threads_each_get_their_own_errors_and_prints(libs, runtime, monkeypatch):
    """The same pipeline through the shim's API from many Python threads (the shim's own
    call contexts, user_context NULL): each call's prints, from Halide's worker threads, come
    out on its own thread as it returns, and each failing call raises with its own message."""
    pipeline = load(libs, runtime, "flv_tagged")
    written = {}
    lock = threading.Lock()

    class PerThread:
        def write(self, text):
            with lock:
                written.setdefault(threading.get_ident(), []).append(text)
            return len(text)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stderr", PerThread())
    failures = []

    def caller(index):
        for attempt in range(5):
            tag = index * 100 + attempt
            image = np.full((8, 3), float(tag), np.float32)
            bad = attempt % 2 == 1
            if bad:
                image[attempt + 1, 2] = -1
            with lock:
                written.pop(threading.get_ident(), None)
            try:
                out = pipeline(image, tag, output=image.shape)
                assert not bad and np.array_equal(out.numpy(), image * 2)
            except shim.PipelineError as e:
                assert bad and f"call {tag} negative at row {attempt + 1}" in str(e)
                assert str(e).count("Requirement Failed") == 1
            text = "".join(written.get(threading.get_ident(), []))
            rows = sorted(line for line in text.splitlines() if " call " in line)
            if not bad:
                if rows != sorted(f"{2 * tag:f} call {tag} row {y}" for y in range(8)):
                    failures.append((tag, rows))
            elif any(f"call {tag} " not in line for line in rows):
                failures.append((tag, rows))

    run_threads(6, caller)
    assert not failures


# --- Halide's memory profiler ------------------------------------------------------------------------

def _profiler_totals(name: bytes):
    """Halide's profiler figures, summed over the entries of pipelines called ``name`` (one
    per library): the pipeline's runs, allocations and bytes, and per Func."""
    totals = {"runs": 0, "num_allocs": 0, "memory_total": 0, "funcs": {}}
    state = lib.halide_profiler_get_state()
    lib.halide_profiler_lock(state)
    try:
        p = state.pipelines
        while p != ffi.NULL:
            if ffi.string(p.name) == name:
                totals["runs"] += p.runs
                totals["num_allocs"] += p.num_allocs
                totals["memory_total"] += p.memory_total
                for f in range(p.num_funcs):
                    s = p.funcs[f]
                    entry = totals["funcs"].setdefault(ffi.string(s.name).decode(),
                                                       {"num_allocs": 0, "memory_total": 0,
                                                        "stack_peak": 0})
                    entry["num_allocs"] += s.num_allocs
                    entry["memory_total"] += s.memory_total
                    entry["stack_peak"] = max(entry["stack_peak"], s.stack_peak)
            p = ffi.cast("struct halide_profiler_pipeline_stats *", p.next)
    finally:
        lib.halide_profiler_unlock(state)
    return totals


def test_memory_figures_of_halides_profiler_are_the_stock_runtimes(libs, stock):
    """A profiled pipeline allocating on the heap per tile of a parallel loop, its argmin's
    state on the stack, called from several threads: the allocations, bytes and stack peak
    Halide's profiler counts under the shim are those it counts under the stock runtime, per
    pipeline and per Func, and what the tiling says (two float32 planes of 8x8x(steps+1)
    per tile). Then shim.profile() gives each call its own share."""
    theirs = stock["orbits"]
    assert theirs["results"] == [0] * ORBIT_CALLS
    tiles = -(-ORBIT_SHAPE[1] // 8) * -(-ORBIT_SHAPE[0] // 8)
    per_tile = 2 * 8 * 8 * 4 * (ORBIT_SCALARS["steps"] + 1)
    assert theirs["funcs"]["orbit"]["num_allocs"] == 2 * tiles * ORBIT_CALLS
    assert theirs["funcs"]["orbit"]["memory_total"] == per_tile * tiles * ORBIT_CALLS
    assert per_tile // 2 <= theirs["memory_peak"] <= per_tile * tiles
    for runtime in RUNTIMES:
        pipeline = shim.load(libs["orbits", runtime])
        before = _profiler_totals(b"flv_orbits")
        results = []

        def calls(index):
            for _ in range(index, ORBIT_CALLS, 3):
                results.append(pipeline(**ORBIT_SCALARS, escape=ORBIT_SHAPE).numpy())

        run_threads(3, calls)
        after = _profiler_totals(b"flv_orbits")
        for out in results:
            np.testing.assert_array_equal(out, theirs["escape"])
        assert after["runs"] - before["runs"] == ORBIT_CALLS
        for key in ("num_allocs", "memory_total"):
            assert after[key] - before[key] == theirs[key], key
            for func in ("orbit", "argmin", "escape"):
                assert after["funcs"][func][key] - before["funcs"].get(func, {key: 0})[key] == \
                    theirs["funcs"][func][key], (func, key)
        assert after["funcs"]["argmin"]["stack_peak"] == theirs["funcs"]["argmin"]["stack_peak"] > 0
        with shim.profile() as prof:
            run_threads(2, lambda index: pipeline(**ORBIT_SCALARS, escape=ORBIT_SHAPE))
        assert len(prof.stages) == 2
        for _, stages in prof.stages:
            orbit = stages.stage("orbit")
            assert orbit.num_allocs == 2 * tiles
            assert orbit.memory_total == per_tile * tiles == stages.memory_total
            assert per_tile // 2 <= orbit.memory_peak <= orbit.memory_total
            assert stages.stage("argmin").stack_peak == theirs["funcs"]["argmin"]["stack_peak"]


# --- copy stages on the simulated host device ----------------------------------------------------

@pytest.fixture
def host_device():
    device = shim.device("host")
    device.clear_faults()
    yield device
    device.clear_faults()


def _on_the_device_only(array, device):
    """A Buffer whose data lives on the simulated device alone: its host memory is zeroed,
    and it is marked device-dirty."""
    buf = shim.Buffer(array.copy())
    buf.copy_to_device(device)
    buf.numpy()[...] = 0
    buf.set_host_dirty(False)
    buf.set_device_dirty()
    return buf


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_copy_stages_on_a_cpu_target_read_an_input_from_the_host_device(libs, stock, runtime,
                                                                        host_device):
    """Copy stages (copy_to_host, each a halide_buffer_copy to host memory) of tiles and of
    whole intermediate buffers, in a CPU pipeline whose input lives on the shim's simulated
    device only: the result is the stock runtime's (given the data on the host) and
    numpy's, with the input's data brought from the device."""
    pipeline = load(libs, runtime, "flv_copy_stages")
    image = copy_input()
    expected = stock["copy_stages"]["outputs"]["output"]
    np.testing.assert_allclose(expected, (image * 2 + 3) ** 2 - 1, rtol=1e-6)
    for _ in range(2):
        source = _on_the_device_only(image, host_device)
        downloaded = host_device.transfers.downloaded
        out = pipeline(source, output=image.shape)
        np.testing.assert_array_equal(out.numpy(), expected)
        assert host_device.transfers.downloaded - downloaded >= image.nbytes
        np.testing.assert_array_equal(source.numpy(), image)  # (and the input is intact)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_async_folded_copy_stage_on_a_cpu_target(libs, stock, runtime, host_device):
    """Frames brought over by an async copy stage, double-buffered with fold_storage, while
    the previous frame is summed; the input on the simulated device, with copies slowed
    to widen the races: each run equal to the stock runtime's."""
    pipeline = load(libs, runtime, "flv_copy_frames")
    frames = frames_input()
    expected = stock["copy_frames"]["outputs"]["output"]
    np.testing.assert_array_equal(expected, sum(frames[t] * (t + 1) for t in range(5)))
    host_device.set_faults(delay=0.0005)
    for _ in range(6):
        out = pipeline(_on_the_device_only(frames, host_device), output=(30, 40))
        np.testing.assert_array_equal(out.numpy(), expected)
