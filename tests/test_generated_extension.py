"""``shim.load(path, convention="extension")`` calls a pipeline exactly as the Python extension
Halide generates for it (``-e python_extension``, src/PythonExtensionGen.cpp) does (issues 27
and 42): the same cases (tests/support/extension_cases.py: layouts, bad inputs, several at
once) through real generated extensions of the sample pipelines, built here and run in a child
process that never imports the shim, and through the shim, give the same outputs, byte for
byte, the same return value and the same exceptions (type, text, and Halide's error code and
message, which name Halide's dimensions). A pipeline built without its checks (no_asserts) is
refused by the shim's, which report what Halide's would have. Then the shim's own convention:
a halide.Buffer keeps its mins, and a Fortran-ordered array is taken as numpy's axes with a
LayoutWarning that says how the extension would differ.
"""

import os
import pickle
import shutil
import subprocess
import sys
import sysconfig
import warnings
from pathlib import Path

import numpy as np
import pytest

import shim
from shim.calls.extension import sanitized
from shim.native import ffi, lib
from shim.pipelines.build import GENERATORS_DIR, Build, build_all
from support import extension_cases

halide = pytest.importorskip("halide", reason="building generated extensions needs halide")
TIMEOUT = 600


def _compiler():
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler to build Halide's generated Python extensions with")
    return compiler


@pytest.fixture(scope="module")
def extensions(tmp_path_factory):
    """The folder holding a generated Python extension of each case's pipeline (host, its
    runtime bundled, as `-e python_extension` users build them), which prints Halide's error
    messages to sys.stderr (the generated code's HALIDE_PYTHON_EXTENSION_LOG_ERRORS_TO_STDERR):
    its exceptions carry only the code."""
    folder = tmp_path_factory.mktemp("extensions")
    env = dict(os.environ, PYTHONPATH=str(GENERATORS_DIR.parent))
    include = [f"-I{Path(halide.__file__).parent / 'include'}",
               f"-I{sysconfig.get_paths()['include']}"]
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for name in extension_cases.PIPELINES:
        subprocess.run([sys.executable, "-m", f"generators.{name}", "-g", name, "-o", str(folder),
                        "-e", "python_extension,object", "-f", name, "target=host"],
                       env=env, cwd=folder, check=True, capture_output=True, timeout=TIMEOUT)
        subprocess.run([_compiler(), "-shared", "-fPIC", "-DHALIDE_PYTHON_EXTENSION_LOG_ERRORS_TO_STDERR",
                        *include, f"{name}.py.cpp", f"{name}.o",
                        "-o", f"{name}{suffix}", "-lpthread", "-ldl"],
                       cwd=folder, check=True, capture_output=True, timeout=TIMEOUT)
    return folder


@pytest.fixture(scope="module")
def generated(extensions):
    """What the cases gave through the generated extensions."""
    out = extensions / "generated.pickle"
    subprocess.run([sys.executable, extension_cases.__file__, str(extensions), str(out)],
                   check=True, capture_output=True, timeout=TIMEOUT)
    return pickle.loads(out.read_bytes())


@pytest.fixture(scope="module", params=["bundled", "no_runtime"])
def shim_paths(request):
    specs = [Build(name, "host", request.param) for name in extension_cases.PIPELINES]
    return {spec.name: path for spec, path in build_all(specs, progress=None).items()}


