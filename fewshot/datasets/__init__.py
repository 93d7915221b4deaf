"""Dataset readers: each returns an `ImageSplit` of uint8 images held in memory."""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

from fewshot.datasets.base import ImageSplit
from fewshot.datasets.memmap import memmap_folder, read_memmap
from fewshot.errors import FewshotError, summary

# name -> reader(data_root, split) -> ImageSplit. Readers register themselves below.
READERS: dict[str, Callable[[Path, str], ImageSplit]] = {}

REPO_DATA = Path(__file__).resolve().parents[2] / "data"


def register(name: str):
    """Decorator adding a reader to READERS under `name`."""

    def wrap(fn: Callable[[Path, str], ImageSplit]) -> Callable[[Path, str], ImageSplit]:
        READERS[name] = fn
        return fn

    return wrap


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
    if mapped is not None:
        return mapped
    try:
        return READERS[dataset](root, split)
    except (OSError, ValueError, EOFError, zlib.error, zipfile.BadZipFile) as e:
        # The readers name the file at fault where they can; this is the net below them.
        raise FewshotError(
            f"cannot read {dataset} {split!r} under {root}: {type(e).__name__}: {summary(e)}"
        ) from None


# Import for their @register side effect.
from fewshot.datasets import (  # noqa: E402,F401
    cifar100_fewshot,
    miniimagenet,
    omniglot,
    tieredimagenet,
)

__all__ = ["READERS", "ImageSplit", "dataset_names", "load_split", "register", "resolve_data_root"]
