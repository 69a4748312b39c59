"""The wheel people install (issue 27): built from a copy of the source tree, tagged abi3 for
CPython 3.11 and later (shim._native uses the 3.11 limited API), repaired by auditwheel to
manylinux_2_28 (issue 42), which its policy grants only to a library that needs nothing newer
than glibc 2.28 (native_stubs/build.py's GLIBC_PINS), installed into a fresh virtual
environment with its dependencies only (numpy, cffi, pyopencl: no halide), where it loads and
runs a pipeline built here. Installing it on this machine's glibc proves nothing about an older
one: the test reads the versions its library needs, as auditwheel does.

The build runs without build isolation, in this environment, which has the build
requirements (pyproject.toml: setuptools, wheel, cffi, halide 21, whose standalone runtime is
compiled into the library): an isolated build fetches halide (168 MB) into its own
environment first, and makes the same wheel."""

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from support import glibc

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 900
# What the built tree does not need (and what a build leaves behind).
IGNORED = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", "*.so",
                                 "_native.c", "*.o", ".pytest_cache", ".hypothesis", "_build",
                                 ".benchmarks")


def _run(*command, **options):
    done = subprocess.run(list(map(str, command)), capture_output=True, text=True,
                          timeout=TIMEOUT, **options)
    assert done.returncode == 0, f"{' '.join(map(str, command))}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def repaired(tmp_path_factory):
    pytest.importorskip("auditwheel", reason="repairing the wheel needs auditwheel (test extra)")
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    shutil.copytree(ROOT, source, ignore=IGNORED, symlinks=True)
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
         work / "dist", source)
    [wheel] = (work / "dist").glob("*.whl")
    assert re.fullmatch(r"halide_shim-[\d.]+-cp311-abi3-linux_x86_64\.whl", wheel.name), wheel.name
    # auditwheel refuses a platform whose policy the wheel breaks. --only-plat: that platform's
    # tag alone, not also every older one whose symbol versions the library happens to meet
    # today (manylinux_2_17's): the wheel claims the floor that the tests hold.
    _run(sys.executable, "-m", "auditwheel", "repair", "--plat", glibc.WHEEL_PLATFORM,
         "--only-plat", "-w", work / "repaired", wheel)
    [fixed] = (work / "repaired").glob("*.whl")
    return fixed


def test_the_wheel_is_abi3_and_manylinux_2_28(repaired):
    assert re.fullmatch(rf"halide_shim-[\d.]+-cp311-abi3-{glibc.WHEEL_PLATFORM}\.whl",
                        repaired.name), repaired.name
    with zipfile.ZipFile(repaired) as wheel:
        names = wheel.namelist()
        metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "shim/_native.abi3.so" in names
    assert {"shim/py.typed", "shim/native/native_types.pyi"} <= set(names)  # (type information)
    assert any(n.startswith("shim/pipelines/generators/") for n in names)
    assert "Requires-Python: >=3.11" in metadata
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")
                and "extra ==" not in line]
    assert sorted(r.split()[1].split(">")[0] for r in requires) == ["cffi", "numpy", "pyopencl"]


def test_the_wheels_library_needs_nothing_newer_than_glibc_2_28(repaired, tmp_path):
    with zipfile.ZipFile(repaired) as wheel:
        library = Path(wheel.extract("shim/_native.abi3.so", tmp_path))
    needs = glibc.needs(library)
    assert needs["pthread_create"] == "GLIBC_2.2.5"  # (pinned: its default is GLIBC_2.34 from 2.34)
    assert max(map(glibc.version, needs.values())) <= glibc.FLOOR
    # the libraries that held the pinned functions before glibc 2.34 are named, and nothing
    # outside glibc (auditwheel would have copied it into the wheel)
    assert set(glibc.needed_libraries(library)) == {
        "libdl.so.2", "libpthread.so.0", "libc.so.6", "ld-linux-x86-64.so.2"}


def interpreter(version: str) -> str | None:
    """A CPython ``version`` ("3.12") on this machine: this one, one pyenv has, or one on PATH."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(root.glob(f"{version}.*/bin/python"),
                   key=lambda p: [int(n) for n in re.findall(r"\d+", p.parent.parent.name)])
    return str(found[-1]) if found else shutil.which(f"python{version}")


# One abi3 wheel for every CPython setup.cfg's classifiers name.
VERSIONS = re.findall(r"Programming Language :: Python :: (3\.\d+)\s",
                      (ROOT / "setup.cfg").read_text())


@pytest.mark.parametrize("version", VERSIONS)
def test_the_wheel_runs_a_pipeline_in_a_fresh_venv(version, repaired, host_pipelines, tmp_path):
    python = interpreter(version)
    if python is None:
        pytest.skip(f"this machine has no CPython {version} (no registry supplies CPython)")
    venv = tmp_path / "venv"
    _run(python, "-m", "venv", venv)
    python = venv / "bin" / "python"
    # (Nothing of this environment's: a PYTHONPATH would put a checkout before the wheel.)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    _run(python, "-m", "pip", "install", "--quiet", repaired, env=env)
    code = ("import sys, numpy as np, shim\n"
            "p = shim.load(sys.argv[1])\n"
            "out = p(np.arange(12, dtype=np.float32).reshape(3, 4), scale=2.0, offset=1.0)\n"
            "print(shim.__file__); print(out.numpy().tolist())\n"
            "import importlib.util; print(importlib.util.find_spec('halide') is None)\n"
            "print('%d.%d' % sys.version_info[:2])\n")
    done = _run(python, "-c", code, host_pipelines["brighten", "no_runtime"], cwd=tmp_path,
                env=env)
    where, values, no_halide, running = done.stdout.splitlines()
    assert running == version
    assert where.startswith(str(venv))  # the installed wheel, not this checkout
    expected = np.arange(12, dtype=np.float32).reshape(3, 4) * 2 + 1
    assert values == str(expected.tolist())
    assert no_halide == "True"
