"""The native module's stamp (shim/native/stamp.py): ``import shim`` refuses a module built for
another package version or from another ABI than the checkout's, with an error that says what
is stale and how to rebuild, instead of failing strangely later."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import configparser
import importlib

import pytest

import shim
from shim.native import stamp as native_stamp
from shim.native import ffi, lib

ROOT = Path(__file__).resolve().parent.parent


def test_the_package_version_has_one_source_that_setup_cfg_and_the_module_share():
    # (setup.cfg read as the build reads its "attr:", with no setuptools: a test imports only
    # what the test extra declares)
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    kind, _, source = config["metadata"]["version"].partition(":")
    module, _, name = source.strip().rpartition(".")
    assert kind.strip() == "attr"
    assert shim.__version__ == getattr(importlib.import_module(module), name)
    stamp = native_stamp.parse(ffi.string(getattr(lib, native_stamp.SYMBOL)).decode())
    assert stamp["version"] == shim.__version__


def test_the_module_is_stamped_with_the_abi_of_this_checkout():
    stamp = native_stamp.parse(ffi.string(getattr(lib, native_stamp.SYMBOL)).decode())
    current = native_stamp.digests(ROOT, native_stamp.CONTRACT)
    assert native_stamp.contract(stamp["sources"]) == current
    assert {"abi/shim_calls.h", "abi/shim_callbacks.h", "native_stubs/build.py"} <= current.keys()


def import_shim(cwd: Path, prelude: str = "", native: Path | None = None):
    """``import shim`` in a fresh interpreter, from the package in ``cwd``, after ``prelude``."""
    env = {k: v for k, v in os.environ.items() if k != "HALIDE_SHIM_NATIVE"}
    env["PYTHONPATH"] = str(cwd)
    if native is not None:
        env["HALIDE_SHIM_NATIVE"] = str(native)
    script = textwrap.dedent(prelude) + "\nimport shim\nprint('imported')\n"
    return subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_module_built_for_another_version_is_refused_naming_both():
    done = import_shim(ROOT, """
        import sys, types
        version = types.ModuleType("shim._version")  # the package as if released since the build
        version.__version__ = "9.9.9"
        sys.modules["shim._version"] = version
        """)
    assert done.returncode != 0 and "imported" not in done.stdout
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("ImportError: shim._native (")
    assert f"is stale: it was built for halide-shim {shim.__version__}, this is halide-shim 9.9.9." in error
    assert f"Rebuild it: pip install -e . (in {ROOT})" in error
    assert "ABI" not in error  # the declarations are the checkout's


@pytest.fixture
def checkout(tmp_path):
    """A copy of the package and of the sources that define its ABI, with this tree's module."""
    shutil.copytree(ROOT / "shim", tmp_path / "shim", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "abi", tmp_path / "abi")
    (tmp_path / "native_stubs").mkdir()
    shutil.copyfile(ROOT / "native_stubs" / "build.py", tmp_path / "native_stubs" / "build.py")
    assert import_shim(tmp_path).stdout.strip() == "imported"  # as copied, it matches
    return tmp_path


def edit_the_abi(root: Path):
    with open(root / "abi" / "shim_calls.h", "a") as f:
        f.write("int shim_call_added_since(void);\n")
    (root / "abi" / "shim_dlpack.h").unlink()
    (root / "abi" / "shim_extra.h").write_text("int shim_extra(void);\n")


def test_a_module_built_from_another_abi_is_refused_naming_what_changed(checkout):
    built = native_stamp.summary(native_stamp.digests(checkout, native_stamp.CONTRACT))
    edit_the_abi(checkout)
    now = native_stamp.summary(native_stamp.digests(checkout, native_stamp.CONTRACT))
    done = import_shim(checkout)
    assert done.returncode != 0 and "imported" not in done.stdout
    error = done.stderr.strip().splitlines()[-1]
    assert error == (
        f"ImportError: shim._native ({checkout / 'shim' / '_native.abi3.so'}) is stale: it was "
        f"built from another ABI (digest {built}) than this checkout's (digest {now}): since it "
        "was built, abi/shim_calls.h changed, abi/shim_dlpack.h removed, abi/shim_extra.h added. "
        f"Rebuild it: pip install -e . (in {checkout})")


def test_a_stale_module_from_halide_shim_native_points_at_the_gpu_kit(checkout):
    edit_the_abi(checkout)
    done = import_shim(checkout, native=checkout / "shim" / "_native.abi3.so")
    error = done.stderr.strip().splitlines()[-1]
    assert "is stale: it was built from another ABI" in error
    assert ("It is the module $HALIDE_SHIM_NATIVE names: prepare the GPU kit again "
            "(python benchmarks/gpu_kit.py prepare)") in error


def test_without_the_sources_only_the_version_is_checked(tmp_path):
    installed = tmp_path / "site-packages" / "shim"
    installed.mkdir(parents=True)
    assert native_stamp.source_root(installed) is None
    assert native_stamp.source_root(ROOT / "shim") == ROOT
    built = {"version": "1.0", "sources": {"abi/shim_calls.h": "0" * 16}}
    assert native_stamp.problems(built, "1.0", None) == []
    assert native_stamp.problems(built, "1.1", None) == [
        "it was built for halide-shim 1.0, this is halide-shim 1.1"]


def test_a_module_without_a_stamp_is_refused():
    assert native_stamp.problems(None, "1.0", ROOT) == [
        "it carries no build stamp (it was built before halide-shim stamped its builds)"]


def test_only_the_contract_is_checked_on_import_not_the_c_files():
    sources = native_stamp.digests(ROOT)
    assert {"native_stubs/fast/fastcall.c", "native_stubs/shim_native.h"} <= sources.keys()
    built = {"version": "1.0", "sources": {**sources, "native_stubs/fast/fastcall.c": "0" * 16,
                                           "native_stubs/shim_native.h": "0" * 16}}
    assert native_stamp.problems(built, "1.0", ROOT) == []
    built["sources"]["abi/shim_profile.h"] = "0" * 16
    built["sources"]["native_stubs/build.py"] = "0" * 16
    [problem] = native_stamp.problems(built, "1.0", ROOT)
    assert problem.endswith("since it was built, abi/shim_profile.h changed, native_stubs/build.py changed")
