"""The command line: ``python -m shim COMMAND``.

    python -m shim info P.so
    python -m shim run P.so --input=in.png --scale=2 --output=out.png [--iterations 10]
    python -m shim profile P.so --input=random:640x480 [--profile trace.json]
    python -m shim demo

``run`` and ``profile`` take the pipeline's own arguments as ``--NAME=VALUE`` (or RunGen's
``NAME=VALUE``), after the shim's options or after ``--``; see shim/runner.py for the values.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import shim
from shim import runner
from shim.devices import kinds, preferred_kind


def _info(args, parser) -> int:
    pipeline = shim.load(args.pipeline, name=args.name)
    print(f"{pipeline.name}  ({pipeline.path})")
    print(f"target: {pipeline.target}")
    print("arguments:")
    for argument in pipeline.arguments:
        print(f"  {argument.describe()}")
    return 0


def _demo(args, parser) -> int:
    from shim import demo

    return demo.run()


def _run(args, parser) -> int:
    pipeline = shim.load(args.pipeline, name=args.name)
    values, outputs = _pipeline_values(pipeline, args)
    device = _device(pipeline, args.device)
    if device is not None:
        values = {name: _on_device(value, device) for name, value in values.items()}
    profiling = args.command == "profile" or args.profile
    with _prepare(pipeline, values, outputs) as call:
        _sync(call())  # warm-up: compiles kernels, allocates, uploads the inputs once
        progress = runner.Progress(args.iterations, f"{pipeline.name}")
        prof = shim.profile() if profiling else None
        if prof is not None:
            prof.start()
        try:
            timings = runner.time_iterations(call, _sync, args.iterations, progress)
        finally:
            if prof is not None:
                prof.stop()
        results = call()
    print(f"{pipeline.name}: {timings.describe()}" + (f" (inputs on {device.kind})" if device else ""))
    _report_outputs(pipeline, results, outputs)
    if args.command == "profile":
        print()
        print(prof.summary())
    if args.profile:
        print(f"trace: {prof.save_trace(args.profile)} (open it in https://ui.perfetto.dev)")
    return 0


def _prepare(pipeline, values, outputs):
    try:
        return pipeline.prepare(**values)
    except shim.BoundsError as e:
        guessed = [a for a in pipeline.outputs if outputs[a.name] is None or outputs[a.name].extents is None]
        if not guessed:
            raise
        sizes = ", ".join(f"{a.name} {'x'.join(map(str, reversed(values[a.name])))}" for a in guessed)
        raise shim.ArgumentError(e.argument, f"{str(e).partition(': ')[2]} (outputs sized "
                                 f"automatically: {sizes}; give --{guessed[0].name}=FILE:WxH... to "
                                 f"choose)") from None


def _pipeline_values(pipeline, args):
    """{argument name: value} for the call, and {output name: OutputSpec}, from the command
    line's pipeline arguments (parsed by a parser made from the pipeline's metadata)."""
    own = argparse.ArgumentParser(prog=f"python -m shim {args.command} {args.pipeline}",
                                  add_help=False, allow_abbrev=False,
                                  description="arguments of " + pipeline.name)
    for argument in pipeline.arguments:
        own.add_argument(f"--{argument.name}", help=argument.describe(),
                         required=argument.is_buffer and not argument.is_output,
                         metavar=_metavar(argument))
    texts = vars(own.parse_args([_dashed(text) for text in args.values]))
    values, inputs, outputs = {}, [], {}
    try:
        for argument in pipeline.arguments:
            text = texts[argument.name]
            if argument.is_output:
                outputs[argument.name] = runner.output_spec(argument, text) if text else None
            elif argument.is_buffer:
                values[argument.name] = runner.input_value(argument, text, pipeline.target)
                inputs.append(values[argument.name])
            elif text is not None:
                values[argument.name] = _scalar(argument, text)
        for argument in pipeline.outputs:
            values[argument.name] = runner.output_shape(argument, outputs[argument.name], inputs)
    except shim.ArgumentError as e:
        own.error(str(e))
    return values, outputs


def _dashed(text: str) -> str:
    """RunGen's NAME=VALUE as --NAME=VALUE."""
    if not text.startswith("-") and "=" in text:
        return "--" + text
    return text


