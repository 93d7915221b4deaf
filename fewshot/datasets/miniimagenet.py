"""miniImageNet (Ravi & Larochelle split, 64/16/20 classes, 84x84) in its three common formats."""

from __future__ import annotations

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
from fewshot.datasets.image_folder import read_image_folder
from fewshot.datasets.safe_pickle import safe_load
from fewshot.runtime.errors import FewshotError

FOLDER = "miniimagenet"
IMAGE_SIZE = 84
# MetaOptNet's data/mini_imagenet.py (also used for tieredImageNet), in [0, 1] units.
MEAN = tuple(x / 255 for x in (120.39586422, 115.59361427, 104.54012653))
STD = tuple(x / 255 for x in (70.68188272, 68.27635443, 72.54505529))

GIDARIS_FILES = {
    "train": "miniImageNet_category_split_train_phase_train.pickle",
    "val": "miniImageNet_category_split_val.pickle",
    "test": "miniImageNet_category_split_test.pickle",
}
# learn2learn names the validation file "validation"; other copies of the same cache say "val".
LEARN2LEARN_FILES = {
    "train": ("mini-imagenet-cache-train.pkl",),
    "val": ("mini-imagenet-cache-validation.pkl", "mini-imagenet-cache-val.pkl"),
    "test": ("mini-imagenet-cache-test.pkl",),
}


def read_learn2learn_cache(path: Path) -> ImageSplit:
    """learn2learn cache: {'image_data': uint8 [N, 84, 84, 3], 'class_dict': {wnid: [indices]}}.

    Classes are numbered in the order of class_dict, as learn2learn does.
    """
    data = safe_load(path)
    if not isinstance(data, dict) or not {"image_data", "class_dict"} <= data.keys():
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise FewshotError(f"{path}: expected keys 'image_data' and 'class_dict', got {keys}")
    images, class_dict = data["image_data"], data["class_dict"]
    num_images = len(images)
    labels = np.full(num_images, -1, dtype=np.int64)
    for k, (wnid, indices) in enumerate(class_dict.items()):
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= num_images):
            raise FewshotError(
                f"{path}: class {wnid} lists image indices outside 0..{num_images - 1}"
            )
        if (labels[idx] >= 0).any():
            raise FewshotError(f"{path}: class {wnid} lists images already in another class")
        labels[idx] = k
    if (labels < 0).any():
        raise FewshotError(f"{path}: {int((labels < 0).sum())} images are in no class")
    return hwc_to_split(
        images,
        labels,
        source=str(path),
        files=[path],
        image_size=IMAGE_SIZE,
        mean=MEAN,
        std=STD,
        names=list(class_dict),
    )


def read_ravi_folder(folder: Path, split: str) -> ImageSplit:
    """images/ + the Ravi CSV list (the folder's own {split}.csv, else the one shipped in data/)."""
    csv_path = folder / f"{split}.csv"
    if not csv_path.is_file():
        csv_path = REPO_DATA / FOLDER / f"{split}.csv"
    images, labels, paths = read_image_folder(csv_path, folder / "images", IMAGE_SIZE)
    return hwc_to_split(
        images,
        labels,
        source=str(csv_path),
        files=[csv_path, *paths],
        image_size=IMAGE_SIZE,
        mean=MEAN,
        std=STD,
    )


def layouts(split: str) -> list[Layout]:
    """The formats a miniImageNet split may come in, in the order they are tried."""
    gidaris = GIDARIS_FILES[split]
    found = [
        Layout(
            "MetaOptNet pickle",
            (gidaris,),
            lambda d: read_gidaris_pickle(d / gidaris, image_size=IMAGE_SIZE, mean=MEAN, std=STD),
        )
    ]
    found += [
        Layout("learn2learn cache", (name,), lambda d, name=name: read_learn2learn_cache(d / name))
        for name in LEARN2LEARN_FILES[split]
    ]
    found.append(
        Layout(
            f"image folder listed by the Ravi {split}.csv",
            ("images/",),
            lambda d: read_ravi_folder(d, split),
        )
    )
    return found


def read_miniimagenet(data_root: Path, split: str) -> ImageSplit:
    """Read a miniImageNet split from data_root/miniimagenet (or data_root itself)."""
    check_split("miniimagenet", split)
    return read_first_layout("miniimagenet", data_root, FOLDER, split, layouts(split))
