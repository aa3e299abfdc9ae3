"""`python -m convert SUBCOMMAND ...`: checkpoint conversion from the command line.

Each subcommand lives in its own module with `register(subparsers)`, which adds its parser and sets
`func` (args -> exit status) as a default. To add one, write the module and append it to SUBCOMMANDS.
Those modules import jax only inside `func`, so that `--help` stays fast.
"""

from __future__ import annotations

import argparse
import sys

from convert import drafter_cli, target

SUBCOMMANDS = (target, drafter_cli)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m convert",
        description="Convert Hugging Face safetensors checkpoints to jaxspec's Orbax format.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from jaxspec.sharding import claim_device_memory   # here, not at the top: --help stays fast
    claim_device_memory()       # the weights are cast on the device: 90% of it, not JAX's 75%
    try:
        return args.func(args)
    except KeyboardInterrupt:  # Ctrl-C: the save has removed its temp dir; no traceback
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
