"""Which Halide release built a library, told at load (shim/calls/library_release.py), and the
libraries the shim refuses clearly instead of running wrongly: those of a release it does not
serve, and those whose code calls its runtime by other names (Halide 22's runtime prefixes),
which the shim cannot serve and which, on a runtime of their own, abort the process at the
first error. Emulated with a small C pipeline (tests/support/unservable_pipeline.c) built with
the metadata and runtime names each case shows."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import shim
from shim.base.elf import dynamic_symbols
from shim.base.releases import BY_NAME, RELEASES, feature_words, target_features
from shim.calls.library_release import UnknownRelease, decide, runtime_prefix
from shim.calls.multitarget import Subtarget, dispatchers, entry_points
from support.releases import build_c_library


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    work = tmp_path_factory.mktemp("releases")
    built = {}

    def get(**macros):
        key = tuple(sorted(macros.items()))
        if key not in built:
            flags = [f"-D{name}" if value is True else f"-D{name}={value}"
                     for name, value in macros.items()]
            built[key] = build_c_library(["unservable_pipeline.c"],
                                         work / f"unservable{len(built)}.so", *flags)
        return built[key]
    return get


DATA = np.arange(10, dtype=np.int32)


@pytest.mark.parametrize("lanes, release", [(1, "21"), (0, "22")])
def test_the_metadata_tells_halide_22_from_earlier_releases(build, lanes, release):
    pipeline = shim.load(build(LANES=lanes))
    assert pipeline.release == release
    np.testing.assert_array_equal(pipeline(DATA, out=DATA.shape).numpy(), DATA + 1)


@pytest.mark.parametrize("bundled", [False, True], ids=["no_runtime", "bundled"])
def test_a_library_with_runtime_prefixes_is_refused(build, bundled):
    macros = {"PREFIX": "acme_", "LANES": 0}
    if bundled:
        macros["BUNDLED"] = True
    with pytest.raises(shim.ArgumentError, match=r"runtime prefixes.*acme_\.\.\., not halide_"):
        shim.load(build(**macros))


def test_a_library_of_a_newer_halide_is_refused(build):
    library = build(TARGET='"x86-64-linux-no_runtime-avx512_zen6"', LANES=0)
    with pytest.raises(shim.ArgumentError, match="avx512_zen6.*newer Halide"):
        shim.load(library)
    done = subprocess.run([sys.executable, "-m", "shim", "info", str(library)],
                          capture_output=True, text=True)
    assert done.returncode != 0 and "avx512_zen6" in done.stderr and "Traceback" not in done.stderr


def test_argument_types_no_release_writes_are_refused(build):
    with pytest.raises(shim.ArgumentError, match=r"\[7\].*no Halide release"):
        shim.load(build(LANES=7))


# --- the evidence, as decide() weighs it ---------------------------------------------------

def test_features_only_a_later_release_knows_rule_out_the_earlier():
    # Halide 21 added avxvnni: a library naming it is not Halide 19's, whatever else it shows.
    assert decide(frozenset({1}), "x86-64-linux-avxvnni-no_runtime", {}, []).release.name == "21"
    # Named by neither 19 nor 21 (Halide 22's sme2), with 19's and 21's type field: refused.
    with pytest.raises(UnknownRelease, match="sme2"):
        decide(frozenset({1}), "arm-64-linux-sme2", {}, [])


def test_a_bundled_runtime_tells_19_from_21():
    mangled = "_ZN6Halide7Runtime8Internal23halide_get_cpu_featuresEv"
    assert decide(frozenset({1}), "x86-64-linux", {mangled: False}, []).release.name == "19"
    decision = decide(frozenset({1}), "x86-64-linux", {"halide_get_cpu_features": False}, [])
    assert decision == (BY_NAME["21"], None, ())


def test_an_undecided_multitarget_library_carries_the_masks_that_settle_it():
    subs = [Subtarget("f-x86-64-linux-avx2", "x86-64-linux-avx2"),
            Subtarget("f-x86-64-linux", "x86-64-linux")]
    decision = decide(frozenset({1}), "x86-64-linux-no_bounds_query-no_runtime", {}, subs)
    assert decision.release.name == "21" and decision.alternative.name == "19"
    # avx2 is bit 7 in Halide 21's numbering, 6 in 19's.
    assert decision.masks[0] == ((1 << 7, 0), (1 << 6, 0))


def test_sub_targets_are_found_in_every_releases_spelling():
    names = ["f", "f-x86-64-linux-avx2", "f-x86-64-linux", "g", "g_x86___64___linux___sse41",
             "g_x86___64___linux", "h", "h-host-avx2"]
    found = dispatchers(names)
    assert {name: [s.target for s in subs] for name, subs in found.items()} == {
        "f": ["x86-64-linux", "x86-64-linux-avx2"],
        "g": ["x86-64-linux", "x86-64-linux-sse41"],
        "h": ["host-avx2"]}
    assert entry_points(names) == ["f", "g", "h"]
    # Names that only look alike are pipelines of their own.
    assert entry_points(["blur", "blur-x", "blur_y"]) == ["blur", "blur-x", "blur_y"]


def test_the_feature_tables_are_halides_own_order():
    # Spot checks against Halide's HalideRuntime.h enums (the numbers the dispatchers pass).
    numbers = {"19": {"avx2": 6, "avx512_sapphirerapids": 43, "opencl": 24, "vulkan": 85},
               "21": {"avx2": 7, "avx512_sapphirerapids": 46, "opencl": 26, "vulkan": 88},
               "22": {"avx2": 7, "avx512_sapphirerapids": 50, "opencl": 30, "vulkan": 98}}
    for release in RELEASES:
        for name, number in numbers[release.name].items():
            assert release.features.index(name) == number
    assert [len(r.features) for r in RELEASES] == [97, 101, 121]
    assert feature_words(BY_NAME["22"], ["hlsl_sm69"]) == (0, 1 << (120 - 64))
    assert target_features(BY_NAME["21"], "x86-64-linux-trace_all-tune_znver4-hvx") == {
        "trace_loads", "trace_stores", "trace_realizations", "hvx_128"}


def test_runtime_prefixes_are_told_by_distinctive_names_only():
    runtime = frozenset({"halide_do_par_for", "halide_error_bad_type", "halide_malloc"})
    assert runtime_prefix({}, frozenset({"acme_do_par_for", "acme_error_bad_type"}),
                          runtime) == "acme_"
    # One look-alike, or the C library's malloc, is no prefix.
    assert runtime_prefix({}, frozenset({"my_do_par_for", "malloc"}), runtime) is None
    assert runtime_prefix({"halide_do_par_for": False},
                          frozenset({"acme_do_par_for", "acme_error_bad_type"}), runtime) is None


def test_a_real_halide_library_shows_its_release(host_pipelines):
    # The sample pipelines, built with halide 21 bundled: its runtime's mark is there.
    path = host_pipelines["brighten", "bundled"]
    defined, _ = dynamic_symbols(path)
    assert "halide_get_cpu_features" in defined
    assert shim.load(path).release == "21"


def test_a_forked_child_registers_the_libraries_it_loads(build):
    # Libraries loaded by another thread while the parent forks: the child's registry is
    # whole and free, and the child loads, registers and runs libraries of its own.
    libraries = [str(build(LANES=lanes)) for lanes in (0, 1)]
    script = f"""
import os, threading, numpy as np, shim
paths = {libraries!r}
def load_many():
    for _ in range(200):
        shim.load(paths[0])
loader = threading.Thread(target=load_many)
loader.start()
pid = os.fork()
if pid == 0:
    pipeline = shim.load(paths[1])
    data = np.arange(5, dtype=np.int32)
    ok = pipeline.release == "21" and (pipeline(data, out=(5,)).numpy() == data + 1).all()
    os._exit(0 if ok else 1)
loader.join()
print("child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["child", "0"], done.stderr[-2000:]
