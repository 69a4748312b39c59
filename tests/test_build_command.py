"""``python -m shim build`` (shim/cli/build.py) beyond what docs/own-pipeline.md runs
(tests/test_own_pipeline.py): which generator and which name, a script's own modules, what it
refuses and how a failed build ends: a shim exception naming what is missing or what failed,
nothing left behind."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import shim

pytest.importorskip("halide", reason="building generators needs halide (the test extra)")

ROOT = Path(__file__).resolve().parent.parent

# Two generators, no hl.main() of its own, and a module of its folder's imported as `python
# SCRIPT` would find it (named as one of shim/cli's, which is not the one it gets).
TWO = textwrap.dedent("""
    import halide as hl
    from images import K

    x = hl.Var("x")

    @hl.generator(name="twice")
    class Twice:
        data = hl.InputBuffer(hl.Int(32), 1)
        out = hl.OutputBuffer(hl.Int(32), 1)

        def generate(self):
            self.out[x] = self.data[x] * 2

    @hl.generator(name="plus_k")
    class PlusK:
        data = hl.InputBuffer(hl.Int(32), 1)
        out = hl.OutputBuffer(hl.Int(32), 1)

        def generate(self):
            self.out[x] = self.data[x] + K
    """)
DATA = np.arange(-5, 20, dtype=np.int32)


def shim_build(*args, cwd: Path, env=None, block_halide=False):
    """``python -m shim build ARGS`` in ``cwd``: (exit status, stdout, stderr)."""
    code = "import sys; from shim.cli.main import main; sys.exit(main(sys.argv[1:]))"
    if block_halide:
        code = "import sys; sys.modules['halide'] = None; " + code
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", code, "build", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout, done.stderr


@pytest.fixture
def two(tmp_path):
    (tmp_path / "gens.py").write_text(TWO)
    (tmp_path / "images.py").write_text("K = 7\n")
    return tmp_path


def test_g_chooses_among_several_and_f_names_the_pipeline_and_its_library(two):
    code, out, err = shim_build("gens.py", "-g", "plus_k", "-f", "add_seven", "-o", "lib",
                                cwd=two)
    assert (code, out) == (0, "lib/add_seven.so\n"), err
    pipeline = shim.load(two / "lib" / "add_seven.so")
    assert pipeline.name == "add_seven"
    np.testing.assert_array_equal(pipeline(DATA).numpy(), DATA + 7)
    # The folder it made is private; only the library is left in it.
    assert stat.S_IMODE((two / "lib").stat().st_mode) == 0o700
    assert [p.name for p in (two / "lib").iterdir()] == ["add_seven.so"]


def test_without_g_a_script_of_several_generators_is_refused_with_their_names(two):
    code, out, err = shim_build("gens.py", "-o", "lib", cwd=two)
    assert code == 1 and out == ""
    assert "python -m shim build: building gens.py for target host failed" in err
    assert "available Generators are:" in err and "twice" in err and "plus_k" in err
    assert list((two / "lib").iterdir()) == []  # (its build folder removed too)


def test_a_generator_that_fails_says_what_halide_said_and_leaves_the_library_there(two):
    assert shim_build("gens.py", "-g", "twice", "-o", "lib", cwd=two)[0] == 0
    before = (two / "lib" / "twice.so").read_bytes()
    code, _, err = shim_build("gens.py", "-g", "twice", "-o", "lib", "no_such_param=1", cwd=two)
    assert code == 1 and "no_such_param" in err, err
    assert [p.name for p in (two / "lib").iterdir()] == ["twice.so"]
    assert (two / "lib" / "twice.so").read_bytes() == before


def test_without_halide_it_says_what_to_install(two):
    code, _, err = shim_build("gens.py", "-g", "twice", cwd=two, block_halide=True)
    assert code == 1
    assert f"building gens.py needs halide, which this Python ({sys.executable}) cannot " \
           "import: pip install halide==" in err
    assert not list(two.glob("*.so"))


def test_without_a_c_compiler_it_says_which_could_not_start(two):
    env = dict(os.environ, CC=str(two / "no-such-cc"))
    code, _, err = shim_build("gens.py", "-g", "twice", cwd=two, env=env)
    assert code == 1 and f"{two / 'no-such-cc'} -shared" in err and "could not start" in err
    assert not list(two.glob("*.so")) and not list(two.glob(".shim-build-*"))


@pytest.mark.parametrize("args, says", [
    (["missing.py"], "GENERATOR: no such file: missing.py"),
    (["notes.txt"], "GENERATOR: notes.txt is neither a Python generator (.py) nor an "
                      "executable"),
    (["gens.py", "host"], "host: expected target=TARGET or a generator parameter as NAME=VALUE"),
    (["gens.py", "=3"], "=3: expected target=TARGET"),
    (["gens.py", "-e", "object"], "unrecognized arguments: -e"),
    (["gens.py", "-o", "notes.txt"], "-o: cannot build in notes.txt: [Errno 17] File exists"),
    (["gens.py", "-g", "twice"], "-o: cannot put the library at twice.so: [Errno 21] Is a "
                                 "directory"),
])
def test_bad_arguments_exit_with_2_naming_the_argument(two, args, says):
    (two / "notes.txt").write_text("not a generator")
    (two / "twice.so").mkdir()  # (where the library would go: a folder)
    code, out, err = shim_build(*args, cwd=two)
    assert code == 2 and out == "" and says in err, err


def test_an_executable_generator_runs_as_it_is(two):
    # Any program with Halide's generator command line: here a script run by this Python.
    program = two / "gengen"
    program.write_text(f"#!{sys.executable}\n" + TWO + "\nhl.main()\n")
    program.chmod(0o700)
    code, out, err = shim_build("./gengen", "-g", "twice", "target=host-no_runtime", cwd=two)
    assert (code, out) == (0, "twice.so\n"), err
    np.testing.assert_array_equal(shim.load(two / "twice.so")(DATA).numpy(), DATA * 2)
