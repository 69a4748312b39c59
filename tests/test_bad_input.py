"""Every kind of bad input raises the documented exception, naming the argument, and the
process lives on."""

import subprocess
import sys

import numpy as np
import pytest

import shim


@pytest.fixture
def image():
    return np.ones((16, 16), np.float32)


def test_wrong_dtype(load, image):
    with pytest.raises(shim.ArgumentError, match="input: expected float32 elements, got float64") as e:
        load("brighten")(image.astype(np.float64), output=image.shape)
    assert e.value.argument == "input"


def test_wrong_number_of_dimensions(load, image):
    with pytest.raises(shim.ArgumentError, match="expected a 2-D buffer, got 3-D") as e:
        load("brighten")(image[None], output=image.shape)
    assert e.value.argument == "input"


def test_wrong_output_dtype_and_dimensions(load, image):
    with pytest.raises(shim.ArgumentError, match="output: expected float32 elements, got int32"):
        load("brighten")(image, output=np.zeros((16, 16), np.int32))
    with pytest.raises(shim.ArgumentError, match="output: expected a 2-D buffer, got 1-D"):
        load("brighten")(image, output=(16,))


def test_missing_input(load):
    with pytest.raises(shim.ArgumentError, match="missing input") as e:
        load("mix")(np.ones((4, 4), np.uint8), output=(4, 4))
    assert e.value.argument == "b"


def test_missing_scalar_without_default(load):
    with pytest.raises(shim.ArgumentError, match="no default") as e:
        load("crop_fill")(f=(4, 4))
    assert e.value.argument == "param"


def test_missing_output_without_estimates_or_inputs(load):
    with pytest.raises(shim.ArgumentError, match="missing output.*no size estimates and no input") as e:
        load("crop_fill")(param=1)
    assert e.value.argument == "f"


def test_unknown_and_duplicate_arguments(load, image):
    with pytest.raises(shim.ArgumentError, match="unknown argument") as e:
        load("brighten")(image, output=image.shape, gain=2.0)
    assert e.value.argument == "gain"
    with pytest.raises(shim.ArgumentError, match="both by position and by name"):
        load("brighten")(image, input=image, output=image.shape)
    with pytest.raises(shim.ArgumentError, match="takes 4 arguments"):
        load("brighten")(image, 1.0, 2.0, image.shape, 5)


def test_scalar_outside_declared_range(load, image):
    with pytest.raises(shim.ArgumentError, match="above the maximum 10.0") as e:
        load("brighten")(image, scale=10.5, output=image.shape)
    assert e.value.argument == "scale"
    with pytest.raises(shim.ArgumentError, match="below the minimum -1000"):
        load("mix")(np.ones((4, 4), np.uint8), np.ones((4, 4), np.float32), offset=-1001,
                    output=(4, 4))


def test_scalar_outside_its_type_or_of_the_wrong_kind(load, image):
    with pytest.raises(shim.ArgumentError, match="does not fit in int16"):
        load("mix")(np.ones((4, 4), np.uint8), np.ones((4, 4), np.float32), offset=2**20,
                    output=(4, 4))
    with pytest.raises(shim.ArgumentError, match="expected an integer"):
        load("crop_fill")(param=1.5, f=(4, 4))
    with pytest.raises(shim.ArgumentError, match="expected a number"):
        load("brighten")(image, scale="2", output=image.shape)
    with pytest.raises(shim.ArgumentError, match="expected a bool"):
        load("checked_sqrt")(image, verbose=1, output=image.shape)


def test_output_of_the_wrong_size_for_the_pipeline(load):
    image = np.zeros((8, 8), np.uint8)
    with pytest.raises(shim.ArgumentError,
                       match=r"writes dimension 0 \(x, numpy axis 0\) over \[0, 256\)") as e:
        load("histogram")(image, output=(100,))
    assert e.value.argument == "output"
    assert e.value.code == -8  # what Halide itself reports: constraint violated


def test_input_too_small_for_the_requested_output(load):
    with pytest.raises(shim.ArgumentError, match="too small") as e:
        load("blur3x3")(np.zeros((10, 10), np.uint16), output=(10, 10))
    assert e.value.argument == "input"
    assert isinstance(e.value, shim.PipelineError) and e.value.code == -4


def test_read_only_output(load, image):
    frozen = np.zeros_like(image)
    frozen.flags.writeable = False
    with pytest.raises(shim.ArgumentError, match="read-only"):
        load("brighten")(image, output=frozen)


def test_unsupported_input_object(load):
    with pytest.raises(shim.ArgumentError, match="expected a numpy array"):
        load("brighten")(object(), output=(4, 4))


def test_halide_runtime_errors_become_pipeline_errors(load):
    # A shim.Buffer is passed as it is: with a stride of 2 in x it violates Halide's default
    # constraint that x is dense, which the pipeline itself reports.
    strided = shim.Buffer(np.ones((8, 16), np.float32)[:, ::2])
    with pytest.raises(shim.PipelineError, match="Constraint violated: input.stride.0") as e:
        load("brighten")(strided, output=(8, 8))
    assert e.value.code == -8 and e.value.code_name == "constraint_violated"


def test_paths_that_are_not_pipelines(tmp_path):
    with pytest.raises(shim.ArgumentError, match="no such file") as e:
        shim.load(tmp_path / "missing.so")
    assert e.value.argument == "path"
    text = tmp_path / "notes.so"
    text.write_text("not a library")
    with pytest.raises(shim.ArgumentError, match="not a Halide pipeline: not an ELF file"):
        shim.load(text)
    with pytest.raises(shim.ArgumentError, match="exports no NAME_argv"):
        shim.load(shim._native.__file__)


def test_choosing_a_pipeline_name_that_is_not_there(host_pipelines):
    with pytest.raises(shim.ArgumentError, match="has no pipeline 'other'") as e:
        shim.load(host_pipelines["brighten", "bundled"], name="other")
    assert e.value.argument == "name"


def test_a_failing_bundled_runtime_pipeline_does_not_abort_the_process(host_pipelines):
    """Halide's own halide_error aborts. In a fresh interpreter, a bundled-runtime pipeline's
    error must come back as an exception because the shim's halide_error wins."""
    code = (
        "import numpy as np, shim\n"
        f"p = shim.load({str(host_pipelines['checked_sqrt', 'bundled'])!r})\n"
        "try:\n"
        "    p(np.full((4, 4), -1, np.float32), output=(4, 4))\n"
        "except shim.PipelineError as e:\n"
        "    print('caught', e.code)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "caught -27"
