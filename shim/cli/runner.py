"""``python -m shim run`` and ``profile``: one pipeline called with values from the command
line as Halide's RunGen calls it, in RunGen's order and with its words (tools/RunGenMain.cpp,
RunGen.h): the arguments checked (``validate``), the scalars and inputs read
(shim/cli/run_values.py), the outputs sized (``--output_extents``, or where none is given the
shim's rule: shim/cli/run_sizes.py), the bounds query, one run or RunGen's adaptive
benchmark (shim/cli/timing.py), or the shim's ``--iterations`` after a warm-up run, and the
outputs saved as RunGen saves them (shim/cli/images.py). With ``--verbose``, RunGen's info
lines, with the shapes the shim uses; on stdout only what RunGen prints there, unless an
option of the shim's asks for more (``--iterations``, ``--device``, ``--profile``, the
``profile`` command, an output given as ``:`` or ``:[W,H,...]``).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import numpy as np

import shim
from shim.base.progress import Progress
from shim.cli import images
from shim.cli import memory_tracker
from shim.cli import run_values
from shim.cli import rungen
from shim.cli import timing
from shim.buffers.buffer import Buffer
from shim.buffers.buffer_arguments import zeroed
from shim.backends.devices import preferred_kind
from shim.base.errors import ArgumentError, BoundsError, DeviceUnavailable, PipelineError, \
    ShimError
from shim.calls.metadata import check_extents
from shim.calls.running import prints_to
from shim.cli.console import Console
from shim.cli.run_sizes import Sizer
from shim.cli.rungen import Failure, dense_shape, shape_text


@dataclass(frozen=True)
class Options:
    """The shim's own options of a run (not RunGen's)."""

    command: str = "run"  # or "profile"
    iterations: int | None = None
    device: str | None = None
    profile: str | None = None  # where the Chrome trace of the timed runs goes
    npy_order: str = "numpy"
    chunks: tuple | None = None
    scheduler: str | None = None

    @property
    def chunked(self) -> bool:
        return self.chunks is not None or self.scheduler is not None

    @property
    def reports(self) -> bool:
        """Whether the shim's own summary of the runs is printed: an option of the shim's
        asked for it."""
        return bool(self.iterations or self.device or self.profile or self.command == "profile")


def describe(pipeline) -> str:
    """RunGen's ``--describe``."""
    lines = [f'Filter name: "{pipeline.name}"']
    for a in pipeline.arguments:
        role = "Output" if a.is_output else "Input"
        kind = (f"Buffer<{rungen.type_name(a.type)}> with {a.dimensions} dimensions"
                if a.is_buffer else rungen.type_name(a.type))
        lines.append(f'  {role} "{a.name}" is of type {kind}')
    return "\n".join(lines)


def unavailable_device(pipeline) -> str | None:
    """``--skip_bad_environment``'s line where the pipeline cannot run here (a device API it
    uses is missing; RunGen checks CUDA, in these words), or None."""
    for kind in sorted(pipeline.device_kinds):
        try:
            shim.device(kind)
        except ShimError:
            name = {"cuda": "Cuda", "opencl": "OpenCL", "vulkan": "Vulkan"}.get(kind, kind)
            return f"[SKIP] This system requires {name}, which is not available."
    return None


def validate(pipeline, line: rungen.CommandLine, ok_to_omit_outputs: bool,
             console: Console) -> dict:
    """RunGen's validate: {argument: text} of every argument, the defaults
    (``--default_input_buffers``, ``--default_input_scalars``) filling in, said so; Failure
    naming every unknown NAME and every argument without a value."""
    flags = line.flags
    names = {a.name for a in pipeline.arguments}
    problems = [f"Unknown argument name: {name}" for name in sorted(line.seen - names)]
    texts = dict(line.values)
    for a in sorted(pipeline.arguments, key=lambda a: a.name):
        if a.name in texts or ok_to_omit_outputs and a.is_output:
            continue
        default = "" if a.is_output else (flags.default_input_buffers if a.is_buffer
                                          else flags.default_input_scalars)
        if default:
            texts[a.name] = default
            console.info(f"Using value of '{default}' for: {a.name}")
        else:
            problems.append(f"Argument value missing for: {a.name}")
    if problems:
        raise Failure("".join(f"{problem}\n" for problem in problems))
    return texts


