"""Make the seed inputs of fuzz/corpus/TARGET/seed-*: small valid inputs, from real pipelines.

    python fuzz/make_seeds.py [TARGET ...]

(with the fuzz extra installed, and Vulkan for the vulkan_module seeds). Each target's seeds are
made by the function of its name below; the files are replaced, not added to, and the
regression inputs (regression-*) stay as they are. The seeds are committed: a fuzz run needs
none of this.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CORPUS = HERE / "corpus"
sys.path[:0] = [str(HERE / "python"), str(ROOT), str(ROOT / "tests")]


def _write(target: str, seeds: dict) -> None:
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("seed-*"):
        old.unlink()
    for name, data in seeds.items():
        (folder / f"seed-{name}").write_bytes(data)
    print(f"{target}: {len(seeds)} seeds, {sum(map(len, seeds.values()))} bytes")


# --- Halide's Vulkan module format ---------------------------------------------------------

_KERNEL_PIPELINES = ("brighten", "blur3x3", "histogram", "mix", "sum_diff")


def _kernel_sources(kind: str) -> dict:
    """{pipeline: the kernels' source its library hands the backend ``kind``} for sample
    pipelines built for it, captured as the backend compiles them, the pipelines run by the
    command line."""
    import shim
    from common import sample_library
    from shim.cli.main import main

    device = shim.device(kind)
    made = device.module
    sources = []
    device.module = lambda source: sources.append(bytes(source)) or made(source)
    found = {}
    for name in _KERNEL_PIPELINES:
        before = len(sources)
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["run", sample_library(name, kind), "--default_input_scalars",
                         "--default_input_buffers=random:0:[16,16]"]) == 0
        found[name] = sources[before]
    device.module = made
    return found


def vulkan_module() -> dict:
    """The modules sample pipelines built for Vulkan hand the backend (on lavapipe), and one of
    two kernels shaped as Halide 22's (tests/support/halide22_vulkan.py, compiled with
    glslangValidator)."""
    from support import halide22_vulkan as h22

    seeds = _kernel_sources("vulkan")
    with tempfile.TemporaryDirectory() as work:
        kernels = [(k, h22.spirv(k, Path(work))) for k in (h22.SCALE, h22.ADD)]
        seeds["halide22-two-kernels"] = h22.module_blob(kernels)
    return seeds


def vulkan_spirv() -> dict:
    """Each entry point's SPIR-V in the vulkan_module seeds, asked about its storage buffers
    (its set, its first storage binding, their count), as vulkan_kernels.c asks."""
    import numpy as np

    seeds = {}
    for path in sorted((CORPUS / "vulkan_module").glob("seed-*")):
        data = path.read_bytes()
        words = np.frombuffer(data[:len(data) // 4 * 4], "<u4")
        kernels, at, sizes = int(words[0]), 1, []
        for _ in range(kernels):
            sizes.append(int(words[at]) // 4)
            at += 2 + int(words[at + 1])
        for k, size in enumerate(sizes):
            module = words[at:at + size]
            header, r = int(module[0]), 2
            for entry in range(int(module[1])):
                r += 1 + int(module[r])  # its name
                uniform, storage, constants = (int(v) for v in module[r:r + 3])
                r += 3
                for _ in range(constants):
                    r += 1 + int(module[r]) + 2
                shared, r = int(module[r]), r + 1
                for _ in range(shared):
                    r += 1 + int(module[r]) + 3
                r += 3
                seeds[f"{path.name[5:]}-{k}-{entry}"] = (
                    struct.pack("<III", entry, uniform, storage) + module[header:].tobytes())
            at += size
    return seeds


def opencl_prototypes() -> dict:
    """Each kernel's name, then the OpenCL source of sample pipelines built for OpenCL, as the
    backend gets it."""
    seeds = {}
    for pipeline, source in _kernel_sources("opencl").items():
        for i, name in enumerate(re.findall(rb"__kernel void (\w+)\(", source)):
            seeds[f"{pipeline}-{i}"] = name + b"\0" + source
    return seeds


# --- ELF files -----------------------------------------------------------------------------

def _tiny_elf(is64: bool, little: bool, symbols: list[tuple[str, int]], machine: int = 62,
              e_type: int = 3) -> bytes:
    """A minimal ELF file with a dynamic symbol table: ``symbols`` as (name, st_shndx) (0:
    undefined, needed), every one a global function. Sections: null, .dynsym, .dynstr."""
    order = "<" if little else ">"
    strtab = b"\0" + b"".join(name.encode() + b"\0" for name, _ in symbols)
    offsets, at = [], 1
    for name, _ in symbols:
        offsets.append(at)
        at += len(name) + 1
    st_info = (1 << 4) | 2  # STB_GLOBAL, STT_FUNC
    if is64:
        entry = [struct.pack(order + "IBBHQQ", 0, 0, 0, 0, 0, 0)]
        entry += [struct.pack(order + "IBBHQQ", off, st_info, 0, shndx, 0x1000, 0)
                  for off, (_, shndx) in zip(offsets, symbols)]
        header_size, section_size, symbol_size = 64, 64, 24
    else:
        entry = [struct.pack(order + "IIIBBH", 0, 0, 0, 0, 0, 0)]
        entry += [struct.pack(order + "IIIBBH", off, 0x1000, 0, st_info, 0, shndx)
                  for off, (_, shndx) in zip(offsets, symbols)]
        header_size, section_size, symbol_size = 52, 40, 16
    dynsym = b"".join(entry)
    dynsym_at = header_size
    dynstr_at = dynsym_at + len(dynsym)
    sections_at = dynstr_at + len(strtab)
    ident = b"\x7fELF" + bytes([2 if is64 else 1, 1 if little else 2, 1]) + bytes(9)
    if is64:
        header = ident + struct.pack(order + "HHIQQQIHHHHHH", e_type, machine, 1, 0, 0,
                                     sections_at, 0, header_size, 0, 0, section_size, 3, 2)
        sections = [bytes(section_size),
                    struct.pack(order + "IIQQQQIIQQ", 0, 11, 2, 0, dynsym_at, len(dynsym), 2, 1,
                                8, symbol_size),
                    struct.pack(order + "IIQQQQIIQQ", 0, 3, 2, 0, dynstr_at, len(strtab), 0, 0,
                                1, 0)]
    else:
        header = ident + struct.pack(order + "HHIIIIIHHHHHH", e_type, machine, 1, 0, 0,
                                     sections_at, 0, header_size, 0, 0, section_size, 3, 2)
        sections = [bytes(section_size),
                    struct.pack(order + "IIIIIIIIII", 0, 11, 2, 0, dynsym_at, len(dynsym), 2, 1,
                                4, symbol_size),
                    struct.pack(order + "IIIIIIIIII", 0, 3, 2, 0, dynstr_at, len(strtab), 0, 0,
                                1, 0)]
    return header + dynsym + strtab + b"".join(sections)


def elf_reader() -> dict:
    """A real pipeline's library (built without its runtime, stripped), hand-made ones of
    each class and byte order naming a pipeline, and an object file's and an archive's
    starts."""
    from common import sample_library

    seeds = {}
    with tempfile.TemporaryDirectory() as work:
        stripped = os.path.join(work, "brighten.so")
        subprocess.run(["strip", "--strip-all", "-o", stripped, sample_library("brighten")],
                       check=True)
        seeds["brighten-stripped.so"] = Path(stripped).read_bytes()
    pipeline = [("fz_argv", 7), ("fz_metadata", 7), ("halide_error", 0), ("memcpy", 0)]
    for is64 in (True, False):
        for little in (True, False):
            name = f"tiny-elf{64 if is64 else 32}-{'le' if little else 'be'}.so"
            seeds[name] = _tiny_elf(is64, little, pipeline, machine=62 if is64 else 3)
    seeds["tiny-prefixed-runtime.so"] = _tiny_elf(True, True, pipeline[:2] + [
        ("fz_rt_error", 0), ("fz_rt_malloc_impl", 0), ("fz_rt_do_par_for", 0),
        ("fz_rt_device_malloc", 0)])
    seeds["tiny-object-file"] = _tiny_elf(True, True, pipeline, e_type=1)
    seeds["archive.a"] = b"!<arch>\n" + _tiny_elf(True, True, pipeline)
    return seeds


# --- metadata ------------------------------------------------------------------------------

def metadata() -> dict:
    """The metadata of sample pipelines: scalars with defaults and bounds, estimates, 2-D and
    3-D buffers, several outputs."""
    import metadata as target
    from common import sample_library

    return {name: target.encode(target.library_metadata(sample_library(name), name))
            for name in ("brighten", "histogram", "plane_sum", "sum_diff", "checked_sqrt",
                         "times_k", "crop_fill")}


# --- pickles -------------------------------------------------------------------------------

def pipeline_pickle() -> dict:
    """A real pipeline pickled with protocols 2 and 5 (each after the byte that says "a
    pickle stream"), and the three values given directly (see the target's docstring)."""
    import shim
    from common import Writer, sample_library

    pipeline = shim.load(sample_library("brighten"))
    seeds = {f"brighten-protocol{p}": b"\0" + pickle.dumps(pipeline, p) for p in (2, 5)}
    seeds["values-real"] = Writer().u8(1).u8(0).u8(0).u8(0).bytes()
    seeds["values-cut-short"] = Writer().u8(1).u8(1).u16(4096).u8(0).u8(0).bytes()
    seeds["values-other-name"] = Writer().u8(1).u8(0).u8(0).u8(1).text("blur3x3").bytes()
    return seeds


# --- inputs of structured targets, chosen by what they do ------------------------------------

def _chosen(run, count: int, size: int) -> dict:
    """Inputs among ``count`` random ones of ``size`` bytes (a fixed sequence), the first of
    each outcome ``run`` (the target's, on an input) reports: one seed per thing the target
    can make happen."""
    import random

    rng = random.Random(0)
    seeds = {}
    for _ in range(count):
        data = bytes(rng.getrandbits(8) for _ in range(size))
        outcome = run(data)
        if outcome is not None and outcome not in seeds:
            seeds[outcome] = data
    return {re.sub(r"[^a-z0-9]+", "-", outcome.lower()).strip("-"): data
            for outcome, data in seeds.items()}


def dlpack() -> dict:
    """Inputs that import through each consumer, from each kind of memory, accepted and
    refused, and that export to each device, read back or dropped."""
    import dlpack as target
    from common import Reader

    def run(data):
        return (target.test_export if data[0] % 2 else target.test_import)(Reader(data[1:]))

    return _chosen(run, 3000, 160)


def array_likes() -> dict:
    """Inputs that each kind of value reaches each consumer with, taken and refused."""
    import array_likes as target

    return _chosen(target.run, 3000, 48)


# --- command lines -------------------------------------------------------------------------

# (command, pipeline, arguments): RunGen's flags and value syntax, the shim's own, and files of
# each kind the target's folder holds.
_COMMAND_LINES = [
    (0, 0, ["input=in.npy", "output=out.npy", "scale=2", "offset=estimate,default"]),
    (0, 0, ["--input=random:7:[16,16]", "--output=:[3+8,2+8]", "scale=0x3"]),
    (0, 0, ["input=constant:1.5:8x8", "output=out.png", "--quiet=true", "--success"]),
    (0, 0, ["input=identity:[8,8]", "--output_extents=[8,8]", "--parsable_output"]),
    (0, 0, ["--default_input_scalars", "input=random:0:[8,8]", "--chunks=4x4",
            "output=chunked.npy"]),
    (0, 0, ["--estimate_all"]),
    (0, 0, ["input=in.pgm", "--npy_order=halide", "output=o.npy", "--verbose"]),
    (0, 0, ["--benchmarks=all", "--benchmark_min_time=0.01", "input=zero:[4,4]"]),
    (0, 0, ["--describe"]),
    (0, 0, ["-h"]),
    (0, 0, ["input=in.npy", "--device=opencl", "--iterations=2", "--track_memory"]),
    (0, 0, ["input=random:[8,8]", "--device=vulkan", "--skip_bad_environment"]),
    (0, 0, ["--default_input_buffers", "--default_input_scalars", "--output_extents=estimate"]),
    (0, 0, ["input=notes.txt"]),
    (0, 0, ["input=empty.png", "output=in.npy"]),
    (1, 0, ["input=zero:[8,8]", "--iterations=2", "--profile", "trace.json"]),
    (2, 0, []),
    (2, 1, ["--name=histogram"]),
    (0, 1, ["input=in.png", "output=h.npy"]),
    (0, 1, ["input=in8.npy", "output=:[256]"]),
    (1, 1, ["input=random:3:estimate_then_auto"]),
    (0, 2, ["input=in3.npy", "output=p.npy"]),
    (0, 2, ["input=random:1:[4,4,3]", "--device=opencl"]),
]


def cli() -> dict:
    """Command lines of each command on each of the target's pipelines."""
    return {f"{['run', 'profile', 'info'][c]}-{['brighten', 'histogram', 'plane_sum'][p]}-{i}":
            bytes([c + 3 * p]) + "\0".join(args).encode() for i, (c, p, args) in
            enumerate(_COMMAND_LINES)}


TARGETS = {f.__name__: f for f in (vulkan_module, vulkan_spirv, opencl_prototypes, elf_reader,
                                   metadata, pipeline_pickle, dlpack, array_likes, cli)}


def main(argv: list[str]) -> int:
    for name in argv or TARGETS:
        _write(name, TARGETS[name]())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