def test_the_extension_convention_matches_generated_extensions(generated, shim_paths):
    functions = {name: shim.load(path, convention="extension") for name, path in shim_paths.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error", shim.LayoutWarning)  # (the convention never warns)
        seen = extension_cases.run(functions)
    assert seen.keys() == generated.keys()
    for label, stock in generated.items():
        mine = seen[label]
        if stock[0] == "error":
            # The generated extension's exception type is the shim's or one of its bases, its
            # text the same; for a pipeline's error, Halide's message the same, and the code
            # its text gives on the shim's. (Where the extension refuses a buffer's format, it
            # then frees a struct it never made: Halide's runtime complains of a null buffer.)
            assert mine[0] == "error" and stock[1][0] in mine[1], (label, mine, stock)
            assert mine[2] == stock[2] and "ShimError" in mine[1], (label, mine, stock)
            if stock[1][0] == "RuntimeError":
                assert mine[3] == stock[3], (label, mine, stock)
                assert mine[4] == int(stock[2].removeprefix("Halide Runtime Error: ")), label
            else:
                assert mine[3:] == (None, None), label
        else:
            assert mine == stock, label
    # The cases exercise both outcomes, the axis rule, and Halide's own checks.
    assert generated["blur F"][0] == "ok" and generated["blur, strided input"][0] == "error"
    codes = {stock[2] for stock in generated.values() if stock[1][0] == "RuntimeError"}
    assert codes == {f"Halide Runtime Error: {code}" for code in (-3, -4, -8, -9, -10, -27)}
    assert generated["blur, input too small in x, F"][3] == \
        "Input buffer input is accessed at 29, which is beyond the max (28) in dimension 0"


# One fault each, which the generated code of a pipeline built without its checks would not
# see (out-of-bounds reads and writes, bytes of another type): the shim's checks refuse each
# as the checks of the same pipeline built with them do, code and message.
UNCHECKED_AS_HALIDE = [
    "blur, input too small in x, C", "blur, input too small in y, C",
    "blur, input too small in x, F", "blur, input too small in y, F", "blur, output too large",
    "blur, wrong element type", "blur, wrong output type", "blur, wrong type and too small",
    "blur, halide.Buffer output beyond the input", "mix, alpha below its minimum",
    "mix, offset wraps to int16", "histogram, 100 bins", "histogram, a float input",
    "histogram, a halide.Buffer output from 1", "blur C", "blur F", "mix"]


@pytest.fixture(scope="module")
def unchecked_functions():
    specs = [Build(name, "host", "bundled", features="no_asserts")
             for name in ("blur3x3", "mix", "histogram")]
    return {spec.name: shim.load(path, convention="extension")
            for spec, path in build_all(specs, progress=None).items()}


def test_a_pipeline_built_without_its_checks_is_refused_as_its_checks_would(
        generated, unchecked_functions):
    seen = extension_cases.run(unchecked_functions)
    for label in UNCHECKED_AS_HALIDE:
        mine, stock = seen[label], generated[label]
        if stock[0] == "ok":
            assert mine == stock, label
        else:
            assert stock[1][0] in mine[1] and mine[2:4] == stock[2:4], (label, mine, stock)
    # A region the pipeline pins, which its checks report as the constraint they test: the
    # code, and the region in Halide's dimensions.
    assert seen["histogram, 300 bins"][2:] == (
        "Halide Runtime Error: -8",
        "Output buffer output covers [0, 299] in dimension 0, where the pipeline writes [0, 255]",
        -8)


def test_the_cases_tell_the_conventions_apart(generated, shim_paths):
    """What the numpy convention does differently: F-ordered arrays (with a LayoutWarning),
    outputs returned; a halide.Buffer keeps its mins in both."""
    blur = shim.load(shim_paths["blur3x3"])
    with pytest.warns(shim.LayoutWarning, match="a Fortran-ordered array") as caught:
        seen = extension_cases.run({"blur3x3": blur})
    # The warning names the caller's line, not the shim's.
    assert {w.filename for w in caught} == {extension_cases.__file__}
    assert seen["blur C"][2] == generated["blur C"][2]
    # Mixed memory orders: each convention refuses what the other runs.
    assert generated["blur F in, C out of the transposed shape"][0] == "ok"
    assert seen["blur F in, C out of the transposed shape"][0] == "error"
    assert generated["blur C in, F out"][0] == "error"
    assert seen["blur C in, F out"][0] == "ok"
    assert seen["blur, halide.Buffers with mins"][2] == \
        generated["blur, halide.Buffers with mins"][2]
    beyond = seen["blur, halide.Buffer output beyond the input"]
    assert beyond[0] == "error" and "BoundsError" in beyond[1]


def test_a_halide_buffer_keeps_its_mins(host_pipelines):
    """Against numpy: an input at (10, 20) read where its mins say, an output at (11, 21)
    written from there; the halide.Buffer itself returned, its host marked newer."""
    blur = shim.load(host_pipelines["blur3x3", "no_runtime"])
    data = np.random.default_rng(3).integers(0, 65536, (10, 12), dtype=np.uint16)
    inp = halide.Buffer(halide.UInt(16), [12, 10])
    inp.set_min([10, 20])
    np.asarray(inp)[:] = data
    out = halide.Buffer(halide.UInt(16), [8, 6])
    out.set_min([11, 21])  # reads input x 11..20, y 21..28
    assert blur(inp, out) is out
    wide = data.astype(np.uint32)
    rows = ((wide[:, :-2] + wide[:, 1:-1] + wide[:, 2:]) // 3).astype(np.uint16).astype(np.uint32)
    expected = ((rows[:-2] + rows[1:-1] + rows[2:]) // 3).astype(np.uint16)
    np.testing.assert_array_equal(np.asarray(out), expected[1:7, 1:9])
    assert out.host_dirty()


def test_a_shim_buffer_is_its_struct_as_a_halide_buffer_is(host_pipelines):
    """The extension takes any Buffer's struct, mins included: a shim.Buffer's gives what a
    halide.Buffer's gives (the cases compare those with the generated extension), and an
    output's device copy is stale afterwards, marked so (the run wrote its host memory)."""
    blur = shim.load(host_pipelines["blur3x3", "no_runtime"], convention="extension")
    data = np.random.default_rng(5).integers(0, 65536, (10, 12), dtype=np.uint16)
    stock_in, stock_out = halide.Buffer(data.copy()), halide.Buffer(halide.UInt(16), [8, 6])
    stock_in.set_min([10, 20])
    stock_out.set_min([11, 21])
    blur(stock_in, stock_out)
    inp = shim.Buffer(data.copy(), mins=[10, 20])
    out = shim.Buffer(np.zeros((6, 8), np.uint16), mins=[11, 21])
    out.copy_to_device(shim.device("host"))
    assert not out.host_dirty()
    assert blur(inp, out) is None
    np.testing.assert_array_equal(np.asarray(out), np.asarray(stock_out))
    assert out.host_dirty() and not out.device_dirty()
    # Beyond the input, as Halide's checks report it: dimension 0 is x.
    with pytest.raises(RuntimeError, match=r"^Halide Runtime Error: -4$") as e:
        blur(inp, shim.Buffer(np.zeros((6, 8), np.uint16), mins=[13, 21]))
    assert e.value.message == ("Input buffer input is accessed at 22, which is beyond the max "
                               "(21) in dimension 0")


def _blurred(data):
    wide = data.astype(np.uint32)
    rows = ((wide[:, :-2] + wide[:, 1:-1] + wide[:, 2:]) // 3).astype(np.uint16).astype(np.uint32)
    return ((rows[:-2] + rows[1:-1] + rows[2:]) // 3).astype(np.uint16)


@pytest.mark.parametrize("runtime", ["bundled", "no_runtime"])
def test_the_extensions_structs_on_a_gpu(gpu, runtime):
    """Calls the numpy convention would make with other structs (Buffers with mins), or would
    refuse itself, run on the extension's, on a GPU as on the CPU: the inputs go up, the
    outputs come back to the host, every struct's device memory is freed (none left live, in
    Python or served in C), a failure is Halide's check's; and they show in a profile."""
    [path] = build_all([Build("blur3x3", gpu.kind, runtime)], progress=None).values()
    blur = shim.load(path, convention="extension")
    data = np.random.default_rng(6).integers(0, 65536, (40, 30), dtype=np.uint16)
    live = gpu.live_allocations, lib.shim_served_live(gpu.index, ffi.new("int64_t *"))
    inp = shim.Buffer(data.copy(), mins=[10, 20])
    out = shim.Buffer(np.zeros((6, 8), np.uint16), mins=[11, 21])
    with shim.profile() as prof:
        blur(inp, out)
    np.testing.assert_array_equal(np.asarray(out), _blurred(data)[1:7, 1:9])
    assert prof.records and out.host_dirty()
    with pytest.raises(RuntimeError, match=r"^Halide Runtime Error: -4$") as e:
        blur(data[:5, :5].copy(), np.zeros((38, 28), np.uint16))
    assert e.value.message == ("Input buffer input is accessed at 29, which is beyond the max "
                               "(4) in dimension 0")
    assert (gpu.live_allocations, lib.shim_served_live(gpu.index, ffi.new("int64_t *"))) == live


def test_extents_beyond_32_bits_are_refused(host_pipelines):
    """The extension truncates extents and strides to C ints, making its struct describe other
    memory: the shim refuses them instead."""
    histogram = shim.load(host_pipelines["histogram", "no_runtime"], convention="extension")
    huge = np.ndarray(dtype=np.uint8, shape=(1, 2**31))  # (never touched: no memory used)
    with pytest.raises(shim.ArgumentError, match="dimension 0 has extent 1 and stride 2147483648; Halide.s are 32-bit") as e:
        histogram(huge, np.zeros(256, np.uint32))
    assert e.value.argument == "input"


def test_sanitized_names_follow_the_generator():
    assert sanitized("input") == "input"
    assert sanitized("a.b_c") == "a_b_c"
    assert sanitized("x-y") == "x_45y"


def test_an_unknown_convention_is_refused(host_pipelines):
    with pytest.raises(shim.ArgumentError, match="convention: expected one of 'numpy', 'extension'"):
        shim.load(host_pipelines["blur3x3", "no_runtime"], convention="fortran")
