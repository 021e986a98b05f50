"""The `specserve` command line: `main(argv)` runs one command. Each command's flags and body
live in a module of this package: models, generate, tune, bench, training (train-drafter,
finetune), up, drain, loadtest, variants; model commands load through platform/serving.py.
An import inside a function says `# lazy: +T (what it loads)`: the time it adds to the CLI's bare
start (0.12 s: `specserve --help` and the admin commands), measured on the 2-core dev machine."""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from specserve.cli import (
    bench,
    drain,
    faults,
    generate,
    loadtest,
    models,
    training,
    tune,
    up,
    variants,
)

COMMANDS = (
    models,
    generate,
    tune,
    bench,
    training,
    up,
    drain,
    loadtest,
    variants,
    faults,
)  # in --help order


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specserve", description="Multi-tenant LLM serving with lossless speculative decoding."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, ValidationError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
