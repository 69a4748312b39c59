"""The command line: ``python -m shim COMMAND`` (or ``halide-shim COMMAND``).

    python -m shim info P.so
    python -m shim run P.so input=in.png scale=0.5 offset=0 output=out.png [--benchmarks=all]
    python -m shim profile P.so input=random:0:[640,480] --default_input_scalars [--profile T.json]
    python -m shim build my_generator.py target=host-opencl [-o DIR]
    python -m shim demo

``run`` and ``profile`` take Halide's RunGen command line after the pipeline's path, read as
RunGen reads it (shim/cli/rungen.py: the pipeline's arguments as ``NAME=VALUE``, RunGen's
flags) beside the shim's own options (``--iterations``, ``--device``, ``--profile``, ...,
which argparse reads); shim/cli/runner.py runs it, printing what RunGen prints
(shim/cli/console.py).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import shim
from shim.profiling import halide_profiler
from shim.cli import build
from shim.cli import images
from shim.cli import runner
from shim.cli import rungen
from shim.backends.devices import kinds
from shim.base.elf import pipeline_names
from shim.cli.console import Console


def program_name() -> str:
    """How the user called us: the console script by its name, else ``python -m shim``."""
    invoked = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return invoked if invoked.startswith("halide-shim") else "python -m shim"


def _load(args):
    """The pipeline the command line names; which of several is the ``--name`` flag's."""
    try:
        return shim.load(args.pipeline, name=args.name)
    except shim.ArgumentError as e:
        if e.argument != "name":
            raise
        names = ", ".join(pipeline_names(args.pipeline))
        problem = "has no pipeline " + repr(args.name) if args.name else "holds several pipelines"
        raise shim.ArgumentError("--name", f"{args.pipeline} {problem} ({names}): choose one "
                                           f"with --name=NAME") from None


def _info(args, parser) -> int:
    pipeline = _load(args)
    print(f"{pipeline.name}  ({pipeline.path})")
    print(f"target: {pipeline.target}")
    print(f"built by: {pipeline.release_description()}")
    if pipeline.subtargets:
        print("sub-targets, in name order (the dispatcher runs the first this CPU can in the order "
              "they were built with, the last of that order in any case):")
        for name, target, missing in pipeline.subtarget_status():
            where = ("features unknown" if missing is None else
                     f"this CPU lacks {', '.join(missing)}" if missing else "this CPU has it all")
            print(f"  {target}  ({name}: {where})")
    print("arguments:")
    for argument in pipeline.arguments:
        print(f"  {argument.describe()}")
    return 0


def _demo(args, parser) -> int:
    from shim.cli import demo

    return demo.run()


def _run(command: str, tokens: list, run_parser: argparse.ArgumentParser, prog: str) -> int:
    """``run`` and ``profile``: ``tokens`` (what follows the command) split into the
    pipeline's path, the shim's options (argparse's; their errors exit with status 2) and
    RunGen's arguments, which are read and run as RunGen reads and runs them: a failure ends
    as RunGen's do (shim/cli/console.py)."""
    path, own, theirs = _split(tokens)
    options = run_parser.parse_args(own)
    if path is None or options.help:
        run_parser.print_help()
        return 0
    name = f"{prog} {command} {path}"  # (RunGen's name for itself in its usage)
    console = Console()
    ours = runner.Options(command=command, **{
        key: getattr(options, key) for key in ("iterations", "device", "profile", "npy_order",
                                               "chunks", "scheduler")})
    if not theirs:
        console.out(rungen.usage(name))  # (RunGen with no arguments)
        return 0
    try:
        try:
            pipeline = _load_named(path, rungen.filter_name(theirs))
        except rungen.Help:
            console.out(rungen.usage(name))
            if any(token.lstrip("-").split("=") in (["verbose"], ["verbose", "true"])
                   for token in theirs if token.startswith("-")):
                _more_help(run_parser, path, theirs)
            return 0
        line = rungen.read(theirs, {a.name for a in pipeline.arguments})
        console.verbose = line.flags.verbose
        if line.flags.benchmarks and options.iterations is not None:
            run_parser.error("--iterations and --benchmarks=all both choose the timed runs: "
                             "give one")
        if ours.chunked and options.npy_order != "numpy":
            run_parser.error("--chunks streams .npy files in numpy's order only: leave out "
                             "--npy_order")
        return _run_line(ours, line, pipeline, console)
    except rungen.Failure as e:
        if e.usage_first:
            console.out(rungen.usage(name))
        console.fail(e.message)
    except shim.ArgumentError as e:
        if e.argument in _OWN_ARGUMENTS or ours.chunked:  # (a chunked run is the shim's)
            run_parser.exit(2, f"{prog} {command}: error: {e}\n")
        console.fail(f"{prog} {command}: error: {e}")
    except MemoryError as e:  # (the sizes fit the machine, but not what this process may take)
        console.fail(f"{prog} {command}: out of memory: {e}")
    except shim.ShimError as e:
        console.fail(f"{prog} {command}: {e}")


