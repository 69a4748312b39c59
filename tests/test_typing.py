"""The package's annotations reach a user's type checker, and they hold for the README's and the
manual's examples: mypy passes the Python blocks that tests/test_readme_examples.py runs, in the
order it runs them, as one script (a name one page defines, later pages use). The shim is found
as an installed package is, on the interpreter's path, where mypy reads a package's
annotations only if it carries the PEP 561 marker (shim/py.typed); a script of wrong calls,
checked in the same run, shows that the annotations are read and that such calls fail.

mypy is the test extra's. It runs as a user runs it, in a process of its own (it reads the
interpreter's path once per process), with its cache in the test's temporary folder.
PyTorch's types are not followed: checking them costs 20 s, and the examples' use of the shim
is what is checked here (without PyTorch installed, its names are Any)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from test_readme_examples import PYTHON, ROOT

pytest.importorskip("mypy", reason="type checking needs mypy (in the test extra)")

CONFIG = """\
[mypy]
allow_redefinition = True
[mypy-torch.*]
follow_imports = skip
ignore_missing_imports = True
"""

# Calls the annotations refuse: (code, the error mypy gives, as a pattern).
WRONG = [
    ("shim.load(3)", r'No overload variant of "load" matches argument type "int"'),
    ("shim.load('p.so').no_such_method()", r'"Pipeline" has no attribute "no_such_method"'),
    ("shim.Buffer(np.zeros(3)).cropped(0, 1.5, 1)", r'Argument 2 to "cropped" of "Buffer" has '
                                                    r'incompatible type "float"'),
    ("shim.device('host').queue", r'"HostBackend" has no attribute "queue"'),
    ("shim.Buffer(np.float32, 640, 480)", r'No overload variant of "Buffer" matches'),
    ("shim.set_num_threads('4')", r'Argument 1 to "set_num_threads" has incompatible type "str"'),
]


def examples_script() -> tuple[str, list[tuple[int, str]]]:
    """The examples as one script, and (first line, block id) of each block in it."""
    lines, starts = [], []
    for block in PYTHON:
        starts.append((len(lines) + 1, block.id))
        lines += block.code.splitlines()
    return "\n".join(lines) + "\n", starts


def where(line: int, starts: list[tuple[int, str]]) -> str:
    first, block = max((start for start in starts if start[0] <= line), default=(1, "?"))
    return f"{block}, line {line - first + 1} of the block"


@pytest.fixture(scope="module")
def mypy_run(tmp_path_factory):
    """mypy's report on examples.py (the examples) and wrong.py (WRONG's calls), checked in
    one run: {file: [(line, message)]}, and the script's blocks."""
    work = tmp_path_factory.mktemp("typing")
    script, starts = examples_script()
    (work / "examples.py").write_text(script)
    (work / "wrong.py").write_text("import numpy as np\nimport shim\n\n"
                                   + "".join(f"{code}\n" for code, _ in WRONG))
    (work / "mypy.ini").write_text(CONFIG)
    # The checkout first on the path: its shim is the one checked, found as an installed one is.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "mypy.ini",
                           "--cache-dir", str(work / "cache"), "--no-error-summary",
                           "--show-error-codes", "examples.py", "wrong.py"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    errors: dict[str, list[tuple[int, str]]] = {"examples.py": [], "wrong.py": []}
    for line in done.stdout.splitlines():
        found = re.match(r"([\w.]+):(\d+): error: (.*)", line)
        if found:
            errors.setdefault(found[1], []).append((int(found[2]), found[3]))
    return errors, starts, done.stdout


def test_the_examples_pass_mypy(mypy_run):
    errors, starts, _ = mypy_run
    assert len(PYTHON) >= 8
    assert not errors["examples.py"], "\n".join(
        f"{where(line, starts)}: {message}" for line, message in errors["examples.py"])


def test_the_annotations_reach_mypy_through_py_typed_and_refuse_wrong_calls(mypy_run):
    """Each wrong call is refused with its own error; without the marker mypy would read no
    annotation of the shim (an error for the import instead, and none for the calls)."""
    errors, _, report = mypy_run
    assert (ROOT / "shim" / "py.typed").is_file()
    got = dict(errors["wrong.py"])
    for line, (code, expected) in enumerate(WRONG, 4):
        assert line in got and re.search(expected, got[line]), (code, report)
    assert len(errors["wrong.py"]) == len(WRONG), report
