"""The `fewshot` command: every sub-command is a `Command` (settings dataclasses + run)."""

from __future__ import annotations

import argparse
import sys

from fewshot.allocator import retain_freed_memory
from fewshot.compare import COMMANDS as COMPARE_COMMANDS
from fewshot.convert import COMMANDS as CONVERT_COMMANDS
from fewshot.errors import FewshotError
from fewshot.evaluate import COMMANDS as EVAL_COMMANDS
from fewshot.hpo.cli import COMMANDS as HPO_COMMANDS
from fewshot.interrupt import Interrupted, exit_status, signals_raise
from fewshot.metaoptnet_import import COMMANDS as IMPORT_COMMANDS
from fewshot.plot import COMMANDS as PLOT_COMMANDS
from fewshot.settings import Command, OneLineParser, add_flags
from fewshot.train_command import COMMANDS as TRAIN_COMMANDS

COMMANDS: list[Command] = [
    *TRAIN_COMMANDS,
    *EVAL_COMMANDS,
    *COMPARE_COMMANDS,
    *PLOT_COMMANDS,
    *IMPORT_COMMANDS,
    *CONVERT_COMMANDS,
    *HPO_COMMANDS,
]


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser: one sub-parser per command, flags from its settings."""
    parser = OneLineParser(
        prog="fewshot", description="Few-shot meta-learning with ensemble hypergradients (EHG)."
    )
    groups: dict[tuple[str, ...], argparse._SubParsersAction] = {
        (): parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    }
    for command in COMMANDS:
        for depth in range(1, len(command.path)):
            prefix = command.path[:depth]
            if prefix not in groups:
                group = groups[prefix[:-1]].add_parser(prefix[-1], help=f"{prefix[-1]} commands")
                groups[prefix] = group.add_subparsers(
                    dest="_".join(prefix), required=True, parser_class=OneLineParser
                )
        sub = groups[command.path[:-1]].add_parser(
            command.path[-1],
            help=command.help,
            description=command.help,
        )
        for cls in command.settings:
            add_flags(sub, cls)
        sub.set_defaults(_command=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point. User errors print one line and exit 2; an interruption exits 128 + signal."""
    args = build_parser().parse_args(argv)
    command: Command = args._command
    name = "fewshot " + " ".join(command.path)
    retain_freed_memory()  # no page faults on re-allocated activations: faster CPU steps
    try:
        with signals_raise():
            command.run(*command.build_settings(args))
    except FewshotError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Interrupted) as e:
        print(f"{name}: interrupted{': ' + str(e) if str(e) else ''}", file=sys.stderr)
        return exit_status(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
