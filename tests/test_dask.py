"""shim.dask.map_pipeline on a LocalCluster of 2 worker processes: chunked results bit-identical
to one call over the whole array, whatever the chunking (chunks smaller than the halo too),
because every chunk gets exactly the region the bounds query asks for, at its true mins."""

import gc
import hashlib
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import shim

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
from shim.dask import map_pipeline  # noqa: E402

CHUNKINGS = [(64, 64), (9, 6), (1, 150), (50, 37), (120, 150)]  # (9, 6): inside the halo


@pytest.fixture(scope="module")
def client():
    """One cluster for the module: starting worker processes costs seconds."""
    with distributed.LocalCluster(processes=True, n_workers=2, threads_per_worker=2,
                                  dashboard_address=None) as cluster:
        with distributed.Client(cluster) as c:
            yield c


def image(shape, dtype=np.uint16, seed=0):
    return np.random.default_rng(seed).integers(0, 3000, shape).astype(dtype)


@pytest.mark.parametrize("name", ["edge_blur", "footprint"])
@pytest.mark.parametrize("chunks", CHUNKINGS, ids=str)
def test_chunked_results_equal_one_whole_call(client, dask_pipeline, name, chunks):
    pipeline = shim.load(dask_pipeline(name))
    src = image((120, 150))
    whole = np.asarray(pipeline(src))
    result = map_pipeline(pipeline, da.from_array(src, chunks=chunks))
    assert result.chunks == da.from_array(src, chunks=chunks).chunks
    got = result.compute()
    assert got.dtype == whole.dtype
    np.testing.assert_array_equal(got, whole)


def test_chunks_smaller_than_the_halo_read_several_blocks(dask_pipeline):
    # The footprint reaches 17 columns right: each 2x2 chunk's region spans many blocks.
    pipeline = shim.load(dask_pipeline("footprint"))
    src = image((40, 60))
    result = map_pipeline(pipeline, da.from_array(src, chunks=(7, 9)), chunks=(2, 2))
    np.testing.assert_array_equal(result.compute(scheduler="threads"), np.asarray(pipeline(src)))


def test_broadcast_blocks_are_made_dense_for_the_pipeline(dask_pipeline):
    # da.full's blocks have stride 0, which a pipeline requiring a dense x refuses.
    pipeline = shim.load(dask_pipeline("edge_blur"))
    src = da.full((40, 60), 7, dtype=image((1, 1)).dtype, chunks=(20, 30))
    # Small output chunks: most of their regions lie inside one block (a view of it).
    result = map_pipeline(pipeline, src, chunks=(5, 5)).compute(scheduler="threads")
    np.testing.assert_array_equal(result,
                                  np.asarray(pipeline(np.full((40, 60), 7, src.dtype))))


def test_transposed_blocks_are_made_dense_where_a_region_is_one_column_wide(dask_pipeline):
    # A transposed block's x strides across the original rows. Near the right edge, repeat_edge
    # clamps footprint's region to one column, whose view numpy calls contiguous whatever its
    # stride, and Halide refused it (src.stride.0 (60) == 1: constraint violated).
    pipeline = shim.load(dask_pipeline("footprint"))
    src = image((40, 60))
    transposed = da.from_array(src, chunks=16).T
    np.testing.assert_array_equal(map_pipeline(pipeline, transposed).compute(scheduler="threads"),
                                  np.asarray(pipeline(np.ascontiguousarray(src.T))))


def test_each_task_depends_on_just_the_blocks_its_region_spans(dask_pipeline):
    # Planning reads no data (the counting blocks stay untouched until the compute, which
    # computes each block some chunk reads, once) and gives each chunk's task only the blocks
    # the bounds query names.
    from dask.core import get_dependencies

    pipeline = shim.load(dask_pipeline("footprint"))
    src = image((40, 60))
    touched = []

    def count(block):
        touched.append(block.shape)
        return block

    blocks = da.from_array(src, chunks=(7, 9)).map_blocks(count, meta=np.empty((0, 0), src.dtype))
    result = map_pipeline(pipeline, blocks, chunks=(10, 12))
    assert touched == []
    graph = dict(result.__dask_graph__())
    in_edges = [np.cumsum((0,) + c) for c in blocks.chunks]
    out_edges = [np.cumsum((0,) + c) for c in result.chunks]
    read = set()
    for row, col in np.ndindex(result.numblocks):
        (y0, y1), (x0, x1) = ((edges[i], edges[i + 1]) for edges, i in zip(out_edges, (row, col)))
        needed = pipeline.required_regions({"footprint": ((x0, x1 - x0), (y0, y1 - y0))},
                                           {"src": ((0, 60), (0, 40))})["src"]
        spans = [[i for i in range(len(edges) - 1) if edges[i] < lo + extent and edges[i + 1] > lo]
                 for edges, (lo, extent) in zip(in_edges, reversed(needed))]
        spanned = {(blocks.name, r, c) for r in spans[0] for c in spans[1]}
        dependencies = get_dependencies(graph, (result.name, row, col))
        assert {d for d in dependencies if isinstance(d, tuple)} == spanned
        assert len(dependencies) == len(spanned) + 1  # and the Pipeline
        assert len(spanned) < blocks.npartitions
        read |= spanned
    np.testing.assert_array_equal(result.compute(scheduler="threads"), np.asarray(pipeline(src)))
    assert len(touched) == len(read)


