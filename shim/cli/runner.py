"""``python -m shim run`` and ``profile``: one pipeline called with values from the command
line, as Halide's RunGen calls it (tools/RunGen.h, RunGenMain.cpp): the values are read
(shim/cli/run_values.py), sizes chosen where none is given (shim/cli/run_sizes.py), every output's
file format checked, then one warm-up run, the timed runs (``--iterations`` or RunGen's
adaptive ``--benchmarks=all``, shim/cli/timing.py), and the outputs saved (shim/cli/images.py).
"""

from __future__ import annotations

import contextlib
import os
import sys

import numpy as np

import shim
from shim.base.progress import Progress
from shim.cli import images
from shim.cli import memory_tracker
from shim.cli import run_values
from shim.cli import timing
from shim.buffers.buffer import Buffer
from shim.buffers.buffer_arguments import zeroed
from shim.backends.devices import preferred_kind
from shim.base.errors import ArgumentError, BoundsError, DeviceUnavailable, ShimError
from shim.calls.metadata import check_extents
from shim.cli.run_sizes import Sizer
from shim.calls.scalars import MISSING


class Console:
    """What a run says: results on stdout; warnings, and with ``verbose`` how sizes were
    chosen, on stderr (as RunGen says them)."""

    def __init__(self, verbose: bool):
        self.verbose = verbose

    def out(self, text: str) -> None:
        try:
            print(text, flush=True)
        except BrokenPipeError:
            # The reader left (| head): the rest goes nowhere, and the run goes on to save its
            # outputs (RunGen's buffered stdout lets it).
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

    def warn(self, text: str) -> None:
        print(f"warning: {text}", file=sys.stderr, flush=True)

    def log(self, text: str) -> None:
        if self.verbose:
            print(f"info: {text}", file=sys.stderr, flush=True)


def describe(pipeline) -> str:
    """RunGen's ``--describe``."""
    lines = [f'Filter name: "{pipeline.name}"']
    for a in pipeline.arguments:
        role = "Output" if a.is_output else "Input"
        kind = f"Buffer<{a.type}> with {a.dimensions} dimensions" if a.is_buffer else str(a.type)
        lines.append(f'  {role} "{a.name}" is of type {kind}')
    return "\n".join(lines)


def unavailable_device(pipeline) -> str | None:
    """Why the pipeline cannot run here (a device API it uses is missing), or None."""
    for kind in sorted(pipeline.device_kinds):
        try:
            shim.device(kind)
        except ShimError as e:
            return f"this pipeline needs {kind}, which is not available: {e}"
    return None


def run(args, pipeline, texts: dict, console: Console) -> int:
    """Run ``pipeline`` with the argument ``texts`` ({name: text}) and the options ``args``
    (cli.py's), reporting through ``console``."""
    scalars = input_scalars(pipeline, texts, args.default_input_scalars)
    arrays, specs = _inputs(pipeline, texts, args.default_input_buffers, console, args.npy_order)
    outputs = {a.name: run_values.parse_output(a, texts[a.name]) if texts.get(a.name)
               else run_values.OutputSpec(None, None) for a in pipeline.outputs}
    boxes, how = output_sizes(pipeline, scalars, arrays, specs, outputs, args.output_extents,
                              console)
    # Every output's file is checked before anything runs, and the trace's.
    check_distinct(pipeline, outputs)
    if args.profile:
        images.check_writable("--profile", args.profile)
    plans = {a.name: images.plan_save(a.name, outputs[a.name].path,
                                      run_values.numpy_shape(boxes[a.name]),
                                      run_values.buffer_dtype(a), console.warn, args.npy_order)
             for a in pipeline.outputs if outputs[a.name].path is not None}
    for name, spec in specs.items():
        arrays[name] = run_values.make_input(_argument(pipeline, name), spec, boxes[name],
                                             pipeline.target)
    values = dict(scalars)
    for a in pipeline.inputs:
        if a.is_buffer:
            values[a.name] = _buffer(arrays[a.name], a.name, boxes[a.name], written=True)
    results = [_output_buffer(a, boxes[a.name], pipeline.target) for a in pipeline.outputs]
    values.update((a.name, result) for a, result in zip(pipeline.outputs, results))
    device = _device(pipeline, args.device)
    if device is not None:
        for a in pipeline.inputs:
            if a.is_buffer:
                values[a.name].copy_to_device(device)
    with _prepare(pipeline, values, how) as call:
        with _quiet(args.quiet):
            timings, highwater, profile = _timed_runs(args, pipeline.name, call, results)
    _report(args, pipeline, timings, results, device, console)
    if highwater is not None:
        console.out(f"Maximum Halide memory: {highwater} bytes for output of "
                    f"{_megapixels(results):.6g} mpix.")
    for a, result in zip(pipeline.outputs, results):
        _save_or_describe(a.name, result, plans.get(a.name), args.parsable_output, console)
    if args.command == "profile":
        console.out("")
        console.out(profile.summary())
    if args.profile:
        try:
            trace = profile.save_trace(args.profile)
        except OSError as e:
            raise ArgumentError("--profile", f"cannot write {args.profile}: {e}") from None
        console.out(f"trace: {trace} (open it in https://ui.perfetto.dev)")
    if args.success:
        console.out("Success!")
    return 0


