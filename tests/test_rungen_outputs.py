"""``python -m shim run`` against RunGen itself (issue 27): Halide's tools/RunGenMain.cpp (as
the halide package ships it) is compiled here with sample pipelines' registrations, and the
same command lines run through the RunGen binaries (the stock runtime, bundled) and through
the shim. With ``--npy_order=halide`` the shim reads and writes .npy files as
halide_image_io does, so the outputs are compared as files, element for element, and each
side reads what the other wrote; by default the shim writes numpy's order, the same bytes
under the transposed shape."""

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from shim.pipelines.build import GENERATORS_DIR, Build, build

halide = pytest.importorskip("halide", reason="building RunGen needs halide")
TIMEOUT = 600
PIPELINES = ("brighten", "blur3x3", "histogram")


def _compiler():
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler to build RunGen with")
    return compiler


@pytest.fixture(scope="module")
def rungen(tmp_path_factory):
    """{pipeline: path of its RunGen binary}."""
    work = tmp_path_factory.mktemp("rungen")
    share = Path(halide.__file__).parent / "share" / "tools"
    include = Path(halide.__file__).parent / "include"
    flags = ["-std=c++17", "-O1", "-DHALIDE_NO_PNG", "-DHALIDE_NO_JPEG", f"-I{include}",
             f"-I{share}"]
    subprocess.run([_compiler(), *flags, "-c", share / "RunGenMain.cpp", "-o", "main.o"],
                   cwd=work, check=True, capture_output=True, timeout=TIMEOUT)
    env = dict(os.environ, PYTHONPATH=str(GENERATORS_DIR.parent))
    binaries = {}
    for name in PIPELINES:
        subprocess.run([sys.executable, "-m", f"generators.{name}", "-g", name, "-o", str(work),
                        "-e", "object,registration", "-f", name, "target=host"],
                       env=env, cwd=work, check=True, capture_output=True, timeout=TIMEOUT)
        binaries[name] = work / f"{name}.rungen"
        subprocess.run([_compiler(), *flags, "main.o", f"{name}.registration.cpp", f"{name}.o",
                        "-o", binaries[name], "-lpthread", "-ldl"],
                       cwd=work, check=True, capture_output=True, timeout=TIMEOUT)
    return binaries


def _stock(binary, *args, cwd):
    done = subprocess.run([binary, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    return done


def _shim(name, *args, cwd):
    library = build(Build(name, "host", "no_runtime"))
    done = subprocess.run([sys.executable, "-m", "shim", "run", str(library), *args],
                          capture_output=True, text=True, cwd=cwd, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    return done


def _npy(path):
    with warnings.catch_warnings():  # (numpy finds halide_image_io's header old-fashioned)
        warnings.filterwarnings("ignore", "Reading `.npy` or `.npz` file required")
        return np.load(path, allow_pickle=False)


LINES = {
    "brighten": ["input=random:7:[64,48]", "scale=2", "offset=0.5"],
    "blur3x3": ["--output_extents=[64,48]", "input=random:3:[66,50]"],
    "histogram": ["--output_extents=[256]", "input=random:11:[40,30]"],
}


@pytest.mark.parametrize("name", PIPELINES)
def test_the_same_command_line_gives_runGens_output(rungen, tmp_path, name):
    _stock(rungen[name], *LINES[name], "output=stock.npy", cwd=tmp_path)
    _shim(name, *LINES[name], "output=shim.npy", "--npy_order=halide", cwd=tmp_path)
    stock, mine = _npy(tmp_path / "stock.npy"), _npy(tmp_path / "shim.npy")
    assert stock.shape == mine.shape and stock.dtype == mine.dtype
    np.testing.assert_array_equal(mine, stock)
    assert stock.std() > 0  # (not all zeros: random inputs went through)
    # numpy's order by default: the same bytes, the shape the other way round.
    _shim(name, *LINES[name], "output=numpy.npy", cwd=tmp_path)
    numpy_order = _npy(tmp_path / "numpy.npy")
    assert numpy_order.shape == stock.shape[::-1]
    assert numpy_order.tobytes() == stock.tobytes()


def test_each_reads_what_the_other_wrote(rungen, tmp_path):
    _stock(rungen["brighten"], *LINES["brighten"], "output=stock.npy", cwd=tmp_path)
    _shim("brighten", "input=stock.npy", "scale=3", "offset=1", "output=shim.npy",
          "--npy_order=halide", cwd=tmp_path)
    _stock(rungen["brighten"], "input=shim.npy", "scale=0.5", "offset=0", "output=back.npy",
           cwd=tmp_path)
    stock = _npy(tmp_path / "stock.npy")
    np.testing.assert_array_equal(_npy(tmp_path / "back.npy"),
                                  (stock * np.float32(3) + np.float32(1)) * np.float32(0.5))


def test_describe_matches_runGen(rungen, tmp_path):
    for name in PIPELINES:
        stock = _stock(rungen[name], "--describe", cwd=tmp_path).stdout
        assert _shim(name, "--describe", cwd=tmp_path).stdout == stock, name


def test_chunked_runs_refuse_halides_npy_order(tmp_path):
    library = build(Build("brighten", "host", "no_runtime"))
    done = subprocess.run([sys.executable, "-m", "shim", "run", str(library),
                           "input=zero:[8,8]", "output=o.npy", "--chunks", "4x4",
                           "--npy_order=halide"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=TIMEOUT)
    assert done.returncode == 2 and "--npy_order" in done.stderr
