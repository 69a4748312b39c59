"""``map_pipeline`` over dask arrays and stored arrays: a dask graph with one task per output
chunk, each fed exactly the input region the pipeline's bounds query says that chunk reads.

Why not ``da.map_overlap``: its halo is symmetric and the same for every chunk, while a
pipeline's footprint may be asymmetric, depend on the scalars, or be clamped at the image's
edges (a ``repeat_edge`` boundary reads no further than the edge). Halide knows each region
exactly, so the graph is planned chunk by chunk at build time (a query costs microseconds),
and each task gets the blocks its region spans, which it cuts and joins into one array that
it gives the pipeline as a Buffer at the region's true mins: the pipeline sees Halide's
coordinates, real neighbours inside the image and the image's real edges at its borders.

Planning reads shapes only. A dask array's blocks (``da.from_zarr``'s too) are computed on the
workers, each once, for the tasks whose regions span them; a stored array (``stored``: a Zarr
array, ``open_tiff``'s source) is in the graph once, as where its data is, and each task reads
its own region from it. A result stored with ``to_zarr`` is written chunk by chunk as the
tasks finish.
"""

from __future__ import annotations

import itertools
import operator
import os
import socket
import sys

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from shim.calls.binding import size_guesses
from shim.buffers.buffer import Buffer
from shim.backends.devices import device as shim_device
from shim.base.errors import (ArgumentError, BoundsError, HalideCodeError, ShimError, SizeWarning,
                              warn_caller)
from shim.calls import output_sizes
from shim.native import lib
from shim.dask.tiff import TiffSource
from shim.dask_device import chunks_for, kept_chunks


def map_pipeline(pipeline, *arrays, output_dtype=None, chunks=None, shape=None, device=None,
                 keep_on_device=False, **scalars):
    """``shim.dask.map_pipeline`` over dask arrays, stored arrays (or anything ``da.asarray``
    takes), in the pipeline's numpy order: its docstring says what the arguments are."""
    inputs, box = _whole_call(pipeline, arrays, shape, scalars)
    outputs = pipeline.outputs
    dtypes = _output_dtypes(outputs, output_dtype)
    device = _checked_device(pipeline, device)
    kept = kept_chunks(device, keep_on_device)
    out_shape = tuple(extent for _, extent in reversed(box))
    out_chunks = _output_chunks(chunks, out_shape, next(iter(inputs.values()), None), dtypes[0])

    token = tokenize(str(pipeline.path), pipeline.name, [_token_of(a) for a in inputs.values()],
                     box, out_chunks, sorted(scalars.items()), device, keep_on_device)
    # dask's public API only: each chunk's task comes from a delayed call taking the Pipeline
    # (in the graph once) and, as Delayed arguments, the input blocks its region spans (or the
    # stored array), so it depends on those alone and dask's optimizations rename them as they
    # fuse. The tasks
    # then go into one layer of the output: one layer per chunk (da.from_delayed and da.block)
    # makes every compute's graph culling quadratic in the chunks (11 s for 4096 of them).
    name = f"shim-{pipeline.name}-{token}"
    runner = dask.delayed(_Shipped.of(pipeline), name=f"shim-pipeline-{token}")
    run_chunk, pick = dask.delayed(_run_chunk), dask.delayed(operator.getitem)
    graph_inputs = {arg: _graph_input(array) for arg, array in inputs.items()}
    whole = {arg: _box_of(array.shape) for arg, array in inputs.items()}
    names = [o.name for o in outputs]
    origins = [np.cumsum((0,) + c[:-1]) for c in out_chunks]
    calls = {}
    for index in itertools.product(*(range(len(c)) for c in out_chunks)):
        starts = [int(origins[axis][i]) for axis, i in enumerate(index)]
        sizes = [out_chunks[axis][i] for axis, i in enumerate(index)]
        chunk_box = tuple((lo + starts[-1 - d], sizes[-1 - d]) for d, (lo, _) in enumerate(box))
        needed = pipeline.required_regions({n: chunk_box for n in names}, whole, **scalars)
        sources = [_source(arg, inputs[arg], graph_inputs[arg], needed[arg]) for arg in inputs]
        plan = (chunk_box, [(region, starts) for region, _, starts in sources], scalars, device,
                keep_on_device, names, dtypes)
        blocks = [block for _, spanned, _ in sources for block in spanned]
        calls[index] = run_chunk(runner, plan, *blocks, dask_key_name=(name, *index))
    layer = _tasks_of(calls.values())
    dependencies = [*(a if isinstance(a, da.Array) else graph_inputs[arg]
                      for arg, a in inputs.items()), runner]
    if len(outputs) == 1:
        graph = HighLevelGraph.from_collections(name, layer, dependencies=dependencies)
        return da.Array(graph, name, out_chunks, dtype=dtypes[0],
                        meta=kept and kept.meta(len(out_chunks), dtypes[0]))
    results = []
    for k, dtype in enumerate(dtypes):
        part = f"{name}-{k}"
        picks = _tasks_of(pick(call, k, dask_key_name=(part, *index))
                          for index, call in calls.items())
        graph = HighLevelGraph.from_collections(part, {**layer, **picks},
                                                dependencies=dependencies)
        results.append(da.Array(graph, part, out_chunks, dtype=dtype,
                                meta=kept and kept.meta(len(out_chunks), dtype)))
    return tuple(results)


