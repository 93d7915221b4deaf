"""Splits converted once into memory-mapped uint8 arrays, which every process then shares.

`fewshot convert --dataset tieredimagenet` reads each split once through its reader (with all
its checks) and writes DATA_ROOT/<dataset>/memmap/<split>/ {images.npy, labels.npy, meta.json}.
`load_split` uses those from then on: the images are mapped rather than read, so the processes
of a torchrun job share one copy in the page cache and start in seconds instead of each
decoding and holding its own (9.5 GB for tieredImageNet's training split).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from fewshot.datasets.base import ImageSplit
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_write_json
from fewshot.runtime.settings import read_json_object

VERSION = 2  # 2: the source fingerprint hashes sampled content, not the modification time
CHUNK = 4096  # images copied at a time while converting
SAMPLES, SAMPLE_BYTES = 8, 1 << 16  # chunks of the source hashed into its fingerprint


def _numbers(value: object) -> bool:
    """Whether `value` is a JSON list of numbers."""
    return isinstance(value, list) and all(isinstance(v, int | float) for v in value)


# What meta.json must hold, key by key (a damaged file is refused in one line, not a KeyError).
META_CHECKS: dict[str, Callable[[object], bool]] = {
    "shape": lambda v: (
        isinstance(v, list) and len(v) == 4 and all(isinstance(d, int) and d >= 0 for d in v)
    ),
    "class_names": lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v),
    "mean": _numbers,
    "std": _numbers,
    "source": lambda v: isinstance(v, str),
    "source_fingerprint": lambda v: (
        v is None or (isinstance(v, dict) and set(v) == {"size", "sampled_sha256"})
    ),
}


def memmap_folder(root: Path, dataset: str, split: str) -> Path:
    """Where the converted split lives under the data root."""
    return root / dataset / "memmap" / split


def _fingerprint(source: str) -> dict | None:
    """Size and a hash of sampled chunks of the file a split was read from (None: not a
    readable file).

    Sampled, not whole: hashing a multi-GB image file on every load would cost more than the
    reading a conversion saves. The size catches truncation and appends, and SAMPLES chunks
    spread over the file (all of a small one) catch a replaced or rewritten file; an edit
    confined between samples that keeps the size goes unseen. The modification time is left
    out: copying the data changes it without changing the content.
    """
    path = Path(source)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            digest = hashlib.sha256(str(size).encode())
            for k in range(SAMPLES):
                f.seek(k * max(size - SAMPLE_BYTES, 0) // (SAMPLES - 1))
                digest.update(f.read(SAMPLE_BYTES))
    except OSError:  # a folder, gone or unreadable: nothing to compare
        return None
    return {"size": size, "sampled_sha256": digest.hexdigest()}


def _reserve(path: Path) -> None:
    """Claim the disk blocks of `path` (already at its full length, sparse) before its pages
    are written through a mapping: a full disk is then an OSError here, not a SIGBUS mid-copy."""
    with open(path, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        try:
            os.posix_fallocate(f.fileno(), 0, size)
            return
        except AttributeError:  # no posix_fallocate on this platform (macOS)
            pass
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
    # Not supported here (some network file systems): the free space is the next best promise.
    if shutil.disk_usage(path.parent).free < size:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def write_memmap(split: ImageSplit, folder: Path) -> None:
    """Write `split` as [N, H, W, C] uint8 images.npy, labels.npy and meta.json into `folder`,
    atomically: the folder appears complete or not at all."""
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    n, c, h, w = split.images.shape
    try:
        partial.mkdir(parents=True)
        images = np.lib.format.open_memmap(partial / "images.npy", "w+", np.uint8, (n, h, w, c))
        _reserve(partial / "images.npy")
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
    except BaseException as e:  # any failure, a FewshotError from the JSON write included
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(e, OSError):
            raise FewshotError(
                f"cannot write {folder}: {e.strerror or e} (the images need "
                f"{n * h * w * c / 2**30:.2f} GiB)"
            ) from None
        raise


def _read_meta(folder: Path) -> dict:
    """meta.json of a converted split, refused in one line when it is damaged or outdated."""
    meta_path = folder / "meta.json"
    meta = read_json_object(meta_path, "converted split metadata")
    if meta.get("version") != VERSION:
        raise FewshotError(f"{meta_path}: written by another version; run fewshot convert again")
    damaged = [key for key, valid in META_CHECKS.items() if key not in meta or not valid(meta[key])]
    if damaged:
        raise FewshotError(
            f"{meta_path}: damaged metadata (missing or malformed {', '.join(damaged)}); "
            "run fewshot convert again"
        )
    return meta


def read_memmap(folder: Path) -> ImageSplit | None:
    """The converted split in `folder`, its images mapped (None when there is none)."""
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        return None
    meta = _read_meta(folder)
    recorded, now = meta["source_fingerprint"], _fingerprint(meta["source"])
    # A source that is gone (or a folder) cannot be compared: the conversion stands.
    if recorded is not None and now is not None and now != recorded:
        raise FewshotError(
            f"{folder}: the source {meta['source']} changed since conversion: convert again "
            "(fewshot convert, or delete the folder)"
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
    meta = _read_meta(folder)
    n, h, w, c = meta["shape"]
    size = (folder / "images.npy").stat().st_size / 2**30
    return f"{folder}: {n} images {h}x{w}x{c}, {size:.2f} GiB (from {meta['source']})"
