"""tieredImageNet (Ren et al. 2018, 351/97/160 classes, 84x84): npz or PNG-pickle images + labels.

The files come from Ren et al.'s few-shot-ssl code, which read the images with OpenCV: the npz
arrays hold BGR pixels, and MetaOptNet trained on them as stored. The PNG variant is decoded to
that same channel order, so both formats give identical tensors and checkpoints transfer.
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np

from fewshot.datasets.array_split import Layout, check_split, hwc_to_split, read_first_layout
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.image_folder import decode_images
from fewshot.datasets.miniimagenet import IMAGE_SIZE, MEAN, STD
from fewshot.datasets.safe_pickle import safe_load
from fewshot.runtime.errors import FewshotError

FOLDER = "tieredimagenet"
# MetaOptNet's files say 'labels'; Ren et al.'s originals say 'label_specific' (the 608 classes,
# 'label_general' being the 34 categories).
LABEL_KEYS = ("labels", "label_specific")


def read_labels(path: Path, num_images: int, images_path: Path) -> tuple[np.ndarray, list | None]:
    """{split}_labels.pkl -> (class index per image, class names or None)."""
    data = safe_load(path)
    key = next((k for k in LABEL_KEYS if isinstance(data, dict) and k in data), None)
    if key is None:
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise FewshotError(
            f"{path}: expected a dict with key 'labels' or 'label_specific', got {keys}"
        )
    labels = np.asarray(data[key])
    if labels.dtype.kind not in "iu":
        raise FewshotError(f"{path}: {key!r} must be integers, got {labels.dtype}")
    if labels.shape != (num_images,):
        raise FewshotError(
            f"{path}: {labels.size} labels for the {num_images} images of {images_path}"
        )
    names = data.get("label_specific_str")
    top = len(names) - 1 if names is not None else None
    if labels.size and (labels.min() < 0 or (top is not None and labels.max() > top)):
        bound = f"0..{top} (label_specific_str)" if top is not None else "non-negative values"
        raise FewshotError(
            f"{path}: {key!r} has values {labels.min()}..{labels.max()}, outside {bound}"
        )
    return labels, None if names is None else list(names)


def read_npz_images(path: Path) -> np.ndarray:
    """{split}_images.npz -> uint8 [N, 84, 84, 3] (key 'images')."""
    try:
        with np.load(path, allow_pickle=False) as d:
            if "images" not in d.files:
                raise FewshotError(f"{path}: no 'images' array (has {', '.join(d.files)})")
            return d["images"]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise FewshotError(f"corrupt tieredImageNet file {path}: {e}") from None


def read_png_pickle(path: Path) -> np.ndarray:
    """{split}_images_png.pkl (a list of PNG byte strings) -> uint8 [N, 84, 84, 3], decoded once."""
    items = safe_load(path)
    if not isinstance(items, list | tuple):
        raise FewshotError(
            f"{path}: expected a list of PNG-encoded images, got {type(items).__name__}"
        )
    return decode_images(items, IMAGE_SIZE, source=str(path), reverse_channels=True)


def read_with_labels(folder: Path, split: str, images_file: str, read_images) -> ImageSplit:
    """Images from one of the two image files + {split}_labels.pkl -> ImageSplit."""
    images_path = folder / images_file
    images = read_images(images_path)
    labels_path = folder / f"{split}_labels.pkl"
    labels, names = read_labels(labels_path, len(images), images_path)
    return hwc_to_split(
        images,
        labels,
        source=str(images_path),
        files=[images_path, labels_path],
        image_size=IMAGE_SIZE,
        mean=MEAN,
        std=STD,
        names=names,
    )


def read_tieredimagenet(data_root: Path, split: str) -> ImageSplit:
    """Read a tieredImageNet split from data_root/tieredimagenet (or data_root itself)."""
    check_split("tieredimagenet", split)
    labels = f"{split}_labels.pkl"
    layouts = [
        Layout(
            "npz images",
            (f"{split}_images.npz", labels),
            lambda d: read_with_labels(d, split, f"{split}_images.npz", read_npz_images),
        ),
        Layout(
            "PNG-bytes pickle",
            (f"{split}_images_png.pkl", labels),
            lambda d: read_with_labels(d, split, f"{split}_images_png.pkl", read_png_pickle),
        ),
    ]
    return read_first_layout("tieredimagenet", data_root, FOLDER, split, layouts)
