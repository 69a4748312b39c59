"""Pickling shim.Pipeline (its library's bytes, hash and name; shim/calls/pipeline_pickle.py) and
shim.Buffer (host data and shape): round trips in this process and in fresh processes that
never saw the library's file, unpickling in several processes at once, damage, and no file
written anywhere. (What another user could do to the files: tests/test_file_security.py.)"""

import hashlib
import multiprocessing
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import shim
from shim.calls.pipeline_pickle import PickledPipelineError
from shim.pipelines.build import Build, build


def brighten_reference(image, scale=2.0, offset=1.0):
    return image * np.float32(scale) + np.float32(offset)


def private_copy(source, directory: Path, tag: str) -> Path:
    """A copy of the library ``source`` whose bytes no other test's have: a tag appended after
    the ELF contents (which the loader ignores), so that its hash is new to this process."""
    path = directory / f"{tag}.so"
    path.write_bytes(Path(source).read_bytes() + f"\0halide-shim test {tag} {os.getpid()}".encode())
    return path


@pytest.fixture
def image():
    return np.random.default_rng(7).random((24, 40), dtype=np.float32)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """This test's cache folder (for this process and the processes it starts), which
    unpickling must leave alone: libraries are loaded from memory, never written to disk."""
    monkeypatch.setenv("HALIDE_SHIM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def loaded_from_memory(pipeline, data: bytes) -> bool:
    """Whether ``pipeline`` was loaded from a sealed memory file holding exactly ``data``."""
    return (pipeline.path.startswith("/proc/self/fd/")
            and os.readlink(pipeline.path).startswith("/memfd:halide-shim ")
            and Path(pipeline.path).read_bytes() == data)


def run_python(code: str, *args, env=None) -> str:
    done = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


# --- Pipeline, in this process -----------------------------------------------------------------

def test_an_in_process_round_trip_is_the_same_pipeline(load, image):
    brighten = load("brighten")
    again = pickle.loads(pickle.dumps(brighten))
    assert again is brighten
    np.testing.assert_array_equal(again(image, output=image.shape).numpy(), brighten_reference(image))


def test_of_a_library_loaded_twice_a_round_trip_gives_back_the_pipeline_pickled(
        host_pipelines, runtime):
    """The one registered first came back, whichever was pickled (while it lived)."""
    first = shim.load(host_pipelines["brighten", runtime])
    second = shim.load(host_pipelines["brighten", runtime])
    assert first is not second
    assert pickle.loads(pickle.dumps(first)) is first
    assert pickle.loads(pickle.dumps(second)) is second
    assert pickle.loads(pickle.dumps(first)) is first


def test_a_pipeline_pickles_what_was_loaded_after_its_file_is_deleted_or_rebuilt(
        host_pipelines, runtime, tmp_path, cache, image):
    path = private_copy(host_pipelines["brighten", runtime], tmp_path, "rebuilt")
    loaded_bytes = path.read_bytes()
    brighten = shim.load(path)
    # Rebuilt in place, the way build tools do (a new file renamed over the old one)...
    other = tmp_path / "other.so"
    shutil.copyfile(host_pipelines["blur3x3", runtime], other)
    os.replace(other, path)
    _, (digest, name, data) = brighten.__reduce__()
    assert (digest, name, data) == (hashlib.sha256(loaded_bytes).hexdigest(), "brighten", loaded_bytes)
    # ... or deleted: the pickle still carries the code this process runs.
    path.unlink()
    pickled = pickle.dumps(brighten)
    del brighten
    restored = pickle.loads(pickled)  # no one holds the original now: loaded from the bytes
    assert restored.name == "brighten"
    assert loaded_from_memory(restored, loaded_bytes)
    assert not cache.exists()
    np.testing.assert_array_equal(restored(image, output=image.shape).numpy(), brighten_reference(image))
    assert pickle.loads(pickle.dumps(restored)) is restored


def test_damaged_library_bytes_are_refused(host_pipelines, tmp_path, cache):
    path = private_copy(host_pipelines["brighten", "bundled"], tmp_path, "damaged")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    damaged = bytearray(data)
    damaged[len(damaged) // 2] ^= 0x40
    with pytest.raises(PickledPipelineError, match="do not match their sha256") as raised:
        shim.Pipeline._from_pickle(digest, "brighten", bytes(damaged))
    assert isinstance(raised.value, shim.ShimError)
    assert isinstance(raised.value, pickle.UnpicklingError)
    assert not cache.exists()


# Libraries the shim's own checks accept, made for the tests below: one the loader then
# refuses (it calls a function nobody defines: a failed dlopen loads nothing), and one it loads,
# whose pipeline is then refused (its metadata function returns NULL).
FAKE_PIPELINES_C = {
    "unloadable": "int halide_shim_test_undefined(void);\n"
                  "int fake_argv(void **args) { return halide_shim_test_undefined(); }\n"
                  "const void *fake_metadata(void) { return 0; }\n",
    "loaded": "int fake_argv(void **args) { return 0; }\n"
              "const void *fake_metadata(void) { return 0; }\n",
}


@pytest.fixture(scope="module")
def fake_pipelines(tmp_path_factory):
    work = tmp_path_factory.mktemp("fake_pipelines")
    made = {}
    for kind, source in FAKE_PIPELINES_C.items():
        (work / f"{kind}.c").write_text(source)
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(work / f"{kind}.so"),
                        str(work / f"{kind}.c")], check=True)
        made[kind] = (work / f"{kind}.so").read_bytes()
    return made


