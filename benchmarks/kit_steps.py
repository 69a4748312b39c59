"""What the check kits share (benchmarks/gpu_kit.py, benchmarks/halide22_kit.py): modules of
the shim loaded by path, progress lines, commands run with a time limit and their output
logged as it comes, pytest's junit counts.

Standard library only, and no import of shim: a kit runs where the shim's native module may
not load in its own interpreter (the GPU kit's Python 3.12), or where the shim under test
lives in another environment (the Halide 22 kit's virtual environment).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_module(path: str):
    """shim/<path>, loaded by path: importing shim needs a native module that may not be
    built yet, or not loadable by this interpreter."""
    name = path.removesuffix(".py").replace("/", "_")
    spec = importlib.util.spec_from_file_location(f"kit_{name}", ROOT / "shim" / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def private_folder(path: Path, what: str) -> Path:
    """``path``, a folder no other user can write (shim/base/private_files.py's rule; made 0700
    with the folders missing on the way), else RuntimeError naming ``what`` it was for."""
    private_files = package_module("base/private_files.py")
    folder = private_files.open_folder(path, instead=f"It is not used as {what}.")
    if folder is None:
        raise RuntimeError(f"{path} can be written by others (see the warning): choose another "
                           f"folder for {what}")
    with folder:
        return folder.path


def log(message: str) -> None:
    print(message, flush=True)


def stream(command, env, timeout: float, log_file, echo: bool = True,
           cwd: Path = ROOT) -> tuple[int | None, str, float]:
    """Run ``command`` in its own process group, writing its output (stdout and stderr) to
    ``log_file`` as it comes, and to this process's stdout where ``echo``; kill the group at
    ``timeout``. (return code or None for a timeout, output, seconds)."""
    started = time.monotonic()
    try:
        child = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                 errors="replace", bufsize=1, start_new_session=True)
    except OSError as e:
        message = f"cannot start {command[0]}: {e}\n"
        log_file.write(message)
        if echo:
            sys.stdout.write(message)
        return 127, message, 0.0
    lines = []

    def pump():
        for line in child.stdout:
            lines.append(line)
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
            log_file.write(line)
            log_file.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = child.wait(timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        code = None
        for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(child.pid, sig)
            except ProcessLookupError:
                break
            try:
                child.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        message = f"\n!! timed out after {timeout:.0f} s: killed\n"
        lines.append(message)
        if echo:
            sys.stdout.write(message)
        log_file.write(message)
    reader.join(timeout=10)
    return code, "".join(lines), time.monotonic() - started


def last_line(output: str, width: int = 160) -> str:
    """The last line of ``output`` that says something, cut to ``width``: a failure's gist."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:width] if lines else ""


def junit_counts(path: Path) -> dict:
    """passed/failed/errors/skipped, skip reasons and failed test ids from a junit file."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "skip_reasons": {}, "failures": []}
    try:
        tree = ElementTree.parse(path)
    except (OSError, ElementTree.ParseError):
        return counts
    for case in tree.iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None:
            counts["failed"] += 1
            counts["failures"].append(test)
        elif case.find("error") is not None:
            counts["errors"] += 1
            counts["failures"].append(f"{test} (error)")
        elif (skipped := case.find("skipped")) is not None:
            counts["skipped"] += 1
            reason = (skipped.get("message") or "").strip()
            if reason == "collection skipped":  # (a module skipped whole: its reason is the text)
                reason = _collection_skip(skipped.text) or f"{test}: {reason}"
            counts["skip_reasons"][reason] = counts["skip_reasons"].get(reason, 0) + 1
        else:
            counts["passed"] += 1
    return counts


def _collection_skip(text: str | None) -> str:
    """The reason in the text pytest's junit gives a module skipped whole: the repr of (path,
    line, "Skipped: reason")."""
    try:
        path, line, reason = ast.literal_eval(text or "")
    except (ValueError, SyntaxError, TypeError):
        return ""
    return f"{Path(path).name}: {str(reason).removeprefix('Skipped: ')}"
