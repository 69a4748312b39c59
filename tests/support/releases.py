"""Pipelines built by other Halide releases, for the tests of libraries of several releases.

halide 21 is this environment's own (the test extra); halide 19 lives in a virtual environment
of its own, since both are the Python package `halide`: ``HALIDE_SHIM_HALIDE19`` names its
Python (.ci/run makes it). A generator runs in a child process of that Python, through
Halide's generator command line, as a user builds with that release.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shim.pipelines.build import compile_library

# The Python of each release that builds pipelines: this one's for 21.
PYTHONS = {"21": sys.executable}
if os.environ.get("HALIDE_SHIM_HALIDE19"):
    PYTHONS["19"] = os.environ["HALIDE_SHIM_HALIDE19"]


def python_of(release: str) -> str:
    """The Python whose halide is ``release``; skips, saying how to get it, where there is none."""
    python = PYTHONS.get(release)
    if python is None:
        pytest.skip(f"no halide {release} to build with: set HALIDE_SHIM_HALIDE19 to the Python "
                    f"of a virtual environment with halide=={release}.0.0 (.ci/run makes one)")
    return python


def build(release: str, source: str, generator: str, targets: list[str], work: Path,
          stem: str | None = None) -> Path:
    """The shared library of ``generator`` (defined in the Python ``source``) built by halide
    ``release`` for ``targets`` (several: a multitarget library, linked whole from the static
    library Halide writes for them), in ``work``: shim.pipelines.build's recipe
    (compile_library), the generator run by that release's Python."""
    python = python_of(release)
    stem = stem or generator
    out = work / f"{stem}-{release}"
    out.mkdir(parents=True, exist_ok=True)
    script = work / f"{stem}-{release}.py"
    script.write_text(source)
    built = compile_library([python, str(script), "-g", generator], ",".join(targets), out)
    library = work / f"{stem}-{release}.so"
    built.replace(library)
    return library


def cpu_flags() -> set[str]:
    """The CPU's feature flags, as the kernel lists them."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# Halide x86 features, and the CPU flags (Linux's names) without any of which a CPU cannot run
# code built for them: what a test picks a feature the test machine lacks from.
LACKABLE = {
    "avx512_sapphirerapids": ("avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "avx_vnni"),
    "avx512_knl": ("avx512pf", "avx512er"),
}


def lacking_feature() -> str:
    """A Halide x86 feature this machine's CPU lacks (skips where it has them all)."""
    flags = cpu_flags()
    for feature, needs in LACKABLE.items():
        if not all(flag in flags for flag in needs):
            return feature
    pytest.skip(f"this CPU has every feature of {', '.join(LACKABLE)}: no sub-target to refuse")


ROOT = Path(__file__).resolve().parent.parent.parent


def build_c_library(sources: list[str], library: Path, *flags: str) -> Path:
    """A shared library of C ``sources`` (in tests/support) emulating a Halide release's
    generated code, on Halide 21's HalideRuntime.h and the shim's declarations in abi/ (for
    Halide 22: abi/halide22_runtime.h). Like a no_runtime pipeline, it needs every runtime
    function from the shim."""
    import halide

    include = Path(halide.install_dir()) / "include"
    paths = [str(ROOT / "tests" / "support" / source) for source in sources]
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-std=gnu11", "-Wall", "-Werror",
                    f"-I{include}", f"-I{ROOT / 'abi'}", *flags, "-o", str(library), *paths],
                   check=True)
    return library


def halide22_instrumented(directory: Path) -> Path:
    """tests/support/halide22_instrumented.c built into a library in ``directory``: Halide 22's
    generated code with its profiler (h22_prof) and its tracing (h22_trace) built in."""
    return build_c_library(["halide22_instrumented.c"], directory / "h22_instrumented.so")
