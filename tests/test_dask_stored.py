"""shim.dask.map_pipeline on stored arrays: Zarr arrays and TIFF files that the tasks read
their own regions of, dask arrays read from Zarr block by block, and results written to Zarr
chunk by chunk (to_zarr), bit-identical to one call over the whole image; planning reads no
data; and an image several times larger than each worker's memory limit streamed from one
Zarr store to another on worker processes whose peak memory is measured and bounded."""

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import shim

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr")
tifffile = pytest.importorskip("tifffile")
import dask  # noqa: E402

from shim.dask import TiffSource, map_pipeline, open_tiff  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import worker_memory  # noqa: E402

MiB = 2**20


def image(shape, seed=0):
    return np.random.default_rng(seed).integers(0, 60000, shape, dtype=np.uint16)


def zarr_store(path, array, chunks):
    stored = zarr.create_array(path, shape=array.shape, chunks=chunks, dtype=array.dtype,
                               compressors=None)
    stored[:] = array
    return zarr.open_array(path, mode="r")


class CountingStore(zarr.storage.WrapperStore):
    """A store that counts the reads of each key (its chunks, its metadata)."""

    def __init__(self, store):
        super().__init__(store)
        self.reads = Counter()

    async def get(self, key, prototype, byte_range=None):
        self.reads[key] += 1
        return await self._store.get(key, prototype, byte_range)


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(processes=True, n_workers=2, threads_per_worker=1,
                                  dashboard_address=None) as cluster:
        with distributed.Client(cluster) as c:
            yield c


@pytest.mark.parametrize("chunks", [(64, 64), (50, 70)], ids=str)
def test_zarr_to_zarr_on_workers_equals_one_call(client, host_pipelines, tmp_path, chunks):
    # (50, 70): the output's chunks are the store's, regions straddling the store's chunks.
    blur = shim.load(host_pipelines["blur3x3", "bundled"])
    src = image((300, 410))
    stored = zarr_store(tmp_path / "in.zarr", src, chunks)
    for source in (stored, da.from_zarr(stored)):  # (read by region, then by block)
        result = map_pipeline(blur, source)
        assert result.chunks[0][0] == chunks[0] and result.chunks[1][0] == chunks[1]
        result.to_zarr(str(tmp_path / "out.zarr"), overwrite=True)
        written = zarr.open_array(tmp_path / "out.zarr", mode="r")
        assert written.chunks == chunks
        np.testing.assert_array_equal(written[:], np.asarray(blur(src)))


def test_planning_reads_no_chunk_and_each_task_reads_its_region(host_pipelines, tmp_path):
    blur = shim.load(host_pipelines["blur3x3", "bundled"])
    src = image((256, 256))
    zarr_store(tmp_path / "in.zarr", src, (64, 64))
    counting = CountingStore(zarr.storage.LocalStore(tmp_path / "in.zarr", read_only=True))
    stored = zarr.open_array(counting, mode="r")
    by_region, by_block = map_pipeline(blur, stored), map_pipeline(blur, da.from_zarr(stored))
    chunk_reads = {key: n for key, n in counting.reads.items() if key.startswith("c/")}
    assert chunk_reads == {}  # (the metadata only)
    np.testing.assert_array_equal(by_region.compute(scheduler="threads"), np.asarray(blur(src)))
    # blur3x3 reads 2 pixels right of and below each output chunk: the task of output chunk
    # (r, c) reads stored chunk (r, c) and the 2 rows and columns it needs of the next ones,
    # so each stored chunk is read by its own task and by those before it along each axis.
    expected = {f"c/{r}/{c}": (1 + (r > 0)) * (1 + (c > 0)) for r in range(4) for c in range(4)}
    assert {k: n for k, n in counting.reads.items() if k.startswith("c/")} == expected
    counting.reads.clear()
    np.testing.assert_array_equal(by_block.compute(scheduler="threads"), np.asarray(blur(src)))
    assert {k: n for k, n in counting.reads.items() if k.startswith("c/")} == \
        {f"c/{r}/{c}": 1 for r in range(4) for c in range(4)}  # (each block once)


def test_a_tiled_tiff_on_workers_that_open_it_themselves(client, dask_pipeline, tmp_path):
    # tifffile's own Zarr store of one file does not pickle; open_tiff's source does.
    blur = shim.load(dask_pipeline("edge_blur"))
    src = image((300, 410))
    tifffile.imwrite(tmp_path / "image.tif", src, tile=(64, 64))
    source = open_tiff(tmp_path / "image.tif")
    assert (source.shape, source.dtype, source.chunks) == (src.shape, src.dtype, (64, 64))
    result = map_pipeline(blur, source, chunks=(100, 100))
    np.testing.assert_array_equal(result.compute(), np.asarray(blur(src)))
    blocks = da.from_array(source, chunks=source.chunks)
    np.testing.assert_array_equal(client.compute(blocks, sync=True), src)
    # tifffile's own store, as dask reads a Zarr store: on the threaded scheduler only.
    with tifffile.imread(tmp_path / "image.tif", aszarr=True) as store:
        own = map_pipeline(blur, da.from_zarr(store), chunks=(100, 100))
        np.testing.assert_array_equal(own.compute(scheduler="threads"), np.asarray(blur(src)))


