"""Arrays worth keeping between processes (decoded images), in one folder per user.

The folder is `$FEWSHOT_CACHE`, else `$XDG_CACHE_HOME/fewshot`, else `~/.cache/fewshot`;
`FEWSHOT_CACHE=""` turns caching off, and so does a user without a home folder. A file is
named by a digest of everything it depends on, so a stale entry is never read. Caching is only
a shortcut: a folder that cannot be written (read-only, full, not a folder), or an entry that
cannot be read, means computing the array again, never an error; an unwritable folder is said
once, in a note on stderr.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_save_npy

# The folders already said to be unwritable: one note a process, however many arrays.
_NOTED: set[Path] = set()


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
    if path is not None:
        try:
            stored = np.load(path, allow_pickle=False) if path.is_file() else None
        except (OSError, ValueError, EOFError):
            stored = None  # unreadable (a disk fault, a folder not ours, a file not ours)
        if stored is not None and valid(stored):
            return stored
    array = compute()
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_save_npy(array, path)
        except (OSError, FewshotError) as e:  # read-only, full, not a folder: computed again
            _note_unwritable(folder, path, e)
    return array


def _note_unwritable(folder: Path, path: Path, error: Exception) -> None:
    """Say once per process and folder that the cache cannot be written, and what follows."""
    if folder in _NOTED:
        return
    _NOTED.add(folder)
    problem = (
        f"cannot write {error.filename or path}: {error.strerror or error}"
        if isinstance(error, OSError)
        else str(error)  # a FewshotError of the atomic write, naming the path and the cause
    )
    print(
        f"note: {problem}; the cache is skipped, this process works in memory (FEWSHOT_CACHE "
        "names another folder, FEWSHOT_CACHE= none)",
        file=sys.stderr,
    )
