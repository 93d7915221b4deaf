"""Data and models of the HPO image tasks: MNIST / Fashion-MNIST (IDX) and CIFAR-10 (JPEG tars).

Each dataset lives in a sub-folder of the data root (`fewshot.datasets.resolve_data_root`):

- `mnist/` and `fashion_mnist/`: `{train,t10k}-{images-idx3,labels-idx1}-ubyte`, gzip-compressed
  (`.gz`) or not; torchvision's `MNIST/raw/` and `FashionMNIST/raw/` folders work as well.
- `cifar10_jpeg/`: `{train,test}.tar.gz` holding `*/{train,test}/<class>/NNNN.jpg`.

Every reader returns a `fewshot.datasets.ImageSplit` (uint8 images [N, C, H, W], int64 labels).

Also shared by the image tasks (hyper-cleaning, per-parameter regularization): the two
classifiers as pure functions of a parameter dict (`init_classifier`, `classifier_logits`),
`evaluate`, and `MinibatchStream`, the training data the inner SGD draws its batches from.
"""

from __future__ import annotations

import gzip
import io
import os
import struct
import tarfile
from pathlib import Path, PurePosixPath

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, UnidentifiedImageError

from fewshot.datasets import resolve_data_root
from fewshot.datasets.base import ImageSplit
from fewshot.errors import FewshotError

