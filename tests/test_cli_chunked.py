"""``python -m shim run ... --chunks WxH [--scheduler ADDRESS]``: a pipeline over its inputs in
chunks through shim.dask.map_pipeline, with a progress bar, results identical to one call."""

import subprocess
import sys

import numpy as np
import pytest

from gpu_cases import blur_reference

pytest.importorskip("dask.array")


def run(*args):
    return subprocess.run([sys.executable, "-m", "shim", *args], capture_output=True, text=True)


@pytest.fixture
def blur(host_pipelines):
    return str(host_pipelines["blur3x3", "bundled"])


@pytest.fixture
def image(tmp_path):
    pixels = np.random.default_rng(3).integers(0, 1 << 16, (70, 90), dtype=np.uint16)
    np.save(tmp_path / "in.npy", pixels)
    return pixels


@pytest.mark.parametrize("chunks", ["16x16", "7x5", "90x70"])
def test_chunked_run_matches_the_whole_run_and_numpy(blur, image, tmp_path, chunks):
    done = run("run", blur, f"input={tmp_path / 'in.npy'}", f"output={tmp_path / 'out.npy'}",
               "--chunks", chunks)
    assert done.returncode == 0, done.stderr
    whole = run("run", blur, f"input={tmp_path / 'in.npy'}", f"output={tmp_path / 'ref.npy'}")
    assert whole.returncode == 0, whole.stderr
    out = np.load(tmp_path / "out.npy")
    np.testing.assert_array_equal(out, np.load(tmp_path / "ref.npy"))
    np.testing.assert_array_equal(out, blur_reference(image))
    assert "100% Completed" in done.stderr  # dask's ProgressBar
    assert f"chunks of {chunks}" in done.stdout and "output: uint16 88x68 -> " in done.stdout
    assert not list(tmp_path.glob("out.npy.*"))  # no partial file left


def test_npy_inputs_in_other_byte_orders_and_layouts_are_read_as_halide_reads_them(
        blur, image, tmp_path):
    np.save(tmp_path / "odd.npy", np.asfortranarray(image.astype(">u2")))
    done = run("run", blur, f"input={tmp_path / 'odd.npy'}", f"output={tmp_path / 'out.npy'}",
               "--chunks=32x16")
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), blur_reference(image))


def test_an_image_input_is_converted_as_without_chunks(blur, tmp_path):
    iio = pytest.importorskip("imageio.v3")
    gray = np.random.default_rng(1).integers(0, 256, size=(34, 50), dtype=np.uint8)
    iio.imwrite(tmp_path / "in.png", gray)
    done = run("run", blur, f"input={tmp_path / 'in.png'}", f"output={tmp_path / 'out.npy'}",
               "--chunks", "16x16")
    assert done.returncode == 0, done.stderr
    assert ('Image loaded for argument "input" is type uint8 but this argument expects type '
            'uint16; data loss may have occurred.') in done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"),
                                  blur_reference(gray.astype(np.uint16) * 257))


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(processes=True, n_workers=2, threads_per_worker=1,
                                  dashboard_address=None) as local:
        yield local.scheduler_address


def test_a_distributed_scheduler_runs_the_chunks_with_its_progress_bar(blur, image, tmp_path,
                                                                        cluster):
    done = run("run", blur, f"input={tmp_path / 'in.npy'}", f"output={tmp_path / 'out.npy'}",
               "--chunks", "16x24", "--scheduler", cluster)
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), blur_reference(image))
    assert "100% Completed" in done.stdout  # distributed's progress


def test_without_dask_chunks_names_the_extra_to_install(blur, tmp_path):
    code = ("import sys; sys.modules['dask'] = None; from shim.cli.main import main; "
            "sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, "run", blur, "input=in.npy",
                           "output=out.npy", "--chunks", "16x16"], capture_output=True,
                          text=True, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "--chunks: needs dask" in done.stderr and "halide-shim[dask]" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("chunks", ["0x5", "abc", "5", "5x-1", "5x5x5", "5x\u00b2"])
def test_bad_chunks_are_refused_naming_the_flag(blur, image, tmp_path, chunks):
    done = run("run", blur, f"input={tmp_path / 'in.npy'}", f"output={tmp_path / 'out.npy'}",
               f"--chunks={chunks}")
    assert done.returncode == 2
    assert "--chunks" in done.stderr and "expected" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out.npy").exists()


@pytest.mark.parametrize("extra, named", [
    (["--benchmarks=all"], "--benchmarks"),
    (["--iterations", "3"], "--iterations"),
    (["--track_memory"], "--track_memory"),
    (["--profile", "trace.json"], "--profile"),
])
def test_timing_flags_are_refused_with_chunks(blur, image, tmp_path, extra, named):
    done = run("run", blur, f"input={tmp_path / 'in.npy'}", f"output={tmp_path / 'out.npy'}",
               "--chunks", "16x16", *extra)
    assert done.returncode == 2
    assert "--chunks" in done.stderr and named in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("arguments, named", [
    (["input=random:0:[90,70]", "output=OUT"], "input: --chunks runs over input files"),
    (["input=IN"], "output: --chunks saves every output to a file"),
    (["input=IN", "output=OUT", "--scheduler", "tcp://127.0.0.1:1"], "--scheduler"),
])
def test_what_a_chunked_run_cannot_take_is_refused(blur, image, tmp_path, arguments, named):
    arguments = [a.replace("IN", str(tmp_path / "in.npy")).replace("OUT", str(tmp_path / "o.npy"))
                 for a in arguments]
    chunks = ["--chunks", "16x16"] if "--scheduler" not in arguments else []
    done = run("run", blur, *arguments, *chunks)
    assert done.returncode == 2
    assert named in done.stderr and "Traceback" not in done.stderr