def _metavar(argument) -> str:
    if argument.is_output:
        return "FILE[:WxH...]"
    if argument.is_buffer:
        return "FILE|random:WxH...|zero:WxH..."
    return "VALUE"


def _scalar(argument, text: str):
    if argument.type.dtype == np.bool_:
        lowered = text.lower()
        if lowered not in ("true", "false", "1", "0"):
            raise shim.ArgumentError(argument.name, f"expected true or false, got {text!r}")
        return lowered in ("true", "1")
    try:
        return float(text) if argument.type.dtype.kind == "f" else int(text, 0)
    except ValueError:
        raise shim.ArgumentError(argument.name, f"expected a number of type {argument.type}, "
                                                f"got {text!r}") from None


def _device(pipeline, kind):
    """The device the inputs are put on before the timed runs: the one asked for, else the
    GPU API the pipeline runs on, else none (host memory)."""
    if kind is None:
        kind = preferred_kind(pipeline.device_kinds)
    return None if kind is None else shim.device(kind)


def _on_device(value, device):
    if not isinstance(value, np.ndarray):
        return value
    buf = shim.Buffer(value)
    buf.copy_to_device(device)
    return buf


def _sync(results) -> None:
    """Wait for the device to finish what the call enqueued."""
    for result in results if isinstance(results, tuple) else (results,):
        if isinstance(result, shim.Buffer):
            result.device_sync()


def _report_outputs(pipeline, results, outputs) -> None:
    results = results if isinstance(results, tuple) else (results,)
    for argument, result in zip(pipeline.outputs, results):
        array = np.asarray(result)
        line = f"{argument.name}: {array.dtype} {'x'.join(map(str, reversed(array.shape)))}"
        spec = outputs[argument.name]
        if spec is not None and spec.path is not None:
            runner.save_output(argument, array, spec.path)
            line += f" -> {spec.path}"
        else:
            line += f", min {array.min()}, max {array.max()}, mean {array.mean():.6g}"
        print(line)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m shim",
                                     description="Run ahead-of-time compiled Halide pipelines.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    info = commands.add_parser("info", help="show a pipeline's name, target and arguments "
                                            "(with defaults, ranges and estimates)")
    info.add_argument("pipeline", help="path of the pipeline's shared library")
    info.add_argument("--name", help="which pipeline, if the library holds several")
    info.set_defaults(handler=_info)

    for name, text in (("run", "run a pipeline on inputs from files or random data, time it"),
                       ("profile", "run, then show what the runtime did (summary table)")):
        run = commands.add_parser(
            name, help=text, description=text + ". The pipeline's arguments follow as "
            "--NAME=VALUE: inputs FILE.npy, an image, random:WxH[xC] or zero:WxH[xC]; scalars "
            "by value (default: the pipeline's); outputs FILE[:WxH...] (default: sized from the "
            "estimates, else like the first input). `python -m shim info P.so` lists them.")
        run.add_argument("pipeline", help="path of the pipeline's shared library")
        run.add_argument("--name", help="which pipeline, if the library holds several")
        run.add_argument("--device", choices=kinds(),
                         help="put the inputs on this device before the timed runs (default: "
                              "the GPU API the pipeline runs on, else host memory)")
        run.add_argument("--iterations", type=_positive, default=1, metavar="N",
                         help="timed runs after one warm-up run (default 1); the device is "
                              "synchronized after each")
        run.add_argument("--profile", metavar="TRACE.json",
                         help="save a Chrome trace of the timed runs (Perfetto opens it)")
        run.set_defaults(handler=_run)

    demo = commands.add_parser("demo", help="build the sample pipelines and run them")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command in ("run", "profile"):
        args.values = [v for v in unknown if v != "--"]
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.handler(args, parser)
    except shim.ArgumentError as e:
        parser.exit(2, f"{parser.prog} {args.command}: error: {e}\n")
    except shim.ShimError as e:
        print(f"{parser.prog} {args.command}: {e}", file=sys.stderr)
        return 1