def _run_line(options: runner.Options, line: rungen.CommandLine, pipeline,
              console: Console) -> int:
    """RunGenMain's steps after its command line: the environment check, --describe, the
    arguments' validation, then the run (or the shim's chunked run)."""
    flags = line.flags
    if flags.skip_bad_environment:
        reason = runner.unavailable_device(pipeline)
        if reason is not None:
            console.out(reason)
            return 0
    if flags.describe:
        console.out(runner.describe(pipeline))
        return 0
    # (RunGen lets a benchmark leave out its outputs; the shim's timed runs too, and a
    # chunked run says itself what it lacks)
    ok_to_omit = flags.benchmarks or flags.track_memory or options.reports or options.chunked
    if flags.benchmarks and flags.track_memory:
        console.warn("Using --track_memory with --benchmarks will produce inaccurate "
                     "benchmark results.")
    texts = runner.validate(pipeline, line, ok_to_omit, console)
    if options.command == "profile":
        # The summary's Stages tables show Halide's profiler figures: its own report at exit
        # would repeat them (it stays where the program or the environment sends it).
        halide_profiler.silence_exit_report_unless_chosen()
    if not options.chunked:
        return runner.run(options, line, pipeline, texts, console)
    from shim.cli import run_chunked  # (its dask is an optional extra)

    return run_chunked.run(options, line.flags, pipeline, texts, console)


def _load_named(path: str, name: str):
    """The pipeline RunGen would run: the one named by --name, else the only one; RunGen's
    failure otherwise."""
    try:
        return shim.load(path, name=name or None)
    except shim.ArgumentError as e:
        if e.argument != "name":
            raise
    listing = "".join(f"  {found}\n" for found in pipeline_names(path)) + "\n"
    if name:
        raise rungen.Failure(f"Filter {name} not found; registered filters are:\n{listing}")
    raise rungen.Failure("Must specify --name if multiple filters are registered; registered "
                         f"filters are:\n{listing}")


def _more_help(run_parser, path: str, tokens: list) -> None:
    """``--help --verbose``: after RunGen's usage, the shim's options and the pipeline's
    own arguments (its metadata, as ``info`` shows them)."""
    print()
    run_parser.print_help()
    try:
        pipeline = _load_named(path, next((t.partition("=")[2] for t in tokens
                                           if t.lstrip("-").startswith("name=")), ""))
    except (shim.ShimError, rungen.Failure):
        return  # (the options alone: the arguments need a pipeline)
    print(f"\nArguments of {pipeline.name} (target {pipeline.target}), as NAME=VALUE:")
    for argument in pipeline.arguments:
        print(f"  {argument.describe()}")


# The shim's options of run and profile (argparse reads them, RunGen the rest), and whether
# each takes a value; with the pipeline's path, what a refusal of is argparse-style (status 2).
_OWN_OPTIONS = {"--iterations": True, "--device": True, "--profile": True, "--chunks": True,
                "--npy_order": True, "--scheduler": True, "-h": False}
_OWN_ARGUMENTS = {*_OWN_OPTIONS, "path"}