def open_files() -> list[str]:
    """What this process's descriptors are open on (not the one listing them)."""
    files = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            files.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:
            pass  # (the listing's own, closed since)
    return files


def open_descriptors() -> int:
    return len(open_files())


def test_refused_library_bytes_leave_no_descriptor_open(host_pipelines, fake_pipelines, cache):
    """Bytes that match their hash but that the load refuses (cut short, not ELF, without the
    pipeline named, or a library the loader cannot open) leave no descriptor behind: each
    unpickle kept its sealed memory file open for the life of the process (300 of 300)."""
    library = Path(host_pipelines["brighten", "bundled"]).read_bytes()
    attempts = {
        "truncated": lambda i: library[:len(library) // 2] + b"%d" % i,
        "not ELF": lambda i: b"not a library %d" % i,
        "no such pipeline": lambda i: library + b"\0halide-shim test %d" % i,
        "not loadable": lambda i: fake_pipelines["unloadable"] + b"\0halide-shim test %d" % i,
    }
    before = open_descriptors()
    for what, data_of in attempts.items():
        for i in range(75):
            data = data_of(i)
            with pytest.raises(shim.ArgumentError):
                shim.Pipeline._from_pickle(hashlib.sha256(data).hexdigest(),
                                           "blur" if what == "no such pipeline" else
                                           "fake" if what == "not loadable" else "brighten",
                                           data)
        assert open_descriptors() == before, what
    assert not cache.exists()


def test_a_library_loaded_before_its_pipeline_is_refused_keeps_its_file(fake_pipelines):
    """Once the loader holds the library, its descriptor stays (the loader knows it by the
    name /proc/self/fd/N, which a later file must not take)."""
    data = fake_pipelines["loaded"] + b"\0halide-shim test %d" % os.getpid()
    digest = hashlib.sha256(data).hexdigest()
    with pytest.raises(shim.ArgumentError, match="bad pipeline metadata"):
        shim.Pipeline._from_pickle(digest, "fake", data)
    assert open_files().count(f"/memfd:halide-shim {digest} (deleted)") == 1


@pytest.mark.parametrize("field, fields", [
    ("sha256", (12, "brighten", b"x")),
    ("name", ("ab", 3, b"x")),
    ("library bytes", ("ab", "brighten", 5)),
    ("library bytes", ("ab", "brighten", "not bytes")),
])
def test_fields_of_the_wrong_type_are_refused_as_a_damaged_pickle(field, fields):
    """(A str or an int for the bytes raised hashlib's TypeError.)"""
    with pytest.raises(PickledPipelineError, match=f"pickled pipeline's {field}: expected"):
        shim.Pipeline._from_pickle(*fields)


def test_unpickling_writes_no_file(host_pipelines, runtime, tmp_path, monkeypatch, image):
    # A file where a cache folder would be, and an empty temporary folder: neither is needed.
    blocked = tmp_path / "blocked"
    blocked.write_text("not a folder")
    monkeypatch.setenv("HALIDE_SHIM_CACHE", str(blocked))
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    path = private_copy(host_pipelines["brighten", runtime], tmp_path, f"no-file-{runtime}")
    data = path.read_bytes()
    restored = shim.Pipeline._from_pickle(hashlib.sha256(data).hexdigest(), "brighten", data)
    np.testing.assert_array_equal(restored(image, output=image.shape).numpy(), brighten_reference(image))
    assert loaded_from_memory(restored, data)
    assert list(temporary.iterdir()) == [] and blocked.read_text() == "not a folder"
    assert pickle.loads(pickle.dumps(restored)) is restored
    assert restored.__reduce__()[1] == (hashlib.sha256(data).hexdigest(), "brighten", data)


# --- Pipeline, in processes that never saw its file ----------------------------------------------

WORKER = """
import os, pickle, sys
import numpy as np
import shim
from shim.calls.pipeline_pickle import PickledPipelineError

with open(sys.argv[1], "rb") as f:
    pickled = f.read()
if sys.argv[3] == "damaged":
    try:
        pickle.loads(pickled)
    except PickledPipelineError as e:
        print("refused:", e)
    sys.exit(0)
pipeline = pickle.loads(pickled)
assert pickle.loads(pickled) is pipeline  # loaded once per process
image = np.load(sys.argv[2])
np.save(sys.argv[2] + ".out.npy", pipeline(image, output=image.shape).numpy())
print(os.readlink(pipeline.path))
"""


def test_a_pickled_pipeline_runs_in_a_process_that_never_saw_its_file(
        host_pipelines, runtime, tmp_path, cache, image):
    path = private_copy(host_pipelines["brighten", runtime], tmp_path, "worker")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    pickled, inputs = tmp_path / "pipeline.pickle", tmp_path / "image.npy"
    pickled.write_bytes(pickle.dumps(shim.load(path)))
    path.unlink()
    np.save(inputs, image)
    for _ in range(2):
        printed = run_python(WORKER, pickled, inputs, "whole")
        assert printed.strip() == f"/memfd:halide-shim {digest} (deleted)"
        np.testing.assert_array_equal(np.load(f"{inputs}.out.npy"), brighten_reference(image))
    assert not cache.exists()


def test_a_damaged_pickle_is_refused_in_a_fresh_process(host_pipelines, tmp_path, cache):
    path = private_copy(host_pipelines["brighten", "bundled"], tmp_path, "fresh-damaged")
    data = path.read_bytes()
    pickled = bytearray(pickle.dumps(shim.load(path)))
    # A bit flipped in the middle of the library's bytes, inside the pickle.
    at = bytes(pickled).index(data[1000:1100]) + 50
    pickled[at] ^= 0x01
    (tmp_path / "damaged.pickle").write_bytes(pickled)
    printed = run_python(WORKER, tmp_path / "damaged.pickle", "-", "damaged")
    assert "refused:" in printed and "do not match their sha256" in printed
    assert not cache.exists()


def unpickle_together(pickled: bytes, barrier, image, results) -> None:
    barrier.wait()
    pipeline = pickle.loads(pickled)
    results.put((os.readlink(pipeline.path), pipeline(image, output=image.shape).numpy()))


def test_processes_unpickling_together_each_run_the_pickled_library(
        host_pipelines, tmp_path, cache, image):
    path = private_copy(host_pipelines["brighten", "bundled"], tmp_path, "together")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    pickled = pickle.dumps(shim.load(path))
    path.unlink()
    context = multiprocessing.get_context("spawn")
    count = 6
    barrier, results = context.Barrier(count), context.Queue()
    workers = [context.Process(target=unpickle_together, args=(pickled, barrier, image, results))
               for _ in range(count)]
    for worker in workers:
        worker.start()
    outputs = [results.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    for loaded_from, output in outputs:
        assert loaded_from == f"/memfd:halide-shim {digest} (deleted)"
        np.testing.assert_array_equal(output, brighten_reference(image))
    assert not cache.exists()


def test_the_name_is_part_of_what_travels(host_pipelines, tmp_path, cache):
    # An unpickled pipeline is (hash, name): a name the library lacks is the load's error.
    path = private_copy(host_pipelines["brighten", "bundled"], tmp_path, "named")
    digest, name, data = shim.load(path, name="brighten").__reduce__()[1]
    assert name == "brighten"
    with pytest.raises(shim.ArgumentError, match="no pipeline 'blur'"):
        shim.Pipeline._from_pickle(digest, "blur", data)


# --- Buffer --------------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", [4, 5])
def test_a_buffer_round_trips_with_its_mins_name_and_values(protocol):
    values = np.arange(60, dtype=np.int16).reshape(3, 4, 5)
    buf = shim.Buffer(values, name="volume", mins=[-2, 7, 1])
    again = pickle.loads(pickle.dumps(buf, protocol=protocol))
    assert again is not buf and not again.numpy() is values
    assert again.box == buf.box and again.name() == "volume"
    assert again.type() == buf.type() and again.writeable
    np.testing.assert_array_equal(again.numpy(), values)
    assert again.host_dirty() and not again.has_device_allocation()
    again[-2, 7, 1] = 99  # its own memory
    assert buf[-2, 7, 1] == 0


def test_a_crop_pickles_only_its_own_elements_at_its_coordinates():
    parent = shim.Buffer(np.arange(200 * 300, dtype=np.float64).reshape(200, 300), mins=[10, 20])
    crop = parent.cropped(rect=[(110, 3), (60, 2)])
    pickled = pickle.dumps(crop)
    assert len(pickled) < 1000  # 6 elements, not the parent's 60000
    again = pickle.loads(pickled)
    assert again.box == ((110, 3), (60, 2))
    np.testing.assert_array_equal(again.numpy(), crop.numpy())
    sliced = pickle.loads(pickle.dumps(parent.sliced(1, 25)))
    assert sliced.box == ((10, 300),)
    np.testing.assert_array_equal(sliced.numpy(), parent.numpy()[5])


def test_views_with_other_strides_come_back_dense():
    buf = shim.Buffer(np.arange(24, dtype=np.uint8).reshape(4, 6))
    view = buf.transposed(0, 1).cropped(1, 1, 3)
    again = pickle.loads(pickle.dumps(view))
    assert again.box == view.box
    np.testing.assert_array_equal(again.numpy(), view.numpy())
    assert again.numpy().flags.c_contiguous or again.numpy().flags.f_contiguous


@pytest.mark.parametrize("protocol", [4, 5])
def test_read_only_stays_read_only_and_writable_stays_writable(protocol):
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    values.flags.writeable = False
    again = pickle.loads(pickle.dumps(shim.Buffer(values), protocol=protocol))
    assert not again.writeable
    with pytest.raises(shim.ArgumentError, match="read-only"):
        again.fill(1)
    # Out of band (Dask's transport): the frames come back as read-only memory.
    frames = []
    pickled = pickle.dumps(shim.Buffer(np.ones((2, 3), np.float32)), protocol=5,
                           buffer_callback=frames.append)
    again = pickle.loads(pickled, buffers=[memoryview(bytes(f.raw())) for f in frames])
    assert again.writeable
    again.fill(2)
    assert again.all_equal(2)


def test_a_zero_dimensional_buffer():
    scalar = shim.Buffer.make_scalar(np.float64, name="s")
    scalar[()] = 2.5
    again = pickle.loads(pickle.dumps(scalar))
    assert again.dimensions() == 0 and again.box == () and again[()] == 2.5
    assert again.name() == "s"


def test_a_buffer_over_another_librarys_memory_pickles_its_values():
    class Producer:
        """A DLPack producer the Buffer keeps alive (its keepalive)."""

        def __init__(self, array):
            self.array = array

        def __dlpack__(self, **kwargs):
            return self.array.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

    values = np.arange(10, dtype=np.int32)
    buf = shim.from_dlpack(Producer(values))
    again = pickle.loads(pickle.dumps(buf))
    np.testing.assert_array_equal(again.numpy(), values)
    values[0] = 42  # the unpickled Buffer does not share the producer's memory
    assert again[0] == 0


def test_device_results_are_downloaded_before_pickling(opencl, image):
    pipeline = shim.load(build(Build("brighten", "opencl", "bundled")))
    out = shim.Buffer(shape=image.shape, dtype=np.float32)
    out.device_malloc(opencl)
    pipeline(image, output=out)
    assert out.device_dirty()
    again = pickle.loads(pickle.dumps(out))
    assert not again.has_device_allocation() and again.device is None
    np.testing.assert_allclose(again.numpy(), brighten_reference(image), rtol=2e-7)
    # Its crop carries its own device results too.
    pipeline(image, output=out)
    crop = out.cropped(rect=[(3, 5), (2, 4)])
    again = pickle.loads(pickle.dumps(crop))
    np.testing.assert_allclose(again.numpy(), brighten_reference(image)[2:6, 3:8], rtol=2e-7)
