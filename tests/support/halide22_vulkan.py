"""Halide 22's Vulkan kernels, emulated: the GLSL compute shaders in tests/support/halide22_kernels
(shaped as Halide 22's code generator makes them, PR 8954), compiled at test time with Khronos's
glslangValidator, wrapped in Halide's Vulkan module format, and built with the pipelines of
halide22_vulkan_pipelines.c into a library the shim serves as Halide 22's.

Halide's module format (src/CodeGen_Vulkan_Dev.cpp, encode_module and encode_header; the same in
Halide 19, 21 and 22), all little-endian uint32 words, each string as len/4 + 1 words padded
with NULs, its length counted in words: [kernel count], then per kernel [its module's bytes,
its name]; then the kernels' modules, each a header ([the header's words, itself included],
[descriptor sets: 1], then for the set [entry point name, uniform buffers, storage buffers,
specialization constants, shared allocations, 3 workgroup-size constant ids]) and the SPIR-V.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from support.releases import build_c_library

KERNELS = Path(__file__).resolve().parent / "halide22_kernels"


class Kernel(NamedTuple):
    """One kernel: its entry point, its GLSL, and the descriptors its module's header declares
    (Halide 22: a uniform buffer whenever it has any argument)."""

    name: str
    glsl: str
    uniform_buffers: int
    storage_buffers: int


SCALE = Kernel("_kernel_scale", "scale.comp", 1, 2)
ADD = Kernel("_kernel_add", "add.comp", 1, 3)


def glslang() -> str:
    """glslangValidator's path; skips where it is not installed."""
    tool = shutil.which("glslangValidator")
    if tool is None:
        pytest.skip("glslangValidator is not installed (Debian: glslang-tools): no compiler for "
                    "the GLSL kernels shaped as Halide 22's")
    return tool


def spirv(kernel: Kernel, work: Path) -> bytes:
    """The kernel's SPIR-V, its entry point named as Halide names it."""
    out = work / f"{kernel.name}.spv"
    subprocess.run([glslang(), "-V", "-e", kernel.name, "--source-entrypoint", "main", "-o",
                    str(out), str(KERNELS / kernel.glsl)], check=True, capture_output=True)
    return out.read_bytes()


def _string(text: str) -> list[int]:
    """A string as Halide's module writes one: its length in words, then the words."""
    raw = text.encode() + b"\0" * (4 - len(text) % 4)
    return [len(raw) // 4, *np.frombuffer(raw, "<u4").tolist()]


def kernel_module(kernel: Kernel, code: bytes) -> bytes:
    """One kernel's module: its header of bindings, then its SPIR-V."""
    entry = [*_string(kernel.name), kernel.uniform_buffers, kernel.storage_buffers,
             0, 0, 0, 0, 0]  # no specialization constants or shared memory; a fixed size
    header = [1, *entry]
    return np.array([len(header) + 1, *header], "<u4").tobytes() + code


def module_blob(kernels: list[tuple[Kernel, bytes]]) -> bytes:
    """Halide's Vulkan module of ``kernels``, each with its SPIR-V."""
    modules = [kernel_module(kernel, code) for kernel, code in kernels]
    table = [len(kernels)]
    for (kernel, _), module in zip(kernels, modules):
        table += [len(module), *_string(kernel.name)]
    return np.array(table, "<u4").tobytes() + b"".join(modules)


def build_library(blob: bytes, work: Path, stem: str = "h22vk") -> Path:
    """halide22_vulkan_pipelines.c built around ``blob``, in ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    values = ", ".join(str(b) for b in blob)
    (work / "halide22_vulkan_kernels.h").write_text(
        f"static const unsigned char H22VK_KERNELS[{len(blob)}] = {{{values}}};\n")
    return build_c_library(["halide22_vulkan_pipelines.c"], work / f"{stem}.so", f"-I{work}")
