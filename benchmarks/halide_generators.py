"""Halide's C++ generators compiled as Halide's own build compiles them, against the installed
halide package (its headers, libHalide, and libHalide_GenGen, whose main is the generator
command line): for benchmarks/halide_apps.py and the Halide 22 kit's AOT tests. Run in the
interpreter whose halide is meant: the package is the one ``import halide`` finds.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def halide_package() -> Path:
    import halide

    return Path(halide.__file__).parent


def run(command, cwd: Path, timeout: float | None = None, env: dict | None = None) -> str:
    """Run ``command`` in ``cwd`` (its tools' temporary files there too: $TMPDIR may be a folder
    others can write); its output, or RuntimeError with it."""
    done = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**(env or os.environ), "TMPDIR": str(cwd)})
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, command))} failed ({done.returncode}):\n"
                           f"{done.stdout}{done.stderr}")
    return done.stdout + done.stderr


def compile_generator(sources, output: Path, cwd: Path, includes=(), timeout: float | None = None) -> Path:
    """The generator executable ``output`` of the C++ ``sources``."""
    package = halide_package()
    run([os.environ.get("CXX", "c++"), "-std=c++17", "-O1", "-fno-rtti", *sources,
         "-I", package / "include", "-I", package / "share" / "tools",
         *[flag for folder in includes for flag in ("-I", folder)],
         package / "lib64" / "libHalide_GenGen.a", "-L", package / "lib64", "-lHalide",
         f"-Wl,-rpath,{package / 'lib64'}", "-lpthread", "-ldl", "-o", output], cwd, timeout)
    return output
