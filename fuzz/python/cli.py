"""atheris target: ``python -m shim run|profile|info PIPELINE.so ...`` command lines.

The input's first byte chooses the command and the pipeline (brighten, histogram or plane_sum,
sample pipelines built for the host); the rest, split at NULs, is the command line after them,
decoded as Python decodes a process's arguments (UTF-8, undecodable bytes as surrogates). It
runs in a private folder holding an input file of each kind the command line reads (.npy of
2 and 3 dimensions, PNG, PGM, a text file, an empty file), put back as they were after each
input, and everything else the command wrote there is deleted.

So that every path names something in that folder, a "/" in an argument becomes "_". Command
lines that by design run long or take much memory are skipped: a number above 4096, more than
2**22 in the product of one argument's numbers (an image's elements), more than 3 iterations,
a benchmark's minimum time above 0.05 s, a distributed scheduler.

Checked: main() returns 0 or 1, exits as argparse does (SystemExit 0 or 2), or fails as
RunGen fails (its message, then SIGABRT: shim/cli/console.py's ``abort``, which here raises
instead, so that the fuzzer's process goes on), and prints no traceback: a raw exception out of
it is the property broken.
"""

import atexit
import contextlib
import io
import math
import os
import re
import shutil
import tempfile

import numpy as np

from common import PropertyViolated, fuzz, quiet, sample_library

from shim.cli import console
from shim.cli.main import main as shim_main


class RunGenFailure(BaseException):
    """console.abort() called: RunGen's way to fail, an outcome the property allows."""


def _abort():
    raise RunGenFailure


console.abort = _abort

PIPELINES = [sample_library(name) for name in ("brighten", "histogram", "plane_sum")]
COMMANDS = ("run", "profile", "info")
WORK = tempfile.mkdtemp(prefix="halide-shim-fuzz-cli-")
atexit.register(shutil.rmtree, WORK, True)


def _inputs() -> dict:
    """{file name: bytes} of the folder's input files."""
    files = {}
    for name, array in (("in.npy", np.arange(64, dtype=np.float32).reshape(8, 8)),
                        ("in3.npy", np.arange(48, dtype=np.float32).reshape(3, 4, 4)),
                        ("in8.npy", np.arange(64, dtype=np.uint8).reshape(8, 8))):
        buffer = io.BytesIO()
        np.save(buffer, array)
        files[name] = buffer.getvalue()
    files["in.pgm"] = b"P5\n4 4\n255\n" + bytes(range(16))
    files["notes.txt"] = b"not an image\n"
    files["empty.png"] = b""
    try:
        import imageio.v3 as iio

        files["in.png"] = iio.imwrite("<bytes>", np.arange(64, dtype=np.uint8).reshape(8, 8),
                                      extension=".png")
    except ImportError:  # (the images extra)
        pass
    return files


INPUTS = _inputs()


def _reset() -> None:
    for name in os.listdir(WORK):
        if name not in INPUTS:
            path = os.path.join(WORK, name)
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else \
                os.unlink(path)
    for name, data in INPUTS.items():
        path = os.path.join(WORK, name)
        try:
            with open(path, "rb") as f:
                if f.read() == data:
                    continue
        except OSError:
            pass
        with open(path, "wb") as f:
            f.write(data)


def _value_of(args: list, at: int) -> str:
    """The value of the flag at ``args[at]``: after its "=", else the next argument."""
    name, equals, value = args[at].partition("=")
    return value if equals else (args[at + 1] if at + 1 < len(args) else "")


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0  # (refused by the command line's own check: quick)


def _takes_long(args: list) -> bool:
    for at, text in enumerate(args):
        numbers = [int(n) for n in re.findall(r"\d+", text)]
        if any(n > 4096 for n in numbers) or math.prod(n for n in numbers if n) > 2**22:
            return True
        name = text.lstrip("-").partition("=")[0]
        if name == "scheduler" and text.startswith("-"):
            return True
        if name == "iterations" and text.startswith("-") and _number(_value_of(args, at)) > 3:
            return True
        if name == "benchmark_min_time" and text.startswith("-") and \
                _number(_value_of(args, at)) > 0.05:
            return True
    return False


def test_one_input(data: bytes) -> None:
    if not data:
        return
    command = COMMANDS[data[0] % 3]
    pipeline = PIPELINES[data[0] // 3 % 3]
    args = [part.decode("utf-8", "surrogateescape").replace("/", "_")
            for part in data[1:].split(b"\0")] if len(data) > 1 else []
    if _takes_long(args):
        return
    argv = [command, pipeline, *args]
    out, err = io.StringIO(), io.StringIO()
    _reset()
    cwd = os.getcwd()
    os.chdir(WORK)
    try:
        with quiet(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = shim_main(argv)
    except RunGenFailure:
        status = 1
    except SystemExit as e:
        status = e.code
        if status not in (0, 2, None):
            raise PropertyViolated(f"{argv!r} exited with {status!r}") from None
    except BaseException as e:
        raise PropertyViolated(f"{argv!r} raised {type(e).__name__}: {e}") from e
    finally:
        os.chdir(cwd)
    if status not in (0, 1, 2, None):
        raise PropertyViolated(f"{argv!r} returned {status!r}")
    if "Traceback (most recent call last)" in err.getvalue():
        raise PropertyViolated(f"{argv!r} printed a traceback:\n{err.getvalue()}")


if __name__ == "__main__":
    fuzz(test_one_input)
