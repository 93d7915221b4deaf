"""Shared pieces of the array readers: format auto-detection and HWC arrays to an ImageSplit."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fewshot.datasets.base import ImageSplit
from fewshot.datasets.safe_pickle import safe_load
from fewshot.runtime.errors import FewshotError

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Layout:
    """One on-disk format of a split: the files it needs (relative to its folder), its reader."""

    name: str
    files: tuple[str, ...]
    read: Callable[[Path], ImageSplit]


def check_split(dataset: str, split: str) -> None:
    """Refuse a split name the few-shot datasets do not have."""
    if split not in SPLITS:
        raise FewshotError(f"{dataset} has splits {', '.join(SPLITS)}, not {split!r}")


def read_first_layout(
    dataset: str, data_root: Path, folder: str, split: str, layouts: Sequence[Layout]
) -> ImageSplit:
    """Read `split` with the first layout whose files exist in data_root/folder (or data_root)."""
    candidates = [data_root / folder, data_root]
    for directory in candidates:
        for layout in layouts:
            if all((directory / name).exists() for name in layout.files):
                return layout.read(directory)
    looked = "; ".join(f"{layout.name}: {' + '.join(layout.files)}" for layout in layouts)
    where = " or ".join(str(d) for d in candidates)
    raise FewshotError(
        f"no {dataset} {split!r} split in {where}. Looked for {looked}. See data/README.md"
    )


def hwc_to_split(
    images: np.ndarray,
    raw_labels: Sequence | np.ndarray,
    *,
    source: str,
    files: Sequence[Path],
    image_size: int,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    names: Mapping | Sequence | None = None,
) -> ImageSplit:
    """uint8 [N, H, W, 3] images + any hashable labels -> ImageSplit with labels 0..C-1.

    Classes are numbered in sorted order of their raw labels; `names` maps a raw label to its
    class name (default: the label itself); `files` are all the files they were read from.
    The pixels are not copied: the [N, C, H, W] tensor is a view of the HWC array, i.e. a
    channels_last tensor, so a 10 GB split stays 10 GB.
    """
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8:
        kind = images.dtype if isinstance(images, np.ndarray) else type(images).__name__
        raise FewshotError(f"{source}: images must be a uint8 array, got {kind}")
    if images.ndim != 4 or images.shape[1:] != (image_size, image_size, 3):
        raise FewshotError(
            f"{source}: expected images [N, {image_size}, {image_size}, 3], got {images.shape}"
        )
    labels = np.asarray(raw_labels)
    if labels.shape != (len(images),):
        raise FewshotError(
            f"{source}: {labels.size} labels for {len(images)} images (shape {labels.shape})"
        )
    classes, index = np.unique(labels, return_inverse=True)
    lookup = names if names is not None else {}
    class_names = [str(lookup[c]) if _has(lookup, c) else str(c) for c in classes.tolist()]
    return ImageSplit(
        torch.from_numpy(images).permute(0, 3, 1, 2),
        torch.from_numpy(index.astype(np.int64)),
        class_names,
        mean=mean,
        std=std,
        source=source,
        files=tuple(map(str, files)),
    )


def _has(lookup: Mapping | Sequence, key: object) -> bool:
    """Whether a mapping has `key`, or a sequence has an element at integer index `key`."""
    if isinstance(lookup, Mapping):
        return key in lookup
    return isinstance(key, int) and 0 <= key < len(lookup)


def read_gidaris_pickle(
    path: Path, *, image_size: int, mean: tuple[float, ...], std: tuple[float, ...]
) -> ImageSplit:
    """MetaOptNet/Gidaris pickle: {'data': uint8 [N, H, W, 3], 'labels': [N] ints, ...}.

    The labels are class ids that need not start at 0 or be contiguous; the optional
    'catname2label' ({wnid: id}) names the classes.
    """
    data = safe_load(path)
    if not isinstance(data, dict) or not {"data", "labels"} <= data.keys():
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise FewshotError(f"{path}: expected a dict with keys 'data' and 'labels', got {keys}")
    labels = np.asarray(data["labels"])
    if labels.dtype.kind not in "iu":
        raise FewshotError(f"{path}: 'labels' must be integers, got {labels.dtype}")
    names = {label: name for name, label in data.get("catname2label", {}).items()}
    return hwc_to_split(
        data["data"],
        labels,
        source=str(path),
        files=[path],
        image_size=image_size,
        mean=mean,
        std=std,
        names=names,
    )
