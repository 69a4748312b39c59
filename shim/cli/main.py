"""The command line: ``python -m shim COMMAND`` (or ``halide-shim COMMAND``).

    python -m shim info P.so
    python -m shim run P.so input=in.png scale=0.5 output=out.png [--benchmarks=all]
    python -m shim profile P.so --input=random:0:[640,480] [--profile trace.json]
    python -m shim build my_generator.py target=host-opencl [-o DIR]
    python -m shim demo

``run`` and ``profile`` take Halide's RunGen command line: the pipeline's arguments as
``NAME=VALUE`` (or ``--NAME=VALUE``) in RunGen's value syntax (shim/cli/run_values.py), and
RunGen's flags (``--benchmarks=all``, ``--output_extents=[W,H]``, ``--estimate_all``, ...)
beside the shim's own (``--iterations``, ``--device``, ``--profile``); shim/cli/runner.py runs it.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys

import shim
from shim.profiling import halide_profiler
from shim.cli import build
from shim.cli import images
from shim.cli import runner
from shim.cli import timing
from shim.backends.devices import kinds
from shim.base.elf import pipeline_names

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


def _run(args, parser) -> int:
    if args.pipeline is None:
        if args.help:
            parser.print_help()
            return 0
        parser.error("the following arguments are required: pipeline")
    pipeline = _load(args)
    own = _pipeline_parser(pipeline, parser.prog)
    if args.help:
        parser.print_help()
        print()
        own.print_help()
        return 0
    if args.describe:
        print(runner.describe(pipeline))
        return 0
    if args.skip_bad_environment:
        reason = runner.unavailable_device(pipeline)
        if reason is not None:
            print(f"[SKIP] {reason}")
            return 0
    if args.benchmarks and args.iterations is not None:
        parser.error("--iterations and --benchmarks=all both choose the timed runs: give one")
    if args.estimate_all:
        args.default_input_buffers = "random:0:estimate_then_auto"
        args.default_input_scalars = "estimate"
        args.output_extents = "estimate"
    args.iterations = args.iterations or 1
    pipeline_values = [f"--{text}" if "=" in text and not text.startswith(("-", "=")) else text
                       for text in args.values]  # RunGen's NAME=VALUE
    given, unknown = own.parse_known_args(pipeline_values)
    named = [text for text in unknown if text.startswith("--") and "=" in text[3:]]
    if named:
        # RunGen's words for a NAME=VALUE whose NAME the pipeline lacks.
        name = named[0][2:].partition("=")[0]
        own.error(f"Unknown argument name: {name} ({pipeline.name} takes "
                  f"{', '.join(a.name for a in pipeline.arguments)})")
    if unknown:
        own.error(f"unrecognized arguments: {' '.join(unknown)}")
    texts = {name: text for name, text in vars(given).items() if text is not None}
    console = runner.Console(args.verbose)
    if args.command == "profile":
        # The summary's Stages tables show Halide's profiler figures: its own report at exit
        # would repeat them (it stays where the program or the environment sends it).
        halide_profiler.silence_exit_report_unless_chosen()
    if (args.chunks is not None or args.scheduler is not None) and args.npy_order != "numpy":
        parser.error("--chunks streams .npy files in numpy's order only: leave out --npy_order")
    if args.chunks is not None or args.scheduler is not None:
        from shim.cli import run_chunked  # (its dask is an optional extra)

        run = run_chunked.run
    else:
        run = runner.run
    if args.benchmarks and args.track_memory:
        console.warn("--track_memory slows every allocation down: the benchmark's times are "
                     "not representative")
    try:
        return run(args, pipeline, texts, console)
    except shim.ArgumentError as e:
        own.error(str(e))


def _pipeline_parser(pipeline, prog: str) -> argparse.ArgumentParser:
    """The parser of a pipeline's own arguments, made from its metadata."""
    own = argparse.ArgumentParser(
        prog=f"{prog} {pipeline.path}", add_help=False, allow_abbrev=False,
        usage=f"{prog} {pipeline.path} NAME=VALUE ... [options]",
        description=f"Arguments of {pipeline.name} (target {pipeline.target}), as NAME=VALUE "
                    f"or --NAME=VALUE. Extents: [W,H,...] (x first); the shim's own (not "
                    f"RunGen's): MIN+EXTENT per dimension, [3+1530,3+2554], and WxH.")
    for argument in pipeline.arguments:
        own.add_argument(f"--{argument.name}", help=argument.describe(),
                         metavar=_metavar(argument), action=_GivenOnce)
    return own


