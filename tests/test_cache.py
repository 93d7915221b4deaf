"""runtime.cache: where arrays are kept between processes, caching off, and a folder that
cannot be written (computed in memory, said once)."""

from __future__ import annotations

import errno
import tempfile
from pathlib import Path

import numpy as np
import pytest

from fewshot.runtime.cache import cache_folder, cached_array


def test_the_folder_is_fewshot_cache_else_xdg_else_home(tmp_path, monkeypatch):
    monkeypatch.setenv("FEWSHOT_CACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_folder() == tmp_path / "mine"
    monkeypatch.delenv("FEWSHOT_CACHE")
    assert cache_folder() == tmp_path / "xdg" / "fewshot"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_folder() == tmp_path / "home" / ".cache" / "fewshot"
    monkeypatch.setattr("os.path.expanduser", lambda path: path)  # no home folder known
    assert cache_folder() is None  # not a folder named "~" in the working directory
    monkeypatch.setenv("FEWSHOT_CACHE", "")
    assert cache_folder() is None


def test_an_array_is_computed_once_then_read(tmp_path, monkeypatch):
    monkeypatch.setenv("FEWSHOT_CACHE", str(tmp_path / "cache"))
    calls = []

    def compute() -> np.ndarray:
        calls.append(1)
        return np.arange(6, dtype=np.uint8).reshape(2, 3)

    for _ in range(2):
        got = cached_array("a.npy", compute, lambda a: a.shape == (2, 3))
        assert np.array_equal(got, np.arange(6).reshape(2, 3))
    assert len(calls) == 1
    assert [p.name for p in Path(tmp_path / "cache").iterdir()] == ["a.npy"]  # no temporaries
    # Caching off: computed every time, nothing written.
    monkeypatch.setenv("FEWSHOT_CACHE", "")
    cached_array("b.npy", compute, lambda a: True)
    assert len(calls) == 2 and not (tmp_path / "cache" / "b.npy").exists()


def read_only(monkeypatch, cache: Path) -> None:
    """A folder whose files cannot be made (a read-only home): what mkstemp meets there."""
    cache.mkdir()

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refused)


def full_disk(monkeypatch, cache: Path) -> None:
    """A disk that fills while the array is written."""
    save = np.save

    def filling(file, array, **kwargs):
        save(file, array[:1], **kwargs)  # part of it written, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "save", filling)


def not_a_folder(monkeypatch, cache: Path) -> None:
    """The cache's path names a file."""
    cache.write_text("")


def entry_a_folder(monkeypatch, cache: Path) -> None:
    """The entry's name is taken by a folder."""
    (cache / "a.npy").mkdir(parents=True)


@pytest.mark.parametrize(
    ("make", "cause", "kept"),
    [
        (read_only, "Permission denied", []),
        (full_disk, "No space left on device", []),
        (not_a_folder, "File exists", []),
        # The other entry is written: only the one whose name is taken is not.
        (entry_a_folder, "it is a folder", ["a.npy", "b.npy"]),
    ],
)
def test_a_cache_that_cannot_be_written_costs_the_work_and_one_note(
    make, cause, kept, tmp_path, monkeypatch, capsys
):
    cache = tmp_path / "cache"
    monkeypatch.setenv("FEWSHOT_CACHE", str(cache))
    monkeypatch.setattr("fewshot.runtime.cache._NOTED", set())
    make(monkeypatch, cache)
    calls = []

    def compute() -> np.ndarray:
        calls.append(1)
        return np.arange(6, dtype=np.uint8).reshape(2, 3)

    for name in ("a.npy", "b.npy", "a.npy"):
        got = cached_array(name, compute, lambda a: a.shape == (2, 3))
        assert np.array_equal(got, np.arange(6).reshape(2, 3))
    assert len(calls) == 3  # a.npy computed again: not kept
    (note,) = capsys.readouterr().err.splitlines()  # said once, however many arrays
    assert note.startswith(f"note: cannot write {cache}") and cause in note
    assert "works in memory" in note
    # No temporary left behind.
    assert (sorted(p.name for p in cache.iterdir()) if cache.is_dir() else []) == kept
