"""The `fewshot` command line: one module per command, `main` builds the parser from them."""

from __future__ import annotations

import sys


def run() -> int:
    """The installed `fewshot` command: Ctrl-C while torch and the commands load is one line."""
    try:
        from fewshot.cli.main import main

        return main()
    except KeyboardInterrupt:
        print("fewshot: interrupted", file=sys.stderr)
        return 130
