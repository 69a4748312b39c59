"""The offline GPU check kit's plumbing (benchmarks/gpu_kit.py), where there is no GPU and no
network: prepare's output, wheel choice, an offline install into a fresh venv, and the CUDA
test files run from the kit with halide and pyopencl unimportable, skipping for the driver."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from shim.pipelines.build import RUNTIMES, generator_names
from shim.backends import cuda as cuda_backend

ROOT = Path(__file__).resolve().parent.parent
KIT_SCRIPT = ROOT / "benchmarks" / "gpu_kit.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_kit  # noqa: E402

CFFI = "cffi-2.0.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
PYCPARSER = "pycparser-3.0-py3-none-any.whl"
DECOYS = ["cffi-2.0.0-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
          "cffi-1.17.1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
          "cffi-2.0.0-cp312-cp312-macosx_11_0_arm64.whl",
          "cffi-2.0.0-cp312-cp312-musllinux_1_1_x86_64.whl"]
PINS = {"cffi": "2.0.0", "pycparser": "3.0"}
# What prepare looks for: wheels of the versions installed here (CI installs the newest).
INSTALLED = gpu_kit.pinned_versions()
KIT_WHEELS = [f"cffi-{INSTALLED['cffi']}-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
              f"pycparser-{INSTALLED['pycparser']}-py3-none-any.whl"]


def fake_wheels(directory: Path, names) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_bytes(b"not really a wheel")
    return directory


def test_wheels_are_chosen_for_the_target_python_and_the_pinned_versions(tmp_path):
    source = fake_wheels(tmp_path / "cache", [CFFI, PYCPARSER, *DECOYS])
    chosen = gpu_kit.fetch_wheels(tmp_path / "kit", "3.12", source, PINS)
    assert sorted(p.name for p in chosen) == sorted([CFFI, PYCPARSER])
    assert sorted(p.name for p in (tmp_path / "kit").iterdir()) == sorted([CFFI, PYCPARSER])
    with pytest.raises(RuntimeError, match=r"no wheel of cffi==2\.0\.0 for CPython 3\.13"):
        gpu_kit.fetch_wheels(tmp_path / "other", "3.13", source, PINS)


def test_the_pins_are_the_versions_installed_here():
    from importlib import metadata

    assert gpu_kit.pinned_versions() == {name: metadata.version(name) for name in ("cffi", "pycparser")}


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """A kit made by prepare as a user runs it: every pipeline, the native module copied from
    shim/, wheels from a local folder (no network), no check with another Python."""
    base = tmp_path_factory.mktemp("gpukit")
    wheels = fake_wheels(base / "wheels", KIT_WHEELS)
    out = base / "kit"
    done = subprocess.run([sys.executable, str(KIT_SCRIPT), "prepare", "--out", str(out), "--native", "copy",
                           "--wheels-from", str(wheels), "--verify", "no"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def test_prepare_lays_out_what_run_needs_within_the_budget(kit):
    manifest = json.loads((kit / "manifest.json").read_text())
    built = {(p["name"], p["target"], p["runtime"]) for p in manifest["pipelines"]}
    assert built == {(n, t, r) for n in generator_names() for t in ("cuda", "host", "vulkan")
                     for r in RUNTIMES}
    for entry in manifest["pipelines"]:
        assert (kit / "pipelines" / entry["file"]).stat().st_size == entry["bytes"] > 0
    assert (kit / "pipelines" / "HALIDE_VERSION").read_text().strip() == manifest["halide_version"]
    assert (kit / manifest["native"]["file"]).name == "_native.abi3.so"
    assert (kit / manifest["harness"]["file"]).exists()
    assert sorted(w["file"] for w in manifest["wheels"]) == sorted(f"wheels/{n}" for n in KIT_WHEELS)
    size = sum(p.stat().st_size for p in kit.rglob("*") if p.is_file())
    assert size < gpu_kit.BUDGET_MIB * 2**20 and manifest["bytes"] == size
    assert manifest["travel_bytes"] < gpu_kit.TRAVEL_LIMIT_MIB * 2**20
    assert set(manifest["seconds"]) == {"pipelines", "native", "own-pipeline", "harness",
                                        "wheels", "verify"}
    # docs/own-pipeline.md's CUDA library, made by the page's commands, and its generator.
    own = {entry["file"]: entry["bytes"] for entry in manifest["own_pipeline"]["files"]}
    assert {"own-pipeline/my_generator.py", "own-pipeline/build/cuda/my_pipeline.so"} <= set(own)
    assert not any("/build/" in name and "/cuda/" not in name for name in own), own
    for name, size in own.items():
        assert (kit / name).stat().st_size == size > 0


def test_prepare_fails_loudly_over_budget(tmp_path):
    wheels = fake_wheels(tmp_path / "wheels", KIT_WHEELS)
    done = subprocess.run([sys.executable, str(KIT_SCRIPT), "prepare", "--out", str(tmp_path / "kit"),
                           "--pipelines", "brighten", "--native", "copy", "--wheels-from", str(wheels),
                           "--verify", "no", "--budget-mib", "0.1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "over its budget of 0.1 MiB" in done.stderr


def test_prepare_does_not_replace_a_folder_that_is_not_a_kit(tmp_path):
    (tmp_path / "precious.txt").write_text("mine")
    with pytest.raises(RuntimeError, match="not a GPU kit"):
        gpu_kit.prepare(tmp_path, ["brighten"], "copy", verify="no")
    assert (tmp_path / "precious.txt").exists()


def test_prepare_refuses_a_native_module_that_would_not_import_with_this_tree(tmp_path, monkeypatch):
    stamp = gpu_kit.native_stamp.read(ROOT / "shim" / "_native.abi3.so")
    monkeypatch.setattr(gpu_kit.native_stamp, "read", lambda library: {**stamp, "version": "0.0.1"})
    with pytest.raises(RuntimeError, match=r"_native\.abi3\.so would not import with this tree: it "
                                           r"was built for halide-shim 0\.0\.1, this is halide-shim"):
        gpu_kit.prepare_native(tmp_path, "copy")


def test_the_kit_records_the_native_stamp_and_names_the_sources_changed_since_its_build(
        tmp_path, capsys, monkeypatch):
    stamp = gpu_kit.native_stamp.read(ROOT / "shim" / "_native.abi3.so")
    entry = gpu_kit.prepare_native(tmp_path, "copy")
    assert entry["version"] == stamp["version"] and entry["sources"] == stamp["sources"]
    # A module built from other C files than this tree's: it imports, the kit warns.
    other_c = {**stamp["sources"], "native_stubs/fast/fastcall.c": "0" * 16}
    del other_c["native_stubs/forks/fork.c"]
    monkeypatch.setattr(gpu_kit.native_stamp, "read", lambda library: {**stamp, "sources": other_c})
    entry = gpu_kit.prepare_native(tmp_path, "copy")
    changed = "native_stubs/fast/fastcall.c changed, native_stubs/forks/fork.c added"
    assert (f"was built from other sources than this tree's ({changed}): the kit carries a stale "
            "native module") in capsys.readouterr().out
    page = {"page_sha256": gpu_kit.sha256(ROOT / "docs" / "own-pipeline.md")}
    [warning] = gpu_kit.kit_warnings(tmp_path, {"native": entry, "pipelines": [],
                                                "own_pipeline": page})
    assert warning.startswith("the kit's native module was built from other native_stubs/abi "
                              f"sources than this tree's ({changed}")
    del entry["sources"]
    assert gpu_kit.kit_warnings(tmp_path, {"native": entry, "pipelines": [],
                                           "own_pipeline": page}) == [
        "the manifest does not say what the kit's native module was built from (a kit from "
        "before native stamps): run prepare again"]


def test_a_kit_made_from_another_own_pipeline_page_says_so(tmp_path):
    native = {"sources": gpu_kit.native_stamp.digests(ROOT)}
    page = {"page_sha256": gpu_kit.sha256(ROOT / "docs" / "own-pipeline.md")}
    assert gpu_kit.kit_warnings(tmp_path, {"native": native, "pipelines": [],
                                           "own_pipeline": page}) == []
    assert gpu_kit.kit_warnings(tmp_path, {"native": native, "pipelines": [],
                                           "own_pipeline": {"page_sha256": "0" * 64}}) == [
        "docs/own-pipeline.md changed since prepare: its CUDA examples run on the builds of "
        "the page as it was then (run prepare again)"]
    assert gpu_kit.kit_warnings(tmp_path, {"native": native, "pipelines": []}) == [
        "the kit has no builds of docs/own-pipeline.md (a kit from before them): run prepare "
        "again"]


@pytest.mark.parametrize("version", ["this", gpu_kit.TARGET_PYTHON])
def test_an_offline_install_of_the_wheels_into_a_fresh_venv(kit, tmp_path, version):
    """pip install --no-index of the kit's kind of wheels (real ones, for ``version``: this
    interpreter's, or the target's where this machine has that Python) into a new venv; cffi
    imports there and loads the carried native module."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}" if version == "this" else version
    python = gpu_kit.find_python(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine")
    try:
        wheels = gpu_kit.fetch_wheels(tmp_path / "wheels", version)
    except RuntimeError as e:
        pytest.skip(f"cannot download the wheels (offline?): {str(e)[-300:]}")
    env_dir = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(env_dir)], check=True, timeout=300)
    env_python = str(env_dir / "bin" / "python")
    done = subprocess.run([env_python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", *map(str, wheels)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    script = textwrap.dedent(gpu_kit.VERIFY_SCRIPT)
    done = subprocess.run([env_python, "-I", "-c", script, str(tmp_path / "nothing"),
                           str(kit / "native" / "_native.abi3.so")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "shim._native loads" in done.stdout


def test_the_cuda_suite_runs_from_the_kit_without_halide_or_pyopencl(kit, tmp_path):
    reason = cuda_backend.unavailable_reason()
    if reason is None:
        pytest.skip("this machine has a CUDA device: the dry run's skips are not expected here")
    if "cuda-python" in reason:
        pytest.skip(f"cuda-python is not installed: the CUDA tests cannot reach the driver ({reason})")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(KIT_SCRIPT), "run", "--kit", str(kit), "--out", str(out),
                           "--steps", "env,cuda-tests,interop,seed-crop,own-pipeline,host-side,"
                                      "bench-gpu",
                           "--dry-run"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    steps = summary["steps"]
    assert summary["failed_steps"] == [] and summary["warnings"] == []
    environment = (out / "env.log").read_text()
    assert '"halide": false' in environment and '"pyopencl": false' in environment
    assert str(kit / "native" / "_native.abi3.so") in environment  # the carried module, not shim/'s
    for name in ("cuda-tests", "interop", "seed-crop"):
        step = steps[name]
        assert step["status"] == "passed" and step["skipped"] > 0, (name, step)
        assert step["passed"] == step["failed"] == step["errors"] == 0, (name, step)
        for skip_reason in step["skip_reasons"]:
            assert skip_reason.lower().startswith("no cuda device on this machine"), skip_reason
            assert "driver" in skip_reason.lower(), skip_reason
    assert steps["host-side"]["passed"] >= 5 and steps["host-side"]["failed"] == 0
    # The page's example that loads nothing ran; its CUDA example skipped for the driver, the
    # others for the builds the kit does not carry.
    own = steps["own-pipeline"]
    assert own["status"] == "passed" and own["passed"] >= 2 and own["failed"] == 0, own
    assert any(r.startswith("needs a cuda device: no CUDA driver") for r in own["skip_reasons"]), own
    assert any(r.startswith("the GPU kit carries the page's CUDA builds only") for r in own["skip_reasons"]), own
    assert steps["bench-gpu"]["status"] == "skipped"
    assert sorted(p.name for p in out.iterdir()) == ["benchmarks.log", "env.log", "manifest.json",
                                                     "summary.json", "summary.txt", "tests.log"]


def test_a_run_that_finds_no_gpu_says_it_ran_nothing_and_fails(kit, tmp_path):
    if cuda_backend.unavailable_reason() is None:
        pytest.skip("this machine has a CUDA device: the run would not be empty")
    done = subprocess.run([sys.executable, str(KIT_SCRIPT), "run", "--kit", str(kit),
                           "--out", str(tmp_path / "out"), "--steps", "env,cuda-tests"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == gpu_kit.NOTHING_RUN != 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "no GPU: nothing run on a GPU" in done.stdout + done.stderr


def test_a_step_that_hangs_is_killed_with_its_children_at_its_time_limit(tmp_path):
    script = ("import subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
              "print('child', child.pid, flush=True)\n"
              "time.sleep(120)\n")
    with open(tmp_path / "log", "w") as log_file:
        code, output, seconds = gpu_kit.stream([sys.executable, "-c", script], dict(os.environ),
                                               3, log_file)
    assert code is None and seconds < 20 and "timed out after 3 s" in output
    child = int(output.split("child ")[1].split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and child_alive(child):
        time.sleep(0.1)
    assert not child_alive(child), "the step's own child outlived the time limit"


def child_alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_a_failing_step_fails_the_run_after_every_step_ran(kit, tmp_path, monkeypatch):
    fails = [sys.executable, "-c", "import sys; print('failing'); sys.exit(1)"]
    passes = [sys.executable, "-c", "print('still ran')"]
    monkeypatch.setattr(gpu_kit, "make_steps", lambda work: [
        gpu_kit.Step("cuda-tests", "fails", [fails], 30, "tests.log"),
        gpu_kit.Step("bench-noop", "runs anyway", [passes], 30, "benchmarks.log", kind="benchmark")])
    assert gpu_kit.run(kit, tmp_path) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed_steps"] == ["cuda-tests"]
    assert summary["steps"]["bench-noop"]["status"] == "passed"
    assert "still ran" in (tmp_path / "benchmarks.log").read_text()
    assert "FAILED: cuda-tests" in (tmp_path / "summary.txt").read_text()
