"""MNIST and Fashion-MNIST in the IDX format (the HPO image tasks).

Each dataset lives in a sub-folder of the data root: `mnist/` and `fashion_mnist/` hold
`{train,t10k}-{images-idx3,labels-idx1}-ubyte`, gzip-compressed (`.gz`) or not; torchvision's
`MNIST/raw/` and `FashionMNIST/raw/` folders work as well. The readers return a
`fewshot.datasets.base.ImageSplit` (uint8 images [N, 1, 28, 28], int64 labels); a missing,
truncated or corrupt file is a FewshotError naming it.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

from fewshot.datasets.base import ImageSplit
from fewshot.runtime.errors import FewshotError

SPLITS = ("train", "test")
MNIST_CLASSES = [str(d) for d in range(10)]
FASHION_CLASSES = [
    "t-shirt/top", "trouser", "pullover", "dress", "coat",
    "sandal", "shirt", "sneaker", "bag", "ankle boot",
]  # fmt: skip

# IDX type byte -> numpy dtype (big-endian, as the format stores it).
IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (gzip-compressed or raw, detected from its first bytes) into an array."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except FileNotFoundError:
        raise FewshotError(f"missing IDX file {path}") from None
    except EOFError:
        raise FewshotError(f"corrupt IDX file {path}: truncated gzip stream") from None
    except (OSError, zlib.error) as e:
        raise FewshotError(f"corrupt IDX file {path}: {e}") from None
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] not in IDX_DTYPES:
        raise FewshotError(f"corrupt IDX file {path}: bad magic number {raw[:4].hex()}")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise FewshotError(f"corrupt IDX file {path}: header truncated")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(IDX_DTYPES[raw[2]])
    # math.prod: exact, where numpy's product of a hostile header (2^21 x 2^21 x 2^22) wraps.
    expected = math.prod(shape) * dtype.itemsize
    found = len(raw) - header
    if found != expected:
        raise FewshotError(
            f"corrupt IDX file {path}: file too {'short' if found < expected else 'long'}: "
            f"header shape {shape} needs {expected} data bytes, the file has {found}"
        )
    return (
        np.frombuffer(raw, dtype=dtype, offset=header)
        .reshape(shape)
        .astype(dtype.newbyteorder("="))
    )


def _find_idx(folders: list[Path], stem: str) -> Path:
    """The first of `stem` or `stem.gz` found in `folders`, or an error naming where it looked."""
    for folder in folders:
        for name in (stem, stem + ".gz"):
            if (folder / name).is_file():
                return folder / name
    raise FewshotError(
        f"missing IDX file {folders[0] / (stem + '.gz')} (or without .gz): "
        "copy the dataset's IDX files there or pass --data-root"
    )


def _idx_paths(
    data_root: Path, folder: str, torchvision_folder: str, split: str
) -> tuple[Path, Path]:
    """The images and labels files of the train or test split of an MNIST-format dataset."""
    if split not in SPLITS:
        raise FewshotError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    folders = [
        data_root / folder,
        data_root / folder / "raw",
        data_root / torchvision_folder / "raw",
    ]
    prefix = "train" if split == "train" else "t10k"
    return (
        _find_idx(folders, f"{prefix}-images-idx3-ubyte"),
        _find_idx(folders, f"{prefix}-labels-idx1-ubyte"),
    )


def idx_length(path: Path) -> int:
    """The first dimension an IDX file's header declares (its number of examples), read from
    the header alone; the reader checks it against the data."""
    try:
        with (gzip.open if _is_gzip(path) else open)(path, "rb") as f:
            header = f.read(8)
    except (OSError, EOFError, zlib.error) as e:
        raise FewshotError(f"corrupt IDX file {path}: {e}") from None
    if len(header) < 8 or header[:2] != b"\x00\x00" or header[3] < 1:
        raise FewshotError(f"corrupt IDX file {path}: bad header {header.hex()}")
    return struct.unpack(">I", header[4:8])[0]


def _is_gzip(path: Path) -> bool:
    """Whether a file starts with the gzip magic number."""
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def mnist_like_length(data_root: Path, folder: str, torchvision_folder: str, split: str) -> int:
    """The number of images of a split of an MNIST-format dataset, from its header alone."""
    return idx_length(_idx_paths(data_root, folder, torchvision_folder, split)[0])


def read_mnist_like(
    data_root: Path, folder: str, torchvision_folder: str, split: str, class_names: list[str]
) -> ImageSplit:
    """Read the train or test split of an MNIST-format dataset stored in data_root/folder."""
    image_path, label_path = _idx_paths(data_root, folder, torchvision_folder, split)
    images, labels = read_idx(image_path), read_idx(label_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise FewshotError(f"{image_path}: expected uint8 images [N, H, W], got {images.shape}")
    if labels.ndim != 1 or len(labels) != len(images):
        raise FewshotError(
            f"{label_path}: expected {len(images)} labels for {image_path.name}, got {labels.shape}"
        )
    if labels.size and int(labels.max()) >= len(class_names):
        row = int(np.argmax(labels >= len(class_names)))
        raise FewshotError(
            f"{label_path}: label {int(labels[row])} at row {row} outside 0..{len(class_names) - 1}"
        )
    return ImageSplit(
        images=torch.from_numpy(images.copy()).unsqueeze(1),
        labels=torch.from_numpy(labels.astype(np.int64)),
        class_names=list(class_names),
        mean=(float(images.mean(dtype=np.float64)) / 255,),
        std=(float(images.std(dtype=np.float64)) / 255,),
        source=str(image_path),
        files=(str(image_path), str(label_path)),
    )


def read_mnist(data_root: Path, split: str) -> ImageSplit:
    """MNIST from data_root/mnist (or data_root/MNIST/raw)."""
    return read_mnist_like(data_root, "mnist", "MNIST", split, MNIST_CLASSES)


def read_fashion_mnist(data_root: Path, split: str) -> ImageSplit:
    """Fashion-MNIST from data_root/fashion_mnist (or data_root/FashionMNIST/raw)."""
    return read_mnist_like(data_root, "fashion_mnist", "FashionMNIST", split, FASHION_CLASSES)


def mnist_length(data_root: Path, split: str) -> int:
    """The images of a split of MNIST, from its header."""
    return mnist_like_length(data_root, "mnist", "MNIST", split)


def fashion_mnist_length(data_root: Path, split: str) -> int:
    """The images of a split of Fashion-MNIST, from its header."""
    return mnist_like_length(data_root, "fashion_mnist", "FashionMNIST", split)
