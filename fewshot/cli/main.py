"""The `fewshot` command: every sub-command is a `Command` (settings dataclasses + run)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable

import fewshot
from fewshot.cli.bench import COMMANDS as BENCH_COMMANDS
from fewshot.cli.compare import COMMANDS as COMPARE_COMMANDS
from fewshot.cli.convert import COMMANDS as CONVERT_COMMANDS
from fewshot.cli.data import COMMANDS as DATA_COMMANDS
from fewshot.cli.eval import COMMANDS as EVAL_COMMANDS
from fewshot.cli.import_metaoptnet import COMMANDS as IMPORT_COMMANDS
from fewshot.cli.predict import COMMANDS as PREDICT_COMMANDS
from fewshot.cli.show import COMMANDS as SHOW_COMMANDS
from fewshot.cli.sweep import COMMANDS as SWEEP_COMMANDS
from fewshot.cli.train import COMMANDS as TRAIN_COMMANDS
from fewshot.evaluation.plot import COMMANDS as PLOT_COMMANDS
from fewshot.hpo.cli import COMMANDS as HPO_COMMANDS
from fewshot.runtime.allocator import retain_freed_memory
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.settings import Command, OneLineParser, add_flags
from fewshot.runtime.signals import Interrupted, exit_status, signals_raise

COMMANDS: list[Command] = [
    *TRAIN_COMMANDS,
    *EVAL_COMMANDS,
    *PREDICT_COMMANDS,
    *SHOW_COMMANDS,
    *COMPARE_COMMANDS,
    *BENCH_COMMANDS,
    *SWEEP_COMMANDS,
    *PLOT_COMMANDS,
    *IMPORT_COMMANDS,
    *CONVERT_COMMANDS,
    *DATA_COMMANDS,
    *HPO_COMMANDS,
]


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser: one sub-parser per command, flags from its settings."""
    parser = OneLineParser(
        prog="fewshot", description="Few-shot meta-learning with ensemble hypergradients (EHG)."
    )
    parser.add_argument("--version", action="version", version=f"fewshot {fewshot.__version__}")
    # Command path prefix -> the add_parser of its sub-command group.
    adders: dict[tuple[str, ...], Callable[..., argparse.ArgumentParser]] = {
        (): parser.add_subparsers(
            dest="command", required=True, parser_class=OneLineParser
        ).add_parser
    }
    for command in COMMANDS:
        for depth in range(1, len(command.path)):
            prefix = command.path[:depth]
            if prefix not in adders:
                group = adders[prefix[:-1]](prefix[-1], help=f"{prefix[-1]} commands")
                adders[prefix] = group.add_subparsers(
                    dest="_".join(prefix), required=True, parser_class=OneLineParser
                ).add_parser
        sub = adders[command.path[:-1]](
            command.path[-1],
            # argparse %-formats a help string (compare's says "95% CI"), not a description.
            help=command.help.replace("%", "%%"),
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
            sys.stdout.flush()  # a closed pipe found here rather than at the interpreter's exit
    except FewshotError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # Whoever read the output has gone (`fewshot predict ... | head`): end as a pipe's
        # writer does, with nothing left for the interpreter's exit to flush into the pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except OSError as e:
        if e.filename is None:  # not about a path the user gave: a fault of ours
            raise
        # A path no check foresaw (a name longer than the file system allows, ...).
        print(f"{name}: error: {e.filename}: {e.strerror or e}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Interrupted) as e:
        print(f"{name}: interrupted{': ' + str(e) if str(e) else ''}", file=sys.stderr)
        return exit_status(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
