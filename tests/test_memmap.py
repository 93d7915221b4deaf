"""Converted splits: mapped arrays give the very tensors the readers give, and are refused when
stale or damaged."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from trainers import make_trainer

import fewshot.datasets
from fewshot.cli.main import main
from fewshot.datasets import READERS, REPO_DATA, ImageSplit, load_split
from fewshot.datasets.memmap import write_memmap
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


@pytest.fixture
def copied_root(tmp_path, tiny_omniglot_root):
    """A small Omniglot root whose files are all copies (a test changes them)."""
    root = tmp_path / "copied"
    shutil.copytree(tiny_omniglot_root, root, symlinks=False)
    return root


def convert_test_split(root) -> list[dict]:
    """Convert the test split under `root`; the source records of its meta.json."""
    args = ["convert", "--dataset", "omniglot", "--splits", "test", "--data-root", str(root)]
    assert main(args) == 0
    return json.loads((root / "omniglot" / "memmap" / "test" / "meta.json").read_text())["sources"]


def test_a_conversion_records_every_file_the_split_was_read_from(copied_root):
    folder = copied_root / "omniglot"
    read = load_split("omniglot", "test", copied_root, converted=False)
    recorded = [entry["path"] for entry in convert_test_split(copied_root)]
    assert (
        recorded
        == list(read.files)
        == [
            str(folder / "splits" / "vinyals" / "test.txt"),
            str(folder / "omniglot_index.csv"),
            str(folder / "images_evaluation.npz"),
        ]
    )


def test_a_split_that_names_no_source_files_is_not_converted(tmp_path):
    split = ImageSplit(
        torch.zeros(2, 1, 4, 4, dtype=torch.uint8), torch.zeros(2), ["a"], (0,), (1,)
    )
    with pytest.raises(ValueError, match="names no files it was read from"):
        write_memmap(split, tmp_path / "memmap")
    assert not (tmp_path / "memmap").exists()


@pytest.mark.parametrize("name", ["images_evaluation.npz", "omniglot_index.csv", "test.txt"])
def test_a_changed_source_file_refuses_the_conversion_naming_it(copied_root, capsys, name):
    sources = convert_test_split(copied_root)
    path = next(Path(entry["path"]) for entry in sources if entry["path"].endswith(name))
    stat, content = path.stat(), path.read_bytes()
    # One byte shorter, its modification time kept: the reader must not use the stale arrays.
    path.write_bytes(content[:-1])
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    folder = copied_root / "omniglot" / "memmap" / "test"
    with pytest.raises(FewshotError) as caught:
        load_split("omniglot", "test", copied_root)
    assert str(caught.value) == (
        f"{folder}: the source {path} changed since conversion ({len(content) - 1} bytes, "
        f"{len(content)} when converted): convert again (fewshot convert, or delete the folder)"
    )
    if name == "images_evaluation.npz":  # the case of the issue: fewshot eval refuses too
        checkpoint = REPO_DATA.parent / "models" / "omniglot" / "protonet_conv4_1shot.pt"
        args = ["eval", "--checkpoint", str(checkpoint), "--data-root", str(copied_root)]
        args += ["--episodes", "2", "--device", "cpu", "--out", str(copied_root / "r.json")]
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"the source {path} changed since conversion" in err
    path.write_bytes(content)  # as when converted: the conversion stands again
    assert "memmap" in load_split("omniglot", "test", copied_root).source


def test_a_conversion_of_an_earlier_version_is_refused(root):
    args = ["convert", "--dataset", "omniglot", "--splits", "test", "--data-root", str(root)]
    assert main(args) == 0
    meta_path = root / "omniglot" / "memmap" / "test" / "meta.json"
    meta = json.loads(meta_path.read_text())
    # Version 2 recorded the split list alone, under "source_fingerprint".
    del meta["sources"]
    meta.update(version=2, source_fingerprint=None)
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(FewshotError) as caught:
        load_split("omniglot", "test", root)
    assert str(caught.value) == (
        f"{meta_path}: written by another version; run fewshot convert again"
    )


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


@pytest.mark.parametrize("key", ["shape", "class_names", "mean", "sources"])
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
