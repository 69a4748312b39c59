"""Multitarget libraries of Halide 19 and 21, as users build them (a generator run with several
targets, its static library linked whole into a shared one), served by the shim side by side
with each release's own runtime.

Each library's sub-targets compute observably different results: its first needs a feature
this machine's CPU lacks, its second AVX2, its last (the fallback) nothing. Halide 19 numbers
features otherwise than 21: its dispatcher's question about avx512_sapphirerapids (bit 43) read
in Halide 21's numbering asks about avx512_cannonlake, which AVX-512 CPUs have, and the process
then runs code for a CPU it is not (SIGILL where that code uses AVX512-FP16).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import shim
from shim.base.errors import ArgumentError
from shim.base.releases import BY_NAME
from shim.native import ffi, lib
from support.releases import build, cpu_flags, lacking_feature
from gpu_cases import run_stock

GENERATOR = textwrap.dedent('''
    import halide as hl

    x = hl.Var("x")

    @hl.generator(name="which")
    class Which:
        data = hl.InputBuffer(hl.Int(32), 1)
        out = hl.OutputBuffer(hl.Int(32), 1)

        def generate(self):
            # Which sub-target runs shows in the result: 1 + the index of the first of these
            # features its target has, 0 for none.
            marks = [hl.TargetFeature.{lacking}, hl.TargetFeature.AVX2]
            t = self.target()
            k = next((i + 1 for i, f in enumerate(marks) if t.has_feature(f)), 0)
            self.out[x] = self.data[x] * 10 + k

    if __name__ == "__main__":
        hl.main()
''')
# hl.TargetFeature's name of each feature the test may pick.
ENUM_NAMES = {"avx512_sapphirerapids": "AVX512_SapphireRapids", "avx512_knl": "AVX512_KNL"}


@pytest.fixture(scope="module")
def lacking():
    return lacking_feature()


def targets(lacking: str, runtime: str) -> list[str]:
    suffix = "-no_runtime" if runtime == "no_runtime" else ""
    return [f"x86-64-linux-{lacking}{suffix}", f"x86-64-linux-avx2{suffix}",
            f"x86-64-linux{suffix}"]


@pytest.fixture(scope="module")
def libraries(tmp_path_factory, lacking):
    """{(release, runtime): the multitarget library}, built lazily."""
    work = tmp_path_factory.mktemp("multitarget")
    source = GENERATOR.replace("{lacking}", ENUM_NAMES[lacking])
    built = {}

    def get(release, runtime):
        if (release, runtime) not in built:
            built[release, runtime] = build(release, source, "which", targets(lacking, runtime),
                                            work, stem=f"which-{runtime}")
        return built[release, runtime]
    return get


def expected_mark() -> int:
    """The sub-target this CPU should run: AVX2's (2) where it has AVX2, else the fallback's."""
    return 2 if {"avx2", "fma", "f16c", "bmi1", "bmi2"} <= cpu_flags() else 0


DATA = np.arange(-5, 27, dtype=np.int32)


@pytest.mark.parametrize("release", ["19", "21"])
def test_the_stock_runtimes_sub_target_runs(libraries, release, tmp_path):
    library = libraries(release, "bundled")
    stock = run_stock(library, "which", {"data": DATA}, {"out": (DATA.shape, np.int32)},
                      tmp_path)["out"]
    pipeline = shim.load(library)  # the dispatcher, found among its sub-targets
    assert pipeline.name == "which"
    out = pipeline(DATA, out=DATA.shape).numpy()
    np.testing.assert_array_equal(out, stock)
    np.testing.assert_array_equal(out, DATA * 10 + expected_mark())
    assert pipeline.release == release


@pytest.mark.parametrize("release", ["19", "21"])
def test_a_no_runtime_library_is_served_by_the_numbering_its_dispatcher_asks_in(libraries,
                                                                                release):
    # Nothing in a no_runtime library of Halide 19 or 21 tells them apart but the masks its
    # dispatcher passes: it is taken for 21 until its first question says otherwise.
    pipeline = shim.load(libraries(release, "no_runtime"))
    out = pipeline(DATA, out=DATA.shape).numpy()
    np.testing.assert_array_equal(out, DATA * 10 + expected_mark())
    assert pipeline.release == release


def test_libraries_of_19_and_21_run_side_by_side_from_threads(libraries):
    pipelines = [shim.load(libraries(release, runtime)) for release in ("19", "21")
                 for runtime in ("bundled", "no_runtime")]
    expected = DATA * 10 + expected_mark()
    failures = []

    def work(pipeline):
        try:
            for _ in range(50):
                np.testing.assert_array_equal(pipeline(DATA, out=DATA.shape).numpy(), expected)
        except BaseException as e:  # reported below
            failures.append(e)

    threads = [threading.Thread(target=work, args=(p,)) for p in pipelines for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[0]
    assert [p.release for p in pipelines] == ["19", "19", "21", "21"]


def test_each_sub_target_is_a_pipeline_of_its_own_too(libraries, lacking):
    library = libraries("21", "bundled")
    pipeline = shim.load(library)
    subtargets = {sub.target: sub.name for sub in pipeline.subtargets}
    assert set(subtargets) == set(targets(lacking, "bundled"))
    avx2 = shim.load(library, name=subtargets["x86-64-linux-avx2"])
    if expected_mark() == 2:
        np.testing.assert_array_equal(avx2(DATA, out=DATA.shape).numpy(), DATA * 10 + 2)
    fallback = shim.load(library, name=subtargets["x86-64-linux"])
    np.testing.assert_array_equal(fallback(DATA, out=DATA.shape).numpy(), DATA * 10)


def test_info_names_the_release_and_the_sub_targets(libraries, lacking):
    library = libraries("19", "bundled")
    done = subprocess.run([sys.executable, "-m", "shim", "info", str(library)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "Halide 19" in done.stdout
    for target in targets(lacking, "bundled"):
        assert target in done.stdout
    assert f"this CPU lacks {lacking}" in done.stdout
    # Listed in name order, which is not the order the dispatcher tries them in: said so.
    listed = [line.split()[0] for line in done.stdout.splitlines()
              if line.startswith("  ") and "(which" in line]
    assert listed == sorted(listed) and "in name order" in done.stdout


def test_a_library_of_two_pipelines_still_asks_which(tmp_path, libraries):
    # Two dispatchers in one library (two generators linked together): shim.load cannot guess.
    other = build("21", GENERATOR.replace("{lacking}", "AVX2").replace('"which"', '"other"'),
                  "other", ["x86-64-linux-avx2-no_runtime", "x86-64-linux-no_runtime"], tmp_path)
    both = tmp_path / "both.so"
    subprocess.run(["cc", "-shared", "-o", str(both), "-Wl,--whole-archive",
                    str(tmp_path / "other-21" / "other.a"),
                    str(libraries("21", "no_runtime").parent / "which-no_runtime-21" / "which.a"),
                    "-Wl,--no-whole-archive"], check=True)
    with pytest.raises(ArgumentError, match=r"several pipelines \(other, which\)"):
        shim.load(both)
    assert shim.load(both, name="other").subtargets
    assert other.exists()


# --- halide_can_use_target_features, asked directly as dispatchers ask it ------------------

def _ask(release_name: str, features) -> int:
    from shim.base.releases import feature_words
    from shim.native.libraries import cpu_can_use
    return cpu_can_use(BY_NAME[release_name], feature_words(BY_NAME[release_name], features))


def test_features_are_answered_by_name_in_each_release(lacking):
    for release in ("19", "21", "22"):
        assert _ask(release, [lacking]) is False
        assert _ask(release, ["no_runtime", "user_context", "cuda", "opencl"]) is True
        assert _ask(release, ["sse41"]) == ("sse4_1" in cpu_flags())
        assert _ask(release, ["avx2"]) == (expected_mark() == 2)
    # A CPU feature the shim has no way to check (Halide 22's SME on any machine here) is
    # never usable: its sub-target never runs.
    assert _ask("22", ["sme2"]) is False


def test_an_applications_answers_reach_dispatchers_as_their_release_reads_them(libraries,
                                                                              tmp_path):
    # A hook of the application's (halide_set_custom_can_use_target_features) answering
    # Halide 22's "not right now" (2) to every question: a Halide 21 dispatcher would take it
    # as "use it" and keep its first sub-target for good, so it is told 0, and runs the
    # fallback. (A copy of the library: a fresh dispatcher, which has not chosen yet.)
    fresh = tmp_path / "fresh.so"
    fresh.write_bytes(libraries("21", "bundled").read_bytes())
    pipeline = shim.load(fresh)
    asked = []

    @ffi.callback("int(int, const uint64_t *)")
    def not_right_now(count, features):
        asked.append(tuple(features[i] for i in range(count)))
        return 2

    previous = lib.halide_set_custom_can_use_target_features(not_right_now)
    try:
        out = pipeline(DATA, out=DATA.shape).numpy()
    finally:
        lib.halide_set_custom_can_use_target_features(previous)
    np.testing.assert_array_equal(out, DATA * 10)
    # It was asked about the two sub-targets before the fallback, in Halide 21's numbering.
    assert len(asked) == 2