def output_shape(pipeline, *arrays, shape=None, **scalars) -> tuple:
    """The shape, numpy order, of the outputs ``map_pipeline`` makes of these arguments (the
    same for every output), from the arrays' shapes alone; raises what it would raise for
    arguments that do not fit."""
    _, box = _whole_call(pipeline, arrays, shape, scalars)
    return tuple(extent for _, extent in reversed(box))


def _whole_call(pipeline, arrays, shape, scalars) -> tuple:
    """({input name: dask or stored array}, the outputs' box, x first) of the call over the
    whole arrays, checked as the pipeline checks that call."""
    buffer_inputs = [a for a in pipeline.inputs if a.is_buffer]
    if len(arrays) != len(buffer_inputs):
        raise ArgumentError("arrays", f"{pipeline.name} takes {len(buffer_inputs)} input "
                                      f"buffers ({', '.join(a.name for a in buffer_inputs)}), "
                                      f"got {len(arrays)} arrays")
    inputs = {arg.name: _dask_input(arg, array) for arg, array in zip(buffer_inputs, arrays)}
    if not pipeline.outputs:
        raise ArgumentError("pipeline", f"{pipeline.name} has no output to map")
    box = _output_box(pipeline, inputs, shape, scalars)
    _check_whole_call(pipeline, inputs, box, scalars)
    return inputs, box


def _tasks_of(calls) -> dict:
    """{key: task} of delayed calls: each one's own layer, without its arguments' graphs."""
    tasks = {}
    for call in calls:
        (layer_name,) = call.__dask_layers__()
        tasks.update(call.__dask_graph__().layers[layer_name])
    return tasks


def _dask_input(arg, array):
    """A dask array, or a stored array (``stored``) kept as it is, checked against ``arg``."""
    array = array if isinstance(array, da.Array) or stored(array) else da.asarray(array)
    if array.ndim != arg.dimensions:
        raise ArgumentError(arg.name, f"expected a {arg.dimensions}-D array, got "
                                      f"{array.ndim}-D with shape {array.shape}")
    if arg.type.dtype is None or array.dtype != arg.type.dtype:
        raise ArgumentError(arg.name, f"expected {arg.type} elements, got dtype {array.dtype}")
    return array


def _output_dtypes(outputs, output_dtype) -> list:
    dtypes = [o.type.dtype for o in outputs]
    if output_dtype is None:
        return dtypes
    given = output_dtype if isinstance(output_dtype, (tuple, list)) else [output_dtype]
    if len(given) != len(outputs) or any(np.dtype(g) != d for g, d in zip(given, dtypes)):
        raise ArgumentError("output_dtype", f"the pipeline's outputs are "
                                            f"{', '.join(f'{o.name}: {d}' for o, d in zip(outputs, dtypes))};"
                                            f" got {output_dtype!r}")
    return dtypes


def _checked_device(pipeline, device):
    if device is None:
        return None
    if device not in pipeline.device_kinds:
        raise ArgumentError("device", f"{pipeline.name} runs on "
                                      f"{', '.join(sorted(pipeline.device_kinds)) or 'the CPU only'}"
                                      f" (target {pipeline.target}), not on {device!r}: build it "
                                      f"for that device")
    return device


