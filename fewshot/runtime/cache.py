"""Arrays worth keeping between processes (decoded images), in one folder per user, and the
checked .npy entries every cache of the project writes (these and a frozen backbone's features).

The folder is `$FEWSHOT_CACHE`, else `$XDG_CACHE_HOME/fewshot`, else `~/.cache/fewshot`;
`FEWSHOT_CACHE=""` turns caching off, and so does a user without a home folder. A file is
named by a digest of everything it depends on, so a stale entry is never read. Each entry is
written with its checksum beside it (NAME.sha256: the SHA-256 of the array's dtype, shape and
bytes), checked before the array is used: an entry whose bytes changed, whose checksum is
missing (an earlier version wrote it) or that cannot be read is computed again and rewritten,
with one note on stderr naming it, never read as data. Caching is only a shortcut: a folder
that cannot be written (read-only, full, not a folder) means computing the array again, never
an error; an unwritable folder is said once, in a note on stderr.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np

from fewshot.runtime.errors import FewshotError, summary
from fewshot.runtime.io import atomic_save_npy, atomic_write_text

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
    """The array stored as `name` (a .npy file of the cache folder) where its checksum holds
    and `valid` accepts it, else `compute()`, stored there for the next process. `name` must
    change with anything the array depends on."""
    folder = cache_folder()
    path = folder / name if folder is not None else None
    if path is not None:
        stored = load_checked(path, "cache entry", "computed again", valid)
        if stored is not None:
            return stored
    array = compute()
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_checked(array, path)
        except (OSError, FewshotError) as e:  # read-only, full, not a folder: computed again
            _note_unwritable(folder, path, e)
    return array


def array_sha256(array: np.ndarray) -> str:
    """The SHA-256 of an array's dtype, shape and bytes (in C order): a cache entry's checksum."""
    digest = hashlib.sha256(f"{array.dtype.str}:{array.shape}".encode())
    digest.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    return digest.hexdigest()


def checksum_path(path: Path) -> Path:
    """The file beside the cache entry `path` that holds its checksum."""
    return path.with_name(f"{path.name}.sha256")


def save_checked(array: np.ndarray, path: Path) -> None:
    """Write `array` to `path` as .npy, then its checksum beside it, each atomically: an entry
    cut short between the two has no checksum of its own and is computed again."""
    atomic_save_npy(array, path)
    atomic_write_text(f"{array_sha256(array)}\n", checksum_path(path))


def load_checked(
    path: Path,
    label: str,
    redo: str,
    valid: Callable[[np.ndarray], bool],
    mmap_mode: Literal["c"] | None = None,
) -> np.ndarray | None:
    """The array of the cache entry `path` (memory-mapped with `mmap_mode`) where its checksum
    holds and `valid` accepts it; else None, after one note naming the entry and what was
    wrong ("note: LABEL PATH failed its checksum: REDO"). No entry at all is None unsaid."""
    if not path.is_file():
        return None
    array, problem = _verified(path, mmap_mode)
    if array is not None and not valid(array):
        array, problem = None, f"holds {array.dtype} {array.shape}, not the array expected"
    if array is None:
        print(f"note: {label} {path} {problem}: {redo}", file=sys.stderr)
    return array


def _verified(path: Path, mmap_mode: Literal["c"] | None) -> tuple[np.ndarray | None, str]:
    """The array stored at `path` if its checksum holds, else None and what is wrong with it."""
    try:
        expected = checksum_path(path).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None, "has no checksum (written by an earlier version, or cut short)"
    try:  # the file is read once: the checksum is of the array (or the mapping) then used
        array = np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        return None, f"cannot be read ({summary(e)})"
    if not isinstance(array, np.ndarray):  # an .npz archive: np.load opens it lazily
        array.close()
        return None, "is not a .npy array"
    if array_sha256(array) != expected:
        return None, "failed its checksum"
    return array, ""


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
