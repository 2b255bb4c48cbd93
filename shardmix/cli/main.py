"""``shardmix``: the console entry point; each subcommand lives in its own module.

A subcommand module ``shardmix.cli.<name>`` provides ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``, importing the library inside ``run`` so that ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from shardmix import __version__
from shardmix.errors import ShardmixError

SUBCOMMANDS = ("convert", "inspect", "stat")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardmix", description="Stream sharded training data into PyTorch, every batch mixed."
    )
    parser.add_argument("--version", action="version", version=f"shardmix {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"shardmix.cli.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"shardmix.cli.{name}":
                raise
            continue
        sub = commands.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run a subcommand; bad input (a ShardmixError, OSError or ValueError) is one line on
    stderr and exit status 2, never a traceback."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (ShardmixError, OSError, ValueError, ImportError) as error:
        text = " ".join([str(error), *getattr(error, "__notes__", ())]).replace("\n", " ")
        print(f"shardmix {args.command}: error: {text}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
