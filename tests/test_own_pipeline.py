"""docs/own-pipeline.md, followed from a generator to a result as a Halide user follows it:
its generators (Python and C++) written into an empty folder, every command of the page run
there in order (``python -m shim build``, Halide's generator command lines, GenGen, ``cc``), then
its examples, which compare every library's results with numpy. Every build of the page runs
here, the CUDA ones too (a build needs no GPU); an example runs where its device is
(OpenCL: PoCL, Vulkan: lavapipe here; CUDA: on a GPU machine, from the GPU kit, which builds
the page's CUDA libraries here and runs this test there with $HALIDE_SHIM_OWN_PIPELINE naming
them: see docs/cuda.md)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

import shim
from support import own_pipeline
from support.doc_blocks import run_in_one_namespace

BLOCKS = own_pipeline.page_blocks()
SHELL = own_pipeline.shell_blocks(BLOCKS)
PYTHON = own_pipeline.python_blocks(BLOCKS)
PREPARED = os.environ.get(own_pipeline.PREPARED)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """(the folder the page was followed in, {shell block key: None or its failure})."""
    if PREPARED:  # (a copy: the examples write there)
        return Path(shutil.copytree(PREPARED, tmp_path_factory.mktemp("kit") / "own-pipeline")), {}
    pytest.importorskip("halide", reason="the page's builds need halide (the test extra)")
    for tool in ("cc", "c++"):
        if shutil.which(tool) is None:
            pytest.skip(f"the page's builds need a C and a C++ compiler: no {tool} here")
    folder = tmp_path_factory.mktemp("own-pipeline")
    return folder, own_pipeline.build(folder)


@pytest.mark.parametrize("block", SHELL, ids=[b.id for b in SHELL])
def test_command_block(block, page):
    if PREPARED:
        pytest.skip(f"built where halide is, into {PREPARED} (benchmarks/gpu_kit.py prepare)")
    outcome = page[1][block.key]
    assert outcome is None, f"{block.id}:\n{block.code}\n{outcome}"


def device_missing(kind: str) -> str | None:
    try:
        shim.device(kind)
    except shim.DeviceUnavailable as e:
        return str(e)
    return None


def why_not_run(block) -> str | None:
    """Why an example does not run here: a device this machine lacks; in the GPU kit, a
    library it does not carry."""
    if PREPARED and not own_pipeline.uses_cuda(block) and "build/" in block.code:
        return "the GPU kit carries the page's CUDA builds only"
    for kind in ("opencl", "vulkan", "cuda"):
        if re.search(rf"\b{kind}\b", block.code) and (reason := device_missing(kind)):
            return f"needs a {kind} device: {reason}"
    return None


@pytest.fixture(scope="module")
def results(page):
    """{python block key: None or its traceback} for the examples that run here."""
    folder, _ = page
    return run_in_one_namespace([b for b in PYTHON if why_not_run(b) is None], folder,
                                own_pipeline.environment())


@pytest.mark.parametrize("block", PYTHON, ids=[b.id for b in PYTHON])
def test_example(block, results):
    if reason := why_not_run(block):
        pytest.skip(reason)
    outcome = results[block.key]
    assert outcome is None, f"{block.id} fails:\n{block.code}\n{outcome}"


def test_the_page_shows_every_way():
    """Each way the page promises (docs/own-pipeline.md's opening) has its commands and an
    example that loads what they built."""
    commands = "".join(b.code for b in SHELL)
    examples = "".join(b.code for b in PYTHON)
    for way in (r"python -m shim build my_generator\.py target=host ",
                r"my_generator\.py -g my_pipeline .*-e object target=host\n",
                r"cc -shared -o \S+ \S+\.o ",
                r"target=host-no_runtime", r"target=host-opencl ", r"target=host-vulkan\S* ",
                r"target=host-cuda\S* ", r"target=[\w-]+,[\w,-]+ ",
                r"-e static_library target=[\w-]+,", r"-Wl,--whole-archive \S+\.a",
                r"c\+\+ .*my_generator\.cpp .*-lHalide_GenGen", r"\./my_generator -g",
                r"python -m shim build \./my_generator", r"-e python_extension,object"):
        assert re.search(way, commands), way
    for way in (r'shim\.load\("build/my_pipeline\.so"\)', r'"build/no_runtime/', r'"build/opencl/',
                r'"build/vulkan/', r'"build/cuda/', r'"build/multi/', r'"build/cpp/',
                r"import my_pipeline", r'convention="extension"'):
        assert re.search(way, examples), way
    assert {own_pipeline.file_name(b) for b in BLOCKS} >= {"my_generator.py", "my_generator.cpp"}
