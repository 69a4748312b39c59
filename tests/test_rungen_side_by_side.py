"""``python -m shim run`` and Halide's RunGen side by side (issue 42): RunGenMain.cpp as the
halide package ships it (share/tools, with halide_image_io.h's PNG and JPEG), compiled here and
linked with pipelines' objects built for the host, and the shim running the same objects as a
shared library. For each command line, both runs' exit status, stdout and stderr are compared
(normalized only where they must differ: each normalization says why) and every file they
write byte for byte. The differences that remain by design are in docs/cli.md."""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from shim.pipelines.build import GENERATORS_DIR

halide = pytest.importorskip("halide", reason="building RunGen needs halide")
TIMEOUT = 600
SAMPLES = ("brighten", "blur3x3", "histogram", "checked_sqrt", "sum_diff")

# A colour pipeline (no sample has one): an 8-bit image of any channel count, copied.
GENERATOR = textwrap.dedent('''
    import halide as hl

    x, y, c = hl.vars("x y c")


    @hl.generator(name="rgb_copy")
    class RgbCopy:
        input = hl.InputBuffer(hl.UInt(8), 3)
        output = hl.OutputBuffer(hl.UInt(8), 3)

        def generate(self):
            self.output[x, y, c] = self.input[x, y, c]


    if __name__ == "__main__":
        hl.main()
''')

SHARE = Path(halide.__file__).parent / "share" / "tools"
INCLUDE = Path(halide.__file__).parent / "include"


def _compiler() -> str:
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler to build RunGen with")
    return compiler


def _compile(work: Path, *arguments) -> subprocess.CompletedProcess:
    return subprocess.run([_compiler(), "-std=c++17", "-O1", f"-I{INCLUDE}", f"-I{SHARE}",
                           *map(str, arguments)], cwd=work, capture_output=True, text=True,
                          timeout=TIMEOUT)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """{pipeline: (its RunGen binary, its shared library for the shim)}, both from one object
    file (so that even the target string each prints is the same)."""
    work = tmp_path_factory.mktemp("rungen_side_by_side")
    (work / "probe.cpp").write_text("#include <png.h>\n#include <jpeglib.h>\nint main() {}\n")
    if _compile(work, "probe.cpp", "-o", "probe", "-lpng", "-ljpeg").returncode != 0:
        pytest.skip("RunGen writes PNG and JPEG through libpng and libjpeg, whose headers are "
                    "not installed (libpng-dev, libjpeg-dev)")
    built = _compile(work, "-c", SHARE / "RunGenMain.cpp", "-o", "main.o")
    assert built.returncode == 0, built.stderr
    (work / "rgb_copy.py").write_text(GENERATOR)
    env = dict(os.environ, PYTHONPATH=str(GENERATORS_DIR.parent))
    binaries = {}
    for name in (*SAMPLES, "rgb_copy"):
        generator = [str(work / "rgb_copy.py")] if name == "rgb_copy" else \
            ["-m", f"generators.{name}"]
        subprocess.run([sys.executable, *generator, "-g", name, "-o", str(work),
                        "-e", "object,registration", "-f", name, "target=host"],
                       env=env, cwd=work, check=True, capture_output=True, timeout=TIMEOUT)
        linked = _compile(work, "main.o", f"{name}.registration.cpp", f"{name}.o", "-o",
                          f"{name}.rungen", "-lpng", "-ljpeg", "-lpthread", "-ldl")
        assert linked.returncode == 0, linked.stderr
        subprocess.run(["cc", "-shared", "-o", f"{name}.so", f"{name}.o", "-lpthread", "-ldl"],
                       cwd=work, check=True, timeout=TIMEOUT)
        binaries[name] = (work / f"{name}.rungen", work / f"{name}.so")
    return binaries


def _input_files(folder: Path) -> None:
    """The image files the command lines read, written with imageio (libpng reads them as
    the shim's readers do)."""
    iio = pytest.importorskip("imageio.v3")
    rng = np.random.default_rng(42)
    iio.imwrite(folder / "gray.png", rng.integers(0, 256, (30, 40), dtype=np.uint8))
    iio.imwrite(folder / "rgb.png", rng.integers(0, 256, (30, 40, 3), dtype=np.uint8))
    iio.imwrite(folder / "gray16.png", rng.integers(0, 65536, (30, 40), dtype=np.uint16))
    np.save(folder / "ramp.npy", np.linspace(-0.5, 1.5, 30 * 40, dtype=np.float32))