def _split(tokens: list) -> tuple:
    """(the pipeline's path or None, the shim's options, RunGen's arguments) of what follows
    ``run``: the path is the first word that is no option's."""
    path, own, theirs = None, [], []
    tokens = iter(tokens)
    for token in tokens:
        option = token.partition("=")[0]
        if option in _OWN_OPTIONS:
            own.append(token)
            value = next(tokens, None) if _OWN_OPTIONS[option] and "=" not in token else None
            if value is not None:
                own.append(value)
        elif path is None and not token.startswith("-"):
            path = token
        else:
            theirs.append(token)
    return path, own, theirs


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _chunk_extents(text: str) -> tuple:
    """--chunks' extents, x first: ``512x512``."""
    parts = text.lower().split("x")
    # (ASCII digits: str.isdigit takes '²', which int() refuses)
    if not all(re.fullmatch(r"[0-9]+", part) and int(part) > 0 for part in parts):
        raise argparse.ArgumentTypeError(f"expected chunk extents WxH (x first), each a "
                                         f"positive integer, got {text!r}")
    return tuple(int(part) for part in parts)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    prog = prog or program_name()
    parser = argparse.ArgumentParser(prog=prog, allow_abbrev=False,
                                     description="Run ahead-of-time compiled Halide pipelines.")
    parser.add_argument("--version", action="version", version=f"halide-shim {shim.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    info = commands.add_parser("info", help="show a pipeline's name, target and arguments "
                                            "(with defaults, ranges and estimates)")
    info.add_argument("pipeline", help="path of the pipeline's shared library")
    info.add_argument("--name", help="which pipeline, if the library holds several")
    info.set_defaults(handler=_info)

    for name, text in (("run", "run a pipeline on inputs from files or made up, time it"),
                       ("profile", "run, then show what the runtime did (summary table)")):
        run = commands.add_parser(
            name, help=text, add_help=False, allow_abbrev=False,
            usage=f"{prog} {name} PIPELINE.so NAME=VALUE ... [RunGen's flags] [options]",
            description=text + ", with Halide's RunGen command line, read and answered as "
            "RunGen reads and answers it: the pipeline's arguments as NAME=VALUE, inputs as a "
            "file (.npy, PNG, JPEG, PGM, PPM; TIFF and BMP the shim's) or zero:[W,H,...], "
            "constant:VALUE:[W,H,...], identity:[W,H,...], random:SEED:[W,H,...] (RunGen's "
            "values, bit for bit; extents x first; estimate, auto or estimate_then_auto in "
            "place of the extents), scalars by value, default or estimate, outputs as FILE "
            "(written byte for byte as RunGen writes it); RunGen's flags --describe, "
            "--benchmarks=all, --benchmark_min_time=SECONDS, --parsable_output, "
            "--output_extents=[W,H,...]|estimate, --estimate_all, "
            "--default_input_buffers[=VALUE], --default_input_scalars[=VALUE], "
            "--track_memory, --quiet, --verbose, --success, --skip_bad_environment, "
            "--name=NAME. `%(prog)s PIPELINE.so --help` prints RunGen's usage (with --verbose, "
            "then this and the pipeline's arguments). The shim's own, which RunGen refuses: "
            "--NAME=VALUE, MIN+EXTENT for a dimension, WxH extents, outputs as FILE:[W,H,...] "
            "or :[W,H,...] (sized, not saved: its values summed up), and the options below. "
            "A failure ends as RunGen's do: its message, then SIGABRT (status 134 in a shell).")
        run.add_argument("-h", dest="help", action="store_true",
                         help="show this help (`PIPELINE.so --help`: RunGen's usage)")
        shim_options = run.add_argument_group("the shim's options")
        shim_options.add_argument(
            "--device", choices=kinds(),
            help="put the inputs on this device before the runs (default: the GPU API the "
                 "pipeline runs on, else host memory)")
        shim_options.add_argument(
            "--iterations", type=_positive, metavar="N",
            help="timed runs after one warm-up run, and their times (min, median, mean); "
                 "the device is synchronized after each")
        shim_options.add_argument("--profile", metavar="TRACE.json",
                                  help="save a Chrome trace of the timed runs (Perfetto opens it)")
        shim_options.add_argument(
            "--chunks", type=_chunk_extents, metavar="WxH",
            help="run once over the inputs in chunks of W x H (x first, like the extents; "
                 "dimensions left out whole) through dask, with a progress bar: .npy inputs and "
                 "outputs stream through memory maps (needs the dask extra)")
        shim_options.add_argument(
            "--npy_order", choices=images.NPY_ORDERS, default="numpy",
            help=".npy files' shape: numpy's (default: a W x H image is (H, W), as np.save "
                 "writes it and np.load gives it) or halide_image_io's, which RunGen reads and "
                 "writes (the same bytes, the shape listed x first: (W, H))")
        shim_options.add_argument(
            "--scheduler", metavar="ADDRESS",
            help="with --chunks: the distributed scheduler to run on (tcp://HOST:PORT; "
                 "default: dask's threads here)")
        run.set_defaults(command_parser=run)

    build.add_parser(commands, prog)

    demo = commands.add_parser("demo", help="build the sample pipelines and run them")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    index = next((i for i, text in enumerate(argv) if not text.startswith("-")), len(argv))
    command = argv[index] if index < len(argv) else None
    try:
        if command in ("run", "profile"):
            # What follows is RunGen's command line and the shim's options (_run reads them);
            # argparse sees the command alone.
            run_parser = parser.parse_args(argv[:index + 1]).command_parser
            return _run(command, argv[index + 1:], run_parser, parser.prog)
        args = parser.parse_args(argv)
        return args.handler(args, parser)
    except shim.ArgumentError as e:
        parser.exit(2, f"{parser.prog} {command}: error: {e}\n")
    except shim.ShimError as e:
        print(f"{parser.prog} {command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{parser.prog} {command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader left (| head): what is left to print goes nowhere, as for other tools.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except MemoryError as e:  # (the sizes fit the machine, but not what this process may take)
        print(f"{parser.prog} {command}: out of memory: {e}", file=sys.stderr)
        return 1
