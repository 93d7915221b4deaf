"""runtime.cache: where arrays are kept between processes, caching off, a folder that cannot be
written (computed in memory, said once), and entries checked before they are read: one whose
bytes changed, whose checksum is gone or that is cut short is computed again with one note."""

from __future__ import annotations

import errno
import hashlib
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest

from fewshot.cli.main import main
from fewshot.datasets import REPO_DATA
from fewshot.runtime.cache import cache_folder, cached_array, checksum_path


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
    # The entry and its checksum, no temporaries.
    assert sorted(p.name for p in Path(tmp_path / "cache").iterdir()) == ["a.npy", "a.npy.sha256"]
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
        (entry_a_folder, "it is a folder", ["a.npy", "b.npy", "b.npy.sha256"]),
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


class Spy:
    """A compute function that counts its calls: the true array, 1000 numbers."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> np.ndarray:
        self.calls += 1
        return np.arange(1000, dtype=np.float32).reshape(10, 100) + 1


def zeros(entry: Path) -> None:
    """The entry's bytes replaced by zeros of the same shape and dtype (its header unchanged)."""
    stored = np.load(entry)
    np.save(entry, np.zeros_like(stored))


def no_checksum(entry: Path) -> None:
    """The checksum gone, as an entry written by an earlier version has none."""
    checksum_path(entry).unlink()


def truncated(entry: Path) -> None:
    """The file cut short in its data (a full disk, a copy interrupted)."""
    entry.write_bytes(entry.read_bytes()[:-100])


def not_numpy(entry: Path) -> None:
    """Bytes that are no .npy file at all."""
    entry.write_bytes(b"\x93NUMPY not an array")


def an_npz(entry: Path) -> None:
    """An .npz archive under the entry's name."""
    with open(entry, "wb") as f:
        np.savez(f, a=np.zeros(3))


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (zeros, "failed its checksum"),
        (no_checksum, "has no checksum"),
        (truncated, "cannot be read"),
        (not_numpy, "cannot be read"),
        (an_npz, "is not a .npy array"),
    ],
)
def test_a_damaged_entry_is_computed_again_with_one_note(
    damage, problem, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("FEWSHOT_CACHE", str(tmp_path))
    compute, want = Spy(), Spy()()
    cached_array("a.npy", compute, lambda a: a.shape == (10, 100))
    assert compute.calls == 1 and capsys.readouterr().err == ""
    damage(tmp_path / "a.npy")
    got = cached_array("a.npy", compute, lambda a: a.shape == (10, 100))
    assert compute.calls == 2 and np.array_equal(got, want)  # the true values, not zeros
    (note,) = capsys.readouterr().err.splitlines()
    assert note.startswith(f"note: cache entry {tmp_path / 'a.npy'} {problem}")
    assert note.endswith(": computed again")
    # Rewritten with its checksum: the next read takes it as it is, without a word.
    assert np.array_equal(cached_array("a.npy", compute, lambda a: True), want)
    assert compute.calls == 2 and capsys.readouterr().err == ""


def test_an_intact_entry_is_read_without_computing_or_a_note(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FEWSHOT_CACHE", str(tmp_path))
    compute = Spy()
    first = cached_array("a.npy", compute, lambda a: a.shape == (10, 100))
    for _ in range(3):
        assert np.array_equal(cached_array("a.npy", compute, lambda a: True), first)
    assert compute.calls == 1 and capsys.readouterr().err == ""


def test_an_entry_that_valid_refuses_is_computed_again_with_a_note(tmp_path, monkeypatch, capsys):
    """An intact entry of another shape than the caller reads (its checksum holds)."""
    monkeypatch.setenv("FEWSHOT_CACHE", str(tmp_path))
    cached_array("a.npy", lambda: np.zeros((2, 3), np.uint8), lambda a: True)
    compute = Spy()
    got = cached_array("a.npy", compute, lambda a: a.shape == (10, 100))
    assert compute.calls == 1 and np.array_equal(got, Spy()())
    (note,) = capsys.readouterr().err.splitlines()
    assert note == (
        f"note: cache entry {tmp_path / 'a.npy'} holds uint8 (2, 3), not the array expected: "
        "computed again"
    )


def test_an_omniglot_entry_overwritten_with_zeros_is_decoded_again(
    tmp_path, tiny_omniglot_root, monkeypatch, capsys
):
    """The zoo ProtoNet evaluated on Omniglot's decoded drawings, the cache entry of their npz
    file then zeroed: the next evaluation decodes again, with the same accuracy (zeros read as
    drawings gave 20 %, chance, where over 90 % is right)."""
    monkeypatch.setenv("FEWSHOT_CACHE", str(tmp_path / "cache"))
    checkpoint = Path(__file__).resolve().parents[1] / "models/omniglot/protonet_conv4_trainval.pt"
    argv = ["eval", "--checkpoint", str(checkpoint), "--data-root", str(tiny_omniglot_root)]
    argv += ["--episodes", "20", "--way", "5", "--device", "cpu"]
    assert main([*argv, "--out", str(tmp_path / "first.json")]) == 0
    digest = hashlib.sha256((REPO_DATA / "omniglot/images_evaluation.npz").read_bytes())
    entry = tmp_path / "cache" / f"omniglot-{digest.hexdigest()[:32]}-28.npy"
    zeros(entry)
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "again.json")]) == 0
    first, again = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("first", "again"))
    assert again["accuracy"] == first["accuracy"] > 90  # percent
    notes = [line for line in capsys.readouterr().err.splitlines() if "checksum" in line]
    assert notes == [f"note: cache entry {entry} failed its checksum: computed again"]
