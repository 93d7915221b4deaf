"""Splits converted once into memory-mapped uint8 arrays, which every process then shares.

`fewshot convert --dataset tieredimagenet` reads each split once through its reader (with all
its checks) and writes DATA_ROOT/<dataset>/memmap/<split>/ {images.npy, labels.npy, meta.json}.
`load_split` uses those from then on: the images are mapped rather than read, so the processes
of a torchrun job share one copy in the page cache and start in seconds instead of each
decoding and holding its own (9.5 GB for tieredImageNet's training split). meta.json holds a
fingerprint of every file the split was read from; when one of them changes, the conversion is
refused, naming that file. A folder of your own images is converted on its first read instead
(`convert_once`), and again when its files change.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from fewshot.datasets.base import ImageSplit
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_write_json
from fewshot.runtime.settings import read_json_object

# 2: the source fingerprint hashes sampled content, not the modification time;
# 3: every file the split was read from is fingerprinted, not only the one that names it.
VERSION = 3
CHUNK = 4096  # images copied at a time while converting
SAMPLES = 8  # chunks of each source file hashed into its fingerprint
# Bytes per chunk: 64 KiB for a split read from a few files, less for one read from many (an
# image folder's tens of thousands), so that checking a conversion hashes about SAMPLE_BUDGET
# bytes however many files it came from (never under 512 bytes a chunk).
SAMPLE_BYTES, SAMPLE_BUDGET, MIN_SAMPLE_BYTES = 1 << 16, 1 << 27, 512


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
    "sources": lambda v: isinstance(v, list) and bool(v) and all(map(_source_entry, v)),
}


def _source_entry(value: object) -> bool:
    """Whether `value` is one source file's record: its path, size and sampled hash."""
    return (
        isinstance(value, dict)
        and set(value) == {"path", "size", "sampled_sha256"}
        and isinstance(value["path"], str)
        and isinstance(value["size"], int)
        and isinstance(value["sampled_sha256"], str)
    )


def memmap_folder(root: Path, dataset: str, split: str) -> Path:
    """Where the converted split lives under the data root."""
    return root / dataset / "memmap" / split


def _sample_bytes(files: int) -> int:
    """Bytes per hashed chunk of each of a split's `files` source files."""
    return min(SAMPLE_BYTES, max(MIN_SAMPLE_BYTES, SAMPLE_BUDGET // (SAMPLES * files)))


def _fingerprint(source: str, sample_bytes: int) -> dict | None:
    """Path, size and a hash of sampled chunks of a file a split was read from (None: not a
    readable file).

    Sampled, not whole: hashing a multi-GB image file on every load would cost more than the
    reading a conversion saves. The size catches truncation and appends, and SAMPLES chunks
    spread over the file (all of a small one) catch a replaced or rewritten file; an edit
    confined between samples that keeps the size goes unseen. The modification time is left
    out: copying the data changes it without changing the content.
    """
    try:
        with open(source, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            digest = hashlib.sha256(str(size).encode())
            for k in range(SAMPLES):
                f.seek(k * max(size - sample_bytes, 0) // (SAMPLES - 1))
                digest.update(f.read(sample_bytes))
    except OSError:  # gone or unreadable: nothing to compare
        return None
    return {"path": source, "size": size, "sampled_sha256": digest.hexdigest()}


def _fingerprints(files: tuple[str, ...]) -> list[dict]:
    """The fingerprint of every file a split was read from, by absolute path (a relative data
    root would not resolve from another folder); one that cannot be read is an error."""
    paths = [os.path.abspath(file) for file in files]
    found = [_fingerprint(path, _sample_bytes(len(paths))) for path in paths]
    unreadable = [path for path, entry in zip(paths, found, strict=True) if entry is None]
    if unreadable:
        raise FewshotError(f"cannot read {unreadable[0]} again to fingerprint it")
    return found


def _changed(recorded: dict, sample_bytes: int) -> str | None:
    """How a recorded source file differs from its record now (None: the same, or gone)."""
    now = _fingerprint(recorded["path"], sample_bytes)
    # A source that is gone cannot be compared: the conversion stands.
    if now is None or now == recorded:
        return None
    if now["size"] != recorded["size"]:
        return f"{now['size']} bytes, {recorded['size']} when converted"
    return "same size, other content"


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
    if not split.files:
        raise ValueError(f"{split.source}: the split names no files it was read from")
    sources = _fingerprints(split.files)
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
        meta["sources"] = sources
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


def _source_change(meta: dict) -> tuple[str, str] | None:
    """The first source file of a conversion that changed since, and how (None: none did)."""
    sample_bytes = _sample_bytes(len(meta["sources"]))
    for recorded in meta["sources"]:
        change = _changed(recorded, sample_bytes)
        if change is not None:
            return recorded["path"], change
    return None


def read_memmap(folder: Path) -> ImageSplit | None:
    """The converted split in `folder`, its images mapped (None when there is none)."""
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        return None
    meta = _read_meta(folder)
    changed = _source_change(meta)
    if changed is not None:
        raise FewshotError(
            f"{folder}: the source {changed[0]} changed since conversion ({changed[1]}): "
            "convert again (fewshot convert, or delete the folder)"
        )
    return _mapped(folder, meta)


def _mapped(folder: Path, meta: dict) -> ImageSplit:
    """The arrays of a converted split whose metadata has been read, mapped."""
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
        files=tuple(str(folder / name) for name in ("meta.json", "images.npy", "labels.npy")),
    )


def _current(folder: Path, sources: Sequence[str]) -> ImageSplit | None:
    """The split converted in `folder` from exactly `sources`, none changed since, mapped;
    None where there is none, or it is of other sources, damaged or outdated."""
    if not (folder / "meta.json").is_file():
        return None
    try:
        meta = _read_meta(folder)
        recorded = [entry["path"] for entry in meta["sources"]]
        if recorded != [os.path.abspath(source) for source in sources] or _source_change(meta):
            return None
        return _mapped(folder, meta)
    except FewshotError:  # damaged or of another version: converted again
        return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file `path` (created if need be) for the block."""
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        yield


def convert_once(
    folder: Path, sources: Sequence[str], read: Callable[[], ImageSplit], again: bool = False
) -> ImageSplit:
    """The split converted in `folder` from exactly `sources` (in order), none of them changed
    since, mapped; otherwise (or when `again`) `read()` is converted into `folder` first. A lock
    beside the folder makes processes that ask at once (the ranks of a torchrun job) convert it
    once and all map that one copy."""
    split = None if again else _current(folder, sources)
    if split is not None:
        return split
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with _locked(folder.with_name(folder.name + ".lock")):
            split = None if again else _current(folder, sources)  # another process's, meanwhile
            if split is None:
                write_memmap(read(), folder)
                split = _mapped(folder, _read_meta(folder))
    except OSError as e:
        raise FewshotError(f"cannot write the conversion {folder}: {e.strerror or e}") from None
    return split


def describe(folder: Path) -> str:
    """One line about a converted split: its size and where it came from."""
    meta = _read_meta(folder)
    n, h, w, c = meta["shape"]
    size = (folder / "images.npy").stat().st_size / 2**30
    return f"{folder}: {n} images {h}x{w}x{c}, {size:.2f} GiB (from {meta['source']})"
