"""Chunks that stay on the device between dask tasks (shim/dask_device.py): a graph of two
GPU pipelines (OpenCL; Vulkan too) whose intermediate chunks are never downloaded, its halos
cut and joined on the device, bit-identical to the whole-image calls; the bytes that did not
move, counted by the device's transfers; what a DeviceArray does as a dask chunk; and what
crossing processes costs (a download on the sender, an upload on the receiver)."""

import pickle
import sys
import types

import numpy as np
import pytest

import shim
from shim.pipelines.build import Build, build_all

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
from dask.sizeof import sizeof  # noqa: E402

from shim.dask import map_pipeline  # noqa: E402
from shim.dask_device import (  # noqa: E402
    DeviceArray,
    DLPackChunks,
    ShimChunks,
    chunks_for,
    concatenate,
)


def blur3x3(target):
    """blur3x3 built for ``target``: 2 pixels smaller than its input, reading 2 to the right
    of and below each output pixel (an asymmetric halo)."""
    (path,) = build_all([Build("blur3x3", target, "no_runtime")], progress=None).values()
    return shim.load(path)


@pytest.fixture(scope="module")
def blur(opencl):
    """(blur3x3 built for OpenCL, blur3x3 built for the CPU)."""
    return blur3x3("opencl"), blur3x3("host")


def image(shape, seed=0):
    return np.random.default_rng(seed).integers(0, 60000, shape, dtype=np.uint16)


def moved(device):
    t = device.transfers
    return np.array([t.uploaded, t.downloaded, t.device_copied])


def region_bytes(pipeline, result, itemsize=2) -> int:
    """Bytes of the input regions the chunks of ``result`` (map_pipeline's) read, summed."""
    total = 0
    edges = [np.cumsum((0,) + c) for c in result.chunks]
    whole = ((0, result.shape[1] + 2), (0, result.shape[0] + 2))
    for row, col in np.ndindex(result.numblocks):
        box = ((int(edges[1][col]), result.chunks[1][col]),
               (int(edges[0][row]), result.chunks[0][row]))
        needed = pipeline.required_regions({"output": box}, {"input": whole})["input"]
        total += needed[0][1] * needed[1][1] * itemsize
    return total


@pytest.mark.parametrize("kind, scheduler, chunks", [
    ("opencl", "sync", (40, 50)), ("opencl", "threads", (40, 50)), ("opencl", "sync", (7, 9)),
    ("vulkan", "threads", (40, 50))], ids=str)
def test_two_pipelines_keep_the_intermediate_on_the_device(request, kind, scheduler, chunks):
    device = request.getfixturevalue(kind)  # (skips, saying why, where there is none)
    gpu, cpu = blur3x3(kind), blur3x3("host")
    src = image((96, 130))
    expected = np.asarray(cpu(np.asarray(cpu(src))))  # the two calls over the whole image
    source = da.from_array(src, chunks=chunks)
    results = {}
    for keep in (True, False):
        mid = map_pipeline(gpu, source, device=kind, keep_on_device=keep)
        out = map_pipeline(gpu, mid, device=kind)
        before = moved(device)
        got = out.compute(scheduler=scheduler)
        results[keep] = moved(device) - before
        np.testing.assert_array_equal(got, expected)
        assert isinstance(mid._meta, DeviceArray if keep else np.ndarray)
    first, second = region_bytes(gpu, mid), region_bytes(gpu, out)
    kept, round_trip = results[True], results[False]
    # Today's path: every task uploads its region and downloads its chunk, both stages.
    assert round_trip[:2].tolist() == [first + second, mid.nbytes + out.nbytes]
    # Kept: the input goes up once, the result comes down once; the intermediate never
    # moves (its halos are device copies).
    assert kept[:2].tolist() == [first, out.nbytes]
    assert 0 < kept[2] <= second  # (a region inside one block is a view: no copy)


def test_a_threaded_graph_of_several_stages_and_a_final_device_gather(blur, opencl):
    gpu, cpu = blur
    src = image((64, 70), seed=1)
    expected = src
    for _ in range(3):
        expected = np.asarray(cpu(expected))
    chained = da.from_array(src, chunks=(20, 25))
    for _ in range(3):
        chained = map_pipeline(gpu, chained, device="opencl", keep_on_device=True)
    before = moved(opencl)
    gathered = chained.compute(scheduler="threads")  # concatenated on the device
    assert isinstance(gathered, DeviceArray) and gathered.on_device
    assert gathered.shape == expected.shape
    assert (moved(opencl) - before)[1] == 0
    np.testing.assert_array_equal(np.asarray(gathered), expected)
    assert (moved(opencl) - before)[1] == expected.nbytes
    # dask's own way home: each chunk downloaded by its task, numpy chunks from then on.
    host = chained.to_backend("numpy")
    assert isinstance(host._meta, np.ndarray)
    np.testing.assert_array_equal(host.compute(scheduler="sync"), expected)