def run(options: Options, line: rungen.CommandLine, pipeline, texts: dict,
        console: Console) -> int:
    """Run ``pipeline`` as RunGen runs it: ``texts`` ({argument: text}, validated), RunGen's
    flags in ``line``, the shim's ``options``; what it says goes through ``console``."""
    flags = line.flags
    by_name = sorted(pipeline.arguments, key=lambda a: a.name)  # (RunGen's order)
    scalars = scalar_values(pipeline, texts, console)
    sizer = Sizer(pipeline, scalars, console.info, console.warn)
    out_of_range = _out_of_range(pipeline, scalars)
    given, promised = {}, None
    if flags.output_extents:
        given = output_extents(pipeline, flags.output_extents, console)
        promised = _promised_inputs(by_name, sizer, given, out_of_range, console)
    inputs, specs = _inputs(by_name, texts, bool(flags.output_extents), promised,
                            options.npy_order, console)
    outputs = {a.name: run_values.parse_output(a, texts[a.name]) if texts.get(a.name)
               else run_values.OutputSpec(None, None) for a in pipeline.outputs}
    given.update((name, spec.box) for name, spec in outputs.items() if spec.box is not None)
    boxes, how = _sizes(pipeline, by_name, sizer, given, inputs, specs, out_of_range, console)
    check_distinct(pipeline, outputs)
    if options.profile:
        images.check_writable("--profile", options.profile)
    plans = {a.name: images.plan_save(a.name, outputs[a.name].path,
                                      run_values.numpy_shape(boxes[a.name]),
                                      run_values.buffer_dtype(a), options.npy_order, console)
             for a in by_name if a.is_output and outputs[a.name].path is not None}
    arrays = {name: run_values.make_input(_argument(pipeline, name), spec, boxes[name],
                                          pipeline.target) for name, spec in specs.items()}
    arrays.update((name, array) for name, array in inputs.items() if array is not None)
    values = dict(scalars)
    for a in pipeline.inputs:
        if a.is_buffer:
            values[a.name] = _buffer(arrays[a.name], a.name, boxes[a.name], written=True)
    results = [_output_buffer(a, boxes[a.name], pipeline.target) for a in pipeline.outputs]
    values.update((a.name, result) for a, result in zip(pipeline.outputs, results))
    _bounds_query_lines(pipeline, by_name, sizer, values, console)
    device = _device(pipeline, options.device)
    if device is not None:
        for a in pipeline.inputs:
            if a.is_buffer:
                values[a.name].copy_to_device(device)
    call = _prepare(pipeline, values, how)
    if flags.benchmarks and flags.benchmarks_value not in ("", "all"):
        raise Failure("The only valid value for --benchmarks is 'all'")
    with call:
        with prints_to(lambda text: None if flags.quiet else console.halide_print(text)):
            timings, highwater, profile = _timed_runs(options, flags, pipeline.name, call,
                                                      results, console)
    _report(options, flags, pipeline, timings, results, device, console)
    if highwater is not None:
        console.out(f"Maximum Halide memory: {highwater} bytes for output of "
                    f"{rungen.c_general(_megapixels(results))} mpix.")
    results_by_name = dict(zip((a.name for a in pipeline.outputs), results))
    for a in by_name:
        if a.is_output:
            _save(a.name, results_by_name[a.name], outputs[a.name], plans.get(a.name), console)
    if options.command == "profile":
        console.out("")
        console.out(profile.summary())
    if options.profile:
        try:
            trace = profile.save_trace(options.profile)
        except OSError as e:
            raise ArgumentError("--profile", f"cannot write {options.profile}: {e}") from None
        console.out(f"trace: {trace} (open it in https://ui.perfetto.dev)")
    if flags.success:
        console.out("Success!")
    return 0


# --- values ---------------------------------------------------------------------------------

def _argument(pipeline, name: str):
    return next(a for a in pipeline.arguments if a.name == name)


def scalar_values(pipeline, texts: dict, console: Console) -> dict:
    """{scalar: value} of the scalars ``texts`` gives (RunGen's load_inputs, its first
    part)."""
    scalars = {}
    for a in sorted(pipeline.inputs, key=lambda a: a.name):
        if a.is_buffer or a.name not in texts:
            continue
        scalars[a.name], keyword = run_values.scalar_value(a, texts[a.name])
        if keyword is not None:
            console.info(f"Argument value for: {a.name} is parsed from metadata ({keyword}) as: "
                         f"{rungen.scalar_text(a.type, scalars[a.name])}")
    return {a.name: scalars[a.name] for a in pipeline.inputs if a.name in scalars}