def side_by_side(pair, tmp_path, name: str, line: str, ours: tuple = ()):
    """(RunGen's run, the shim's) of ``line`` for the pipeline ``name``, each in a folder of
    its own holding the same input files (so that both name the same files); ``ours``: the
    shim's own options, given to the shim only."""
    binary, library = pair[name]
    runs = []
    for side, command in (("rungen", [str(binary)]),
                          ("shim", [sys.executable, "-m", "shim", "run", str(library), *ours])):
        folder = tmp_path / side
        folder.mkdir()
        _input_files(folder)
        runs.append(subprocess.run([*command, *shlex.split(line)], cwd=folder,
                                   capture_output=True, text=True, timeout=TIMEOUT))
    rungen, ours_run = runs
    # (a program's name: RunGen names itself after its binary in its usage, the shim after
    # the command that runs it)
    for run, program in ((rungen, binary.name),
                         (ours_run, f"python -m shim run {library}")):
        run.stdout = run.stdout.replace(f"Usage: {program} ", "Usage: PROGRAM ")
    return rungen, ours_run


def assert_same(rungen, ours, tmp_path):
    assert ours.returncode == rungen.returncode, ours.stderr
    assert ours.stdout == rungen.stdout
    assert ours.stderr == rungen.stderr
    written = sorted(p.name for p in (tmp_path / "rungen").iterdir())
    assert sorted(p.name for p in (tmp_path / "shim").iterdir()) == written
    for name in written:
        assert (tmp_path / "shim" / name).read_bytes() == (tmp_path / "rungen" / name).read_bytes(), name


