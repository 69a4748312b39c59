"""``python -m shim build``: a Halide generator of the user's built into the shared library
``shim.load`` takes, with the halide the user installed (docs/own-pipeline.md).

    python -m shim build my_generator.py target=host-opencl [-o DIR] [-g NAME] [-f FUNCTION] [NAME=VALUE ...]
    python -m shim build ./my_generator -g my_pipeline target=host   # a C++ generator (GenGen)

GENERATOR is a Python script of ``hl.generator`` classes, run by this Python (whose halide
builds it; the script's only generator unless ``-g`` names one), or a generator executable (a
C++ generator linked with Halide's GenGen). The build is the sample pipelines' recipe,
shim.pipelines.build.compile_library: Halide's object file, or for several comma-separated
targets its static library with the dispatcher, linked into DIR/FUNCTION.so.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from shim.base.errors import ArgumentError, BuildError

# Runs a Python generator's script with Halide's generator command line, in a process that
# never imports the shim.
_PYTHON_GENERATOR = Path(__file__).with_name("python_generator.py")


def add_parser(commands, prog: str) -> None:
    """The ``build`` command, among the command line's (shim/cli/main.py)."""
    parser = commands.add_parser(
        "build", help="build a Halide generator into the .so shim.load takes (needs halide "
                      "for a Python generator, and a C compiler)",
        usage=f"{prog} build GENERATOR [target=TARGET] [NAME=VALUE ...] [-g NAME] "
              f"[-f FUNCTION] [-o DIR]",
        description="Build a Halide generator into a shared library: GENERATOR is a Python "
                    "script of hl.generator classes (built by this Python's halide) or a "
                    "generator executable (a C++ generator linked with Halide's GenGen). "
                    "TARGET is Halide's target string (default host): host-opencl, "
                    "host-cuda-cuda_capability_61, host-no_runtime (the library then runs on "
                    "the shim's runtime only), or several, comma-separated, for a multitarget "
                    "library. Other NAME=VALUE are the generator's parameters. Prints the "
                    "library's path, DIR/FUNCTION.so (docs/own-pipeline.md).")
    _add_options(parser)
    parser.add_argument("generator", metavar="GENERATOR",
                        help="a Python generator (.py) or a generator executable")
    # Everything after GENERATOR, options included: argparse stops taking NAME=VALUE words
    # at the first option after them, so run() reads these with parse_intermixed_args.
    parser.add_argument("values", nargs=argparse.REMAINDER, metavar="NAME=VALUE",
                        help="target=TARGET and the generator's parameters")
    parser.set_defaults(handler=run, command_parser=parser)


def _add_options(parser) -> None:
    parser.add_argument("-g", dest="generator_name", metavar="NAME",
                        help="which generator (default: a Python script's only one)")
    parser.add_argument("-f", dest="function", metavar="FUNCTION",
                        help="the pipeline's name, and the library's (default: the generator's)")
    parser.add_argument("-o", dest="out", metavar="DIR", default=".",
                        help="where the library goes (default: the current folder; made if "
                             "missing, private)")


def run(args, parser) -> int:
    if {"-h", "--help"} & set(args.values):
        parser.print_help()
        return 0
    again = argparse.ArgumentParser(prog=parser.prog, usage=parser.usage, add_help=False)
    _add_options(again)
    again.add_argument("values", nargs="*")
    again.parse_intermixed_args(args.values, namespace=args)
    target, parameters = "host", []
    for value in args.values:
        name, equals, text = value.partition("=")
        if not (equals and name and text):
            raise ArgumentError(value, "expected target=TARGET or a generator parameter as "
                                       "NAME=VALUE")
        if name == "target":
            target = text
        else:
            parameters.append(value)
    print(build(args.generator, target, Path(args.out), args.generator_name, args.function,
                parameters))
    return 0


def build(generator: str, target: str, out: Path, name: str | None = None,
          function: str | None = None, parameters=()) -> Path:
    """``generator`` built for ``target`` into ``out``/FUNCTION.so (replacing one there);
    returns its path, under ``out`` as given."""
    from shim.pipelines.build import BuildFailed, compile_library

    command = [*_program(generator), *(["-g", name] if name else []),
               *(["-f", function] if function else []), *parameters]
    try:
        out.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Built in a private folder of its own inside ``out``, named by mkdtemp, then renamed
        # into place: the library appears whole or not at all, and the tools' own temporary
        # files ($TMPDIR) are there too, out of others' reach.
        work = tempfile.mkdtemp(prefix=".shim-build-", dir=out.absolute())
    except OSError as e:
        raise ArgumentError("-o", f"cannot build in {out}: {e}") from None
    try:
        try:
            library = compile_library(command, target, work, dict(os.environ, TMPDIR=work))
        except BuildFailed as e:
            raise BuildError(f"building {generator} for target {target} failed: {e}") from None
        final = out / library.name
        try:
            os.replace(library, final)
        except OSError as e:
            raise ArgumentError("-o", f"cannot put the library at {final}: {e}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def _program(generator: str) -> list[str]:
    """The command that runs ``generator``'s generator command line."""
    path = Path(generator)
    if not path.is_file():
        raise ArgumentError("GENERATOR", f"no such file: {generator} (expected a Python "
                                         f"generator, .py, or a generator executable)")
    if path.suffix == ".py":
        from shim.pipelines.build import GET_HALIDE, installed_halide_version

        if installed_halide_version() is None:
            raise BuildError(f"building {generator} needs halide, which this Python "
                             f"({sys.executable}) cannot import: {GET_HALIDE}")
        return [sys.executable, str(_PYTHON_GENERATOR), str(path.resolve())]
    if not os.access(path, os.X_OK):
        raise ArgumentError("GENERATOR", f"{generator} is neither a Python generator (.py) nor "
                                         f"an executable (a C++ generator linked with GenGen)")
    return [str(path.resolve())]
