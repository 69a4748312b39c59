"""What the installed distribution claims: the sample pipelines install as shim.pipelines, not
as a top-level ``pipelines``, a generic import name that an unrelated project on PyPI has."""

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def distribution():
    try:
        return metadata.distribution("halide-shim")
    except metadata.PackageNotFoundError:
        pytest.skip("halide-shim is not installed: the checkout is on sys.path")


def test_the_distribution_has_one_top_level_package(distribution):
    assert distribution.read_text("top_level.txt").split() == ["shim"]


def test_the_pipelines_import_under_shim_only(distribution, tmp_path):
    # Isolated (-I) and outside the checkout: what the installation provides, not sys.path.
    script = ("import importlib.util, json\n"
              "import shim.pipelines.build as build\n"
              "spec = importlib.util.find_spec('pipelines')\n"
              "print(json.dumps([build.generator_names(), spec and spec.origin]))")
    done = subprocess.run([sys.executable, "-I", "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    names, top_level = json.loads(done.stdout)
    assert "brighten" in names
    # An unrelated "pipelines" may be installed; this distribution's must not be.
    assert top_level is None or not Path(top_level).samefile(ROOT / "pipelines" / "__init__.py")