def _out_of_range(pipeline, scalars: dict) -> str | None:
    """The error Halide's code reports for the first scalar beyond its range, in Halide's
    words (RunGen reports it from its bounds query), or None."""
    for a in pipeline.inputs:
        value = scalars.get(a.name)
        if a.is_buffer or value is None or isinstance(value, bool):
            continue
        shown = (lambda v: f"{v:e}") if a.type.dtype is None or a.type.dtype.kind == "f" else str
        for limit, words in ((a.min, "at least"), (a.max, "at most")):
            if limit is not None and (value < limit if words == "at least" else value > limit):
                return (f"halide_error: Parameter {a.name} is {shown(value)} but must be "
                        f"{words} {shown(limit)}")
    return None


def output_extents(pipeline, text: str, console: Console) -> dict:
    """RunGen's --output_extents (``text``): {output: Box}."""
    given = {}
    for a in sorted(pipeline.outputs, key=lambda a: a.name):
        if text == "estimate":
            box = run_values.estimated_box(a)
            if box is None:
                raise Failure(f"Argument {a.name} was specified as 'estimate', but no valid "
                              f"estimates were provided.")
            console.info(f"Output {a.name} is parsed from metadata as: "
                         f"{shape_text(dense_shape(box))}")
        else:
            box = rungen.parse_extents(text, "--output_extents")
            console.info(f"Output {a.name} has user-specified Shape: "
                         f"{shape_text(dense_shape(box))}")
        given[a.name] = run_values.check_dimensions(a, box, "--output_extents")
    return given


def _promised_inputs(by_name, sizer: Sizer, given: dict, out_of_range, console: Console):
    """RunGen's bounds_query_input_shapes for the --output_extents ``given``: {input: the
    shape the bounds query asks of it}, or None where the query fails."""
    promised = None if out_of_range else sizer.promised_inputs(given)
    for a in by_name:
        if a.is_buffer and not a.is_output:
            console.info(f"Input {a.name} failed bounds-query\n" if promised is None else
                         f"Input {a.name} has a bounds-query shape of "
                         f"{shape_text(promised[a.name])}")
    return promised


def _inputs(by_name, texts: dict, extents_given: bool, promised, npy_order: str,
            console: Console):
    """RunGen's loading of the input buffers, by name: ({input: array read from a file, or
    None for the others}, {input: InputSpec} of the others). ``auto`` extents are the
    bounds query's answer for ``--output_extents`` (``promised``, RunGen's) where that is
    given, else the shim's, from the outputs' sizes (run_sizes)."""
    arrays, specs = {}, {}
    for a in by_name:
        if not a.is_buffer or a.is_output or a.name not in texts:
            continue
        spec = run_values.parse_input(a, texts[a.name])
        if spec.path is not None:
            arrays[a.name] = run_values.read_input(a, spec, console, npy_order)
            console.info(f"Input {a.name}: Shape is {shape_text(_array_shape(arrays[a.name]))}")
            continue
        extents = spec.extents
        if extents in ("estimate", "estimate_then_auto"):
            estimated = run_values.estimated_box(a)
            if estimated is None and extents == "estimate":
                raise Failure(f"Argument {a.name} was specified as 'estimate', but no valid "
                              f"estimates were provided.")
            if estimated is None:
                console.info(f"Input {a.name} has no estimates; using bounds-query result "
                             f"instead.")
            extents = "auto" if estimated is None else estimated  # (a 0-D buffer's is ())
        if extents == "auto" and extents_given:
            if promised is None:
                raise Failure(f"Input {a.name} could not calculate a shape satisfying "
                              f"bounds-query constraints.\nTry relaxing the constraints, or "
                              f"providing an explicit estimate for the input.\n")
            extents = tuple((lo, extent) for lo, extent, _ in promised[a.name])
        specs[a.name] = spec if extents == spec.extents else \
            run_values.InputSpec(spec.text, kind=spec.kind, extents=extents, value=spec.value,
                                 seed=spec.seed)
        arrays[a.name] = None
        if extents != "auto":
            console.info(f"Input {a.name}: Shape is {shape_text(dense_shape(extents))}")
    return arrays, specs


