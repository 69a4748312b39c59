"""docs/own-pipeline.md as a reader follows it: its files (a block whose first line is a
comment naming the file: ``# my_generator.py``) written into an empty folder, its shell
blocks (the builds) run there in order, each as one bash script, then its python blocks, in
one namespace (tests/test_own_pipeline.py). The GPU kit builds the page's CUDA libraries here
this way (benchmarks/gpu_kit.py prepare) and runs its CUDA examples on a GPU machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from support.doc_blocks import Block, readme_blocks

ROOT = Path(__file__).resolve().parent.parent.parent
PAGE = ROOT / "docs" / "own-pipeline.md"
SHELLS = ("sh", "bash")

# Set to a folder where the page's CUDA builds were made (benchmarks/gpu_kit.py prepare), the
# page's test runs its python blocks there instead of building: on a machine without halide.
PREPARED = "HALIDE_SHIM_OWN_PIPELINE"

_FILE_NAME = re.compile(r"(?:#|//) ([\w.-]+\.(?:py|cpp))\n")


def page_blocks() -> list[Block]:
    return readme_blocks(PAGE.read_text(), str(PAGE.relative_to(ROOT)))


def file_name(block: Block) -> str | None:
    """The file a block is the text of, or None for a command or an example."""
    found = _FILE_NAME.match(block.code)
    return found.group(1) if found else None


def shell_blocks(blocks) -> list[Block]:
    return [b for b in blocks if b.language in SHELLS]


def python_blocks(blocks) -> list[Block]:
    return [b for b in blocks if b.language == "python" and file_name(b) is None]


def uses_cuda(block: Block) -> bool:
    return re.search(r"\bcuda\b", block.code) is not None


def environment(**more) -> dict:
    """The environment the page's commands run in (and ``more`` variables): ``python`` is this
    interpreter, and it imports this checkout's shim."""
    return dict(os.environ,
                PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
                PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                **more)


def build(folder: Path, which=None, **more) -> dict:
    """The page's files written into ``folder`` and its shell blocks run there, in order (only
    those ``which`` accepts, if given; ``more``: environment variables for them); {block key:
    None, or what the failing script printed}."""
    blocks = page_blocks()
    for block in blocks:
        if (name := file_name(block)) is not None:
            (folder / name).write_text(block.code)
    outcomes = {}
    for block in shell_blocks(blocks):
        if which is not None and not which(block):
            continue
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code], cwd=folder,
                              capture_output=True, text=True, timeout=600, env=environment(**more))
        outcomes[block.key] = None if done.returncode == 0 else (
            f"exits {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return outcomes
