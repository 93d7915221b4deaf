"""Dataset readers: each returns an `ImageSplit` of uint8 images held in memory.

Another package's data set joins by an entry point of the group `fewshot.datasets` naming a
`DatasetPlugin`: its reader and the geometry of its images.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fewshot.datasets.base import ImageSplit
from fewshot.datasets.folder import (
    FOLDER,
    MAX_SIDE,
    check_counts,
    checked_listing,
    conversion_folder,
    list_split,
    listing_geometry,
    read_folder,
)
from fewshot.datasets.memmap import memmap_folder, read_memmap, write_memmap
from fewshot.runtime.errors import FewshotError, summary
from fewshot.runtime.plugins import RegistryNames, described, require_signature
from fewshot.runtime.settings import SettingError, refuse_unused, setting

Reader = Callable[[Path, str], ImageSplit]

REPO_DATA = Path(__file__).resolve().parents[2] / "data"


@dataclass(frozen=True)
class DatasetPlugin:
    """What a `fewshot.datasets` entry point names: a reader `(data_root, split) ->
    ImageSplit` and the channels and side of the square images it gives (known before any is
    read: the settings are checked against them)."""

    reader: Reader
    channels: int
    image_size: int


def _adopt_dataset(name: str, plugin: object) -> None:
    """Register a plug-in data set; TypeError unless it is a DatasetPlugin of a reader and a
    geometry of 1 or 3 channels."""
    if not isinstance(plugin, DatasetPlugin):
        raise TypeError(f"must name a fewshot.datasets.DatasetPlugin, not {described(plugin)}")
    require_signature(plugin.reader, "a reader (data_root: Path, split: str)", REPO_DATA, "train")
    sizes = (plugin.channels, plugin.image_size)
    if plugin.channels not in (1, 3) or not (
        isinstance(plugin.image_size, int) and 1 <= plugin.image_size <= MAX_SIDE
    ):
        raise TypeError(
            f"must give 1 or 3 channels and an image side of 1 to {MAX_SIDE}, not {sizes}"
        )
    READERS[name], GEOMETRY[name] = plugin.reader, sizes


def dataset_names() -> RegistryNames:
    """The names --dataset takes: the registered readers', then `folder` (your own images);
    `name in dataset_names()` also finds and registers a plug-in data set (entry point group
    `fewshot.datasets`)."""
    return _NAMES


def resize_setting() -> Any:
    """The --resize field of a command that reads data."""
    return setting(
        None,
        help="folder data set: resize every image to N x N (default: the images' own size, one "
        "square size for all)",
        low=1,
        high=MAX_SIDE,
    )


def channels_setting() -> Any:
    """The --channels field of a command that reads data."""
    return setting(
        None,
        help="folder data set: convert every image to 1 (grayscale) or 3 (RGB) channels "
        "(default: the images' own, the same for all)",
        low=1,
        high=3,
    )


def check_data_options(settings: Any) -> None:
    """Refuse, naming the flag, --channels other than 1 or 3, --dataset folder without
    --data-root, and --resize or --channels for a built-in dataset (its images have one
    geometry); `settings` has the fields dataset, data_root, resize and channels."""
    if settings.channels == 2:
        raise SettingError("channels", "must be 1 (grayscale) or 3 (RGB), got 2")
    if settings.dataset == FOLDER and not settings.data_root:
        raise SettingError("data_root", "must be given with --dataset folder: your images' folder")
    if settings.dataset not in (None, FOLDER):
        refuse_unused(settings, ["resize", "channels"], f"--dataset {settings.dataset}")


def resolve_data_root(data_root: str | os.PathLike | None = None) -> Path:
    """--data-root if given, else $FEWSHOT_DATA, else the repository's data/ folder."""
    root = Path(data_root or os.environ.get("FEWSHOT_DATA") or REPO_DATA)
    if not root.is_dir():
        raise FewshotError(f"data root {root} is not a folder (set --data-root or FEWSHOT_DATA)")
    return root


def _folder_root(data_root: str | os.PathLike | None) -> Path:
    """The root of a folder data set: --data-root, which it needs."""
    if data_root is None:
        raise FewshotError("--dataset folder needs --data-root: the folder of your images")
    return resolve_data_root(data_root)


def _refuse_options(dataset: str, resize: int | None, channels: int | None) -> None:
    """Refuse an unknown dataset name, and resize or channels for a built-in dataset."""
    if dataset not in _NAMES or dataset == FOLDER:
        raise FewshotError(f"unknown dataset {dataset!r}; choose from {', '.join(_NAMES)}")
    if resize is not None or channels is not None:
        channels_, side = GEOMETRY[dataset]
        raise FewshotError(
            f"--resize and --channels apply to --dataset folder, not {dataset} (its images are "
            f"{channels_}x{side}x{side})"
        )


def dataset_geometry(
    dataset: str,
    data_root: str | os.PathLike | None = None,
    split: str = "train",
    resize: int | None = None,
    channels: int | None = None,
) -> tuple[int, int]:
    """(channels, image side) of a dataset's images, known before any is decoded: a built-in
    set's own (GEOMETRY); a folder data set's `channels` and `resize` where given, else those
    of the first image of `split` (read from its header)."""
    if dataset != FOLDER:
        _refuse_options(dataset, resize, channels)
        return GEOMETRY[dataset]
    if resize is not None and channels is not None:
        return channels, resize
    return listing_geometry(list_split(_folder_root(data_root), split), resize, channels)


def check_split(
    dataset: str, split: str, data_root: str | os.PathLike | None = None, per_class: int = 1
) -> None:
    """Refuse, before any image is decoded, a folder data set's split that is missing, lists a
    class without a folder, shares a class with another split or has a class of fewer than
    `per_class` images (a built-in dataset's split is checked as `load_split` reads it)."""
    if dataset == FOLDER:
        checked_listing(_folder_root(data_root), split, per_class)


