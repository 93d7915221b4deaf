"""Arrays worth keeping between processes (decoded images), in one folder per user.

The folder is `$FEWSHOT_CACHE`, else `$XDG_CACHE_HOME/fewshot`, else `~/.cache/fewshot`;
`FEWSHOT_CACHE=""` turns caching off, and so does a user without a home folder. A file is
named by a digest of everything it depends on, so a stale entry is never read. Caching is only
a shortcut: a folder that cannot be written, or an entry that cannot be read, means computing
the array again, never an error.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fewshot.runtime.io import atomic_save_npy


def cache_folder() -> Path | None:
    """The cache folder, or None when `FEWSHOT_CACHE` is set empty (caching off) or no folder
    is known (no XDG_CACHE_HOME and no home folder: a container's user without one)."""
    chosen = os.environ.get("FEWSHOT_CACHE")
    if chosen is not None:
        return Path(chosen) if chosen else None
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "fewshot"
    home = os.path.expanduser("~")
    return Path(home) / ".cache" / "fewshot" if home != "~" else None


def cached_array(
    name: str, compute: Callable[[], np.ndarray], valid: Callable[[np.ndarray], bool]
) -> np.ndarray:
    """The array stored as `name` (a .npy file of the cache folder) where `valid` accepts it,
    else `compute()`, stored there for the next process. `name` must change with anything the
    array depends on."""
    folder = cache_folder()
    path = folder / name if folder is not None else None
    if path is not None and path.is_file():
        try:
            array = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError):
            array = None  # unreadable (a disk fault, a file not ours): computed again
        if array is not None and valid(array):
            return array
    array = compute()
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_save_npy(array, path)
        except OSError:
            pass  # a read-only or full disk: the next process computes it again
    return array