def _sizes(pipeline, by_name, sizer: Sizer, given: dict, inputs: dict, specs: dict,
           out_of_range, console: Console):
    """({buffer: Box} of every buffer argument, {output: how its size was chosen}): the
    outputs not given sized by the shim's rule (RunGen's: like its first input), then the
    inputs whose extents are ``auto``."""
    boxes = {name: tuple((0, n) for n in reversed(array.shape))
             for name, array in inputs.items() if array is not None}
    boxes.update((name, spec.extents) for name, spec in specs.items() if spec.extents != "auto")
    auto = [name for name, spec in specs.items() if spec.extents == "auto"]
    # Refused before the bounds query, whose halide_dimension_t strides could not hold them.
    for name, box in [*boxes.items(), *given.items()]:
        check_extents(_argument(pipeline, name), run_values.numpy_shape(box), pipeline.target)
    missing = [a for a in by_name if a.is_output and a.name not in given]
    if missing and boxes:
        first = min(boxes)
        for a in missing:
            console.info(f"Output {a.name} assumes the shape of first input: "
                         f"{shape_text(dense_shape(boxes[first]))}")
    if out_of_range:
        console.info("Running bounds query...")
        raise Failure(out_of_range)
    inputs = {name: boxes.get(name) for name in [*boxes, *auto]}
    outputs, how = sizer.outputs(given, inputs)
    if console.verbose:
        rungens = _rungen_outputs(sizer, missing, given, inputs)
        for a in missing:
            if outputs[a.name] != rungens.get(a.name):
                console.info(f"Output {a.name} is sized {how[a.name]}: "
                             f"{run_values.describe_box(outputs[a.name])}")
    if auto:
        derived = sizer.derived_inputs(outputs, boxes, auto)
        for name in sorted(auto):
            console.info(f"Input {name}: Shape is {shape_text(dense_shape(derived[name]))}")
        boxes.update(derived)
        for name in auto:
            spec = specs[name]
            specs[name] = run_values.InputSpec(spec.text, kind=spec.kind, extents=derived[name],
                                               value=spec.value, seed=spec.seed)
    return boxes | outputs, how


def _rungen_outputs(sizer: Sizer, missing, given: dict, inputs: dict) -> dict:
    """{output: the Box RunGen would give it}, for the shim's --verbose line where its own
    differs: the bounds query's answer for the shape of the first input (RunGen's
    choose_output_extents: its dimensions, then extent 1000 for x and y, 4 beyond), where the
    query pins it, else that shape."""
    known = {name: box for name, box in inputs.items() if box is not None}
    if not known:
        return {}
    first = known[min(known)]
    guesses = {a.name: tuple(first[d] if d < len(first) else (0, 1000 if d < 2 else 4)
                             for d in range(a.dimensions)) for a in missing}
    answered = sizer.shapes(given | guesses, {name: box or ((0, 0),) * sizer.dimensions(name)
                                              for name, box in inputs.items()})
    if answered is None:
        return guesses
    return {name: tuple((lo, extent) for lo, extent, _ in answered[name])
            if all(extent > 0 for _, extent, _ in answered[name]) else guess
            for name, guess in guesses.items()}


def _array_shape(array: np.ndarray) -> tuple:
    return dense_shape(tuple((0, n) for n in reversed(array.shape)))


def check_distinct(pipeline, outputs: dict) -> None:
    """Refuse two outputs saved to one file: the second would silently replace the first."""
    saved = {}
    for a in pipeline.outputs:
        path = outputs[a.name].path
        if path is not None:
            first = saved.setdefault(os.path.realpath(path), a.name)
            if first != a.name:
                raise ArgumentError(a.name, f"{first} is saved to {path} too")


def _bounds_query_lines(pipeline, by_name, sizer: Sizer, values: dict, console: Console):
    """RunGen's --verbose lines of its bounds query: each input's shape and what the query
    asks of it, each output's answer and shape (the shim's buffers, as they are: it copies
    no input into the strides the query answers, as RunGen does)."""
    if not console.verbose:
        return
    console.info("Running bounds query...")
    boxes = {a.name: values[a.name].box for a in pipeline.arguments if a.is_buffer}
    answered = sizer.shapes({a.name: boxes[a.name] for a in pipeline.outputs},
                            {a.name: boxes[a.name] for a in pipeline.inputs if a.is_buffer})
    for a in by_name:
        if a.is_buffer and not a.is_output:
            console.info(f"Input {a.name}: Shape is {shape_text(_shape(values[a.name]))}")
            if answered is not None:
                console.info(f"Input {a.name}: BoundsQuery result is "
                             f"{shape_text(answered[a.name])}")
    for a in by_name:
        if a.is_output:
            if answered is not None:
                console.info(f"Output {a.name}: BoundsQuery result is "
                             f"{shape_text(answered[a.name])}")
            console.info(f"Output {a.name}: Shape is {shape_text(_shape(values[a.name]))}")


