"""Dataset readers: each returns an `ImageSplit` of uint8 images held in memory."""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

from fewshot.datasets.base import ImageSplit
from fewshot.datasets.memmap import memmap_folder, read_memmap
from fewshot.runtime.errors import FewshotError, summary

Reader = Callable[[Path, str], ImageSplit]

REPO_DATA = Path(__file__).resolve().parents[2] / "data"


def dataset_names() -> list[str]:
    """The names readers are registered under."""
    return sorted(READERS)


def resolve_data_root(data_root: str | os.PathLike | None = None) -> Path:
    """--data-root if given, else $FEWSHOT_DATA, else the repository's data/ folder."""
    root = Path(data_root or os.environ.get("FEWSHOT_DATA") or REPO_DATA)
    if not root.is_dir():
        raise FewshotError(f"data root {root} is not a folder (set --data-root or FEWSHOT_DATA)")
    return root


def load_split(
    dataset: str, split: str, data_root: str | os.PathLike | None = None, converted: bool = True
) -> ImageSplit:
    """Read one split ('train', 'val', 'test', ...) of a dataset by name; a split converted by
    `fewshot convert` is mapped from its arrays (`converted=False`: always use the reader)."""
    if dataset not in READERS:
        raise FewshotError(f"unknown dataset {dataset!r}; choose from {', '.join(dataset_names())}")
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
    return data


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
# data is read (a network, an augmentation and a memory estimate depend on it).
GEOMETRY: dict[str, tuple[int, int]] = {
    "cifar-fs": (3, cifar100_fewshot.IMAGE_SIZE),
    "fc100": (3, cifar100_fewshot.IMAGE_SIZE),
    "miniimagenet": (3, miniimagenet.IMAGE_SIZE),
    "omniglot": (1, omniglot.IMAGE_SIZE),
    "tieredimagenet": (3, miniimagenet.IMAGE_SIZE),
}

__all__ = [
    "GEOMETRY",
    "READERS",
    "ImageSplit",
    "Reader",
    "dataset_names",
    "load_split",
    "resolve_data_root",
]
