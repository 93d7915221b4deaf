"""CIFAR-FS (Bertinetto et al.) and FC100 (Oreshkin et al.): few-shot splits of CIFAR-100, 32x32.

Two formats: MetaOptNet's pickles ({CIFAR_FS,FC100}_{split}.pickle), or the original
`cifar-100-python/` folder split by the class lists shipped in data/cifar_fs_fc100/
(CIFAR-FS lists fine classes, FC100 lists superclasses; train and test images are pooled,
600 per class, as both papers do).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fewshot.datasets import REPO_DATA
from fewshot.datasets.array_split import (
    Layout,
    check_split,
    hwc_to_split,
    read_first_layout,
    read_gidaris_pickle,
)
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.safe_pickle import safe_load
from fewshot.runtime.errors import FewshotError

IMAGE_SIZE = 32
# MetaOptNet's data/CIFAR_FS.py and data/FC100.py, in [0, 1] units.
MEAN = tuple(x / 255 for x in (129.37731888, 124.10583864, 112.47758569))
STD = tuple(x / 255 for x in (68.20947949, 65.43124043, 70.45866994))
CIFAR100_FILES = ("cifar-100-python/train", "cifar-100-python/test", "cifar-100-python/meta")
SPLIT_LISTS = REPO_DATA / "cifar_fs_fc100"


@dataclass(frozen=True)
class Variant:
    """One of the two CIFAR-100 few-shot datasets."""

    name: str
    pickle_prefix: str
    list_folder: str
    by_superclass: bool


CIFAR_FS = Variant("cifar-fs", "CIFAR_FS", "cifar_fs", by_superclass=False)
FC100 = Variant("fc100", "FC100", "fc100", by_superclass=True)


def split_list_file(variant: Variant, split: str) -> Path:
    """The shipped class list of a split."""
    return SPLIT_LISTS / variant.list_folder / f"{split}.json"


def split_list(variant: Variant, split: str) -> list[str]:
    """Class names of a split: fine classes (CIFAR-FS) or superclasses (FC100)."""
    path = split_list_file(variant, split)
    if not path.is_file():
        raise FewshotError(f"missing split list {path}")
    entries = json.loads(path.read_text())
    # CIFAR-FS entries are [superclass, class] pairs; FC100 entries are superclass names.
    return [e if variant.by_superclass else e[1] for e in entries]


def _cifar_part(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One CIFAR-100 batch file -> (data [N, 3072], fine labels, coarse labels)."""
    part = safe_load(path)
    if not isinstance(part, dict) or not {"data", "fine_labels", "coarse_labels"} <= part.keys():
        raise FewshotError(f"{path}: not a CIFAR-100 python batch (keys data, fine_labels, ...)")
    data = np.asarray(part["data"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * IMAGE_SIZE**2:
        raise FewshotError(f"{path}: expected uint8 data [N, 3072], got {data.dtype} {data.shape}")
    fine, coarse = np.asarray(part["fine_labels"]), np.asarray(part["coarse_labels"])
    if fine.shape != (len(data),) or coarse.shape != (len(data),):
        raise FewshotError(f"{path}: {fine.size} / {coarse.size} labels for {len(data)} images")
    return data, fine, coarse


def read_cifar100_python(folder: Path, variant: Variant, split: str) -> ImageSplit:
    """Select a split's classes from cifar-100-python/{train,test} by the shipped class list."""
    base = folder / "cifar-100-python"
    meta = safe_load(base / "meta")
    if not isinstance(meta, dict) or not {"fine_label_names", "coarse_label_names"} <= meta.keys():
        raise FewshotError(f"{base / 'meta'}: expected fine_label_names and coarse_label_names")
    fine_names = np.asarray(meta["fine_label_names"])
    coarse_names = np.asarray(meta["coarse_label_names"])
    parts = [_cifar_part(base / name) for name in ("train", "test")]
    data, fine, coarse = (np.concatenate(column) for column in zip(*parts, strict=True))
    for labels, names in ((fine, fine_names), (coarse, coarse_names)):
        if labels.size and (labels.min() < 0 or labels.max() >= len(names)):
            raise FewshotError(f"{base}: labels outside 0..{len(names) - 1} of {base / 'meta'}")

    wanted = split_list(variant, split)
    present = coarse_names[coarse] if variant.by_superclass else fine_names[fine]
    unknown = sorted(set(wanted) - set(present.tolist()))
    if unknown:
        raise FewshotError(f"{base}: no images of the {variant.name} {split} classes {unknown}")
    keep = np.isin(present, wanted)
    chw = data[keep].reshape(-1, 3, IMAGE_SIZE, IMAGE_SIZE)
    images = np.ascontiguousarray(chw.transpose(0, 2, 3, 1))  # small: 600 images per class
    return hwc_to_split(
        images,
        fine[keep],
        source=str(base),
        files=[*(folder / name for name in CIFAR100_FILES), split_list_file(variant, split)],
        image_size=IMAGE_SIZE,
        mean=MEAN,
        std=STD,
        names=fine_names.tolist(),
    )


def read_variant(variant: Variant, data_root: Path, split: str) -> ImageSplit:
    """Read a split of CIFAR-FS or FC100 from data_root/<name> (or data_root itself)."""
    check_split(variant.name, split)
    pickle_name = f"{variant.pickle_prefix}_{split}.pickle"
    layouts = [
        Layout(
            "MetaOptNet pickle",
            (pickle_name,),
            lambda d: read_gidaris_pickle(
                d / pickle_name, image_size=IMAGE_SIZE, mean=MEAN, std=STD
            ),
        ),
        Layout(
            "CIFAR-100 python version",
            CIFAR100_FILES,
            lambda d: read_cifar100_python(d, variant, split),
        ),
    ]
    return read_first_layout(variant.name, data_root, variant.name, split, layouts)


def read_cifar_fs(data_root: Path, split: str) -> ImageSplit:
    """Read a CIFAR-FS split (64/16/20 classes)."""
    return read_variant(CIFAR_FS, data_root, split)


def read_fc100(data_root: Path, split: str) -> ImageSplit:
    """Read an FC100 split (60/20/20 classes from 12/4/4 superclasses)."""
    return read_variant(FC100, data_root, split)
