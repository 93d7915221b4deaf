"""`python -m fewshot`: the `fewshot` command."""

import sys

from fewshot.cli import run

sys.exit(run())
