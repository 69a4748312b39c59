"""The command line: ``python -m shim COMMAND``."""

from __future__ import annotations

import argparse
import sys

import shim


def _info(args) -> int:
    pipeline = shim.load(args.pipeline, name=args.name)
    print(f"{pipeline.name}  ({pipeline.path})")
    print(f"target: {pipeline.target}")
    print("arguments:")
    for argument in pipeline.arguments:
        print(f"  {argument.describe()}")
    return 0


def _demo(args) -> int:
    from shim import demo

    return demo.run()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m shim",
                                     description="Run ahead-of-time compiled Halide pipelines.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    info = commands.add_parser("info", help="show a pipeline's name, target and arguments")
    info.add_argument("pipeline", help="path of the pipeline's shared library")
    info.add_argument("--name", help="which pipeline, if the library holds several")
    info.set_defaults(handler=_info)

    demo = commands.add_parser("demo", help="build the sample pipelines and run them")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except shim.ArgumentError as e:
        parser.exit(2, f"{parser.prog} {args.command}: error: {e}\n")
    except shim.ShimError as e:
        print(f"{parser.prog} {args.command}: {e}", file=sys.stderr)
        return 1