@pytest.mark.parametrize("layout", ["pages", "files"])
def test_a_stack_is_read_page_by_page(dask_pipeline, tmp_path, monkeypatch, layout):
    # A stack of 3 images, as the pages of one file or as 3 files (a glob pattern), each
    # page through a 2-D pipeline: each task reads the one page its block is, never the stack
    # (the source counts what it is asked for).
    pages = image((3, 120, 90))
    if layout == "pages":
        tifffile.imwrite(tmp_path / "stack.tif", pages, photometric="minisblack")
        files = tmp_path / "stack.tif"
    else:
        for k, page in enumerate(pages):
            tifffile.imwrite(tmp_path / f"page{k}.tif", page)
        files = str(tmp_path / "page*.tif")
    source = open_tiff(files)
    assert source.shape == pages.shape and source.chunks[0] == 1
    reads = []
    read = TiffSource.__getitem__

    def counted(self, key):
        region = read(self, key)
        if region.size:  # (dask's from_array reads an empty one, for its meta)
            reads.append(region.shape)
        return region

    monkeypatch.setattr(TiffSource, "__getitem__", counted)
    blur = shim.load(dask_pipeline("edge_blur"))
    stack = da.from_array(source, chunks=source.chunks)
    planes = [map_pipeline(blur, stack[k]) for k in range(3)]
    assert reads == []  # (planning reads nothing)
    for k, plane in enumerate(planes):
        np.testing.assert_array_equal(plane.compute(scheduler="threads"),
                                      np.asarray(blur(pages[k])))
    assert [int(np.prod(shape)) for shape in reads] == [120 * 90] * 3  # (a page each)


def test_what_open_tiff_cannot_read_is_an_argument_error(tmp_path):
    (tmp_path / "not.tif").write_bytes(b"not a tiff at all")
    with tifffile.TiffWriter(tmp_path / "pyramid.tif") as pyramid:  # (a group of 2 levels)
        pyramid.write(image((128, 128)), subifds=1, tile=(64, 64))
        pyramid.write(image((64, 64)), subfiletype=1, tile=(64, 64))
    assert open_tiff(tmp_path / "pyramid.tif", level=1).shape == (64, 64)
    for files, options in [(tmp_path / "not.tif", {}), (tmp_path / "missing.tif", {}),
                           (tmp_path / "pyramid.tif", {}),
                           (tmp_path / "pyramid.tif", {"no_such_option": 1})]:
        with pytest.raises(shim.ArgumentError, match="files: cannot read"):
            open_tiff(files, **options)
    for files in [None, 7, [], [tmp_path / "pyramid.tif", 3]]:
        with pytest.raises(shim.ArgumentError, match="files: expected a path"):
            open_tiff(files)


def test_a_stored_input_is_checked_as_a_dask_one(dask_pipeline, tmp_path):
    blur = shim.load(dask_pipeline("edge_blur"))
    floats = zarr_store(tmp_path / "f.zarr", image((20, 30)).astype(np.float32), (10, 10))
    with pytest.raises(shim.ArgumentError, match="src: expected uint16"):
        map_pipeline(blur, floats)
    flat = zarr_store(tmp_path / "flat.zarr", image((600,)), (100,))
    with pytest.raises(shim.ArgumentError, match="src: expected a 2-D array"):
        map_pipeline(blur, flat)
    shifted = shim.load(dask_pipeline("shifted"))
    with pytest.raises(shim.BoundsError):
        map_pipeline(shifted, zarr_store(tmp_path / "s.zarr", image((20, 30)), (10, 10)),
                     shape=(20, 30))


# The image streamed through workers that could not hold it: each worker's memory limit
# (dask's memory_limit; the nanny ends a worker past 95% of it) is a third of the image, and
# the two together hold less than it. Spilling to disk and pausing are off, so that the bound
# is the graph's own and a worker past it fails the test rather than waiting.
LIMIT = 192 * MiB
SHAPE, CHUNK, TILE = (16384, 20480), 1024, (1021, 1031)  # 640 MiB of uint16


def test_an_image_larger_than_the_workers_memory_streams_from_zarr_to_zarr(host_pipelines,
                                                                           tmp_path):
    blur = shim.load(host_pipelines["blur3x3", "bundled"])
    # Random tiles whose sides divide neither the chunks nor the image: no two chunks alike.
    tile, src = image(TILE, seed=1), np.empty(SHAPE, np.uint16)
    for y in range(0, SHAPE[0], TILE[0]):
        for x in range(0, SHAPE[1], TILE[1]):
            part = src[y:y + TILE[0], x:x + TILE[1]]
            part[...] = tile[:part.shape[0], :part.shape[1]]
    assert src.nbytes >= 3 * LIMIT
    zarr_store(tmp_path / "in.zarr", src, (CHUNK, CHUNK))
    expected = np.asarray(blur(src))
    del src
    quiet = {"distributed.worker.memory.target": False, "distributed.worker.memory.spill": False,
             "distributed.worker.memory.pause": False}
    with dask.config.set(quiet), \
            distributed.LocalCluster(processes=True, n_workers=2, threads_per_worker=1,
                                     memory_limit=LIMIT, dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        started = worker_memory.worker_peaks(client)
        result = map_pipeline(blur, zarr.open_array(tmp_path / "in.zarr", mode="r"))
        result.to_zarr(str(tmp_path / "out.zarr"))
        peaks = worker_memory.worker_peaks(client)
        tasks = client.run(lambda dask_worker: dask_worker.state.executed_count)
    print(f"worker peaks (MiB): started {started}, after {peaks}")
    assert len(peaks) == 2 and all(peak * MiB < LIMIT for peak in peaks.values()), peaks
    assert all(count > 0 for count in tasks.values())  # (both did their share)
    written = zarr.open_array(tmp_path / "out.zarr", mode="r")
    assert written.chunks == (CHUNK, CHUNK)
    for rows in range(0, expected.shape[0], 4096):  # (compared a band at a time)
        np.testing.assert_array_equal(written[rows:rows + 4096], expected[rows:rows + 4096])