def on_device(array, device="opencl"):
    chunk = DeviceArray.from_host(array, device)
    chunk.buffer.copy_to_device(device)
    return chunk


@pytest.mark.parametrize("into", ["numpy", "zarr"])
def test_a_store_downloads_each_kept_chunk_once(blur, opencl, tmp_path, into):
    gpu, cpu = blur
    src = image((90, 120), seed=4)
    kept = map_pipeline(gpu, da.from_array(src, chunks=(40, 50)), device="opencl",
                        keep_on_device=True)
    before = moved(opencl)
    if into == "zarr":  # (each task writes its chunk: np.asarray of it, downloaded there)
        zarr = pytest.importorskip("zarr", reason="to_zarr needs zarr (the dask extra's)")
        kept.to_zarr(str(tmp_path / "out.zarr"))
        target = zarr.open_array(str(tmp_path / "out.zarr"), mode="r")
    else:
        target = np.zeros(kept.shape, kept.dtype)
        da.store(kept, target, scheduler="threads")
    assert (moved(opencl) - before)[1] == kept.nbytes
    np.testing.assert_array_equal(target[...], np.asarray(cpu(src)))


def test_device_arrays_index_as_views_of_device_memory(opencl):
    a = np.arange(4 * 5 * 6, dtype=np.int32).reshape(4, 5, 6)
    x = on_device(a)
    assert x.on_device and x.shape == a.shape and x.dtype == a.dtype and x.ndim == 3
    assert len(x) == 4 and x.size == a.size and x.nbytes == a.nbytes and sizeof(x) == a.nbytes
    before = moved(opencl)
    views = [(1, slice(1, 4)), (slice(None), -1, slice(2, None)), (Ellipsis, 3),
             (None, slice(0, 2), Ellipsis, None), (slice(2, 2),), (0, 0, 0), (slice(-3, -1),)]
    made = [x[index] for index in views]
    assert (moved(opencl) - before).tolist() == [0, 0, 0]  # views move nothing
    for index, view in zip(views, made):
        assert view.shape == a[index].shape and view.on_device, index
        np.testing.assert_array_equal(view.get(), a[index])
    np.testing.assert_array_equal(np.asarray(x), a)
    for index in [(slice(None, None, 2),), ([0, 1],), (np.array([True] * 4),), ("a",), (0.5,),
                  (True,)]:
        with pytest.raises(shim.ArgumentError) as refused:
            x[index]
        assert refused.value.argument == "index"
    for index in [(4,), (0, 5), (0, 0, 0, 0), (Ellipsis, Ellipsis)]:
        with pytest.raises((shim.CoordinateError, shim.ArgumentError)):
            x[index]


def test_concatenation_happens_where_the_chunks_are(opencl):
    a = image((6, 9))
    parts = [on_device(a[:, :4]), on_device(a[:, 4:])]
    before = moved(opencl)
    joined = concatenate(parts, axis=1)
    assert joined.on_device and (moved(opencl) - before).tolist() == [0, 0, a.nbytes]
    np.testing.assert_array_equal(joined.get(), a)
    # Chunks a client gathers arrive in host memory: joined there, nothing goes up.
    arrived = [pickle.loads(pickle.dumps(part)) for part in parts]
    assert not any(part.on_device for part in arrived)
    before = moved(opencl)
    joined = concatenate(arrived, axis=-1)
    assert not joined.on_device and (moved(opencl) - before).tolist() == [0, 0, 0]
    np.testing.assert_array_equal(joined.get(), a)
    # A numpy chunk among them goes up to join them.
    before = moved(opencl)
    joined = concatenate([parts[0], a[:, 4:]], axis=1)
    assert joined.on_device and (moved(opencl) - before).tolist() == [a[:, 4:].nbytes, 0,
                                                                       parts[0].nbytes]
    np.testing.assert_array_equal(joined.get(), a)
    with pytest.raises(shim.ArgumentError, match="arrays"):
        concatenate([parts[0], on_device(image((5, 5)))], axis=1)
    with pytest.raises(shim.ArgumentError, match="axis"):
        concatenate(parts, axis=2)


def test_pickling_downloads_and_the_first_use_uploads_once(blur, opencl):
    gpu, cpu = blur
    src = image((30, 40))
    out = ShimChunks("opencl").output((28, 38), np.uint16, [0, 0])
    gpu(src, out)
    chunk = ShimChunks("opencl").result(out)
    before = moved(opencl)
    data = pickle.dumps(chunk)
    assert (moved(opencl) - before)[1] == chunk.nbytes  # the sender downloads
    arrived = pickle.loads(data)
    assert isinstance(arrived, DeviceArray) and not arrived.on_device
    np.testing.assert_array_equal(arrived.get(), np.asarray(cpu(src)))
    before = moved(opencl)
    chunks = ShimChunks("opencl")
    assert chunks.source(arrived) is arrived.buffer and arrived.on_device
    chunks.source(arrived)
    assert (moved(opencl) - before).tolist() == [chunk.nbytes, 0, 0]  # up once, at first read