def _output_box(pipeline, inputs: dict, shape, scalars) -> tuple:
    """The outputs' box, x first: ``shape`` at mins 0, else by the rule a call sizes an
    omitted output by (shim/calls/output_sizes.py: the largest the inputs cover, else the
    estimates, with a SizeWarning where that is not what the first input gives); an output
    the pipeline pins elsewhere gets the box it asks for. None fits: None (the whole call's
    check then refuses, as a call sizing its outputs would)."""
    outputs = pipeline.outputs
    if shape is not None:
        return _box_of(_extents(shape))
    known = {name: _box_of(array.shape) for name, array in inputs.items()}
    first = next(iter(known.items()), None)
    guesses = dict(size_guesses([outputs[0]], first))
    if not guesses:
        raise ArgumentError("shape", f"cannot tell the size of {outputs[0].name}: the pipeline "
                                     "has no estimates for it and there is no input to size it "
                                     "like; pass shape= (numpy order)")
    name = outputs[0].name
    like = next(({name: boxes[0]} for how, boxes in guesses.items() if how.startswith("like")),
                None)
    estimated = guesses.get("from the pipeline's estimates")

    def ask(boxes: dict) -> dict | None:
        try:
            return pipeline.required_regions({o.name: boxes[name] for o in outputs}, known,
                                             **scalars)
        except HalideCodeError:  # (a BoundsError among them)
            return None

    choice = output_sizes.choose(ask, known, like, estimated and {name: estimated[0]},
                                 first and first[0], hint="pass shape=")
    if choice is None:
        return None
    if choice.surprise is not None:
        warn_caller(f"{pipeline.name}: {name} {tuple(n for _, n in reversed(choice.boxes[name]))}"
                    f", {choice.surprise}; pass shape= to choose it", SizeWarning)
    return choice.boxes[name]


def _extents(shape) -> list[int]:
    """``shape=`` as extents: an int or a sequence of ints, each at least 1 (pipelines take
    buffers with at least one element along every axis)."""
    extents = [shape] if isinstance(shape, (int, np.integer)) else shape
    try:
        extents = list(extents)
    except TypeError:
        extents = None
    if extents is None or not all(isinstance(e, (int, np.integer)) and not isinstance(e, bool)
                              and e >= 1 for e in extents):
        raise ArgumentError("shape", f"expected the outputs' shape in numpy order, an int or a "
                                     f"sequence of ints of at least 1, got {shape!r}")
    return [int(e) for e in extents]


def _box_of(shape) -> tuple:
    """The box, x first, of an array of ``shape`` (numpy order) at mins 0."""
    return tuple((0, extent) for extent in reversed(shape))


def _covers(shape, box) -> bool:
    return all(0 <= lo and lo + extent <= size for (lo, extent), size in zip(box, reversed(shape)))


def _check_whole_call(pipeline, inputs: dict, box, scalars) -> None:
    """Marshal and bounds-check one call over the whole arrays, as the pipeline would, without
    their memory: every array stands in as one row broadcast to its shape (the query reads
    shapes only, and nothing runs). Raises that call's error; with ``box`` None, outputs are
    left for the call to size, which fails (before allocating) saying how it guessed."""
    values = {name: _stand_in(array.shape, array.dtype, writeable=False)
              for name, array in inputs.items()}
    if box is not None:
        out_shape = tuple(extent for _, extent in reversed(box))
        mins = [lo for lo, _ in box]
        for o in pipeline.outputs:
            values[o.name] = Buffer(_stand_in(out_shape, o.type.dtype, writeable=True), mins=mins)
    with pipeline.prepare(**values, **scalars):
        if box is None:
            raise BoundsError(pipeline.outputs[0].name, lib.halide_error_code_access_out_of_bounds,
                              "no size fits the inputs: pass shape=")


def _stand_in(shape, dtype, writeable: bool) -> np.ndarray:
    row = np.zeros(shape[-1:] or (1,), dtype)
    strides = (0,) * (len(shape) - 1) + (row.itemsize,) if shape else ()
    return np.lib.stride_tricks.as_strided(row, shape, strides, writeable=writeable)


