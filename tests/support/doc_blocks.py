"""The fenced code blocks of the README and the manual's pages, and running their python
blocks as a reader does: tests/test_readme_examples.py (every page but those with a test of
their own) and tests/test_own_pipeline.py (docs/own-pipeline.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository's root
    line: int  # of the opening fence, 1-based
    section: str
    language: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line} ({self.section})"

    @property
    def key(self) -> str:
        return f"{self.page}:{self.line}"


def readme_blocks(text: str, page: str = "README.md") -> list[Block]:
    """The fenced blocks that have a language, dedented (a block inside a list item is
    indented), with the heading they are under."""
    blocks, section, fence = [], "", None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if fence is None:
            if stripped.startswith("#"):
                section = stripped.lstrip("#").strip()
            elif stripped.startswith("```"):
                fence = (number, stripped[3:].strip(), len(line) - len(stripped), [])
        elif stripped.startswith("```"):
            start, language, indent, lines = fence
            if language and not language.startswith("{"):  # ({toctree}, {eval-rst}: Sphinx's)
                code = textwrap.dedent("\n".join(lines)) + "\n"
                blocks.append(Block(page, start, section, language, code))
            fence = None
        else:
            fence[3].append(line)
    assert fence is None, f"{page}:{fence[0]}: a code block is never closed"
    return blocks


# Runs the blocks in one namespace, each whatever came before it failed, and writes each one's
# outcome (None, or the traceback) to the results file.
RUNNER = textwrap.dedent("""
    import json, sys, traceback
    blocks, results = json.load(open(sys.argv[1])), {}
    namespace = {"__name__": "__main__"}  # (as a script pasted from the manual runs)
    for key, code in blocks:
        try:
            exec(compile(code, key, "exec"), namespace)
            results[key] = None
        except BaseException:
            results[key] = traceback.format_exc()
    json.dump(results, open(sys.argv[2], "w"))
    """)


def run_in_one_namespace(blocks: list[Block], folder: Path, env: dict | None = None) -> dict:
    """{block key: None or the traceback} for ``blocks`` run in order, in one namespace, by a
    fresh interpreter working in ``folder``."""
    (folder / "blocks.json").write_text(json.dumps([(b.key, b.code) for b in blocks]))
    done = subprocess.run([sys.executable, "-c", RUNNER, "blocks.json", "results.json"],
                          cwd=folder, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((folder / "results.json").read_text())
