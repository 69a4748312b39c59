"""Timing the shim against Halide's stock runtime in one run.

The stock runtime must not share a process with the shim (the shim interposes every halide_*
symbol), so it runs in a child process that answers timing requests over a pipe. The runtimes
take turns sample by sample, so a noisy moment on the machine hits both alike; results are
the min and median over the samples.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import subprocess
import sys
from pathlib import Path


class ChildProcess:
    """A child running ``command``, which prints "ready", then answers each JSON request line
    with one line: the seconds the request took."""

    def __init__(self, command, env=None):
        self._child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       text=True, env=env)
        line = self._child.stdout.readline().strip()
        if line != "ready":
            self._child.kill()
            raise RuntimeError(f"{' '.join(map(str, command))} did not start (said {line!r})")

    def seconds(self, **request) -> float:
        self._child.stdin.write(json.dumps(request) + "\n")
        self._child.stdin.flush()
        return float(self._child.stdout.readline())

    def close(self) -> None:
        self._child.stdin.close()
        self._child.wait()


def serve(seconds) -> None:
    """The child's side: ``seconds(**request)`` for each request on stdin."""
    print("ready", flush=True)
    for line in sys.stdin:
        print(seconds(**json.loads(line)), flush=True)


def interleave(runners: dict, requests: dict, repeats: int, per_sample=lambda request: 1) -> dict:
    """{runner: {case: {"min": x, "median": x}}}: each runner's ``seconds(**request)`` for each
    case, divided by ``per_sample(request)`` (e.g. the calls a sample makes), over ``repeats``
    samples taken in turns."""
    samples = {name: {case: [] for case in requests} for name in runners}
    for runner in runners.values():
        for request in requests.values():
            runner.seconds(**request)  # warm up: compile, allocate, fault pages in
    # (Imported here: the stock runtime's children import this module and must not load the
    # shim.)
    from shim.base.progress import Progress

    progress = Progress(repeats, f"{len(requests)} cases x {len(runners)} sides, samples")
    for sample in range(repeats):
        for case, request in requests.items():
            for name, runner in runners.items():
                samples[name][case].append(runner.seconds(**request) / per_sample(request))
        progress.update(sample + 1)
    progress.finish()
    return {name: {case: {"min": min(v), "median": statistics.median(v)} for case, v in cases.items()}
            for name, cases in samples.items()}


def built_once(name: str, build: str, last: str, files: dict[str, str] | None = None) -> Path:
    """The folder of a benchmark's libraries (build/benchmarks/NAME-DIGEST in the checkout),
    made by ``build`` (a Python script given the folder) once per script, ``files`` (written
    into the folder first) and Halide version; ``last``: a file the build makes last."""
    files = files or {}
    version = subprocess.run([sys.executable, "-c", "from importlib import metadata; "
                              "print(metadata.version('halide'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    key = "|".join([build, *files.values(), version])
    folder = (Path(__file__).resolve().parent.parent / "build" / "benchmarks"
              / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}")
    if not (folder / last).exists():
        folder.mkdir(parents=True, exist_ok=True)
        for file, text in files.items():
            (folder / file).write_text(text)
        subprocess.run([sys.executable, "-c", build, str(folder)], check=True)
    return folder