def test_the_chunk_type_follows_the_device(monkeypatch):
    assert isinstance(chunks_for("opencl"), ShimChunks)
    assert isinstance(chunks_for("vulkan"), ShimChunks)
    monkeypatch.setitem(sys.modules, "cupy", None)  # (not importable)
    assert isinstance(chunks_for("cuda"), ShimChunks)
    stand_in = types.ModuleType("cupy")
    monkeypatch.setitem(sys.modules, "cupy", stand_in)
    chunks = chunks_for("cuda")
    assert isinstance(chunks, DLPackChunks) and chunks.xp is stand_in


def test_dlpack_chunks_through_a_graph(blur, opencl, monkeypatch):
    """CuPy's chunks on CUDA, exchanged by DLPack: no CUDA here, so numpy stands in for CuPy
    and OpenCL for CUDA. Each chunk a pipeline writes is handed over by DLPack, each block a
    task reads is taken by DLPack, and the regions are joined on the device as for any chunk."""
    gpu, cpu = blur
    stand_in = DLPackChunks(np, "opencl")
    monkeypatch.setattr("shim.dask.chunked.chunks_for", lambda device: stand_in)
    monkeypatch.setattr("shim.dask_device.chunks_for", lambda device: stand_in)
    src = image((60, 70), seed=3)
    mid = map_pipeline(gpu, da.from_array(src, chunks=(25, 30)), device="opencl",
                       keep_on_device=True)
    assert isinstance(mid._meta, np.ndarray) and mid._meta.shape == (0, 0)
    out = map_pipeline(gpu, mid, device="opencl")
    np.testing.assert_array_equal(out.compute(scheduler="sync"),
                                  np.asarray(cpu(np.asarray(cpu(src)))))
    block = image((5, 7))
    buf = stand_in.source(block)  # no copy
    assert np.shares_memory(buf.numpy(), block) and buf.box == ((0, 7), (0, 5))


def test_keep_on_device_is_checked(blur):
    gpu, _ = blur
    src = da.from_array(image((20, 30)), chunks=10)
    with pytest.raises(shim.ArgumentError) as refused:
        map_pipeline(gpu, src, keep_on_device=True)
    assert refused.value.argument == "keep_on_device" and "device=" in str(refused.value)
    with pytest.raises(shim.ArgumentError) as refused:
        map_pipeline(gpu, src, device="opencl", keep_on_device="yes")
    assert refused.value.argument == "keep_on_device"


@pytest.fixture(scope="module")
def cluster(opencl):
    with distributed.LocalCluster(processes=True, n_workers=2, threads_per_worker=2,
                                  dashboard_address=None) as local:
        with distributed.Client(local) as client:
            yield client


def test_a_cluster_keeps_chunks_on_their_worker_and_pickles_them_across(blur, cluster):
    gpu, cpu = blur
    src = image((96, 130), seed=2)
    expected = np.asarray(cpu(np.asarray(cpu(src))))
    first, second = sorted(cluster.scheduler_info()["workers"])

    def transfers():
        return {worker: np.array(counts) for worker, counts in cluster.run(
            lambda: (lambda t: (t.uploaded, t.downloaded, t.device_copied))(
                shim.device("opencl").transfers)).items()}

    source = da.from_array(src, chunks=(40, 50))
    mid = map_pipeline(gpu, source, device="opencl", keep_on_device=True)
    stage_one = region_bytes(gpu, mid)
    # Both stages on one worker: it keeps the intermediate on its device.
    before = transfers()
    out = map_pipeline(gpu, mid, device="opencl")
    np.testing.assert_array_equal(cluster.compute(out, workers=[first]).result(), expected)
    after = transfers()
    assert (after[first] - before[first])[:2].tolist() == [stage_one, out.nbytes]
    assert (after[second] - before[second]).tolist() == [0, 0, 0]
    # The intermediate on one worker, the next stage on the other: each chunk crosses
    # pickled, downloaded by the sender and uploaded once by the receiver.
    held = cluster.persist(mid, workers=[first])
    distributed.wait(held)
    before = transfers()
    out = map_pipeline(gpu, held, device="opencl")
    np.testing.assert_array_equal(cluster.compute(out, workers=[second]).result(), expected)
    after = transfers()
    assert (after[first] - before[first])[:2].tolist() == [0, mid.nbytes]
    assert (after[second] - before[second])[:2].tolist() == [mid.nbytes, out.nbytes]