# --- values ---------------------------------------------------------------------------------

def _argument(pipeline, name: str):
    return next(a for a in pipeline.arguments if a.name == name)


def input_scalars(pipeline, texts: dict, default_text: str | None) -> dict:
    """{scalar: value}; a scalar without text takes ``--default_input_scalars``, else the
    pipeline's default (MISSING: checked where the value is converted)."""
    scalars = {}
    for a in pipeline.inputs:
        if not a.is_buffer:
            text = texts.get(a.name) or default_text
            scalars[a.name] = MISSING if text is None else run_values.scalar_value(a, text)
    return scalars


def _inputs(pipeline, texts: dict, default_text: str | None, console: Console,
            npy_order: str = "numpy"):
    """({input: array} of the inputs read from files, {input: InputSpec} of the others)."""
    arrays, specs = {}, {}
    for a in pipeline.inputs:
        if not a.is_buffer:
            continue
        text = texts.get(a.name) or default_text
        if text is None:
            raise ArgumentError(a.name, f"missing input: give {a.name}=FILE (or zero:[W,H,...], "
                                        f"random:SEED:[W,H,...], ...) or --default_input_buffers")
        spec = run_values.parse_input(a, text)
        if spec.path is not None:
            arrays[a.name] = run_values.read_input(a, spec, console.warn, npy_order)
        else:
            specs[a.name] = spec
    return arrays, specs


def check_distinct(pipeline, outputs: dict) -> None:
    """Refuse two outputs saved to one file: the second would silently replace the first."""
    saved = {}
    for a in pipeline.outputs:
        path = outputs[a.name].path
        if path is not None:
            first = saved.setdefault(os.path.realpath(path), a.name)
            if first != a.name:
                raise ArgumentError(a.name, f"{first} is saved to {path} too")


def output_sizes(pipeline, scalars, arrays, specs, outputs, output_extents, console):
    """({buffer: Box} for every buffer argument, {output: how its size was chosen})."""
    inputs = {name: tuple((0, n) for n in reversed(array.shape)) for name, array in arrays.items()}
    auto = []
    for name, spec in specs.items():
        arg = _argument(pipeline, name)
        extents = spec.extents
        if extents in ("estimate", "estimate_then_auto"):
            estimated = run_values.estimated_box(arg)
            if estimated is None and extents == "estimate":
                raise ArgumentError(name, f"{spec.text!r} asks for the estimates, but the "
                                          f"pipeline has none for every dimension of {name}")
            extents = "auto" if estimated is None else estimated  # (a 0-D buffer's is ())
        if extents == "auto":
            auto.append(name)
            inputs[name] = None
        else:
            inputs[name] = extents
    given = {}
    for a in pipeline.outputs:
        if outputs[a.name].box is not None:
            given[a.name] = outputs[a.name].box
        elif output_extents == "estimate":
            given[a.name] = run_values.estimated_box(a)
            if given[a.name] is None:
                raise ArgumentError("--output_extents", f"'estimate', but the pipeline has no "
                                                        f"estimates for every dimension of {a.name}")
        elif output_extents is not None:
            given[a.name] = run_values.check_dimensions(
                a, run_values.parse_box("--output_extents", output_extents), "--output_extents")
    # Refused before the bounds query, whose halide_dimension_t strides could not hold them.
    for name, box in [*inputs.items(), *given.items()]:
        if box is not None:
            check_extents(_argument(pipeline, name), run_values.numpy_shape(box), pipeline.target)
    sizer = Sizer(pipeline, scalars, console.log, console.warn)
    boxes, how = sizer.outputs(given, inputs)
    if auto:
        inputs.update(sizer.derived_inputs(boxes, inputs, auto))
    return inputs | boxes, how


def _output_buffer(arg, box, target: str) -> Buffer:
    shape = run_values.numpy_shape(box)
    check_extents(arg, shape, target)  # before the memory is allocated
    return _buffer(zeroed(shape, run_values.buffer_dtype(arg), arg.name), arg.name, box,
                   written=False)


def _buffer(array: np.ndarray, name: str, box, written: bool) -> Buffer:
    """A Buffer over ``array`` at ``box``'s mins; host-dirty if the host holds its data."""
    buf = Buffer.over_array(array, name, mins=[lo for lo, _ in box])
    buf.set_host_dirty(written)
    return buf


