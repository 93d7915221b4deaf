"""The repository's own files: what git tracks, so that a file a user writes into the checkout
(an `--out` result in models/, a run folder) is none of them."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def tracked(*patterns: str) -> list[Path] | None:
    """The files git tracks that match the git pathspecs `patterns`, sorted; None outside a
    git checkout (or without git)."""
    try:
        done = subprocess.run(
            ["git", "ls-files", *patterns], cwd=REPO, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return sorted(REPO / name for name in done.stdout.split())
