"""The sanitizer builds' plumbing (docs/development.md, "Sanitizers"): native_stubs/build.py's
$HALIDE_SHIM_SANITIZE, and how tests tell the runtime they run under (tests/support/sanitizers.py),
which decides what they skip there. .ci/sanitizers runs the builds themselves."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import build_script, sanitizers

ROOT = Path(__file__).resolve().parent.parent


def test_the_variable_chooses_the_flags_and_a_wrong_value_is_named(monkeypatch):
    build = build_script.load()
    monkeypatch.delenv("HALIDE_SHIM_SANITIZE", raising=False)
    assert build.sanitize_flags() == ([], [])
    monkeypatch.setenv("HALIDE_SHIM_SANITIZE", "thread")
    compile_flags, link_flags = build.sanitize_flags()
    assert "-fsanitize=thread" in compile_flags and link_flags == ["-fsanitize=thread"]
    monkeypatch.setenv("HALIDE_SHIM_SANITIZE", "address,thread")
    with pytest.raises(RuntimeError, match=r"\$HALIDE_SHIM_SANITIZE='address,thread': expected "
                                           r"one of 'address,undefined', 'thread' \(or unset\)"):
        build.sanitize_flags()


def test_this_process_knows_whether_a_sanitizers_runtime_is_preloaded():
    preloaded = os.environ.get("LD_PRELOAD", "")
    expected = ("address" if "libasan" in preloaded else "thread" if "libtsan" in preloaded
                else None)
    assert sanitizers.RUNTIME == expected
    if expected is None:  # (then nothing skips for one)
        assert sanitizers.THREADS_BUSY_AT_FORK is sanitizers.THREADS_AFTER_FORK is None


@pytest.mark.parametrize("runtime, library", [("address", "libasan.so"), ("thread", "libtsan.so")])
def test_a_process_with_a_sanitizers_runtime_preloaded_knows_it(runtime, library):
    compiler = shutil.which("gcc")
    path = compiler and subprocess.run([compiler, f"-print-file-name={library}"],
                                       capture_output=True, text=True).stdout.strip()
    if not path or not os.path.isabs(path):
        pytest.skip(f"gcc has no {library} here")
    env = {**os.environ, "LD_PRELOAD": path, "PYTHONPATH": str(ROOT / "tests"),
           "ASAN_OPTIONS": "detect_leaks=0"}
    done = subprocess.run([sys.executable, "-c", "from support import sanitizers; "
                           "print(sanitizers.RUNTIME)"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [runtime]