def _device(pipeline, kind):
    """The device the inputs are put on before the runs: the one asked for, else the GPU API
    the pipeline runs on, else none (host memory)."""
    if kind is None:
        kind = preferred_kind(pipeline.device_kinds)
        return None if kind is None else shim.device(kind)
    try:
        return shim.device(kind)
    except DeviceUnavailable as e:  # (asked for on the command line: the flag is named)
        raise ArgumentError("--device", str(e)) from None


def _prepare(pipeline, values: dict, how: dict):
    """The prepared call; a bounds error on an output whose size was guessed says how it was
    guessed and how to give one."""
    try:
        return pipeline.prepare(**values)
    except BoundsError as e:
        guessed = {name: label for name, label in how.items() if label != "given"}
        if not guessed:
            raise
        sizes = ", ".join(f"{name} {run_values.describe_box(values[name].box)} ({label})"
                          for name, label in guessed.items())
        first = next(iter(guessed))
        raise ArgumentError(e.argument, f"{str(e).partition(': ')[2]} (outputs sized "
                                        f"automatically: {sizes}; give --output_extents=[W,H,...] "
                                        f"or {first}=FILE:[W,H,...] to choose)") from None


# --- the runs -------------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet(quiet: bool):
    """RunGen's ``--quiet``: what the pipeline prints (halide_print, which the shim writes to
    stderr) is dropped."""
    if not quiet:
        yield
        return
    with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
        yield


def _timed_runs(args, label: str, call, results: list):
    """(Timings or Benchmark, the memory high-water mark if tracked, the Profile if one
    was recorded) of the runs the options ask for, after one warm-up run."""
    def run_once():
        call()
        for result in results:
            result.device_sync()  # else a GPU run would time only the enqueueing

    profile = shim.profile() if args.command == "profile" or args.profile else None
    if profile is None:
        run_once()  # warm-up: compiles kernels, allocates, uploads the inputs once
    else:
        # A build with Halide's tracing prints every event while no profile records (Halide's
        # way): the warm-up of profiled runs goes in a profile of its own, thrown away, so that
        # the timed runs' tables are not preceded by a printed trace of the warm-up.
        with shim.profile(trace_limit=0):
            run_once()
    with contextlib.ExitStack() as stack:
        if profile is not None:
            stack.enter_context(profile)
        tracker = stack.enter_context(memory_tracker.track()) if args.track_memory else None
        if args.benchmarks:
            timings = timing.benchmark(run_once, args.benchmark_min_time)
        else:
            progress = Progress(args.iterations, label)
            timings = timing.time_iterations(run_once, args.iterations, progress)
    return timings, None if tracker is None else tracker.highwater, profile


def _megapixels(results: list) -> float:
    """RunGen's output size: the first two extents of each output, in units of 2^20."""
    pixels = sum(int(np.prod(result.shape[-2:])) for result in results)
    return pixels / 2**20


def _report(args, pipeline, timings, results, device, console: Console) -> None:
    throughput = _megapixels(results) / timings.best
    if args.parsable_output:
        rows = timings.parsable() + [("THROUGHPUT_MPIX_PER_SEC", throughput),
                                     ("HALIDE_TARGET", pipeline.target)]
        for key, value in rows:
            shown = f"{value:.6g}" if isinstance(value, float) else value
            console.out(f"{pipeline.name}  {key:<24} {shown}")  # RunGen's columns
        return
    where = f" (inputs on {device.kind})" if device is not None else ""
    if args.benchmarks:
        console.out(f"Benchmark for {pipeline.name} produces {timings.describe()}{where}.")
        console.out(f"Best output throughput is {throughput:.6g} mpix/sec.")
    else:
        console.out(f"{pipeline.name}: {timings.describe()}{where}")


def _save_or_describe(name: str, result: Buffer, plan, parsable: bool, console: Console):
    array = result.numpy()
    if plan is not None:
        images.save(plan, array, name)
    if parsable:
        return
    if plan is not None:
        console.out(f"{name}: {_shape_text(result)} -> {plan.path}")
    else:
        with np.errstate(all="ignore"):  # (the mean of inf and -inf is nan: no warning needed)
            mean = array.mean()
        # (str: a float32 as the float32 it is, 0.1 rather than 0.10000000149011612)
        console.out(f"{name}: {_shape_text(result)}, min {str(array.min())}, max "
                    f"{str(array.max())}, mean {mean:.6g}")


def _shape_text(result: Buffer) -> str:
    text = f"{result.dtype} {'x'.join(str(n) for _, n in result.box)}"
    mins = [lo for lo, _ in result.box]
    return text + (f" from ({', '.join(map(str, mins))})" if any(mins) else "")
