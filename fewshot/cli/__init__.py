"""The `fewshot` command line: one module per command, `main` builds the parser from them."""

from __future__ import annotations


def run() -> int:
    """The installed `fewshot` command: a signal while torch and the commands load, while the
    flags are read, or once the command is done ends it at once in one line (an exception there
    would leave half-imported modules behind, or a traceback of the interpreter's exit)."""
    from fewshot.runtime.signals import ignore_signals, stop_signals_at_once

    stop_signals_at_once()  # `main` handles signals its own way during the command only
    from fewshot.cli.main import main
    from fewshot.runtime.distributed import end_rank

    status = main()
    ignore_signals()  # the status is known: nothing left for a signal to stop
    end_rank(status)  # under torchrun: no finalisation to abort a finished rank
    return status
