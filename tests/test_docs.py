"""The manual (docs/, Sphinx and MyST) builds with warnings as errors: its pages, their links
and headings, and the API reference autodoc makes from the docstrings of ``shim.__all__``
(a docstring that docutils cannot read fails here). Its examples run in
tests/test_readme_examples.py."""

import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_manual_builds_without_a_warning(tmp_path):
    pytest.importorskip("sphinx", reason="the manual needs the docs extra (in the test extra)")
    pytest.importorskip("myst_parser", reason="the manual needs the docs extra (in the test extra)")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b",
                           "html", str(DOCS), str(tmp_path / "html")],
                          capture_output=True, text=True, timeout=600, cwd=DOCS.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    api = (tmp_path / "html" / "api.html").read_text()
    import shim
    for name in ("load", "Buffer", "Pipeline", "profile", "Type", "LayoutWarning",
                 "Pipeline.__call__", "Pipeline.prepare", "Buffer.copy_to_device",
                 "Buffer.copy_to_host", "Buffer.device_malloc", "Buffer.device_free",
                 "Buffer.device_sync", "Buffer.set_device_dirty", "Buffer.__dlpack__"):
        assert f'id="shim.{name}"' in api, name
    assert 'id="shim.Buffer.over_array"' not in api  # (the shim's own modules' only)
    assert len(shim.__all__) > 30
    for page in ("using", "devices", "crops", "threads", "interop", "dask", "profiling", "cli",
                 "security", "cuda"):
        assert (tmp_path / "html" / f"{page}.html").exists(), page


def test_the_errors_page_names_every_exception_and_warning_class():
    """docs/errors.md names every exception and warning class the shim exports, and those its
    conventions and pickles raise."""
    import inspect

    import shim
    from shim.calls.extension import ExtensionValueError, HalideRuntimeError
    from shim.calls.pipeline_pickle import PickledPipelineError

    page = (DOCS / "errors.md").read_text()
    classes = [getattr(shim, name) for name in shim.__all__
               if inspect.isclass(getattr(shim, name))
               and issubclass(getattr(shim, name), BaseException)]
    classes += [HalideRuntimeError, ExtensionValueError, PickledPipelineError]
    missing = [cls.__name__ for cls in classes if f"{cls.__name__}`" not in page]
    assert not missing, f"docs/errors.md does not name {missing}"
    assert len(classes) >= 13
