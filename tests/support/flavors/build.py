"""Building the flavor pipelines (generators.py) as a user does: Halide's generator command line
(``python generators.py -g NAME -o DIR -e object target=... param=value``), then
``cc -shared``, the extern stages' C (externs.c) linked in as a static library of the tests'
own. Objects and libraries are made once per test session (``Builds`` is a session fixture's
value) and many at a time, two compilers at once."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
GENERATORS = HERE / "generators.py"
ROOT = HERE.parents[2]  # the checkout: pipelines/stock.py is imported from there
JOBS = 2


def halide_include() -> Path:
    """Halide's runtime headers, found without importing halide (its compiler stays out of
    the test process)."""
    spec = importlib.util.find_spec("halide")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("halide is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "include"


def _run(command, cwd=None):
    done = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, command))} failed ({done.returncode}):\n"
                           f"{done.stdout}{done.stderr}")


class Builds:
    """Objects and libraries in ``folder``, each made once (thread-safe)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._lock = threading.Lock()
        self._made: dict = {}
        self._externs = None

    def _once(self, key, make):
        with self._lock:
            event = self._made.get(key)
            owner = event is None
            if owner:
                event = self._made[key] = [threading.Event(), None, None]
        if owner:
            try:
                event[1] = make()
            except BaseException as e:  # noqa: BLE001 - handed to every waiter
                event[2] = e
            event[0].set()
        event[0].wait()
        if event[2] is not None:
            raise event[2]
        return event[1]

    def object(self, generator: str, target: str, params: dict | None = None,
               function: str | None = None) -> Path:
        """``generator`` compiled for ``target`` (a Halide target string) with generator
        ``params``, its pipeline named ``function`` (default: the generator's name): the
        object file."""
        params = params or {}
        function = function or generator
        stem = "-".join([function, target] + [f"{k}={v}" for k, v in sorted(params.items())])
        stem = "".join(ch if ch.isalnum() or ch in "-_=." else "_" for ch in stem)

        def make():
            out = self.folder / stem
            out.mkdir()
            _run([sys.executable, GENERATORS, "-g", generator, "-o", out, "-e", "object",
                  "-f", function, f"target={target}", *[f"{k}={v}" for k, v in params.items()]])
            return out / f"{function}.o"

        return self._once(("object", stem), make)

    def externs(self) -> Path:
        """libflv_externs.a: externs.c, compiled once."""
        def make():
            obj = self.folder / "externs.o"
            _run(["cc", "-O1", "-fPIC", "-c", "-I", halide_include(), "-o", obj,
                  HERE / "externs.c"])
            archive = self.folder / "libflv_externs.a"
            _run(["ar", "rcs", archive, obj])
            return archive

        return self._once(("externs",), make)

    def library(self, name: str, objects, sources=()) -> Path:
        """``name``.so of ``objects`` ((generator, target[, params[, function]]) each), C
        ``sources`` (files beside this one) compiled in, and the extern stages' library."""
        def make():
            paths = [self.object(*spec) for spec in objects]
            out = self.folder / f"{name}.so"
            _run(["cc", "-shared", "-fPIC", "-I", halide_include(), "-o", out, *paths,
                  *[HERE / s for s in sources], self.externs(), "-lpthread", "-ldl", "-lm"])
            return out

        return self._once(("library", name), make)

    def libraries(self, specs: dict) -> dict:
        """{key: (name, objects[, sources])} -> {key: path}: every object first, two
        compilers at a time (the slowest, those that carry a runtime, first), then the
        links."""
        objects = list(dict.fromkeys(_frozen(o) for spec in specs.values() for o in spec[1]))
        objects.sort(key=lambda o: "no_runtime" in o[1])
        with ThreadPoolExecutor(JOBS) as pool:
            list(pool.map(lambda o: self.object(o[0], o[1], dict(o[2]), o[3]), objects))
            self.externs()
            futures = {key: pool.submit(self.library, *spec) for key, spec in specs.items()}
            return {key: future.result() for key, future in futures.items()}


def _frozen(spec):
    """(generator, target, params as sorted pairs, function) of an object's spec."""
    generator, target, *rest = spec
    params = rest[0] if rest and rest[0] else {}
    function = rest[1] if len(rest) > 1 else None
    return generator, target, tuple(sorted(params.items())), function


def stock_environment() -> dict:
    """The environment of a child that runs Halide's stock runtime (stock_child.py): the
    checkout on the path, for pipelines.stock, and nothing of the shim."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE.parent.parent)])
    return env


def run_stock(folder: Path, requests: list, timeout: float = 900) -> list:
    """Runs stock_child.py's ``requests`` ((case, kwargs) each) in one child process under
    Halide's stock runtime; their answers, in order (a case that raised fails here, with the
    child's traceback)."""
    import pickle
    import tempfile

    with tempfile.TemporaryDirectory(dir=folder) as work:
        asked, answered = Path(work) / "requests.pkl", Path(work) / "answers.pkl"
        asked.write_bytes(pickle.dumps(requests))
        done = subprocess.run([sys.executable, HERE / "stock_child.py", asked, answered],
                              env=stock_environment(), capture_output=True, text=True,
                              timeout=timeout)
        assert done.returncode == 0, f"the stock child failed ({done.returncode}):\n{done.stderr}"
        answers = pickle.loads(answered.read_bytes())
    for (case, _), answer in zip(requests, answers):
        assert not (isinstance(answer, dict) and "stock_failure" in answer), \
            f"stock case {case} failed:\n{answer['stock_failure']}"
    return answers


_shared: Builds | None = None


def shared_builds(tmp_path_factory) -> Builds:
    """The session's Builds (one folder for every test module's objects and libraries)."""
    global _shared
    if _shared is None:
        _shared = Builds(tmp_path_factory.mktemp("flavors"))
    return _shared
