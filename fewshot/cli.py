"""The `fewshot` command: each sub-command lives in its own module's `add_parser`."""

from __future__ import annotations

import argparse
import importlib
import sys

from fewshot.errors import FewshotError

# Modules that define `add_parser(subparsers)`, each adding one or more sub-commands.
COMMAND_MODULES = (
    "fewshot.train",
    "fewshot.evaluate",
    "fewshot.hpo.cli",
    "fewshot.metaoptnet_import",
)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every sub-command."""
    parser = argparse.ArgumentParser(
        prog="fewshot", description="Few-shot meta-learning with ensemble hypergradients (EHG)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point: run a sub-command; user errors print one line and exit with status 2."""
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except FewshotError as e:
        print(f"fewshot {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