class _GivenOnce(argparse.Action):
    """A pipeline's argument: one value, not empty (RunGen refuses both; an empty value is
    often a shell variable that was not set)."""

    def __call__(self, parser, namespace, value, option_string=None):
        if getattr(namespace, self.dest) is not None:
            raise argparse.ArgumentError(self, "given twice")
        if not value:
            raise argparse.ArgumentError(self, "expected a value")
        setattr(namespace, self.dest, value)


def _metavar(argument) -> str:
    if argument.is_output:
        return "FILE|FILE:[W,H,...]|:[W,H,...] (the last two the shim's)"
    if argument.is_buffer:
        return ("FILE|zero:EXT|constant:V:EXT|identity:EXT|random:SEED:EXT "
                "(EXT: [W,H,...], estimate, auto or estimate_then_auto)")
    return "VALUE|default|estimate"


def _rungen_style(values: list) -> list:
    """RunGen's flags in argparse's spelling: ``-flag`` as ``--flag``, ``--switch=true|false``
    as the switch or nothing, a flag without its optional value with RunGen's implied one."""
    spelled = []
    for text in values:
        name, equals, value = text.lstrip("-").partition("=")
        if text.startswith("-") and name in _RUNGEN_FLAGS:
            if name in _SWITCHES and equals:
                if value.lower() not in ("true", "false"):
                    raise argparse.ArgumentTypeError(f"--{name}: expected true or false, got "
                                                     f"{value!r}")
                if value.lower() == "true":
                    spelled.append(f"--{name}")
                continue
            if name in _IMPLIED_VALUES and not equals:
                text = f"--{name}={_IMPLIED_VALUES[name]}"
            spelled.append("--" + text.lstrip("-"))
        else:
            spelled.append(text)
    return spelled


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


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < math.inf:  # (nan is neither; inf would never end)
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


# RunGen's flags, in the order --help lists them: argparse's keywords for each. A switch
# (store_true) is true or false: ``--quiet``, ``--quiet=true``, ``--quiet=false``; ``implied``
# is the value of a flag given without one.
_RUNGEN = {
    "benchmarks": dict(choices=["all"], implied="all",
                       help="RunGen's adaptive benchmark instead of --iterations: report the "
                            "best time"),
    "benchmark_min_time": dict(type=_seconds, metavar="SECONDS",
                               default=timing.DEFAULT_MIN_TIME,
                               help="least time the benchmark runs for (default %(default)s)"),
    "parsable_output": dict(action="store_true",
                            help="print the timings one 'PIPELINE  KEY  VALUE' per line"),
    "describe": dict(action="store_true",
                     help="print the names and types of the arguments and exit"),
    "output_extents": dict(metavar="[W,H,...]|estimate",
                           help="the extents of every output (a dimension may be MIN+EXTENT), "
                                "or their estimates"),
    "estimate_all": dict(action="store_true",
                         help="estimates for everything: --default_input_buffers="
                              "random:0:estimate_then_auto --default_input_scalars=estimate "
                              "--output_extents=estimate"),
    "default_input_buffers": dict(metavar="VALUE", implied="zero:auto",
                                  help="the value of every input buffer not given "
                                       "(alone: zero:auto)"),
    "default_input_scalars": dict(metavar="VALUE", implied="estimate,default",
                                  help="the value of every scalar not given "
                                       "(alone: estimate,default)"),
    "track_memory": dict(action="store_true",
                         help="print the most host memory the pipeline held at once "
                              "(halide_malloc)"),
    "quiet": dict(action="store_true", help="drop what the pipeline prints"),
    "verbose": dict(action="store_true", help="say how sizes were chosen"),
    "success": dict(action="store_true", help="print 'Success!' after a successful run"),
    "skip_bad_environment": dict(action="store_true",
                                 help="print [SKIP] and exit 0 when the pipeline's device API "
                                      "is not available"),
}
_SWITCHES = {name for name, options in _RUNGEN.items() if options.get("action") == "store_true"}
_IMPLIED_VALUES = {name: options["implied"] for name, options in _RUNGEN.items()
                   if "implied" in options}
