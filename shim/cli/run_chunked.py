"""``python -m shim run P.so ... --chunks WxH [--scheduler ADDRESS]``: one run over inputs
larger than memory, chunk by chunk through ``shim.dask.map_pipeline`` (each chunk given the
input region Halide's bounds query asks for), on dask's threaded scheduler or a distributed
one, with a progress bar.

``.npy`` inputs are read block by block from the file and ``.npy`` outputs written block by
block into it, so data larger than memory streams through; with ``--scheduler`` the workers
open the files at the same paths (a local cluster, or a shared filesystem). Image inputs and
outputs are whole arrays, as images are.

dask is the ``dask`` extra, imported when a chunked run starts: ``python -m shim`` works
without it.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from shim.cli import images
from shim.cli import run_values
from shim.base.errors import ArgumentError
from shim.cli.run_sizes import Sizer
from shim.cli.runner import check_distinct, output_extents, scalar_values

_EXTRA = "pip install 'halide-shim[dask]'"


def run(options, flags, pipeline, texts: dict, console) -> int:
    """The chunked run of ``pipeline`` (``options``: the shim's, runner.Options; ``flags``:
    RunGen's; ``texts``: {argument: text}, validated)."""
    _check_options(options, flags)
    da, map_pipeline = _dask(options.scheduler)
    scalars = scalar_values(pipeline, texts, console)
    arrays = {a.name: _input(da, a, texts[a.name], options.chunks, console)
              for a in pipeline.inputs if a.is_buffer}
    outputs = {a.name: run_values.parse_output(a, texts[a.name]) if texts.get(a.name)
               else run_values.OutputSpec(None, None) for a in pipeline.outputs}
    for a in pipeline.outputs:
        if outputs[a.name].path is None:
            raise ArgumentError(a.name, "--chunks saves every output to a file: give "
                                        f"{a.name}=FILE (.npy streams to disk)")
    check_distinct(pipeline, outputs)
    given = output_extents(pipeline, flags.output_extents, console) \
        if flags.output_extents else {}
    given.update((name, spec.box) for name, spec in outputs.items() if spec.box is not None)
    boxes, _ = Sizer(pipeline, scalars, console.info, console.warn).outputs(
        given, {name: tuple((0, n) for n in reversed(array.shape))
                for name, array in arrays.items()})
    box = _output_box(pipeline, boxes)
    shape = run_values.numpy_shape(box)
    chunks = _chunk_shape(options.chunks, shape, pipeline.outputs[0].dimensions)
    plans = {a.name: images.plan_save(a.name, outputs[a.name].path, shape,
                                      run_values.buffer_dtype(a))
             for a in pipeline.outputs}
    device = None if options.device in (None, "host") else options.device
    try:
        results = map_pipeline(pipeline, *arrays.values(), shape=shape, chunks=chunks,
                               device=device, **scalars)
    except ArgumentError as e:
        if e.argument != "device":
            raise
        raise ArgumentError("--device", str(e).partition(": ")[2]) from None
    results = results if isinstance(results, tuple) else (results,)
    count = int(np.prod(results[0].numblocks))
    started = time.perf_counter()
    _compute(da, options.scheduler, {name: (plans[name], result)
                                     for name, result in zip(plans, results)}, console)
    seconds = time.perf_counter() - started
    if not flags.parsable_output:
        pixels = len(results) * int(np.prod(shape[-2:])) / 2**20  # (RunGen's mpix)
        console.out(f"{pipeline.name}: {count} chunks of "
                    f"{'x'.join(map(str, options.chunks))} in {seconds:.3g} s "
                    f"({pixels / seconds:.6g} mpix/sec)")
        for a in pipeline.outputs:
            console.out(f"{a.name}: {np.dtype(run_values.buffer_dtype(a))} "
                        f"{'x'.join(str(n) for _, n in box)} -> {plans[a.name].path}")
    if flags.success:
        console.out("Success!")
    return 0


def _check_options(options, flags) -> None:
    """Refuse what a chunked run cannot do: it runs once, over dask's workers."""
    if options.chunks is None:
        raise ArgumentError("--scheduler", "is for a chunked run: give --chunks WxH too")
    refused = [("--benchmarks", flags.benchmarks),
               ("--iterations", options.iterations is not None and options.iterations > 1),
               ("--profile", options.profile), ("--track_memory", flags.track_memory),
               ("profile", options.command == "profile")]
    for flag, given in refused:
        if given:
            raise ArgumentError("--chunks", f"runs the pipeline once over its chunks, on dask's "
                                            f"workers: it cannot be timed or profiled as "
                                            f"{flag} asks; drop {flag} or --chunks")


def _dask(scheduler):
    """(dask.array, shim.dask.map_pipeline), or the extra to install."""
    try:
        import dask.array as da

        from shim.dask import map_pipeline
        if scheduler is not None:
            import distributed  # noqa: F401 (checked now, before any work)
    except ImportError as e:
        raise ArgumentError("--scheduler" if scheduler is not None and "distributed" in str(e)
                            else "--chunks", f"needs dask, an optional extra: {_EXTRA} "
                                             f"({e})") from None
    return da, map_pipeline


# --- inputs -----------------------------------------------------------------------------------

class NpyFile:
    """A ``.npy`` file as dask reads an array: its shape and dtype, and the blocks asked for,
    read from a memory map in this machine's byte order and C order (as Halide reads
    them). It pickles as its path, so a worker reads its blocks from the file itself."""

    def __init__(self, path: str, mode: str = "r"):
        self.path, self.mode = path, mode
        self._array = None
        array = self._open()
        self.shape, self.dtype, self.ndim = array.shape, array.dtype.newbyteorder("="), array.ndim

    def _open(self) -> np.ndarray:
        if self._array is None:
            self._array = np.load(self.path, mmap_mode=self.mode, allow_pickle=False)
        return self._array

    def __getitem__(self, key):
        return np.asarray(self._open()[key], self.dtype, order="C")

    def __setitem__(self, key, value):
        self._open()[key] = value

    def __getstate__(self):
        return {**self.__dict__, "_array": None}


def _input(da, arg, text, chunks, console):
    """An input buffer as a dask array, chunked like the outputs (the dimensions --chunks
    leaves out whole), converted to the argument as RunGen converts a file."""
    spec = run_values.parse_input(arg, text)
    if spec.path is None:
        raise ArgumentError(arg.name, f"--chunks runs over input files (.npy streams from "
                                      f"disk); {text!r} is made in memory: run it without "
                                      f"--chunks, or save it to a .npy first")
    dtype = run_values.buffer_dtype(arg)
    if images.suffix_of(spec.path) != ".npy":
        array = run_values.read_input(arg, spec, console)
        return da.from_array(array, chunks=_file_chunks(chunks, array.shape))
    source = _open_npy(spec.path, arg.name)
    array = da.from_array(source, chunks=_file_chunks(chunks, source.shape), asarray=False)
    array = images.conform(array, arg.dimensions, array.dtype, arg.name, console)
    if array.dtype != dtype:
        console.warn(images.type_warning(arg.name, array.dtype, dtype))
        array = array.map_blocks(images.convert, dtype=dtype)
    return array


def _open_npy(path: str, argument: str) -> NpyFile:
    if not os.path.isfile(path):  # (a FIFO would be read until someone writes to it)
        problem = "is a directory" if os.path.isdir(path) else (
            "no such file" if not os.path.exists(path) else "is not a regular file")
        raise ArgumentError(argument, f"cannot read {path}: {problem}")
    try:
        with open(path, "rb") as f:
            if f.read(len(np.lib.format.MAGIC_PREFIX)) != np.lib.format.MAGIC_PREFIX:
                raise ArgumentError(argument, f"{path} is not a .npy file")
        source = NpyFile(path)
    except (OSError, ValueError) as e:
        raise ArgumentError(argument, f"cannot read {path}: {e}") from None
    if source.dtype.kind not in "biuf":
        raise ArgumentError(argument, f"cannot read {path}: its elements are {source.dtype}, "
                                      f"not numbers (bool, integers or floats)")
    return source


def _file_chunks(chunks: tuple, shape: tuple) -> tuple:
    """dask's chunks (numpy order) for an array of ``shape``: --chunks' extents (x first)
    on its last axes, the others whole."""
    given = tuple(reversed(chunks))[-len(shape):] if shape else ()
    return (-1,) * (len(shape) - len(given)) + given


# --- outputs ----------------------------------------------------------------------------------

def _output_box(pipeline, boxes: dict):
    """The box every output has (map_pipeline runs them over one box, at mins 0)."""
    first, *others = pipeline.outputs
    box = boxes[first.name]
    for a in others:
        if boxes[a.name] != box:
            raise ArgumentError(a.name, f"--chunks runs every output over one box, and "
                                        f"{a.name} is {run_values.describe_box(boxes[a.name])} "
                                        f"where {first.name} is "
                                        f"{run_values.describe_box(box)}")
    if any(lo for lo, _ in box):
        raise ArgumentError(first.name, f"--chunks computes outputs from (0, 0, ...), not "
                                        f"{run_values.describe_box(box)}: give extents alone")
    return box


def _chunk_shape(chunks: tuple, shape: tuple, dimensions: int) -> tuple:
    """The outputs' chunks in numpy order, from --chunks' extents (x first): at least x and y
    (all of a 1-D output's), the dimensions left out whole."""
    if not min(2, dimensions) <= len(chunks) <= dimensions:
        expected = "W" if dimensions == 1 else "WxH" + "".join(
            f"[x{d}]" for d in "CDEFG"[:dimensions - 2])
        raise ArgumentError("--chunks", f"expected {expected} (chunk extents, x first, for "
                                        f"{dimensions}-D outputs), got "
                                        f"{'x'.join(map(str, chunks))!r}")
    return _file_chunks(chunks, shape)


def _compute(da, scheduler, saves: dict, console) -> None:
    """Compute the outputs into their files (``saves``: {output: (SavePlan, dask array)}),
    with a progress bar; .npy files are written as temporary files beside them, renamed once
    all are done (a run that fails leaves no half-written output)."""
    streamed = {name: save for name, save in saves.items()
                if images.suffix_of(save[0].path) == ".npy"}
    whole = {name: save for name, save in saves.items() if name not in streamed}
    partial = {}
    try:
        targets = []
        for name, (plan, array) in streamed.items():
            partial[name] = _new_file_beside(plan.path)
            np.lib.format.open_memmap(partial[name], mode="w+", dtype=array.dtype,
                                      shape=array.shape).flush()
            targets.append(NpyFile(partial[name], mode="r+"))
        # Disjoint regions of each file: no lock (a distributed worker could not share one).
        work = [da.store([array for _, array in streamed.values()], targets, lock=False,
                         compute=False)] if streamed else []
        computed = _with_progress(scheduler, work + [array for _, array in whole.values()])
        for (name, (plan, _)), array in zip(whole.items(), computed[len(work):]):
            images.save(plan, np.asarray(array), name, console)
        for name, (plan, _) in streamed.items():
            os.replace(partial.pop(name), plan.path)
    finally:
        for path in partial.values():  # (only those never renamed: the names are ours)
            if os.path.exists(path):
                os.remove(path)


def _new_file_beside(path: str) -> str:
    """The name of a new empty file beside ``path``, ``PATH.RANDOM.partial``, made by this call
    (exclusively): never a file or a link someone else put there first, as they could under a
    name known in advance in a folder they can write into."""
    while True:
        candidate = f"{path}.{os.urandom(6).hex()}.partial"
        try:
            os.close(os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))
        except FileExistsError:
            continue
        return candidate


def _with_progress(scheduler, work: list) -> list:
    """dask's results of ``work``, on the threaded scheduler with dask's progress bar (on
    stderr: stdout has the results), or on the distributed scheduler at ``scheduler`` with
    distributed's (which prints on stdout)."""
    import dask

    if scheduler is None:
        from dask.diagnostics import ProgressBar

        with ProgressBar(out=sys.stderr):
            return list(dask.compute(*work, scheduler="threads"))
    import distributed

    try:
        client = distributed.Client(scheduler, timeout="10s")
    except (OSError, ValueError, TypeError) as e:
        raise ArgumentError("--scheduler", f"cannot connect to {scheduler!r} (expected a "
                                           f"distributed scheduler's address, "
                                           f"tcp://HOST:PORT): {e}") from None
    with client:
        futures = client.compute(work)
        distributed.progress(futures)
        print(file=sys.stdout, flush=True)  # (the bar ends without a newline)
        return client.gather(futures)
