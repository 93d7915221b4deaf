"""Converted splits: mapped arrays give the very tensors the readers give, and are refused when
stale or damaged."""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest
import torch
from trainers import make_trainer

import fewshot.datasets
from fewshot.cli.main import main
from fewshot.datasets import READERS, load_split
from fewshot.runtime.errors import FewshotError
from fewshot.training.settings import TrainSettings


@pytest.fixture
def root(tmp_path, tiny_omniglot_root):
    """A private copy of the small Omniglot root (its split lists copied, the rest linked)."""
    folder = tmp_path / "omniglot"
    (folder / "splits").mkdir(parents=True)
    for entry in (tiny_omniglot_root / "omniglot").iterdir():
        if entry.name != "splits":
            (folder / entry.name).symlink_to(entry.resolve())
    source = tiny_omniglot_root / "omniglot" / "splits" / "vinyals"
    shutil.copytree(source, folder / "splits" / "vinyals")  # copies: a test changes one
    return tmp_path


def test_a_converted_split_is_the_read_split(root, capsys, monkeypatch):
    assert (
        main(
            [
                "convert",
                "--dataset",
                "omniglot",
                "--splits",
                "train",
                "val",
                "--data-root",
                str(root),
            ]
        )
        == 0
    )
    assert "480 images 28x28x1" in capsys.readouterr().out
    read = load_split("omniglot", "train", root, converted=False)

    def no_reading(*args):
        raise AssertionError("the reader was called")

    monkeypatch.setitem(READERS, "omniglot", no_reading)
    mapped = load_split("omniglot", "train", root)
    assert torch.equal(mapped.images, read.images) and torch.equal(mapped.labels, read.labels)
    assert (mapped.class_names, mapped.mean, mapped.std) == (read.class_names, read.mean, read.std)


def test_training_on_a_converted_split_is_unchanged(root, tmp_path):
    config = dict(way=5, query=2, episodes_per_epoch=4, val_episodes=4, device="cpu")
    before = make_trainer(TrainSettings(**config, data_root=str(root), out=str(tmp_path / "a")))
    losses = [before.train_step()[0] for _ in range(2)]
    assert main(["convert", "--dataset", "omniglot", "--data-root", str(root)]) == 0
    after = make_trainer(TrainSettings(**config, data_root=str(root), out=str(tmp_path / "b")))
    assert "memmap" in after.train_data.source
    assert [after.train_step()[0] for _ in range(2)] == losses


def test_stale_or_damaged_conversions_are_refused(root):
    assert (
        main(["convert", "--dataset", "omniglot", "--splits", "test", "--data-root", str(root)])
        == 0
    )
    folder = root / "omniglot" / "memmap" / "test"
    split_list = root / "omniglot" / "splits" / "vinyals" / "test.txt"
    stat, text = split_list.stat(), split_list.read_bytes()
    os.utime(split_list, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    load_split("omniglot", "test", root)  # touched, not changed: the conversion stands
    # Changed content of the same size and modification time: the fingerprint sees it.
    split_list.write_bytes(text[::-1])
    os.utime(split_list, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(FewshotError, match=r"the source .*test\.txt changed since conversion"):
        load_split("omniglot", "test", root)
    split_list.write_bytes(text)  # as when converted
    images = folder / "images.npy"
    images.write_bytes(images.read_bytes()[:1000])
    with pytest.raises(FewshotError, match="corrupt converted split"):
        fewshot.datasets.load_split("omniglot", "test", root)


@pytest.mark.parametrize("key", ["shape", "class_names", "mean", "source_fingerprint"])
def test_damaged_metadata_is_refused_naming_the_file(root, capsys, key):
    args = ["convert", "--dataset", "omniglot", "--splits", "test", "--data-root", str(root)]
    assert main(args) == 0
    meta_path = root / "omniglot" / "memmap" / "test" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({k: v for k, v in meta.items() if k != key}))
    with pytest.raises(FewshotError) as caught:
        load_split("omniglot", "test", root)
    assert str(caught.value) == (
        f"{meta_path}: damaged metadata (missing or malformed {key}); run fewshot convert again"
    )
    assert main(args) == 0  # converting again repairs it
    assert len(load_split("omniglot", "test", root).labels) == meta["shape"][0]


@pytest.mark.parametrize("failure", [errno.ENOSPC, errno.EOPNOTSUPP])
def test_a_full_disk_is_one_line_and_leaves_nothing(root, capsys, monkeypatch, failure):
    def no_space(*_args):
        raise OSError(failure, os.strerror(failure))

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    # Where posix_fallocate is unsupported, the free space decides.
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(1, 1, 0))
    args = ["convert", "--dataset", "omniglot", "--splits", "test", "--data-root", str(root)]
    assert main(args) == 2
    err = capsys.readouterr().err
    folder = root / "omniglot" / "memmap" / "test"
    assert err.startswith(f"fewshot convert: error: cannot write {folder}: No space left")
    assert err.count("\n") == 1
    assert not [p for p in (root / "omniglot" / "memmap").rglob("*") if p.is_file()]
