"""The `fewshot` command line: one module per command, `main` builds the parser from them."""

from __future__ import annotations


def run() -> int:
    """The installed `fewshot` command: a signal while torch and the commands load ends it at
    once in one line (an exception there would leave half-imported modules behind)."""
    from fewshot.runtime.signals import ignore_signals, signals_stop_at_once

    with signals_stop_at_once():
        from fewshot.cli.main import main
        from fewshot.runtime.distributed import end_rank
    status = main()
    # The command is done: a signal now would only kill the interpreter's exit (status -2, or
    # a traceback from its finalisation).
    ignore_signals()
    end_rank(status)  # under torchrun: no finalisation to abort a finished rank
    return status