SPLITS = ("train", "test")
MNIST_CLASSES = [str(d) for d in range(10)]
FASHION_CLASSES = [
    "t-shirt/top", "trouser", "pullover", "dress", "coat",
    "sandal", "shirt", "sneaker", "bag", "ankle boot",
]  # fmt: skip
CIFAR10_CLASSES = [
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
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
    except (OSError, EOFError) as e:
        raise FewshotError(f"corrupt IDX file {path}: {e}") from None
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] not in IDX_DTYPES:
        raise FewshotError(f"corrupt IDX file {path}: bad magic number {raw[:4].hex()}")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise FewshotError(f"corrupt IDX file {path}: header truncated")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(IDX_DTYPES[raw[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        raise FewshotError(
            f"corrupt IDX file {path}: shape {shape} needs {expected} data bytes, "
            f"found {len(raw) - header}"
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


def read_mnist_like(
    data_root: Path, folder: str, torchvision_folder: str, split: str, class_names: list[str]
) -> ImageSplit:
    """Read the train or test split of an MNIST-format dataset stored in data_root/folder."""
    if split not in SPLITS:
        raise FewshotError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    folders = [
        data_root / folder,
        data_root / folder / "raw",
        data_root / torchvision_folder / "raw",
    ]
    prefix = "train" if split == "train" else "t10k"
    image_path = _find_idx(folders, f"{prefix}-images-idx3-ubyte")
    label_path = _find_idx(folders, f"{prefix}-labels-idx1-ubyte")
    images, labels = read_idx(image_path), read_idx(label_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise FewshotError(f"{image_path}: expected uint8 images [N, H, W], got {images.shape}")
    if labels.ndim != 1 or len(labels) != len(images):
        raise FewshotError(
            f"{label_path}: expected {len(images)} labels for {image_path.name}, got {labels.shape}"
        )
    if labels.size and int(labels.max()) >= len(class_names):
        raise FewshotError(f"{label_path}: label {int(labels.max())} outside 0..9")
    return ImageSplit(
        images=torch.from_numpy(images.copy()).unsqueeze(1),
        labels=torch.from_numpy(labels.astype(np.int64)),
        class_names=list(class_names),
        mean=(float(images.mean(dtype=np.float64)) / 255,),
        std=(float(images.std(dtype=np.float64)) / 255,),
        source=str(image_path),
    )


def read_cifar10_jpeg(data_root: Path, split: str) -> ImageSplit:
    """Read CIFAR-10 from data_root/cifar10_jpeg/{split}.tar.gz, ordered by class then file name."""
    if split not in SPLITS:
        raise FewshotError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    path = data_root / "cifar10_jpeg" / f"{split}.tar.gz"
    if not path.is_file():
        raise FewshotError(
            f"missing {path}: copy the CIFAR-10 JPEG tarballs there or pass --data-root"
        )
    found: list[tuple[int, str, bytes]] = []
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                parts = PurePosixPath(member.name).parts
                if not member.isfile() or not member.name.endswith(".jpg") or len(parts) < 3:
                    continue
                if parts[-3] != split or parts[-2] not in CIFAR10_CLASSES:
                    raise FewshotError(f"{path}: unexpected member {member.name}")
                data = tar.extractfile(member).read()  # bytes only; nothing is written to disk
                found.append((CIFAR10_CLASSES.index(parts[-2]), parts[-1], data))
    except (tarfile.TarError, OSError, EOFError) as e:
        raise FewshotError(f"corrupt CIFAR-10 archive {path}: {e}") from None
    if not found:
        raise FewshotError(f"{path}: no <class>/*.jpg images under {split}/")
    found.sort(key=lambda item: item[:2])
    images = torch.empty(len(found), 3, 32, 32, dtype=torch.uint8)
    for i, (_, name, data) in enumerate(found):
        try:
            with Image.open(io.BytesIO(data)) as image:
                pixels = np.asarray(image.convert("RGB"))
        except (UnidentifiedImageError, OSError) as e:
            raise FewshotError(f"{path}: cannot decode {name}: {e}") from None
        if pixels.shape != (32, 32, 3):
            raise FewshotError(f"{path}: {name} is {pixels.shape[:2]}, expected 32x32")
        images[i] = torch.from_numpy(pixels.transpose(2, 0, 1).copy())
    scaled = images.double() / 255
    return ImageSplit(
        images=images,
        labels=torch.tensor([label for label, _, _ in found]),
        class_names=list(CIFAR10_CLASSES),
        mean=tuple(scaled.mean(dim=(0, 2, 3)).tolist()),
        std=tuple(scaled.std(dim=(0, 2, 3)).tolist()),
        source=str(path),
    )


def load_image_dataset(
    name: str, split: str, data_root: str | os.PathLike | None = None
) -> ImageSplit:
    """Read split 'train' or 'test' of 'mnist', 'fashion-mnist' or 'cifar10' from the data root."""
    root = resolve_data_root(data_root)
    if name == "mnist":
        return read_mnist_like(root, "mnist", "MNIST", split, MNIST_CLASSES)
    if name == "fashion-mnist":
        return read_mnist_like(root, "fashion_mnist", "FashionMNIST", split, FASHION_CLASSES)
    if name == "cifar10":
        return read_cifar10_jpeg(root, split)
    raise FewshotError(f"unknown image dataset {name!r}; choose from {', '.join(IMAGE_DATASETS)}")


IMAGE_DATASETS = ("mnist", "fashion-mnist", "cifar10")


def flat_pixels(split: ImageSplit, index: torch.Tensor | None = None) -> torch.Tensor:
    """Images (optionally a subset) as float32 rows [n, C*H*W] with pixels scaled to [0, 1]."""
    images = split.images if index is None else split.images[index]
    return images.reshape(len(images), -1).float().div_(255)


# Classifiers of the HPO image tasks, as pure functions of a parameter dict (any pytree works
# with fewshot.hpo's estimators): "sr" softmax regression, "mlp" in_dim-300-classes with ReLU.
CLASSIFIERS = ("sr", "mlp")
MLP_HIDDEN = 300


def init_classifier(kind: str, in_dim: int, num_classes: int, seed: int) -> dict[str, torch.Tensor]:
    """Initial parameters: zeros for softmax regression, nn.Linear-style uniform for the MLP."""
    if kind == "sr":
        return {"w": torch.zeros(in_dim, num_classes), "b": torch.zeros(num_classes)}
    if kind != "mlp":
        raise FewshotError(f"unknown model {kind!r}; choose from {', '.join(CLASSIFIERS)}")
    gen = torch.Generator().manual_seed(seed)

    def uniform(*shape: int, fan_in: int) -> torch.Tensor:
        return (torch.rand(*shape, generator=gen) * 2 - 1) / fan_in**0.5

    return {
        "w1": uniform(in_dim, MLP_HIDDEN, fan_in=in_dim),
        "b1": uniform(MLP_HIDDEN, fan_in=in_dim),
        "w2": uniform(MLP_HIDDEN, num_classes, fan_in=MLP_HIDDEN),
        "b2": uniform(num_classes, fan_in=MLP_HIDDEN),
    }


def classifier_logits(theta: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Logits [n, classes] of either classifier for flat inputs x [n, in_dim]."""
    if "w" in theta:
        return torch.addmm(theta["b"], x, theta["w"])
    hidden = torch.relu(torch.addmm(theta["b1"], x, theta["w1"]))
    return torch.addmm(theta["b2"], hidden, theta["w2"])


@torch.no_grad()
def evaluate(
    theta: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
) -> tuple[float, float]:
    """(accuracy in %, mean cross-entropy) of a classifier."""
    logits = classifier_logits(theta, x)
    return 100 * float((logits.argmax(1) == y).float().mean()), float(F.cross_entropy(logits, y))


class MinibatchStream:
    """Training data for inner SGD: each `next()` is the next seeded mini-batch of an epoch.

    Returns (x, y, index) with `index` the rows' ids (`ids`, default 0..n-1). A batch of n or more
    is plain full-batch gradient descent: the whole set every call, in order, without copying.
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        batch: int,
        seed: int,
        ids: torch.Tensor | None = None,
    ) -> None:
        if batch >= len(y):
            # Full batch: the same x every step. Column-major storage turns autograd's weight
            # gradient x^T @ grad into a plain GEMM (about 1.5x faster linear layers on CPU).
            x = x.T.contiguous().T
        self.x, self.y, self.batch = x, y, batch
        self.ids = torch.arange(len(y), device=y.device) if ids is None else ids
        self.gen = torch.Generator().manual_seed(seed)
        self.order, self.pos = torch.empty(0, dtype=torch.long), 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The next mini-batch (a fresh permutation per epoch)."""
        if self.batch >= len(self.y):
            return self.x, self.y, self.ids
        if self.pos + self.batch > len(self.order):
            self.order = torch.randperm(len(self.y), generator=self.gen).to(self.y.device)
            self.pos = 0
        rows = self.order[self.pos : self.pos + self.batch]
        self.pos += self.batch
        return self.x[rows], self.y[rows], self.ids[rows]
