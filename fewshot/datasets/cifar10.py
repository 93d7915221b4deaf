"""CIFAR-10 as JPEG re-encodings in tar archives (the HPO image tasks).

`data_root/cifar10_jpeg/{train,test}.tar.gz` hold `*/{train,test}/<class>/NNNN.jpg`; images are
decoded in memory with `torchvision.io.decode_jpeg` (nothing is written to disk) into a
`fewshot.datasets.base.ImageSplit` ordered by class, then file name. A missing or corrupt archive,
an unexpected member or an undecodable image is a FewshotError naming the archive (and member).
"""

from __future__ import annotations

import re
import tarfile
import warnings
import zlib
from pathlib import Path, PurePosixPath

import torch

from fewshot.datasets.base import ImageSplit
from fewshot.runtime.errors import FewshotError

SPLITS = ("train", "test")
CIFAR10_CLASSES = [
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
]  # fmt: skip


def _members(path: Path, split: str) -> list[tuple[int, str, bytes]]:
    """(class index, file name, JPEG bytes) of every image in the archive."""
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
                found.append((CIFAR10_CLASSES.index(parts[-2]), member.name, data))
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise FewshotError(f"corrupt CIFAR-10 archive {path}: {e}") from None
    return found


def decode(data: bytes, path: Path, member: str) -> torch.Tensor:
    """One 32x32 JPEG as uint8 [3, 32, 32]; a FewshotError naming the member if it cannot be."""
    # Imported here: torchvision takes a second or more to import, which every command paid.
    from torchvision.io import ImageReadMode, decode_jpeg

    try:
        image = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), ImageReadMode.RGB)
    except RuntimeError as e:
        reason = re.sub(r"^.*\.cpp:\d+, ", "", str(e)).strip() or "undecodable"
        raise FewshotError(f"{path}: cannot decode {member}: {reason}") from None
    if tuple(image.shape) != (3, 32, 32):
        raise FewshotError(f"{path}: {member} is {tuple(image.shape[1:])}, expected 32x32")
    return image


def read_cifar10_jpeg(data_root: Path, split: str) -> ImageSplit:
    """Read CIFAR-10 from data_root/cifar10_jpeg/{split}.tar.gz, ordered by class then file name."""
    if split not in SPLITS:
        raise FewshotError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    path = data_root / "cifar10_jpeg" / f"{split}.tar.gz"
    if not path.is_file():
        raise FewshotError(
            f"missing {path}: copy the CIFAR-10 JPEG tarballs there or pass --data-root"
        )
    found = _members(path, split)
    if not found:
        raise FewshotError(f"{path}: no <class>/*.jpg images under {split}/")
    found.sort(key=lambda item: (item[0], PurePosixPath(item[1]).name))
    images = torch.empty(len(found), 3, 32, 32, dtype=torch.uint8)
    with warnings.catch_warnings():
        # torchvision 0.29 announces that TorchCodec will take over image decoding; the
        # decoder is the one this project is tested with (<= 0.29.1), pixel-identical to PIL's.
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="torchvision")
        for i, (_, member, data) in enumerate(found):
            images[i] = decode(data, path, member)
    scaled = images.double() / 255
    return ImageSplit(
        images=images,
        labels=torch.tensor([label for label, _, _ in found]),
        class_names=list(CIFAR10_CLASSES),
        mean=tuple(scaled.mean(dim=(0, 2, 3)).tolist()),
        std=tuple(scaled.std(dim=(0, 2, 3)).tolist()),
        source=str(path),
        files=(str(path),),
    )
