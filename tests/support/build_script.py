"""native_stubs/build.py, the native library's build script, loaded by path (it is no module of
the package). Loading it runs what it runs at import: it prepares the library's build (cffi's
declarations, the files it caches under build/native/), and compiles nothing else."""

import importlib.util
from pathlib import Path

PATH = Path(__file__).resolve().parents[2] / "native_stubs" / "build.py"


def load():
    spec = importlib.util.spec_from_file_location("native_build", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