# (pipeline, RunGen's command line, the shim's own options: --npy_order=halide writes .npy
# files in halide_image_io's order, RunGen's, where the shim's default is numpy's)
HALIDE_NPY = ("--npy_order=halide",)
LINES = {
    # Runs, their outputs in every format RunGen writes (floats beyond [0, 1] wrap around in
    # 16-bit PNG, PGM and TIFF as they do in RunGen)
    "npy": ("brighten", "input=random:7:[64,48] scale=2 offset=0.5 output=out.npy", HALIDE_NPY),
    "png16": ("brighten", "input=random:7:[64,48] scale=2 offset=0.5 output=out.png", ()),
    "tiff": ("brighten", "input=random:7:[64,48] scale=2 offset=0.5 output=out.tiff", ()),
    "pgm": ("brighten", "input=random:7:[64,48] scale=1 offset=0 output=out.pgm", ()),
    "rgb_png": ("rgb_copy", "input=random:3:[37,23,3] output=out.png", ()),
    "rgba_png": ("rgb_copy", "input=random:3:[37,23,4] output=out.png", ()),
    "rgb_ppm": ("rgb_copy", "input=random:3:[37,23,3] output=out.ppm", ()),
    "rgb_jpeg": ("rgb_copy", "input=random:3:[37,23,3] output=out.jpg", ()),
    "rgb_tiff": ("rgb_copy", "input=random:3:[300,200,3] output=out.tiff", ()),
    "two_outputs": ("sum_diff", "a=random:1:[20,10] b=random:2:[20,10] sum=sum.npy "
                                "diff=diff.tiff --success", HALIDE_NPY),
    "stencil": ("blur3x3", "input=random:3:[66,50] output=out.png --output_extents=[64,48]", ()),
    "pinned": ("histogram", "input=random:11:[40,30] output=out.npy", HALIDE_NPY),
    # (one row each: in what order rows computed in parallel print is the thread pool's choice)
    "prints": ("checked_sqrt", "input=constant:4:[8,1] verbose=true output=out.npy", HALIDE_NPY),
    "quiet": ("checked_sqrt", "input=constant:4:[8,1] verbose=true output=out.npy --quiet",
              HALIDE_NPY),
    "octal": ("brighten", "input=zero:[0x8,010] scale=0x2 offset=010 output=out.tiff", ()),
    "defaults": ("brighten", "input=identity:[5,4] scale=default offset=estimate,default "
                             "output=out.tiff --verbose", ()),
    "default_inputs": ("brighten", "--default_input_buffers --default_input_scalars "
                                   "--output_extents=[8,6] output=out.tiff --verbose", ()),
    # Inputs from files, converted with RunGen's warnings
    "gray_png": ("brighten", "input=gray.png scale=1 offset=0 output=out.tiff", ()),
    "gray16_png": ("brighten", "input=gray16.png scale=1 offset=0 output=out.tiff", ()),
    "rgb_into_2d": ("brighten", "input=rgb.png scale=1 offset=0 output=out.tiff", ()),
    "gray_into_3d": ("rgb_copy", "input=gray.png output=out.png", ()),
    "npy_in": ("brighten", "input=ramp.npy scale=1 offset=0 output=out.png", ()),
    # --describe, --output_extents, --estimate_all, --verbose
    "describe": ("sum_diff", "--describe", ()),
    "describe_scalars": ("checked_sqrt", "-describe", ()),
    "output_extents": ("blur3x3", "input=zero:auto output=out.tiff --output_extents=[10,8] "
                                  "--verbose", ()),
    "estimate_all": ("blur3x3", "--estimate_all output=out.png --verbose", ()),
    "estimate_then_auto": ("histogram", "input=zero:estimate_then_auto output=out.tiff "
                                        "--output_extents=estimate --verbose", ()),
    "verbose": ("brighten", "input=random:7:[64,48] scale=2 offset=0.5 output=out.tiff "
                            "--verbose", ()),
    "verbose_two": ("sum_diff", "a=random:1:[20,10] b=random:2:[20,12] sum=sum.tiff "
                                "diff=diff.tiff --verbose", ()),
    "verbose_pinned": ("histogram", "input=random:1:[40,30] output=out.tiff --verbose", ()),
    "verbose_conversions": ("brighten", "input=rgb.png scale=1 offset=0 output=out.png "
                                        "--verbose", ()),
    # Usage
    "no_arguments": ("brighten", "", ()),
    "help": ("brighten", "input=zero:[2,2] --help", ()),
    "help_first": ("brighten", "--a=b=c -help", ()),
    # Errors: RunGen's message on stderr, then SIGABRT
    "unknown_argument": ("brighten", "input=zero:[2,2] scale=1 offset=1 output=out.npy foo=3 "
                                     "bar=4", ()),
    "unknown_flag": ("brighten", "input=zero:[2,2] --foo", ()),
    "missing_argument": ("brighten", "input=zero:[2,2] scale=2", ()),
    "bad_scalar": ("brighten", "input=zero:[2,2] scale=abc offset=1 output=out.npy", ()),
    "scalar_beyond_float32": ("brighten", "input=zero:[2,2] scale=1e39 offset=1 "
                                          "output=out.npy", ()),
    "scalar_out_of_range": ("brighten", "input=zero:[2,2] scale=30 offset=1 output=out.npy",
                            ()),
    "bad_bool": ("checked_sqrt", "input=zero:[2,2] verbose=1 output=out.npy", ()),
    "bad_constant": ("brighten", "input=constant:abc:[4,4] scale=1 offset=1 output=out.npy",
                     ()),
    "bad_seed": ("brighten", "input=random:x:[4,4] scale=1 offset=1 output=out.npy", ()),
    "bad_syntax": ("brighten", "input=zero:[4,4]:9 scale=1 offset=1 output=out.npy", ()),
    "bad_extent": ("brighten", "input=random:7:[64,x] scale=1 offset=1 output=out.npy", ()),
    "bad_extents": ("brighten", "input=random:7:64 scale=1 offset=1 output=out.npy", ()),
    "no_estimates": ("sum_diff", "a=zero:estimate b=zero:[2,2] sum=s.npy diff=d.npy", ()),
    "bad_flag_value": ("brighten", "input=zero:[2,2] scale=1 offset=1 output=out.npy "
                                   "--verbose=yes", ()),
    "bad_benchmarks": ("brighten", "--benchmarks=some input=zero:[2,2] scale=1 offset=1", ()),
    "bad_min_time": ("brighten", "--benchmark_min_time=abc input=zero:[2,2]", ()),
    "twice": ("brighten", "input=zero:[2,2] input=zero:[4,4]", ()),
    "invalid_argument": ("brighten", "input=zero:[2,2] a=b=c", ()),
    "no_value": ("brighten", "input= scale=1", ()),
    "no_name": ("brighten", "=3", ()),
    "not_an_argument": ("brighten", "input", ()),
    "missing_file": ("brighten", "input=missing.png scale=1 offset=1 output=out.npy", ()),
    "unknown_suffix": ("brighten", "input=zero:[2,2] scale=1 offset=1 output=out.xyz", ()),
    "channels": ("rgb_copy", "input=random:3:[37,23,4] output=out.jpg", ()),
    "channels_ppm": ("brighten", "input=zero:[4,4] scale=1 offset=1 output=out.ppm", ()),
    "pipeline_error": ("checked_sqrt", "input=constant:-4:[8,1] verbose=false output=out.npy",
                       ()),
    "name_not_found": ("brighten", "--name=foo input=zero:[2,2]", ()),
    "name_empty": ("brighten", "--name input=zero:[2,2]", ()),
    "name_twice": ("brighten", "--name=a --name=b", ()),
}