def test_two_inputs_with_different_chunkings(client, dask_pipeline):
    pipeline = shim.load(dask_pipeline("two"))
    a, b = image((120, 90)), image((120, 90), np.int32, seed=1)
    whole = np.asarray(pipeline(a, b))
    result = map_pipeline(pipeline, da.from_array(a, chunks=(50, 20)),
                          da.from_array(b, chunks=(13, 90)))
    assert result.chunks == ((50, 50, 20), (20, 20, 20, 20, 10))
    np.testing.assert_array_equal(result.compute(), whole)


def test_output_chunks_and_shape_on_request(dask_pipeline):
    pipeline = shim.load(dask_pipeline("edge_blur"))
    src = image((50, 70))
    result = map_pipeline(pipeline, da.from_array(src, chunks=10), chunks=(25, 35),
                          shape=(40, 60))
    assert result.chunks == ((25, 15), (35, 25))
    expected = np.asarray(pipeline(src, np.empty((40, 60), np.uint16)))
    np.testing.assert_array_equal(result.compute(scheduler="threads"), expected)


def test_several_outputs_and_broadcast_scalars(client, host_pipelines):
    sum_diff = shim.load(host_pipelines["sum_diff", "bundled"])
    a = image((30, 40), np.int32)
    b = image((30, 40), np.int32, seed=3)
    total, diff = map_pipeline(sum_diff, da.from_array(a, chunks=7), da.from_array(b, chunks=11))
    got_total, got_diff = client.compute([total, diff], sync=True)
    np.testing.assert_array_equal(got_total, a + b)
    np.testing.assert_array_equal(got_diff, a - b)
    brighten = shim.load(host_pipelines["brighten", "bundled"])
    f = np.random.default_rng(4).random((30, 40), dtype=np.float32)
    out = map_pipeline(brighten, da.from_array(f, chunks=8), scale=2.0, offset=1.0).compute()
    np.testing.assert_array_equal(out, np.asarray(brighten(f, scale=2.0, offset=1.0)))


def test_an_input_too_small_for_the_whole_output_is_the_calls_own_error(dask_pipeline):
    pipeline = shim.load(dask_pipeline("shifted"))
    src = image((20, 30))
    with pytest.raises(shim.BoundsError) as whole:
        pipeline(src, np.empty((20, 30), np.uint16))
    with pytest.raises(shim.BoundsError) as mapped:
        map_pipeline(pipeline, da.from_array(src, chunks=5), shape=(20, 30))
    assert str(mapped.value) == str(whole.value) and mapped.value.argument == "src"


def test_bad_arguments_name_the_argument(dask_pipeline):
    pipeline = shim.load(dask_pipeline("edge_blur"))
    src = da.from_array(image((20, 30)), chunks=10)
    with pytest.raises(shim.ArgumentError, match="arrays"):
        map_pipeline(pipeline, src, src)
    with pytest.raises(shim.ArgumentError, match="src: expected uint16"):
        map_pipeline(pipeline, src.astype(np.float32))
    with pytest.raises(shim.ArgumentError, match="output_dtype"):
        map_pipeline(pipeline, src, output_dtype=np.float32)
    with pytest.raises(shim.ArgumentError, match="device"):
        map_pipeline(pipeline, src, device="opencl")


@pytest.mark.parametrize("argument, value", [
    ("chunks", (0, 15)), ("chunks", ((20, 0), (30,))), ("chunks", "not a size"),
    ("shape", (-1, 30)), ("shape", (0, 30)), ("shape", (20.5, 30)), ("shape", (True, 30)),
    ("shape", "ab"), ("shape", object()),
])
def test_bad_chunks_and_shapes_are_argument_errors_naming_them(dask_pipeline, argument, value):
    """chunks=(0, 45) raised a bare ZeroDivisionError and shape=(-1, 45) numpy's ValueError;
    a float extent was cut to an int without a word."""
    pipeline = shim.load(dask_pipeline("edge_blur"))
    src = da.from_array(image((20, 30)), chunks=10)
    with pytest.raises(shim.ArgumentError) as refused:
        map_pipeline(pipeline, src, **{argument: value})
    assert refused.value.argument == argument


