"""Atomic writes: the umask's file mode, and failures that keep the previous file and name it;
checkpoints refused in one line, without the warnings torch gives on the way."""

from __future__ import annotations

import os
import pickle
import warnings

import pytest
import torch

from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_torch_save, atomic_write_text, check_writable, load_checkpoint


def test_files_get_the_mode_the_umask_gives(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_torch_save({"x": torch.ones(2)}, tmp_path / "a.pt")
        atomic_write_text("hi", tmp_path / "b.txt")
    finally:
        os.umask(old)
    assert (tmp_path / "a.pt").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "b.txt").stat().st_mode & 0o777 == 0o640


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    atomic_torch_save({"x": torch.zeros(3)}, path)

    def disk_full(obj, f):
        f.write(b"partial")
        # What torch raises when the disk fills during a save.
        raise RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(FewshotError, match=f"cannot write {path}: the write failed .* intact"):
        atomic_torch_save({"x": torch.ones(3)}, path)
    monkeypatch.undo()
    assert torch.equal(load_checkpoint(path)["x"], torch.zeros(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_an_impossible_destination_is_one_error_naming_it(tmp_path):
    (tmp_path / "file").write_text("")
    target = tmp_path / "file" / "out.json"
    with pytest.raises(FewshotError, match=f"cannot write {target}"):
        check_writable(target)
    with pytest.raises(FewshotError, match=f"cannot write {target}"):
        atomic_write_text("x", target)


class RunsCode:
    """Unpickled, it would call print: what a hostile checkpoint holds."""

    def __reduce__(self):
        return (print, ("this ran",))


def test_a_refused_checkpoint_is_one_line_without_torchs_warnings(tmp_path):
    hostile = tmp_path / "hostile.pt"
    # Protocol 4, not torch's 2: torch's loader warns about it before refusing the file.
    hostile.write_bytes(pickle.dumps({"w": RunsCode()}, protocol=4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(FewshotError, match="could run code"):
            load_checkpoint(hostile)
    assert [str(w.message) for w in caught] == []


def test_a_checkpoint_that_loads_keeps_its_warnings(tmp_path, monkeypatch):
    path = tmp_path / "a.pt"
    atomic_torch_save({"x": torch.ones(1)}, path)
    load = torch.load

    def warning_load(*args, **kwargs):
        warnings.warn("a note of torch's", UserWarning, stacklevel=1)
        return load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", warning_load)
    with pytest.warns(UserWarning, match="a note of torch's"):
        assert torch.equal(load_checkpoint(path)["x"], torch.ones(1))