@pytest.mark.parametrize("case", LINES)
def test_the_shim_answers_as_runGen_does(pair, tmp_path, case):
    name, line, ours = LINES[case]
    rungen, shim_run = side_by_side(pair, tmp_path, name, line, ours)
    assert_same(rungen, shim_run, tmp_path)


def test_failures_end_as_runGens_do(pair, tmp_path):
    rungen, shim_run = side_by_side(pair, tmp_path, "brighten", "input=zero:[2,2] --foo")
    assert rungen.returncode == shim_run.returncode == -signal.SIGABRT
    assert "Traceback" not in shim_run.stderr
    # From a shell: 134 for both; and where cores are kept, none of the shim's Python.
    binary, library = pair["brighten"]
    for side, command in (("rungen", str(binary)),
                          ("shim", f"{sys.executable} -m shim run {library}")):
        done = subprocess.run(["sh", "-c", f"ulimit -c unlimited; {command} --foo; echo $?"],
                              cwd=tmp_path / side, capture_output=True, text=True,
                              timeout=TIMEOUT)
        assert done.stdout.splitlines()[-1] == "134"
    assert not any(p.name.startswith("core") for p in (tmp_path / "shim").iterdir())


# RunGen's benchmark lines, their figures replaced: (line, figures, significant digits)
BENCHMARK = re.compile(r"Benchmark for (\w+) produces best case of (\S+) sec/iter \(over (\d+) "
                       r"samples, (\d+) iterations, accuracy (\S+)%\)\.")
THROUGHPUT = re.compile(r"Best output throughput is (\S+) mpix/sec\.")
PARSABLE = re.compile(r"(\w+)  (\w+) +(\S+)")


def _figures(stdout: str) -> tuple:
    """stdout with each timing figure replaced by N (the runs take their own times), and
    each figure checked to be written as RunGen writes it (C's %g: six significant digits,
    two after RunGen's setprecision(2))."""
    def check(text: str, digits: int) -> str:
        assert text == f"{float(text):.{digits}g}", text
        return "N"

    def benchmark(m):
        return (f"Benchmark for {m[1]} produces best case of {check(m[2], 6)} sec/iter (over N "
                f"samples, N iterations, accuracy {check(m[5], 2)}%).")

    def parsable(m):
        if m[2] in ("SAMPLES", "ITERATIONS"):
            assert m[3].isdigit(), m[0]
            return f"{m[1]}  {m[2]:<24} N"
        if m[2] == "HALIDE_TARGET":
            return m[0]
        return f"{m[1]}  {m[2]:<24} {check(m[3], 6)}"

    text = BENCHMARK.sub(benchmark, stdout)
    text = THROUGHPUT.sub(lambda m: f"Best output throughput is {check(m[1], 2)} mpix/sec.", text)
    return PARSABLE.sub(parsable, text) if "BEST_TIME_MSEC_PER_ITER" in text else text


