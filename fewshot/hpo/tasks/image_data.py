"""The image sets of the HPO tasks by name, as flat [0, 1] pixel rows.

The readers live in `fewshot.datasets.idx` (MNIST, Fashion-MNIST) and `fewshot.datasets.cifar10`.
"""

from __future__ import annotations

import os

import torch

from fewshot.datasets import resolve_data_root
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.cifar10 import read_cifar10_jpeg
from fewshot.datasets.idx import (
    fashion_mnist_length,
    mnist_length,
    read_fashion_mnist,
    read_mnist,
)
from fewshot.runtime.errors import FewshotError

IMAGE_READERS = {"mnist": read_mnist, "fashion-mnist": read_fashion_mnist}
IMAGE_READERS["cifar10"] = read_cifar10_jpeg
IMAGE_DATASETS = tuple(IMAGE_READERS)
# Pixels per flat row and the class count of each set: known before reading it (memory checks).
FLAT_SIZES = {"mnist": 28 * 28, "fashion-mnist": 28 * 28, "cifar10": 3 * 32 * 32}
NUM_CLASSES = 10
# How many images a split of each MNIST-format set holds, from its file's header alone.
HEADER_LENGTHS = {"mnist": mnist_length, "fashion-mnist": fashion_mnist_length}


def load_image_dataset(
    name: str, split: str, data_root: str | os.PathLike | None = None
) -> ImageSplit:
    """Read split 'train' or 'test' of 'mnist', 'fashion-mnist' or 'cifar10' from the data root."""
    if name not in IMAGE_READERS:
        raise FewshotError(
            f"unknown image dataset {name!r}; choose from {', '.join(IMAGE_DATASETS)}"
        )
    return IMAGE_READERS[name](resolve_data_root(data_root), split)


def split_length(name: str, split: str, data_root: str | os.PathLike | None = None) -> int:
    """The images of split 'train' or 'test' of 'mnist' or 'fashion-mnist', read from the
    header of its file before any image is (the reader checks the header against the data)."""
    return HEADER_LENGTHS[name](resolve_data_root(data_root), split)


def flat_pixels(split: ImageSplit, index: torch.Tensor | None = None) -> torch.Tensor:
    """Images (optionally a subset) as float32 rows [n, C*H*W] with pixels scaled to [0, 1]."""
    images = split.images if index is None else split.images[index]
    return images.reshape(len(images), -1).float().div_(255)