def load_split(
    dataset: str,
    split: str,
    data_root: str | os.PathLike | None = None,
    converted: bool = True,
    *,
    resize: int | None = None,
    channels: int | None = None,
    per_class: int = 1,
) -> ImageSplit:
    """Read one split ('train', 'val', 'test', ...) of a dataset by name; a split converted by
    `fewshot convert` is mapped from its arrays (`converted=False`: always use the reader).
    `folder` is your own images under `data_root` (see `fewshot.datasets.folder`), converted on
    first read and held at `resize` x `resize` with `channels` where given. A class of fewer
    than `per_class` images (an episode's shot + query) is refused, naming it and its count;
    a folder's before any image is decoded."""
    if dataset == FOLDER:
        root = _folder_root(data_root)
        return read_folder(root, split, resize, channels, per_class, converted)
    _refuse_options(dataset, resize, channels)
    root = resolve_data_root(data_root)
    mapped = read_memmap(memmap_folder(root, dataset, split)) if converted else None
    try:
        data = READERS[dataset](root, split) if mapped is None else mapped
    except (OSError, ValueError, EOFError, zlib.error, zipfile.BadZipFile) as e:
        # The readers name the file at fault where they can; this is the net below them.
        raise FewshotError(
            f"cannot read {dataset} {split!r} under {root}: {type(e).__name__}: {summary(e)}"
        ) from None
    channels, side = GEOMETRY[dataset]
    if (data.channels, data.image_size, data.images.shape[3]) != (channels, side, side):
        raise FewshotError(
            f"{data.source}: {dataset} images must be {channels} x {side} x {side}, got "
            f"{' x '.join(map(str, data.images.shape[1:]))}"
        )
    counts = torch.bincount(data.labels, minlength=data.num_classes).tolist()
    check_counts(data.class_names, counts, data.source, per_class)
    return data


def convert_split(
    dataset: str,
    split: str,
    data_root: str | os.PathLike | None = None,
    *,
    resize: int | None = None,
    channels: int | None = None,
) -> Path:
    """Convert one split into memory-mapped arrays now (anew if it was before), through its
    reader and all its checks; returns the folder they are in."""
    if dataset == FOLDER:
        root = _folder_root(data_root)
        data = read_folder(root, split, resize, channels, again=True)
        return conversion_folder(root, split, data.channels, data.image_size)
    _refuse_options(dataset, resize, channels)
    root = resolve_data_root(data_root)
    folder = memmap_folder(root, dataset, split)
    write_memmap(load_split(dataset, split, root, converted=False), folder)
    return folder


# Imported last: the reader modules read REPO_DATA from this package.
from fewshot.datasets import cifar100_fewshot, miniimagenet, omniglot  # noqa: E402
from fewshot.datasets.cifar100_fewshot import read_cifar_fs, read_fc100  # noqa: E402
from fewshot.datasets.miniimagenet import read_miniimagenet  # noqa: E402
from fewshot.datasets.omniglot import read_omniglot  # noqa: E402
from fewshot.datasets.tieredimagenet import read_tieredimagenet  # noqa: E402

# The registry: name -> reader(data_root, split). A new reader gets its line here;
# tests/test_architecture.py fails on a reader that no registry lists.
READERS: dict[str, Reader] = {
    "cifar-fs": read_cifar_fs,
    "fc100": read_fc100,
    "miniimagenet": read_miniimagenet,
    "omniglot": read_omniglot,
    "tieredimagenet": read_tieredimagenet,
}
# What each reader gives: (channels, image side). Settings are checked against it before any
# data is read (a network, an augmentation and a memory estimate depend on it); a folder data
# set's comes from its images or options (`dataset_geometry`).
GEOMETRY: dict[str, tuple[int, int]] = {
    "cifar-fs": (3, cifar100_fewshot.IMAGE_SIZE),
    "fc100": (3, cifar100_fewshot.IMAGE_SIZE),
    "miniimagenet": (3, miniimagenet.IMAGE_SIZE),
    "omniglot": (1, omniglot.IMAGE_SIZE),
    "tieredimagenet": (3, miniimagenet.IMAGE_SIZE),
}
# What each reader normalises its images with (per-channel mean, std in [0, 1] units): what a
# model trained on it saw, for checkpoints written before they recorded it.
NORMALIZATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar-fs": (cifar100_fewshot.MEAN, cifar100_fewshot.STD),
    "fc100": (cifar100_fewshot.MEAN, cifar100_fewshot.STD),
    "miniimagenet": (miniimagenet.MEAN, miniimagenet.STD),
    "omniglot": (omniglot.MEAN, omniglot.STD),
    "tieredimagenet": (miniimagenet.MEAN, miniimagenet.STD),
}
# Readers of drawings made light on a dark ground (Omniglot's ink 255 on 0: the negative of its
# own PNG files and of a scan): a model trained on one reads dark-on-light images only as
# their negatives (`fewshot predict --invert`).
LIGHT_ON_DARK: frozenset[str] = frozenset({"omniglot"})
_NAMES = RegistryNames(
    "fewshot.datasets", "data set", READERS.keys(), _adopt_dataset, extra=[FOLDER]
)

__all__ = [
    "FOLDER",
    "GEOMETRY",
    "LIGHT_ON_DARK",
    "NORMALIZATION",
    "READERS",
    "DatasetPlugin",
    "ImageSplit",
    "Reader",
    "channels_setting",
    "check_data_options",
    "check_split",
    "convert_split",
    "dataset_geometry",
    "dataset_names",
    "load_split",
    "resize_setting",
    "resolve_data_root",
]
