"""Splits converted once into memory-mapped uint8 arrays, which every process then shares.

`fewshot convert --dataset tieredimagenet` reads each split once through its reader (with all
its checks) and writes DATA_ROOT/<dataset>/memmap/<split>/ {images.npy, labels.npy, meta.json}.
`load_split` uses those from then on: the images are mapped rather than read, so the processes
of a torchrun job share one copy in the page cache and start in seconds instead of each
decoding and holding its own (9.5 GB for tieredImageNet's training split).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from fewshot.datasets.base import ImageSplit
from fewshot.errors import FewshotError
from fewshot.io import atomic_write_json
from fewshot.settings import read_json_object

VERSION = 1
CHUNK = 4096  # images copied at a time while converting


def memmap_folder(root: Path, dataset: str, split: str) -> Path:
    """Where the converted split lives under the data root."""
    return root / dataset / "memmap" / split


def _fingerprint(source: str) -> list[int] | None:
    """Size and modification time of the file a split was read from (None: not a file)."""
    path = Path(source)
    if not path.is_file():
        return None
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def write_memmap(split: ImageSplit, folder: Path) -> None:
    """Write `split` as [N, H, W, C] uint8 images.npy, labels.npy and meta.json into `folder`,
    atomically: the folder appears complete or not at all."""
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir(parents=True)
        n, c, h, w = split.images.shape
        images = np.lib.format.open_memmap(partial / "images.npy", "w+", np.uint8, (n, h, w, c))
        for start in range(0, n, CHUNK):
            images[start : start + CHUNK] = split.images[start : start + CHUNK].permute(0, 2, 3, 1)
        images.flush()
        del images
        np.save(partial / "labels.npy", split.labels.numpy())
        meta = {"version": VERSION, "shape": [n, h, w, c], "class_names": split.class_names}
        meta.update(mean=list(split.mean), std=list(split.std), source=split.source)
        meta["source_fingerprint"] = _fingerprint(split.source)
        atomic_write_json(meta, partial / "meta.json")
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(partial, folder)
    except OSError as e:
        shutil.rmtree(partial, ignore_errors=True)
        raise FewshotError(f"cannot write {folder}: {e.strerror or e}") from None


def read_memmap(folder: Path) -> ImageSplit | None:
    """The converted split in `folder`, its images mapped (None when there is none)."""
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        return None
    meta = read_json_object(meta_path, "converted split")
    if meta.get("version") != VERSION:
        raise FewshotError(f"{meta_path}: written by another version; run fewshot convert again")
    fingerprint = meta.get("source_fingerprint")
    now = _fingerprint(meta.get("source", ""))
    if fingerprint is not None and now is not None and now != fingerprint:
        raise FewshotError(
            f"{folder} is older than {meta['source']}, which has changed since; run fewshot "
            "convert again (or delete the folder)"
        )
    try:
        # "c": a private mapping; its pages stay shared with other processes until written
        # (they never are), and torch gets a writable array.
        images = np.load(folder / "images.npy", mmap_mode="c")
        labels = np.load(folder / "labels.npy")
    except (OSError, ValueError) as e:
        raise FewshotError(f"corrupt converted split {folder}: {e}") from None
    if list(images.shape) != meta["shape"] or images.dtype != np.uint8:
        raise FewshotError(f"{folder}/images.npy: expected uint8 {meta['shape']}")
    return ImageSplit(
        torch.from_numpy(images).permute(0, 3, 1, 2),
        torch.from_numpy(labels),
        list(meta["class_names"]),
        tuple(meta["mean"]),
        tuple(meta["std"]),
        source=str(folder),
    )


def describe(folder: Path) -> str:
    """One line about a converted split: its size and where it came from."""
    meta = json.loads((folder / "meta.json").read_text())
    n, h, w, c = meta["shape"]
    size = (folder / "images.npy").stat().st_size / 2**30
    return f"{folder}: {n} images {h}x{w}x{c}, {size:.2f} GiB (from {meta['source']})"
