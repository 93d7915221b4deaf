"""A frozen backbone's features on disk: every image of a split embedded once, then
memory-mapped by each training step, each validation and each later evaluation of the run.

A file is named by everything its features depend on (the split's images and labels, their
normalisation, the backbone's class, weights and buffers, and the precision it runs in), so a
change to any of them names another file and a stale cache is never read. Each file is written
with its checksum and checked before use (runtime.cache's checked entries): a damaged one is
embedded again, with one note.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fewshot.datasets.base import ImageSplit
from fewshot.runtime.cache import load_checked, save_checked

# The folder of a run's cache, inside its run folder.
FOLDER = "features"


def backbone_digest(backbone: nn.Module, precision: str) -> str:
    """SHA-256 of the backbone's class, every weight and buffer, and its precision."""
    digest = hashlib.sha256(f"{type(backbone).__qualname__}:{precision}".encode())
    for name, tensor in sorted(backbone.state_dict().items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


class FeatureCache:
    """The .npy files of one folder, each a split's features [N, d] (float32) under one
    backbone with its checksum beside it; `features` embeds a split only when its file is
    missing, or fails its checksum or shape (then with a note)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def path(self, split: ImageSplit, backbone: str) -> Path:
        """The file of `split`'s features under the backbone of digest `backbone`."""
        digest = hashlib.sha256(f"{backbone}:{split.mean}:{split.std}".encode())
        digest.update(split.fingerprint().encode())
        return self.folder / f"{digest.hexdigest()[:32]}.npy"

    def features(
        self, split: ImageSplit, backbone: str, embed: Callable[[ImageSplit], torch.Tensor]
    ) -> torch.Tensor:
        """The features of every image of `split` (`embed(split)` once, written atomically),
        memory-mapped from the file on the CPU."""
        path = self.path(split, backbone)

        def whole(array: np.ndarray) -> bool:
            return array.dtype == np.float32 and array.ndim == 2 and len(array) == len(split.labels)

        # Copy-on-write: a writable view for torch, the file itself never written.
        mapped = load_checked(path, "feature cache", "embedded again", whole, mmap_mode="c")
        if mapped is None:
            save_checked(embed(split).float().cpu().numpy(), path)
            mapped = np.load(path, mmap_mode="c", allow_pickle=False)
        return torch.from_numpy(mapped)


class FeatureMemory:
    """`FeatureCache` in memory: a split's features under one backbone, embedded once for
    every evaluation of one model in one process (fewshot bench's cells of one split), where
    that costs less than embedding the `images` of all their episodes."""

    def __init__(self, images: int) -> None:
        self.images = images
        self.held: dict[str, torch.Tensor] = {}

    def pays(self, split_images: int) -> bool:
        """Whether embedding a split of `split_images` images once costs less than embedding
        every episode's."""
        return split_images < self.images

    def features(
        self, split: ImageSplit, backbone: str, embed: Callable[[ImageSplit], torch.Tensor]
    ) -> torch.Tensor:
        """The features of every image of `split` (`embed(split)` the first time)."""
        key = f"{backbone}:{split.mean}:{split.std}:{split.fingerprint()}"
        if key not in self.held:
            self.held[key] = embed(split).float().cpu()
        return self.held[key]