def _output_chunks(chunks, shape, first, dtype) -> tuple:
    if chunks is None:
        first_chunks = first is not None and _chunks_of(first)
        if first is not None and first.shape == shape:
            return first_chunks
        chunks = (tuple(c[0] for c in first_chunks) if first is not None
                  and first.ndim == len(shape) else "auto")
    empty = ArgumentError("chunks", f"every chunk needs at least one element along every axis, "
                                    f"got {chunks!r} (output shape {shape})")
    try:
        normalized = da.core.normalize_chunks(chunks, shape, dtype=dtype)
    except ZeroDivisionError:  # (dask divides by a chunk size of 0)
        raise empty from None
    except (ValueError, TypeError) as e:
        raise ArgumentError("chunks", f"{e} (output shape {shape})") from None
    if any(size < 1 for sizes in normalized for size in sizes):
        raise empty
    return normalized


def stored(array) -> bool:
    """Whether ``array`` is read where it is stored, each task reading its own region: a Zarr
    array (``zarr.open_array``) or a TIFF file (``shim.dask.open_tiff``). Both pickle small
    (where the data is, not the data) and read only the stored chunks a region covers, so a
    worker holds no input between its tasks; a dask array's blocks are computed once each
    and held until every chunk whose region spans them is done."""
    zarr = sys.modules.get("zarr")  # (no Zarr array exists before zarr is imported)
    return isinstance(array, TiffSource) or zarr is not None and isinstance(array, zarr.Array)


def _token_of(array) -> str:
    return array.name if isinstance(array, da.Array) else tokenize(array)


def _chunks_of(array) -> tuple:
    """An input's chunks in dask's form: a dask array's blocks, a stored array's chunks."""
    if isinstance(array, da.Array):
        return array.chunks
    return da.core.normalize_chunks(array.chunks, array.shape)


def _graph_input(array):
    """What the tasks take of an input: its blocks (Delayed, by block index), or the stored
    array itself, in the graph once."""
    if isinstance(array, da.Array):
        return array.to_delayed(optimize_graph=False)
    return dask.delayed(array, name=f"shim-stored-{tokenize(array)}")


def _source(name: str, array, graph_input, box) -> tuple:
    """What a task needs of one input: the region (Halide's box, x first), what it takes (the
    blocks the region spans, or the stored array) and the blocks' numpy-order origins (None
    for a stored array, which the task reads the region of)."""
    lows = [lo for lo, _ in reversed(box)]
    highs = [lo + extent for lo, extent in reversed(box)]
    if not _covers(array.shape, box):
        raise BoundsError(name, lib.halide_error_code_access_out_of_bounds,
                          f"a chunk reads {box} (x first), outside the array of shape "
                          f"{array.shape}")
    if not isinstance(array, da.Array):
        return box, [graph_input], None
    spans, origins = [], []
    for axis, chunk in enumerate(array.chunks):
        edges = np.cumsum((0,) + chunk)
        first = int(np.searchsorted(edges, lows[axis], side="right")) - 1
        last = int(np.searchsorted(edges, highs[axis], side="left"))
        spans.append(range(first, last))
        origins.append(edges)
    indices = list(itertools.product(*spans))
    starts = [tuple(int(origins[axis][i]) for axis, i in enumerate(index)) for index in indices]
    return box, [graph_input[index] for index in indices], starts


class _Shipped:
    """A pipeline as its graph carries it: what it pickles as (its library's bytes, their
    sha256 and its name), loaded by the tasks that run it (each process loads it once: the
    same fields unpickle as the same Pipeline). Unpickling this loads nothing and cannot fail,
    so that a host that cannot load the library (one that lacks a library it links) fails the
    tasks that need it, and the compute with their error: a distributed worker that cannot
    unpickle data it fetched from another worker tries again forever, the graph hanging with
    the error in that worker's log alone (dask/distributed issues 3558 and 6705). Nor does the
    scheduler, which unpickles every graph it is sent, load the pipelines it schedules (and
    keep them loaded for the rest of its life: their code cannot be unloaded)."""

    def __init__(self, name: str, restore, fields: tuple, pipeline=None):
        self.name, self._restore, self._fields, self._pipeline = name, restore, fields, pipeline

    @classmethod
    def of(cls, pipeline) -> _Shipped:
        restore, fields = pipeline.__reduce__()
        # (It keeps the pipeline, as the graph did, for the tasks that run in this process.)
        return cls(pipeline.name, restore, fields, pipeline)

    def __reduce__(self):
        return _Shipped, (self.name, self._restore, self._fields)

    def load(self):
        """The Pipeline (loaded once per process: restoring again would give the same)."""
        if self._pipeline is None:
            try:
                self._pipeline = self._restore(*self._fields)
            except ShimError as e:
                raise ArgumentError("pipeline", f"{self.name} cannot be loaded on this worker "
                                                f"(host {socket.gethostname()}, process "
                                                f"{os.getpid()}) from the library bytes it was "
                                                f"sent: {e}") from e
        return self._pipeline