# (--name and --help are the shim's, spelled as RunGen spells its own)
_RUNGEN_FLAGS = {*_RUNGEN, "name", "help"}


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
            usage=f"{prog} {name} PIPELINE.so NAME=VALUE ... [options]",
            description=text + ", with Halide's RunGen command line. The pipeline's arguments "
            "follow as NAME=VALUE (or --NAME=VALUE): inputs as a file (.npy, PNG, JPEG, PGM, "
            "PPM, BMP, TIFF) or zero:[W,H,...], constant:VALUE:[W,H,...], "
            "identity:[W,H,...], random:SEED:[W,H,...] (RunGen's values, bit for bit; extents "
            "x first; estimate, auto or estimate_then_auto in place of the extents); scalars "
            "by value, default or estimate (the pipeline's default if not given); outputs as "
            "FILE (default size: the largest the inputs cover, starting like the first input, "
            "else the estimates, with a warning). The shim's own, which RunGen refuses: "
            "MIN+EXTENT for a dimension, WxH extents, outputs as FILE:[W,H,...] or :[W,H,...]. "
            "A file of another type or dimensionality is converted as RunGen does, with a "
            "warning. `%(prog)s PIPELINE.so --help` lists the pipeline's arguments.")
        run.add_argument("pipeline", nargs="?", metavar="PIPELINE.so",
                         help="path of the pipeline's shared library")
        run.add_argument("-h", "--help", action="store_true",
                         help="show this help (and the pipeline's arguments, after its path)")
        shim_options = run.add_argument_group("the shim's options")
        shim_options.add_argument("--name", help="which pipeline, if the library holds several")
        shim_options.add_argument(
            "--device", choices=kinds(),
            help="put the inputs on this device before the runs (default: the GPU API the "
                 "pipeline runs on, else host memory)")
        shim_options.add_argument(
            "--iterations", type=_positive, metavar="N",
            help="timed runs after one warm-up run (default 1); the device is synchronized "
                 "after each")
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
        rungen = run.add_argument_group(
            "RunGen's flags", "as Halide's RunGen takes them (also -flag; switches also "
                              "=true or =false)")
        for name, options in _RUNGEN.items():
            options = {key: value for key, value in options.items() if key != "implied"}
            rungen.add_argument(f"--{name}", **options)
        run.set_defaults(handler=_run, command_parser=run)

    build.add_parser(commands, prog)

    demo = commands.add_parser("demo", help="build the sample pipelines and run them")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((text for text in argv if not text.startswith("-")), None)
    if command in ("run", "profile"):
        try:
            argv = _rungen_style(argv)
        except argparse.ArgumentTypeError as e:
            parser.exit(2, f"{parser.prog} {command}: error: {e}\n")
    args, unknown = parser.parse_known_args(argv)
    if args.command in ("run", "profile"):
        args.values = [v for v in unknown if v != "--"]
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.handler(args, getattr(args, "command_parser", parser))
    except shim.ArgumentError as e:
        parser.exit(2, f"{parser.prog} {args.command}: error: {e}\n")
    except shim.ShimError as e:
        print(f"{parser.prog} {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{parser.prog} {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader left (| head): what is left to print goes nowhere, as for other tools.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except MemoryError as e:  # (the sizes fit the machine, but not what this process may take)
        print(f"{parser.prog} {args.command}: out of memory: {e}", file=sys.stderr)
        return 1
