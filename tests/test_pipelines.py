"""Calling the sample pipelines with numpy data: results against numpy references, for builds
with the runtime bundled and with no_runtime."""

import array

import numpy as np
import pytest

import shim
from support.threads import run_threads


def blur_reference(image):
    wide = image.astype(np.uint32)
    blur_x = (wide[:, :-2] + wide[:, 1:-1] + wide[:, 2:]) // 3
    return ((blur_x[:-2] + blur_x[1:-1] + blur_x[2:]) // 3).astype(np.uint16)


def assert_close(actual, expected):
    """Float results: Halide may fuse multiply-add, which rounds once instead of twice."""
    np.testing.assert_allclose(actual, expected, rtol=2e-7, atol=0)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def test_elementwise_map_with_defaults(load, rng):
    brighten = load("brighten")
    image = rng.random((48, 64), dtype=np.float32)
    out = brighten(image, output=image.shape)
    assert isinstance(out, shim.Buffer)
    assert_close(out.numpy(), image * np.float32(2.0) + np.float32(1.0))


def test_scalars_by_position_and_by_name(load, rng):
    brighten = load("brighten")
    image = rng.random((16, 32), dtype=np.float32)
    expected = image * np.float32(3.0) + np.float32(-0.5)
    assert_close(brighten(image, 3.0, -0.5, image.shape).numpy(), expected)
    assert_close(brighten(offset=-0.5, input=image, output=image.shape, scale=3).numpy(), expected)


def test_blur_with_compute_root_stage_and_parallel_rows(load, rng):
    blur = load("blur3x3")
    image = rng.integers(0, 1 << 16, size=(130, 259), dtype=np.uint16)
    out = blur(image, output=(128, 257))
    np.testing.assert_array_equal(out.numpy(), blur_reference(image))


def test_several_inputs_of_different_types_and_scalar_defaults(load, rng):
    mix = load("mix")
    a = rng.integers(0, 256, size=(20, 30), dtype=np.uint8)
    b = rng.random((20, 30), dtype=np.float32)
    expected = a.astype(np.float32) * np.float32(0.5) + b * np.float32(0.5)
    np.testing.assert_allclose(mix(a, b, output=a.shape).numpy(), expected, rtol=1e-6)
    expected = a.astype(np.float32) * np.float32(0.25) + b * np.float32(0.75) + np.float32(-7)
    np.testing.assert_allclose(mix(a=a, b=b, alpha=0.25, offset=-7, output=a.shape).numpy(),
                               expected, rtol=1e-6)


def test_two_outputs_come_back_as_a_tuple_in_metadata_order(load, rng):
    sum_diff = load("sum_diff")
    a = rng.integers(-10**6, 10**6, size=(17, 23), dtype=np.int32)
    b = rng.integers(-10**6, 10**6, size=(17, 23), dtype=np.int32)
    total, diff = sum_diff(a, b, sum=a.shape, diff=a.shape)
    np.testing.assert_array_equal(total.numpy(), a + b)
    np.testing.assert_array_equal(diff.numpy(), a - b)


def test_histogram_reduction_sizes_its_output_from_the_estimates(load, rng):
    histogram = load("histogram")
    image = rng.integers(0, 256, size=(100, 70), dtype=np.uint8)
    out = histogram(image)
    assert out.shape == (256,)
    np.testing.assert_array_equal(out.numpy(), np.bincount(image.ravel(), minlength=256))


def test_the_crop_pipeline(load):
    crop_fill = load("crop_fill")
    out = crop_fill(param=3, f=(5, 7))
    ys, xs = np.mgrid[0:5, 0:7]
    np.testing.assert_array_equal(out.numpy(), xs * 100 + ys + 3 * 10000)


def test_output_numpy_array_is_written_in_place_and_returned(load, rng):
    brighten = load("brighten")
    image = rng.random((8, 8), dtype=np.float32)
    out = np.zeros_like(image)
    returned = brighten(image, output=out)
    assert returned is out
    assert_close(out, image * np.float32(2) + np.float32(1))


def test_output_buffer_is_written_and_returned(load, rng):
    brighten = load("brighten")
    image = rng.random((8, 8), dtype=np.float32)
    out = shim.Buffer(shape=(8, 8), dtype=np.float32)
    assert brighten(image, output=out) is out
    assert_close(np.asarray(out), image * np.float32(2) + np.float32(1))


def test_input_is_wrapped_without_copying_and_read_as_it_is_now(load):
    brighten = load("brighten")
    image = np.ones((4, 4), np.float32)
    buf = shim.Buffer(image)
    assert buf.numpy() is image
    image[:] = 5
    np.testing.assert_array_equal(brighten(buf, offset=0, output=(4, 4)).numpy(), 10)


def test_non_contiguous_and_negative_stride_inputs(load, rng):
    brighten = load("brighten")
    base = rng.random((10, 20), dtype=np.float32)
    for view in (base[:, ::2], base[::-1], base.T, base[::2, ::-3]):
        out = brighten(view, offset=0, output=view.shape)
        np.testing.assert_array_equal(out.numpy(), view * np.float32(2))


def test_non_contiguous_and_negative_stride_outputs_receive_the_result(load, rng):
    brighten = load("brighten")
    image = rng.random((6, 5), dtype=np.float32)
    canvas = np.full((6, 10), -1, np.float32)
    brighten(image, offset=0, output=canvas[:, ::2])
    np.testing.assert_array_equal(canvas[:, ::2], image * np.float32(2))
    np.testing.assert_array_equal(canvas[:, 1::2], -1)
    flipped = np.zeros((6, 5), np.float32)
    brighten(image, offset=0, output=flipped[::-1])
    np.testing.assert_array_equal(flipped[::-1], image * np.float32(2))


def test_buffer_protocol_and_dlpack_inputs(load):
    histogram = load("histogram")
    data = bytes(range(256)) * 4
    expected = np.full(256, 4)

    class DLPackOnly:
        """Exposes nothing but the DLPack protocol."""

        def __init__(self, array):
            self._array = array

        def __dlpack__(self, **kwargs):
            return self._array.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self._array.__dlpack_device__()

    as_2d = np.frombuffer(data, np.uint8).reshape(4, 256)
    np.testing.assert_array_equal(histogram(as_2d).numpy(), expected)
    np.testing.assert_array_equal(histogram(memoryview(bytearray(data)).cast("B", (4, 256))).numpy(),
                                  expected)
    np.testing.assert_array_equal(histogram(DLPackOnly(as_2d)).numpy(), expected)
    unsigned = array.array("B", data)
    with pytest.raises(shim.ArgumentError, match="2-D"):
        histogram(unsigned)  # 1-D: refused with a clear error, not misread


def test_errors_reported_from_worker_threads_reach_the_caller(load):
    checked_sqrt = load("checked_sqrt")
    values = np.full((64, 8), 9.0, np.float32)
    values[50, 5] = -4.0
    with pytest.raises(shim.PipelineError) as info:
        checked_sqrt(values, output=values.shape)
    assert info.value.code == -27  # halide_error_code_requirement_failed
    assert "negative input" in str(info.value) and "at row 50" in str(info.value)


def test_print_output_from_worker_threads_is_captured(load, capfd):
    checked_sqrt = load("checked_sqrt")
    values = np.full((32, 8), 16.0, np.float32)
    out = checked_sqrt(values, verbose=True, output=values.shape)
    np.testing.assert_array_equal(out.numpy(), 4.0)
    printed = capfd.readouterr().err.splitlines()
    assert sorted(printed) == sorted(f"4.000000 row {y}" for y in range(32))


def test_many_python_threads_call_pipelines_at_once(load, rng):
    blur = load("blur3x3")
    images = [rng.integers(0, 1 << 16, size=(66, 70), dtype=np.uint16) for _ in range(8)]
    failures = []

    def work(index):
        image = images[index]
        expected = blur_reference(image)
        for _ in range(25):
            if not np.array_equal(blur(image, output=(64, 68)).numpy(), expected):
                failures.append(image)

    run_threads(len(images), work)
    assert not failures


def test_metadata_is_exposed(load, runtime):
    mix = load("mix")
    assert mix.name == "mix"
    assert [a.name for a in mix.arguments] == ["a", "b", "alpha", "offset", "output"]
    alpha = mix.arguments[2]
    assert (alpha.default, alpha.min, alpha.max) == (0.5, 0.0, 1.0)
    assert str(alpha.type) == "float32" and not alpha.is_buffer
    assert [a.name for a in mix.outputs] == ["output"]
    assert ("no_runtime" in mix.target) == (runtime == "no_runtime")