def _shape(buf: Buffer) -> tuple:
    raw = buf.raw
    return tuple((raw.dim[d].min, raw.dim[d].extent, raw.dim[d].stride)
                 for d in range(raw.dimensions))


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

def _timed_runs(options: Options, flags, label: str, call, results: list, console: Console):
    """(Timings or Benchmark, the memory high-water mark if tracked, the Profile if one
    was recorded) of the runs the options ask for: RunGen's one run or its benchmark, or the
    shim's warm-up run then ``--iterations`` timed ones. A pipeline's error is RunGen's
    ``halide_error`` failure."""
    def run_once():
        try:
            call()
        except PipelineError as e:
            # RunGen's error handler aborts at the first message (the shim keeps every one the
            # call's threads reported, a line each)
            raise Failure(f"halide_error: {e.message.splitlines()[0]}") from None
        for result in results:
            result.device_sync()  # else a GPU run would time only the enqueueing

    profile = shim.profile() if options.command == "profile" or options.profile else None
    if options.reports and not flags.benchmarks:
        if profile is None:
            run_once()  # warm-up: compiles kernels, allocates, uploads the inputs once
        else:
            # A build with Halide's tracing prints every event while no profile records
            # (Halide's way): the warm-up of profiled runs goes in a profile of its own,
            # thrown away, so that the timed runs' tables are not preceded by a printed trace
            # of the warm-up.
            with shim.profile(trace_limit=0):
                run_once()
    with contextlib.ExitStack() as stack:
        if profile is not None:
            stack.enter_context(profile)
        tracker = stack.enter_context(memory_tracker.track()) if flags.track_memory else None
        if flags.benchmarks:
            console.info("Benchmarking filter...")
            timings = timing.benchmark(run_once, flags.benchmark_min_time)
        else:
            console.info("Running filter...")
            progress = Progress(options.iterations or 1, label)
            timings = timing.time_iterations(run_once, options.iterations or 1, progress)
    return timings, None if tracker is None else tracker.highwater, profile


def _megapixels(results: list) -> float:
    """RunGen's output size: the first two extents of each output (one for a 1-D output, 1
    for a 0-D one), in units of 2^20."""
    pixels = sum(int(np.prod(result.shape[-2:])) for result in results)
    return pixels / 2**20


def _report(options: Options, flags, pipeline, timings, results, device, console: Console):
    """RunGen's benchmark lines, or the shim's summary of its own timed runs."""
    if not flags.benchmarks and not options.reports:
        return  # (RunGen says nothing of one run)
    throughput = _megapixels(results) / timings.best
    if flags.parsable_output:
        rows = timings.parsable() + [("THROUGHPUT_MPIX_PER_SEC", throughput),
                                     ("HALIDE_TARGET", pipeline.target)]
        for key, value in rows:
            shown = rungen.c_general(value) if isinstance(value, float) else value
            console.out(f"{pipeline.name}  {key:<24} {shown}")  # RunGen's columns
    elif flags.benchmarks:
        console.out(f"Benchmark for {pipeline.name} produces {timings.describe()}.")
        # (RunGen's precision of two digits, set for the accuracy, holds for this line too)
        console.out(f"Best output throughput is {rungen.c_general(throughput, 2)} mpix/sec.")
    else:
        where = f" (inputs on {device.kind})" if device is not None else ""
        console.out(f"{pipeline.name}: {timings.describe()}{where}")


def _save(name: str, result: Buffer, spec, plan, console: Console) -> None:
    """RunGen's saving of an output; the shim's summary of one sized but not saved (``:`` or
    ``:[W,H,...]``)."""
    if plan is None:
        console.info(f"(Output {name} was not saved.)")
        if spec.summed_up:
            array = result.numpy()
            with np.errstate(all="ignore"):  # (the mean of inf and -inf is nan: no warning)
                mean = array.mean()
            # (str: a float32 as the float32 it is, 0.1 rather than 0.10000000149011612)
            console.out(f"{name}: {_shape_text(result)}, min {str(array.min())}, max "
                        f"{str(array.max())}, mean {mean:.6g}")
        return
    images.save(plan, result.numpy(), name, console)


def _shape_text(result: Buffer) -> str:
    text = f"{result.dtype} {'x'.join(str(n) for _, n in result.box)}"
    mins = [lo for lo, _ in result.box]
    return text + (f" from ({', '.join(map(str, mins))})" if any(mins) else "")