@pytest.mark.parametrize("name, line", [
    ("brighten", "--benchmarks=all input=random:7:[64,48] scale=1 offset=0 "
                 "--benchmark_min_time=0.01"),
    ("brighten", "--benchmarks=all --parsable_output input=random:7:[64,48] scale=1 offset=0 "
                 "--benchmark_min_time=0.01"),
    ("blur3x3", "--benchmarks --estimate_all --benchmark_min_time=0.01 output=out.tiff "
                "--verbose"),
    ("brighten", "--track_memory --benchmarks=all input=zero:[64,48] scale=1 offset=0 "
                 "--benchmark_min_time=0.01"),
    ("brighten", "--track_memory input=zero:[64,48] scale=1 offset=0 output=out.npy"),
])
def test_benchmark_lines_are_runGens(pair, tmp_path, name, line):
    rungen, shim_run = side_by_side(pair, tmp_path, name, line, HALIDE_NPY)
    assert shim_run.returncode == rungen.returncode == 0, shim_run.stderr
    assert _figures(shim_run.stdout) == _figures(rungen.stdout)
    assert shim_run.stderr == rungen.stderr
    if "output=" in line:
        output = line.split("output=")[1].split()[0]
        assert (tmp_path / "shim" / output).read_bytes() == \
            (tmp_path / "rungen" / output).read_bytes()


# --- halide_image_io's type conversion, every pair of types --------------------------------------

CONVERT = textwrap.dedent('''
    #include "HalideBuffer.h"
    #include "halide_image_io.h"
    #include <cstdio>
    #include <string>
    #include <vector>
    using namespace Halide::Tools::Internal;

    template<typename To, typename From>
    void run(FILE *in, FILE *out) {
        From value;
        while (fread(&value, sizeof value, 1, in) == 1) {
            To converted = convert<To, From>(value);
            fwrite(&converted, sizeof converted, 1, out);
        }
    }

    #define TYPES(X) X(bool, "bool") X(uint8_t, "uint8") X(uint16_t, "uint16") \\
        X(uint32_t, "uint32") X(uint64_t, "uint64") X(int8_t, "int8") X(int16_t, "int16") \\
        X(int32_t, "int32") X(int64_t, "int64") X(float, "float32") X(double, "float64")

    template<typename From>
    void to(const std::string &name, FILE *in, FILE *out) {
    #define TO(T, NAME) if (name == NAME) run<T, From>(in, out);
        TYPES(TO)
    }

    int main(int argc, char **argv) {
        std::string from = argv[1], name = argv[2];
    #define FROM(T, NAME) if (from == NAME) to<T>(name, stdin, stdout);
        TYPES(FROM)
        return 0;
    }
''')
TYPES = ("bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
         "float32", "float64")


def _samples(name: str) -> np.ndarray:
    dtype = np.dtype(name)
    if dtype == np.bool_:
        return np.array([False, True])
    rng = np.random.default_rng(len(name))
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        edges = [e for e in (info.min, info.max, 0, 1, 127, 128, 255, 256, 32767, 32768, 65535,
                             info.max // 2, info.max // 2 + 1) if info.min <= e <= info.max]
        return np.concatenate([np.array(edges, dtype),
                               rng.integers(info.min, info.max, 300, dtype=dtype, endpoint=True)])
    # Floats within [0, 1], beyond it (wrapping around), halves (rounding) and no numbers.
    edges = [0, 1, 0.5, 1 / 255, 0.5 / 255, 1.5 / 255, 0.49999997, 2, 2.5, -1, -0.5, 1e10,
             -1e10, 1e30, np.inf, -np.inf, np.nan, 1 - 1e-9]
    return np.concatenate([np.array(edges, dtype), rng.uniform(-3, 3, 300).astype(dtype),
                           rng.uniform(0, 1, 300).astype(dtype)])


def test_type_conversions_are_halide_image_ios(tmp_path):
    from shim.cli.images import convert

    (tmp_path / "convert.cpp").write_text(CONVERT)
    built = _compile(tmp_path, "-DHALIDE_NO_PNG", "-DHALIDE_NO_JPEG", "convert.cpp", "-o",
                     "convert")
    assert built.returncode == 0, built.stderr
    for source in TYPES:
        values = _samples(source)
        for target in TYPES:
            if target == source:
                continue
            halide_io = subprocess.run([tmp_path / "convert", source, target],
                                       input=values.tobytes(), capture_output=True,
                                       check=True, timeout=TIMEOUT).stdout
            converted = np.asarray(convert(values, np.dtype(target)))
            assert converted.dtype == np.dtype(target)
            assert converted.tobytes() == halide_io, (source, target)