def test_required_regions_answers_the_bounds_query(dask_pipeline):
    pipeline = shim.load(dask_pipeline("footprint"))
    image_box = ((0, 400), (0, 300))
    needed = pipeline.required_regions({"footprint": ((100, 10), (50, 4))}, {"src": image_box})
    assert needed["footprint"] == ((100, 10), (50, 4))
    (x_lo, x_extent), (y_lo, y_extent) = needed["src"]
    assert x_lo == 112 and x_lo + x_extent >= 127 and y_lo <= 45  # right of x only
    # repeat_edge clamps to the input's box: near the edge it reads no further.
    (x_lo, x_extent), _ = pipeline.required_regions({"footprint": ((390, 10), (0, 4))},
                                                    {"src": image_box})["src"]
    assert x_lo + x_extent == 400
    with pytest.raises(shim.ArgumentError, match="footprint"):
        pipeline.required_regions({"footprint": ((0, 1),)})


def test_progress_bar_sees_every_task(dask_pipeline, capsys):
    from dask.diagnostics import ProgressBar

    pipeline = shim.load(dask_pipeline("edge_blur"))
    result = map_pipeline(pipeline, da.from_array(image((64, 64)), chunks=16))
    with ProgressBar(out=None) as bar:
        result.compute(scheduler="threads")
    assert bar.last_duration > 0  # it ran over these tasks, to the end


def test_opencl_on_the_workers(client, dask_pipeline):
    try:
        shim.device("opencl")
    except shim.DeviceUnavailable as e:
        pytest.skip(f"no OpenCL device: {e}")
    cpu = shim.load(dask_pipeline("edge_blur"))
    gpu = shim.load(dask_pipeline("edge_blur", "opencl"))
    src = image((96, 130))
    result = map_pipeline(gpu, da.from_array(src, chunks=(40, 50)), device="opencl")
    np.testing.assert_array_equal(result.compute(), np.asarray(cpu(src)))


def test_a_pickled_pipeline_runs_on_workers_that_never_saw_its_file(client, dask_pipeline,
                                                                    tmp_path):
    path = tmp_path / "gone.so"
    path.write_bytes(open(dask_pipeline("edge_blur"), "rb").read())
    pipeline = shim.load(path)
    src = image((60, 80))
    expected = np.asarray(pipeline(src))
    path.unlink()  # no worker can load it from there now
    result = map_pipeline(pipeline, da.from_array(src, chunks=25))
    np.testing.assert_array_equal(result.compute(), expected)


def test_the_graph_carries_the_pipeline_for_its_tasks_to_load(dask_pipeline, tmp_path):
    """Unpickling a graph (as distributed's scheduler does with every graph it is sent) loads
    no library; its tasks load the pipeline from the bytes it carries. (Where the graph carried
    the Pipeline, unpickling loaded it, and a worker that could not load it, fetching it from
    another worker, tried again forever: tests/test_dask_hosts.py.)"""
    pipeline = shim.load(dask_pipeline("edge_blur"))
    src = image((20, 30))
    result = map_pipeline(pipeline, da.from_array(src, chunks=10))
    graph = pickle.dumps((dict(result.__dask_graph__()), result.__dask_keys__()))
    code = ("import pickle, sys\n"
            "import dask, numpy as np\n"
            "graph, keys = pickle.load(sys.stdin.buffer)\n"
            "def loaded(): return any('/memfd:halide-shim' in l for l in open('/proc/self/maps'))\n"
            "print(loaded())\n"
            "np.save(sys.argv[1], np.block([list(row) for row in dask.get(graph, keys)]))\n"
            "print(loaded())\n")
    out = tmp_path / "result.npy"
    done = subprocess.run([sys.executable, "-c", code, str(out)], input=graph,
                          capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.split() == [b"False", b"True"]
    np.testing.assert_array_equal(np.load(out), np.asarray(pipeline(src)))


def test_tasks_in_this_process_run_the_pipeline_they_were_given(dask_pipeline, tmp_path):
    """Not a second copy loaded from its bytes, though no one else holds the Pipeline."""
    path = tmp_path / "unique.so"
    path.write_bytes(Path(dask_pipeline("edge_blur")).read_bytes() + b"\0unique to this test")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    src = image((20, 30))
    result = map_pipeline(shim.load(path), da.from_array(src, chunks=10))
    gc.collect()
    got = result.compute(scheduler="threads")
    assert digest not in Path("/proc/self/maps").read_text()
    np.testing.assert_array_equal(got, np.asarray(shim.load(dask_pipeline("edge_blur"))(src)))


def test_a_region_outside_its_array_is_a_bounds_error_with_halides_code():
    # (A guard no graph of a correct bounds query reaches; it raised TypeError, the code missing.)
    from shim.dask import chunked

    with pytest.raises(shim.BoundsError, match="outside the array") as e:
        chunked._source("src", da.zeros((4, 4)), None, ((0, 10), (0, 10)))
    assert e.value.argument == "src" and e.value.code == -4
