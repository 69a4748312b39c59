"""pipelines/build.py: cache keys and the command line."""

import subprocess
import sys

import pytest

from pipelines.build import Build, generator_names


def test_every_required_sample_pipeline_exists():
    assert {"brighten", "blur3x3", "mix", "sum_diff", "histogram", "crop_fill"} <= set(generator_names())


def test_cache_key_depends_on_target_and_runtime():
    keys = {Build("brighten", t, r).key() for t in ("host", "opencl", "cuda")
            for r in ("bundled", "no_runtime")}
    assert len(keys) == 6


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="unknown pipeline"):
        Build("nope")
    with pytest.raises(ValueError, match="unknown target"):
        Build("brighten", "metal")


def test_cached_builds_are_reused(host_pipelines):
    path = host_pipelines["brighten", "bundled"]
    before = path.stat().st_mtime_ns
    done = subprocess.run([sys.executable, "-m", "pipelines.build", "brighten", "--runtime", "bundled"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(path)
    assert path.stat().st_mtime_ns == before


def test_command_line_errors_are_argparse_errors():
    done = subprocess.run([sys.executable, "-m", "pipelines.build", "nope"], capture_output=True, text=True)
    assert done.returncode == 2 and "unknown pipeline(s): nope" in done.stderr
