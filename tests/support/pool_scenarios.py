"""pool_scenarios.c, built against the shim and linked with Halide's own standalone runtime, and
run in child processes (a watchdog: a scenario the pool never finishes fails its test instead
of hanging it). ``run("shim", [...])`` and ``run("stock", [...])`` answer {scenario: values}."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SOURCE = HERE / "pool_scenarios.c"
RUNTIMES = ("shim", "stock")
WATCHDOG_SECONDS = 120

# The child: the shim's runtime first where it is the one under test (as `import shim` loads it,
# RTLD_GLOBAL), then the scenarios. argv: runtime, library, scenario names.
RUNNER = r"""
import ctypes, json, sys
if sys.argv[1] == "shim":
    import shim
scenarios = ctypes.CDLL(sys.argv[2])
seen = {}
for name in sys.argv[3:]:
    out = (ctypes.c_int64 * 64)()
    count = getattr(scenarios, "pool_scenario_" + name)(out)
    seen[name] = list(out[:count])
print(json.dumps(seen))
"""


def _build(out: Path, *extra: str) -> Path:
    halide = pytest.importorskip("halide", reason="compiling the scenarios needs Halide's header")
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-I",
                        os.path.join(halide.install_dir(), "include"), "-o", str(tmp),
                        str(SOURCE), *extra, "-lpthread", "-ldl", "-lm"], check=True)
        tmp.replace(out)
    return out


def library(runtime: str) -> Path:
    """The scenarios for ``runtime``: "shim" (Halide's functions left to the process, whose
    shim defines them) or "stock" (Halide's standalone runtime linked in), built once per source
    and Halide version into build/tests/."""
    from importlib import metadata

    halide = pytest.importorskip("halide", reason="linking Halide's runtime needs halide")

    version = metadata.version("halide")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    folder = ROOT / "build" / "tests"
    if runtime == "shim":
        return _build(folder / f"pool_scenarios-{digest}-shim.so")
    runtime_object = folder / f"halide_runtime-{version}.o"
    if not runtime_object.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = runtime_object.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp.o")
        host = halide.get_host_target()
        halide.compile_standalone_runtime(str(tmp), halide.Target(host.os, host.arch, host.bits))
        tmp.replace(runtime_object)
    return _build(folder / f"pool_scenarios-{digest}-stock-{version}.so", str(runtime_object))


def run(runtime: str, names: list[str], **environment: str) -> dict[str, list[int]]:
    """Run the scenarios ``names`` in order, in one new process with ``runtime``'s pool and the
    variables ``environment`` set (HL_NUM_THREADS...; the others of this process's, but its own
    HL_NUM_THREADS and HL_NUMTHREADS, are kept)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HL_NUM_THREADS", "HL_NUMTHREADS")}
    env.update(environment)
    try:
        done = subprocess.run([sys.executable, "-c", RUNNER, runtime, str(library(runtime)),
                               *names], capture_output=True, text=True, env=env,
                              timeout=WATCHDOG_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{runtime}'s pool hung in {names} (no result after {WATCHDOG_SECONDS}s)")
    assert done.returncode == 0, f"{runtime}: {done.returncode}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.splitlines()[-1])
