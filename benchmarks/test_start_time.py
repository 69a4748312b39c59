"""pytest-benchmark view of benchmarks/start_time.py: each round is one new interpreter running
the command to its exit, with the package's bytecode read from a compiled PYTHONPYCACHEPREFIX.

    python -m pytest benchmarks/test_start_time.py --benchmark-enable --benchmark-group-by=func

For the table against ``import numpy`` and the targets, run the script itself.
"""

import os

import pytest

import start_time
from shim.pipelines.build import Build, build


@pytest.fixture(scope="module")
def environment(tmp_path_factory):
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(tmp_path_factory.mktemp("pycache")))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


@pytest.mark.parametrize("name", list(start_time.commands("LIBRARY")))
def test_start_time(benchmark, environment, name):
    command = start_time.commands(str(build(Build("brighten", "host", "no_runtime"))))[name]
    start_time.seconds(command, environment)  # (compiles the bytecode)
    benchmark.pedantic(start_time.seconds, args=(command, environment), rounds=10)
