"""Converted splits: mapped arrays give the very tensors the readers give, and are refused when
stale or damaged."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

import fewshot.datasets
from fewshot.cli import main
from fewshot.config import TrainConfig
from fewshot.datasets import READERS, load_split
from fewshot.errors import FewshotError
from fewshot.train import Trainer


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
    before = Trainer(TrainConfig(**config, data_root=str(root), out=str(tmp_path / "a")))
    losses = [before.train_step()[0] for _ in range(2)]
    assert main(["convert", "--dataset", "omniglot", "--data-root", str(root)]) == 0
    after = Trainer(TrainConfig(**config, data_root=str(root), out=str(tmp_path / "b")))
    assert "memmap" in after.train_split.source
    assert [after.train_step()[0] for _ in range(2)] == losses


def test_stale_or_damaged_conversions_are_refused(root):
    assert (
        main(["convert", "--dataset", "omniglot", "--splits", "test", "--data-root", str(root)])
        == 0
    )
    folder = root / "omniglot" / "memmap" / "test"
    split_list = root / "omniglot" / "splits" / "vinyals" / "test.txt"
    stat = split_list.stat()
    os.utime(split_list, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(FewshotError, match="has changed since; run fewshot convert again"):
        load_split("omniglot", "test", root)
    os.utime(split_list, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # as when converted
    images = folder / "images.npy"
    images.write_bytes(images.read_bytes()[:1000])
    with pytest.raises(FewshotError, match="corrupt converted split"):
        fewshot.datasets.load_split("omniglot", "test", root)
