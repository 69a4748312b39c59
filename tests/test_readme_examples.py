"""The examples of the README and of the manual (docs/, its pages in the index's order, but
those a test of their own runs: OWN_TESTS) run, so that none can rot: their ```python blocks
in order, in one namespace (the manual reads top to bottom: a name defined in one page is used
in later ones), in a fresh interpreter whose
working directory holds the sample pipelines under the names the examples load
(``blur3x3.so``, ``crop_fill-opencl.so``, ``P.so``, ...); their shell blocks'
``python -m shim ...`` commands there too. A block or command skips only for a reason
given here (it needs a GPU or PyTorch this machine lacks; it is not an example of the shim's
use, as ``pip install`` is). And what the README says about when host memory is current,
tested where a GPU backend runs it."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import shim
from shim.pipelines.build import RUNTIMES, Build, build_all, generator_names
from support.doc_blocks import readme_blocks, run_in_one_namespace

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
SHELLS = ("sh", "bash", "shell", "console")


# The manual's pages whose examples a test of their own runs (each builds what its page loads).
OWN_TESTS = {"own-pipeline": "tests/test_own_pipeline.py"}


def manual_pages() -> list[Path]:
    """The README, then the manual's pages in the order of docs/index.md's toctree, but those
    of OWN_TESTS."""
    index = (DOCS / "index.md").read_text()
    toctree = index.split("```{toctree}", 1)[1].split("```", 1)[0]
    names = [line.strip() for line in toctree.splitlines()
             if line.strip() and not line.strip().startswith(":")]
    return [README] + [DOCS / f"{name}.md" for name in names if name not in OWN_TESTS]


PAGES = manual_pages()
TEXT = "\n".join(page.read_text() for page in PAGES)


BLOCKS = [block for page in PAGES
          for block in readme_blocks(page.read_text(), str(page.relative_to(ROOT)))]
PYTHON = [b for b in BLOCKS if b.language == "python"]


def shell_commands(blocks) -> list[tuple[str, str]]:
    """(block id, command) for each command of the shell blocks: lines joined where they end
    in a backslash, split at ``&&``, comments and prompts dropped, duplicates once."""
    commands = {}
    for block in blocks:
        if block.language not in SHELLS:
            continue
        for line in block.code.replace("\\\n", " ").splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip().removeprefix("$ ").strip()
            for command in filter(None, (part.strip() for part in line.split("&&"))):
                commands.setdefault(command, block.id)
    return [(where, command) for command, where in commands.items()]


COMMANDS = shell_commands(BLOCKS)

# Commands that are not examples of the shim's use, and why they do not run here.
NOT_EXAMPLES = [
    (r"^pip install ", "installs the package (.ci/run runs the quick start in a fresh venv)"),
    (r"^python -m pytest( |$)", "runs the test suite, this test among them"),
    (r"^python3? benchmarks/gpu_kit\.py", "the GPU kit: tests/test_gpu_kit.py checks its plumbing"),
    (r"^python3? benchmarks/halide22_kit\.py",
     "the Halide 22 kit: tests/test_halide22_kit.py checks its plumbing"),
    (r"^python3? benchmarks/[a-z_]+\.py", "a benchmark run: minutes, and machine-dependent figures"),
    (r"^python3? fuzz/run\.py", "a fuzz run: minutes (.ci/run runs it; tests/test_fuzz_regressions.py "
                                 "replays what fuzzing found)"),
    (r"^dask (scheduler|worker)( |$)", "starts a cluster's processes, which run until stopped "
                                       "(tests/test_dask_hosts.py starts them, each on a host "
                                       "of its own)"),
]


def why_not_run(command: str) -> str | None:
    """Why a shell command does not run here, or None to run it."""
    if re.search(r"\[[^\]]*(\||\.\.\.)[^\]]*\]", command):
        return "a usage synopsis (placeholders in brackets), not a command"
    if command.startswith("python -m shim"):
        return None
    for pattern, reason in NOT_EXAMPLES:
        if re.match(pattern, command):
            return reason
    raise AssertionError(f"README command {command!r}: not a `python -m shim` command, and this "
                         "test does not say why it cannot run: run it, or add the reason to "
                         "NOT_EXAMPLES")


# --- what the examples need ----------------------------------------------------------------------


def cuda_missing() -> str | None:
    from shim.backends import cuda

    return cuda.unavailable_reason()


def opencl_missing() -> str | None:
    try:
        shim.device("opencl")
    except shim.DeviceUnavailable as e:
        return str(e)
    return None


def needs(code: str) -> str | None:
    """Why a block cannot run on this machine (a device or a package it lacks), or None."""
    if re.search(r"\bcuda\b", code) and (reason := cuda_missing()):
        return f"needs a CUDA device: {reason}"
    if re.search(r"-opencl\.so|\"opencl\"", code) and (reason := opencl_missing()):
        return f"needs an OpenCL device: {reason}"
    if re.search(r"\btorch\b", code) and importlib.util.find_spec("torch") is None:
        return "needs PyTorch (pip install -e '.[torch]')"
    return None


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, host_pipelines):
    """A folder with the sample pipelines under the README's names: NAME.so (host, runtime
    bundled), NAME-opencl.so (where there is an OpenCL device), NAME-FEATURES.so (host, built
    with Halide's profile or trace_* target features), P.so (brighten), and an image in.png
    for the command line's examples."""
    work = tmp_path_factory.mktemp("readme")
    for name in generator_names():
        (work / f"{name}.so").symlink_to(host_pipelines[name, "bundled"])
    (work / "P.so").symlink_to(host_pipelines["brighten", "bundled"])
    opencl_names = sorted(set(re.findall(r"\b(\w+)-opencl\.so", TEXT))
                          & set(generator_names()))
    if opencl_names and opencl_missing() is None:
        built = build_all([Build(name, "opencl", "bundled") for name in opencl_names], progress=None)
        for spec, path in built.items():
            (work / f"{spec.name}-opencl.so").symlink_to(path)
    featured = {(name, features) for name, features
                in re.findall(r"\b(\w+)-((?:profile|trace)[\w-]*)\.so", TEXT)
                if name in generator_names()}
    built = build_all([Build(name, features=features) for name, features in featured],
                      progress=None)
    for spec, path in built.items():
        (work / f"{spec.name}-{'-'.join(spec.features)}.so").symlink_to(path)
    if importlib.util.find_spec("PIL") is not None:
        from PIL import Image

        pixels = np.random.default_rng(0).integers(0, 256, (480, 640), dtype=np.uint8)
        Image.fromarray(pixels).save(work / "in.png")
    return work


@pytest.fixture(scope="module")
def python_results(workdir):
    """{block key: None or the traceback} for every python block this machine can run."""
    return run_in_one_namespace([b for b in PYTHON if needs(b.code) is None], workdir)


@pytest.mark.parametrize("block", PYTHON, ids=[b.id for b in PYTHON])
def test_python_example(block, python_results):
    if reason := needs(block.code):
        pytest.skip(reason)
    outcome = python_results[block.key]
    assert outcome is None, f"{block.id} fails:\n{block.code}\n{outcome}"


@pytest.mark.parametrize("where, command", COMMANDS, ids=[c for _, c in COMMANDS])
def test_shell_example(where, command, workdir):
    if reason := why_not_run(command) or needs(command):
        pytest.skip(reason)
    # `python` is this interpreter, importing this checkout's shim.
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run(["bash", "-c", command.replace("python ", f"{sys.executable} ", 1)],
                          cwd=workdir, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, (f"{where}: `{command}` exits {done.returncode}:\n"
                                  f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")


def test_the_readme_has_examples_of_both_kinds():
    assert len(PYTHON) >= 8 and any(c.startswith("python -m shim ") for _, c in COMMANDS)


# --- when host memory is current (README: Devices) --------------------------------------------


@pytest.fixture
def brighten_on(gpu):
    """brighten built for the ``gpu`` fixture's device."""
    (path,) = build_all([Build("brighten", gpu.kind, RUNTIMES[0])], progress=None).values()
    return shim.load(path)


def test_a_bare_numpy_output_is_written_when_the_call_returns(brighten_on):
    image = np.random.default_rng(1).random((24, 40), dtype=np.float32)
    out = np.zeros_like(image)
    assert brighten_on(image, scale=2.0, offset=0.0, output=out) is out
    np.testing.assert_array_equal(out, image * 2)  # no sync, no copy: already there


def test_an_array_wrapped_in_a_buffer_is_current_after_a_read_through_the_buffer(brighten_on):
    image = np.random.default_rng(2).random((24, 40), dtype=np.float32)
    array = np.zeros_like(image)
    buf = shim.Buffer(array)
    brighten_on(image, scale=2.0, offset=0.0, output=buf)
    assert buf.device_dirty() and not array.any()  # the results are on the device only
    np.asarray(buf)  # a read through the Buffer copies them back
    np.testing.assert_array_equal(array, image * 2)


def test_writes_through_numpy_reach_the_device_after_set_host_dirty(brighten_on):
    buf = shim.Buffer(np.ones((24, 40), np.float32))
    brighten_on(buf, scale=1.0, offset=0.0, output=np.empty((24, 40), np.float32))  # buf goes up
    buf.numpy()[:] = 5  # written on the host: the device copy does not know
    stale = brighten_on(buf, scale=1.0, offset=0.0, output=(24, 40))
    assert (stale.numpy() == 1).all()
    buf.set_host_dirty()
    fresh = brighten_on(buf, scale=1.0, offset=0.0, output=(24, 40))
    assert (fresh.numpy() == 5).all()
