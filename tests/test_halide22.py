"""Halide 22's libraries, prepared: pipelines emulating Halide 22's generated code
(tests/support/halide22_pipelines.c, on the shim's declarations of its ABI) served by the
release that built them, beside Halide 21's, in one process.

What Halide 22 changed that every pipeline meets: halide_type_t's third field became
`reserved`, 0, and generated code compares a buffer's whole type word with its own, so a
buffer the shim made the Halide 21 way (lanes 1) fails every Halide 22 pipeline's type check;
its dispatchers read halide_can_use_target_features' answers 2 and 3.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import shim
from shim.base.errors import PipelineError
from shim.base.releases import BY_NAME, feature_words
from shim.native import ffi, lib
from shim.native.libraries import cpu_can_use
from support.releases import build_c_library, lacking_feature

H22 = BY_NAME["22"]


@pytest.fixture(scope="module")
def h22_library(tmp_path_factory):
    return build_c_library(["halide22_pipelines.c"],
                           tmp_path_factory.mktemp("halide22") / "h22.so")


@pytest.fixture(scope="module")
def scale(h22_library):
    return shim.load(h22_library, name="h22_scale")


IMAGE = np.random.default_rng(22).integers(0, 256, (37, 53), dtype=np.uint8)


def test_a_halide22_library_is_known_by_its_metadata(scale):
    assert scale.release == "22"
    assert [str(a.type) for a in scale.arguments] == ["uint8", "int32", "uint8"]


def test_every_way_of_passing_buffers_passes_halide22s_type_check(scale):
    expected = (IMAGE * np.uint8(3)).astype(np.uint8)
    np.testing.assert_array_equal(scale(IMAGE, 3, IMAGE.shape).numpy(), expected)  # a shape
    out = np.zeros_like(IMAGE)
    scale(IMAGE, 3, out)  # numpy arrays, the fast path's structs
    np.testing.assert_array_equal(out, expected)
    # an omitted output, sized by the bounds query
    np.testing.assert_array_equal(scale(IMAGE, gain=3).numpy(), expected)
    buffer, result = shim.Buffer(IMAGE.copy()), shim.Buffer(np.zeros_like(IMAGE))
    scale(buffer, 3, result)  # shim.Buffers
    np.testing.assert_array_equal(result.numpy(), expected)
    with scale.prepare(buffer, 3, result) as run:  # a prepared call, run twice
        run()
        run()
    np.testing.assert_array_equal(result.numpy(), expected)


def test_one_buffer_goes_to_pipelines_of_halide21_and_22_in_turn(scale, host_pipelines):
    histogram = shim.load(host_pipelines["histogram", "no_runtime"])
    assert histogram.release == "21"
    image = shim.Buffer(IMAGE.copy())
    scaled = shim.Buffer(np.zeros_like(IMAGE))
    for gain in (1, 2, 3):
        scale(image, gain, scaled)  # 22 reads image, writes scaled
        counts = histogram(scaled, output=(256,)).numpy()  # 21 reads what 22 wrote
        expected = (IMAGE * np.uint8(gain)).astype(np.uint8)
        np.testing.assert_array_equal(scaled.numpy(), expected)
        np.testing.assert_array_equal(counts, np.bincount(expected.ravel(), minlength=256))


def test_one_buffer_in_calls_of_both_releases_at_once_fails_clearly_never_wrongly(
        scale, host_pipelines):
    # Halide's type check reads a field the two releases set differently: a Buffer in calls of
    # both at once fails one of them with Halide's bad_type, which says why; no call computes
    # anything wrong.
    histogram = shim.load(host_pipelines["histogram", "bundled"])
    image = shim.Buffer(IMAGE.copy())
    expected_scaled = (IMAGE * np.uint8(2)).astype(np.uint8)
    expected_counts = np.bincount(IMAGE.ravel(), minlength=256)
    failures, wrong = [], []

    def run(call, check):
        for _ in range(300):
            try:
                check(call())
            except PipelineError as e:
                if e.code != lib.halide_error_code_bad_type or "another Halide release" not in str(e):
                    wrong.append(e)
                failures.append(e)
            except BaseException as e:  # reported below
                wrong.append(e)

    def check_scaled(out):
        if not np.array_equal(out.numpy(), expected_scaled):
            wrong.append("scaled")

    def check_counts(out):
        if not np.array_equal(out.numpy(), expected_counts):
            wrong.append("counts")

    threads = [threading.Thread(target=run, args=(lambda: scale(image, 2, IMAGE.shape),
                                                   check_scaled)),
               threading.Thread(target=run, args=(lambda: histogram(image, output=(256,)),
                                                   check_counts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, wrong[:3]
    # Afterwards, each alone, both right again.
    check_scaled(scale(image, 2, IMAGE.shape))
    check_counts(histogram(image, output=(256,)))
    assert not wrong


# --- halide_can_use_target_features for a Halide 22 dispatcher ----------------------------

@pytest.fixture(scope="module")
def dispatch(h22_library):
    return shim.load(h22_library, name="h22_dispatch")


def _questions(*feature_sets) -> np.ndarray:
    return np.array([feature_words(H22, features) for features in feature_sets], np.uint64)


def test_a_halide22_dispatcher_is_answered_in_its_own_numbering(dispatch):
    lacking = lacking_feature()
    # Halide 22 numbers opencl 30, where 21's 30 is profile: features that are not the CPU's
    # are never refused, and the CPU's by their names.
    sets = [[lacking], ["avx2"], ["opencl", "no_runtime"], ["sse41", "avx"], ["sme2"]]
    answers = dispatch(_questions(*sets), answers=(len(sets),)).numpy()
    expected = [int(cpu_can_use(H22, feature_words(H22, s))) for s in sets]
    assert answers.tolist() == expected
    assert answers[0] == 0 and answers[2] == 1 and answers[4] == 0


def test_answers_2_and_3_reach_halide22_dispatchers_as_they_are(dispatch):
    replies = iter([2, 3, 0, 1, -1])

    @ffi.callback("int(int, const uint64_t *)")
    def hook(count, features):
        return next(replies)

    previous = lib.halide_set_custom_can_use_target_features(hook)
    try:
        answers = dispatch(_questions(["avx2"], ["avx2"], ["avx2"], ["avx2"], ["avx2"]),
                           answers=(5,)).numpy()
    finally:
        lib.halide_set_custom_can_use_target_features(previous)
    assert answers.tolist() == [2, 3, 0, 1, -1]


def test_halide22s_new_error_is_the_shims_too():
    # Halide 22's Arm SME2 code calls halide_error_streaming_vscale_invalid: a library calling
    # it loads, and the error comes back with its code, named, and Halide's message.
    from shim.base.errors import error_name
    from shim.native import CallContext

    context = CallContext.begin()
    previous = lib.shim_call_enter(context.pointer)
    try:
        code = lib.halide_error_streaming_vscale_invalid(ffi.NULL, b"f", 2, 4)
        message = context.errors()
    finally:
        lib.shim_call_leave(previous)
        context.end()
    assert code == -49 and error_name(code) == "streaming_vscale_invalid"
    assert "streaming vscale of Scalable Vector is 4" in message and "runtime" in message


def test_a_halide22_extension_module_imported_after_the_shim_is_served_as_22(tmp_path,
                                                                             monkeypatch):
    # Halide's generated extensions are imported, not shim.load()ed: the import registers
    # their library with its release all the same.
    import ctypes
    import importlib
    import os
    import sysconfig

    from shim.native.libraries import release_at

    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    build_c_library(["halide22_pipelines.c", "halide22_extension.c"], tmp_path / f"h22ext{suffix}",
                    f"-I{sysconfig.get_paths()['include']}")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("h22ext")
    argv = ctypes.CDLL(module.__file__, mode=os.RTLD_NOLOAD | os.RTLD_LAZY).h22_scale_argv
    assert release_at(ctypes.cast(argv, ctypes.c_void_p).value) is H22
