"""benchmarks/soak.py as a test: threads doing random device operations on shared parents and
their crops, forks while they do, and on the main thread a worker whose operations a raising
signal handler interrupts while profiles start and stop and pyopencl.array is half-imported
(see that file). Every read is checked against what the thread wrote; a lost write, a device
allocation left, a hung thread or child, or any exception but the README's documented refusal
fails it. Brief here (6 s); HALIDE_SHIM_LONG_TESTS=1 runs it for minutes."""

import subprocess
import sys
from pathlib import Path

import pytest

from support.budget import LONG

ROOT = Path(__file__).resolve().parent.parent
MINUTES = 2.0 if LONG else 0.1
HANG_GUARD_S = 120 + MINUTES * 60 * 2  # (the soak's own guards end what hangs well before)


@pytest.mark.parametrize("device", ["host", "opencl"])
def test_the_soak_loses_no_write_and_leaves_nothing(device, request):
    if device == "opencl":
        request.getfixturevalue("opencl")  # (skips, saying why, where there is none)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--threads", "4",
                           "--minutes", str(MINUTES), "--device", device],
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    report = done.stdout[-6000:] + done.stderr[-3000:]
    assert done.returncode == 0 and done.stdout.rstrip().endswith("OK"), report
    assert "interrupted" in done.stdout and "fork" in done.stdout, report  # (both were tried)
