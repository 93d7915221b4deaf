"""runtime.cache: where arrays are kept between processes, and caching off."""

from __future__ import annotations

from pathlib import Path

import numpy as np

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
