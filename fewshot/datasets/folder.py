"""Your own images as a few-shot data set (`--dataset folder --data-root ROOT`), in either layout:

- a folder per split of class folders: ROOT/train/<class>/*.png|jpg, ROOT/val/..., ROOT/test/...;
- one folder of class folders, ROOT/images/<class>/... (or ROOT/<class>/... where there is no
  images/), and a split file per split naming its classes: ROOT/train.txt (one class per line)
  or ROOT/train.csv (a header with a `label` column, as the Ravi & Larochelle miniImageNet lists
  and LibFewShot's `filename,label`; its distinct labels are the classes, and every image of
  their folders is read).

Classes are numbered in sorted order of their names, a class's images taken in sorted order of
their file names. A split's images must all have the channels and the square size of its first
image, unless `channels` (1 or 3) and `resize` (a side) say what to convert them all to (resized
with Lanczos filtering). The first read of a split decodes it once into the memory-mapped
conversion ROOT/memmap/<split>_<C>x<S>x<S>/ that every later read (and every rank of a torchrun
job) maps; a file added, removed or changed since makes the next read convert it again. A split
is normalised with the per-channel mean and standard deviation of its own pixels (a trained
model keeps those of its training split).
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import ImageMode

from fewshot.datasets.base import ImageSplit
from fewshot.datasets.image_folder import (
    DECODE_ERRORS,
    converted,
    in_parallel,
    open_image,
    resized,
)
from fewshot.datasets.memmap import convert_once
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.memory import refuse_if_too_big

FOLDER = "folder"
SPLITS = ("train", "val", "test")  # the few-shot splits, which must share no class
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"})
SPLIT_FILE_SUFFIXES = (".txt", ".csv")
# A split file is read whole: an ImageNet-sized `filename,label` list is about 50 MB.
MAX_SPLIT_FILE_BYTES = 1 << 27
# The largest side a split is held at: its images take N x side^2 x channels bytes.
MAX_SIDE = 1024
CONVERSIONS = "memmap"  # ROOT/memmap/<split>_<C>x<S>x<S>/


@dataclass(frozen=True)
class Listing:
    """One split of a folder data set as it lies on disk, nothing decoded: its classes in
    sorted order and the image files of each, and the split file that names them (if any)."""

    source: str
    classes: dict[str, list[Path]]
    split_file: Path | None = None

    @property
    def images(self) -> list[Path]:
        """Every image file of the split, class by class."""
        return [path for paths in self.classes.values() for path in paths]

    @property
    def files(self) -> tuple[str, ...]:
        """Every file the split is read from: its split file, then its images."""
        return tuple(map(str, [*([self.split_file] if self.split_file else []), *self.images]))


def _split_source(root: Path, split: str) -> Path | None:
    """The folder or split file that holds `split` (None: neither); refused when both do."""
    found = [root / split] if (root / split).is_dir() else []
    found += [
        root / f"{split}{suffix}"
        for suffix in SPLIT_FILE_SUFFIXES
        if (root / f"{split}{suffix}").is_file()
    ]
    if len(found) > 1:
        raise FewshotError(
            f"{root}: the {split} split is given {len(found)} times "
            f"({', '.join(path.name for path in found)}); keep one"
        )
    return found[0] if found else None


def read_split_file(path: Path) -> list[str]:
    """The classes a split file names: a text file's lines (blank ones and `#` comments left
    out), or the distinct values of a CSV file's `label` column; each must be a folder name."""
    try:
        if path.stat().st_size > MAX_SPLIT_FILE_BYTES:
            raise FewshotError(
                f"{path}: a split file of {path.stat().st_size} bytes, over the "
                f"{MAX_SPLIT_FILE_BYTES} allowed"
            )
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise FewshotError(f"{path} is not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise FewshotError(f"cannot read {path}: {e.strerror or e}") from None
    if path.suffix == ".csv":
        try:
            rows = csv.DictReader(io.StringIO(text))
            if rows.fieldnames is None or "label" not in rows.fieldnames:
                raise FewshotError(
                    f"{path}: expected a CSV whose header has a 'label' column (e.g. "
                    "filename,label)"
                )
            names = [row["label"] or "" for row in rows]
        except csv.Error as e:
            raise FewshotError(f"{path}: not a CSV file: {e}") from None
    else:
        names = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    classes = list(dict.fromkeys(name.strip() for name in names if name.strip()))
    if not classes:
        raise FewshotError(f"{path} names no classes")
    bad = next((c for c in classes if c in (".", "..") or "/" in c or "\\" in c), None)
    if bad is not None:
        raise FewshotError(f"{path}: class {bad!r} is not the name of a folder")
    return classes


def _class_names(source: Path) -> list[str]:
    """The classes of a split folder (its sub-folders, hidden ones left out) or split file."""
    if source.is_dir():
        return sorted(
            entry.name
            for entry in os.scandir(source)
            if entry.is_dir() and not entry.name.startswith(".")
        )
    return read_split_file(source)


def _images(folder: Path) -> list[Path]:
    """The image files of a class folder (by suffix, hidden files left out), sorted by name."""
    return sorted(
        Path(entry.path)
        for entry in os.scandir(folder)
        if entry.is_file()
        and not entry.name.startswith(".")
        and os.path.splitext(entry.name)[1].lower() in IMAGE_SUFFIXES
    )


def _check_disjoint(root: Path, split: str, classes: list[str]) -> None:
    """Refuse a class of a few-shot split that another one (train, val, test) also has."""
    if split not in SPLITS:
        return
    for other in SPLITS:
        source = _split_source(root, other) if other != split else None
        shared = sorted(set(classes) & set(_class_names(source))) if source else []
        if shared:
            raise FewshotError(
                f"{root}: class {shared[0]!r} is in both the {split} and the {other} split "
                f"({len(shared)} shared); few-shot splits must not share a class"
            )


def list_split(root: Path, split: str) -> Listing:
    """List one split of the folder data set at `root` (nothing decoded), refusing in one line
    a missing split, a split given twice, a listed class without a folder and a class that
    another split has."""
    try:
        source = _split_source(root, split)
        if source is None:
            raise FewshotError(
                f"no {split} split in {root}: expected a folder {root / split} of class folders, "
                f"or a split file {split}.txt or {split}.csv naming its classes"
            )
        names = _class_names(source)
        if source.is_dir():
            if not names:
                raise FewshotError(f"{source} holds no class folders")
            folders = {name: source / name for name in names}
        else:
            base = root / "images" if (root / "images").is_dir() else root
            folders = {name: base / name for name in sorted(names)}
            missing = next((name for name in names if not folders[name].is_dir()), None)
            if missing is not None:
                raise FewshotError(f"{source}: class {missing!r} has no folder {folders[missing]}")
        _check_disjoint(root, split, names)
        classes = {name: _images(folders[name]) for name in folders}
    except OSError as e:
        raise FewshotError(f"cannot list {e.filename or root}: {e.strerror or e}") from None
    return Listing(str(source), classes, None if source.is_dir() else source)


def list_classes(folder: Path) -> Listing:
    """A folder of class folders (e.g. a support set: FOLDER/<class>/*.png), listed and
    checked before any image is decoded: refused in one line when it is missing, holds no
    class folders or has a class without images."""
    try:
        if not folder.is_dir():
            raise FewshotError(f"{folder} is not a folder of class folders")
        names = _class_names(folder)
        if not names:
            raise FewshotError(f"{folder} holds no class folders")
        classes = {name: _images(folder / name) for name in names}
    except OSError as e:
        raise FewshotError(f"cannot list {e.filename or folder}: {e.strerror or e}") from None
    check_counts(names, [len(paths) for paths in classes.values()], str(folder), 1)
    return Listing(str(folder), classes)


def list_images(paths: list[Path]) -> Listing:
    """Image files, and folders of them (their image files, sorted by name), as one listing of
    one class, in the order given; refused in one line for a missing path or a folder
    without images."""
    files = []
    for path in paths:
        try:
            if path.is_dir():
                found = _images(path)
                if not found:
                    raise FewshotError(
                        f"{path} holds no image files ({', '.join(sorted(IMAGE_SUFFIXES))})"
                    )
                files += found
            elif path.is_file():
                files.append(path)
            else:
                raise FewshotError(f"no such file or folder: {path}")
        except OSError as e:
            raise FewshotError(f"cannot list {e.filename or path}: {e.strerror or e}") from None
    return Listing(", ".join(map(str, paths)), {"images": files})


def check_counts(class_names: list[str], counts: list[int], source: str, per_class: int) -> None:
    """Refuse a split with a class of fewer than `per_class` images, naming it and its count."""
    if not counts:
        return
    smallest = min(range(len(counts)), key=counts.__getitem__)
    if counts[smallest] < per_class:
        need = (
            f"the episodes need {per_class} per class (support + query)"
            if per_class > 1
            else "every class needs one"
        )
        raise FewshotError(
            f"class {class_names[smallest]!r} of {source} has {counts[smallest]} images; {need}"
        )


def channels_of(mode: str) -> int:
    """The channels an image of a Pillow mode has as a few-shot image: 1 for grayscale modes
    ('L', '1', 'I', 'LA', ...), 3 for the colour ones ('RGB', 'P', 'RGBA', 'CMYK', ...)."""
    return 1 if ImageMode.getmode(mode).basemode == "L" else 3


def _header(path: Path) -> tuple[int, int, int]:
    """(channels, width, height) of an image file, from its header."""
    try:
        with open_image(path) as img:
            return channels_of(img.mode), img.width, img.height
    except DECODE_ERRORS as e:
        raise FewshotError(f"cannot read image {path}: {e}") from None


def first_image(listing: Listing) -> tuple[Path, tuple[int, int, int]]:
    """The first image of a split and its (channels, width, height)."""
    path = next(iter(listing.images), None)
    if path is None:
        raise FewshotError(f"{listing.source}: its classes hold no images")
    return path, _header(path)


def listing_geometry(
    listing: Listing, resize: int | None = None, channels: int | None = None
) -> tuple[int, int]:
    """(channels, side) a split is held at: `channels` and `resize` where given, else those of
    its first image, which must be square."""
    if resize is not None and channels is not None:
        return channels, resize
    path, (have, width, height) = first_image(listing)
    if resize is None and (width != height or width > MAX_SIDE):
        why = "not square" if width != height else f"over {MAX_SIDE}"
        raise FewshotError(
            f"{path} is {width}x{height} ({why}): give --resize N (at most {MAX_SIDE}) to "
            "resize every image to N x N"
        )
    return channels or have, resize or width


def _statistics(images: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and standard deviation of uint8 [N, H, W, C] images, in [0, 1] units
    (a constant channel gets 1: nothing to scale)."""
    channels = images.shape[-1]
    total, squares, count = np.zeros(channels), np.zeros(channels), 0
    for start in range(0, len(images), 1024):
        pixels = images[start : start + 1024].reshape(-1, channels).astype(np.float64) / 255
        total += pixels.sum(axis=0)
        squares += (pixels * pixels).sum(axis=0)
        count += len(pixels)
    mean = total / max(count, 1)
    std = np.sqrt(np.maximum(squares / max(count, 1) - mean * mean, 0.0))
    return tuple(mean.tolist()), tuple(s if s > 0 else 1.0 for s in std.tolist())


def decode_listing(
    listing: Listing, channels: int, side: int, convert: bool, resize: bool
) -> ImageSplit:
    """Decode every image of a split once into uint8 [N, side, side, channels]; an image of
    other channels (unless `convert`) or size (unless `resize`) than the first is refused, as
    is a file that cannot be decoded whole (truncated, damaged, not an image), naming it."""
    paths, first = listing.images, listing.images[0]
    refuse_if_too_big(
        len(paths) * side * side * channels,
        torch.device("cpu"),
        f"holding the {len(paths)} images of {listing.source} at {channels}x{side}x{side}",
        "--resize",
    )
    out = np.empty((len(paths), side, side, channels), dtype=np.uint8)
    mode = "L" if channels == 1 else "RGB"

    def decode(i: int) -> None:
        path = paths[i]
        try:
            with open_image(path) as img:
                if not convert and channels_of(img.mode) != channels:
                    raise FewshotError(
                        f"mixed channels: {path} has {channels_of(img.mode)}, {first} has "
                        f"{channels}; give --channels 1 or 3 to convert every image"
                    )
                if not resize and img.size != (side, side):
                    raise FewshotError(
                        f"mixed sizes: {path} is {img.width}x{img.height}, {first} is "
                        f"{side}x{side}; give --resize N to resize every image to N x N"
                    )
                pixels = np.asarray(resized(converted(img, mode), side))
        except DECODE_ERRORS as e:
            raise FewshotError(f"cannot decode image {path}: {e}") from None
        out[i] = pixels.reshape(side, side, channels)

    in_parallel(len(paths), decode)
    counts = [len(files) for files in listing.classes.values()]
    labels = np.repeat(np.arange(len(counts)), counts)
    mean, std = _statistics(out)
    return ImageSplit(
        torch.from_numpy(out).permute(0, 3, 1, 2),
        torch.from_numpy(labels),
        list(listing.classes),
        mean,
        std,
        source=listing.source,
        files=listing.files,
    )


def conversion_folder(root: Path, split: str, channels: int, side: int) -> Path:
    """Where a split's conversion at this geometry lives."""
    return root / CONVERSIONS / f"{split}_{channels}x{side}x{side}"


def checked_listing(root: Path, split: str, per_class: int = 1) -> Listing:
    """A split of the folder data set at `root`, listed and checked before any image is
    decoded: refused in one line when missing, badly listed or with a class of fewer than
    `per_class` images."""
    listing = list_split(root, split)
    counts = [len(paths) for paths in listing.classes.values()]
    check_counts(list(listing.classes), counts, listing.source, max(per_class, 1))
    return listing


def read_folder(
    root: Path,
    split: str,
    resize: int | None = None,
    channels: int | None = None,
    per_class: int = 1,
    converted: bool = True,
    again: bool = False,
) -> ImageSplit:
    """One split of the folder data set at `root`: listed and checked, then mapped from its
    conversion, made now where there is none or its files changed (`again`: made anew);
    `converted=False` decodes it into memory instead."""
    listing = checked_listing(root, split, per_class)
    have, side = listing_geometry(listing, resize, channels)

    def decode() -> ImageSplit:
        return decode_listing(listing, have, side, channels is not None, resize is not None)

    if not converted:
        return decode()
    return convert_once(conversion_folder(root, split, have, side), listing.files, decode, again)


def describe_source(root: Path, split: str) -> str:
    """'CxHxW' of the first image of a split of the folder data set at `root`."""
    _, (channels, width, height) = first_image(list_split(root, split))
    return f"{channels}x{height}x{width}"
