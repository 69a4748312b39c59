"""The manual (docs/, Sphinx and MyST) builds with warnings as errors: its pages, their links
and headings, and the API reference autodoc makes from the docstrings of ``shim.__all__``
(a docstring that docutils cannot read fails here), complete: every public name and member.
Its examples run in tests/test_readme_examples.py, and pass mypy in tests/test_typing.py."""

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import shim

DOCS = Path(__file__).resolve().parent.parent / "docs"

# The classes of what the API hands back without naming them (docs/api.md documents them after
# shim.__all__): the extension convention's function and errors, a pickle's error, the devices
# shim.device() gives, and what a profile holds.
REACHED = ["shim.calls.extension.ExtensionFunction", "shim.calls.extension.HalideRuntimeError",
           "shim.calls.pipeline_pickle.PickledPipelineError", "shim.backends.base.Backend",
           "shim.backends.base.Transfers", "shim.backends.host.HostBackend",
           "shim.backends.opencl.OpenCLBackend", "shim.backends.cuda.CUDABackend",
           "shim.backends.vulkan.VulkanBackend", "shim.backends.opencl_image.OpenCLImageBackend",
           "shim.profiling.profiler.Record", "shim.profiling.profiler.BufferInfo",
           "shim.profiling.halide_profiler.CallStages", "shim.profiling.halide_profiler.StageStats",
           "shim.profiling.halide_trace.AccessCounts", "shim.profiling.halide_trace.Access"]


@pytest.fixture(scope="module")
def html(tmp_path_factory):
    """The manual, built with warnings as errors: its folder."""
    pytest.importorskip("sphinx", reason="the manual needs the docs extra (in the test extra)")
    pytest.importorskip("myst_parser", reason="the manual needs the docs extra (in the test extra)")
    out = tmp_path_factory.mktemp("manual") / "html"
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b",
                           "html", str(DOCS), str(out)],
                          capture_output=True, text=True, timeout=600, cwd=DOCS.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_the_manual_builds_without_a_warning(html):
    api = (html / "api.html").read_text()
    for name in ("load", "Buffer", "Pipeline", "profile", "Type", "LayoutWarning",
                 "Pipeline.__call__", "Pipeline.prepare", "Buffer.copy_to_device",
                 "Buffer.copy_to_host", "Buffer.device_malloc", "Buffer.device_free",
                 "Buffer.device_sync", "Buffer.set_device_dirty", "Buffer.__dlpack__",
                 # (instance attributes: documented where __init__ sets them)
                 "Pipeline.name", "Pipeline.target", "Pipeline.path", "Pipeline.arguments",
                 "Profile.records", "Profile.duration_ns"):
        assert f'id="shim.{name}"' in api, name
    assert 'id="shim.Buffer.over_array"' not in api  # (the shim's own modules' only)
    assert len(shim.__all__) > 30
    for page in ("using", "devices", "crops", "threads", "interop", "dask", "profiling", "cli",
                 "security", "cuda"):
        assert (html / f"{page}.html").exists(), page


def excluded_members() -> set[str]:
    """The names docs/api.md's ``:exclude-members:`` options leave out of the reference (what
    the shim's own modules use)."""
    names: set[str] = set()
    listing = False
    for line in (DOCS / "api.md").read_text().splitlines():
        option = re.match(r"\s*:exclude-members:(.*)", line)
        if option or (listing and line.strip() and not line.strip().startswith((":", ".."))):
            names.update(n.strip() for n in (option[1] if option else line).split(",") if n.strip())
            listing = True
        else:
            listing = False
    return names


def public_members(cls: type) -> set[str]:
    """The public members the shim's own modules define on ``cls`` and the classes it derives
    from (not Python's: int's methods of an IntEnum, tuple's of Dimension)."""
    return {name for base in cls.__mro__ if base.__module__.split(".")[0] == "shim"
            for name in vars(base) if not name.startswith("_")}


def test_the_reference_has_every_public_name_and_member(html):
    """Every name of shim.__all__, every public member of its classes but those api.md leaves
    out by name, and the classes of what the API hands back unnamed, have an entry."""
    entries = set(re.findall(r'id="([^"]+)"', (html / "api.html").read_text()))
    excluded = excluded_members()
    assert {"over_array", "raw", "to_c", "handle"} <= excluded  # (the parse reads every line)
    wanted = [f"shim.{name}" for name in shim.__all__] + REACHED
    for name in shim.__all__:
        value = getattr(shim, name)
        if inspect.isclass(value) and not issubclass(value, BaseException):
            wanted += [f"shim.{name}.{member}"
                       for member in sorted(public_members(value) - excluded)]
    missing = [name for name in wanted if name not in entries]
    assert not missing, f"docs/api.md has no entry for {missing}"
    assert len(wanted) > 150


def test_the_errors_page_names_every_exception_and_warning_class():
    """docs/errors.md names every exception and warning class the shim exports, and those its
    conventions and pickles raise."""
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