def _run_chunk(shipped, plan, *blocks):
    """One task: the output chunk over the plan's box from its inputs' regions (``blocks``:
    those of every input in turn, as many as the plan's ``starts`` of each, or the stored
    array where ``starts`` is None)."""
    pipeline = shipped.load()
    box, sources, scalars, device, keep, output_names, dtypes = plan
    kind = shim_device(device) if device else None
    chunks = chunks_for(device) if device else None
    arguments = {}
    blocks = iter(blocks)
    for name, (region, starts) in zip(_input_names(pipeline), sources):
        if starts is None:
            data = _read(next(blocks), region)
        else:
            spanned = list(itertools.islice(blocks, len(starts)))
            if chunks is not None and any(chunks.is_chunk(block) for block in spanned):
                arguments[name] = chunks.assemble(region, spanned, starts)  # (on the device)
                continue
            data = _assemble(region, spanned, starts)
        buf = Buffer(data, mins=[lo for lo, _ in region])
        if kind is not None:
            buf.copy_to_device(kind)
        arguments[name] = buf
    shape = tuple(extent for _, extent in reversed(box))
    mins = [lo for lo, _ in box]
    outs = [chunks.output(shape, dtype, mins) if keep
            else Buffer(np.empty(shape, dtype), mins=mins) for dtype in dtypes]
    pipeline(**arguments, **dict(zip(output_names, outs)), **scalars)
    # (np.asarray downloads device results; kept ones stay there, as the device's chunks)
    results = tuple(chunks.result(out) if keep else np.asarray(out) for out in outs)
    return results[0] if len(results) == 1 else results


def _input_names(pipeline) -> list:
    return [a.name for a in pipeline.inputs if a.is_buffer]


def _read(array, region) -> np.ndarray:
    """The ``region`` (x first) of a stored array, read from its store."""
    return _dense(np.asarray(array[tuple(slice(lo, lo + extent)
                                         for lo, extent in reversed(region))]))


def _dense(array: np.ndarray) -> np.ndarray:
    """``array``, or a copy of it whose x is dense: Halide pipelines require x's stride to be 1
    by default, whatever its extent. A block dask made by broadcasting (da.zeros, da.full) has
    stride 0, one it transposed strides across rows; np.ascontiguousarray would keep a view
    whose x has one element at any stride (numpy calls it contiguous), a new array's is 1."""
    if array.ndim and array.strides[-1] != array.itemsize:
        return np.array(array, order="C")
    return array


def _assemble(region, blocks, starts) -> np.ndarray:
    """The ``region`` (x first) of an input, from the blocks it spans at their numpy-order
    ``starts``: a view where one block holds it all, else a copy of each block's part."""
    lows = [lo for lo, _ in reversed(region)]
    shape = tuple(extent for _, extent in reversed(region))
    parts = []
    for block, start in zip(blocks, starts):
        block = np.asarray(block)
        inside = tuple(slice(max(lo - s, 0), min(lo + n - s, size))
                       for lo, n, s, size in zip(lows, shape, start, block.shape))
        at = tuple(slice(s + part.start - lo, s + part.stop - lo)
                   for part, s, lo in zip(inside, start, lows))
        parts.append((block[inside], at))
    if len(parts) == 1:
        return _dense(parts[0][0])
    region_array = np.empty(shape, parts[0][0].dtype)
    for part, at in parts:
        region_array[at] = part
    return region_array
