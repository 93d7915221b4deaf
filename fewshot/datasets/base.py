"""The in-memory form every dataset reader returns."""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass, field

import torch

from fewshot.runtime.errors import FewshotError


@dataclass
class ImageSplit:
    """One split of a few-shot dataset, held in memory.

    images: uint8 tensor [N, C, H, W]; labels: int64 tensor [N] with values 0..len(class_names)-1.
    mean/std are the per-channel normalisation constants of the dataset (in [0, 1] units).
    `source` names it in messages; `files` are all the files it was read from (a conversion
    fingerprints each, to refuse itself when any of them changes). `parts`: the data sets a
    joined split holds one after another, each (name, images) (see fewshot.datasets.sources);
    empty for a split of one.
    """

    images: torch.Tensor
    labels: torch.Tensor
    class_names: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str = ""
    files: tuple[str, ...] = ()
    parts: tuple[tuple[str, int], ...] = ()
    # The last fingerprint and what it was of: the images and labels tensors (weakly held)
    # with their version counters, which every in-place change moves.
    _fingerprint: tuple[tuple, str] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.dim() != 4:
            raise FewshotError(
                f"{self.source}: images must be uint8 [N, C, H, W], got "
                f"{self.images.dtype} {tuple(self.images.shape)}"
            )
        if self.labels.shape != (self.images.shape[0],):
            raise FewshotError(
                f"{self.source}: {self.labels.numel()} labels for {self.images.shape[0]} images"
            )
        n = len(self.class_names)
        if self.labels.numel() and (int(self.labels.min()) < 0 or int(self.labels.max()) >= n):
            raise FewshotError(f"{self.source}: labels outside 0..{n - 1}")
        self.labels = self.labels.long()

    @property
    def num_classes(self) -> int:
        """Number of classes in the split."""
        return len(self.class_names)

    @property
    def channels(self) -> int:
        """Number of image channels."""
        return self.images.shape[1]

    @property
    def image_size(self) -> int:
        """Height (= width) of the stored images."""
        return self.images.shape[2]

    def fingerprint(self) -> str:
        """SHA-256 of the images (as [N, H, W, C] bytes) and labels, what episodes are drawn
        from: the same however the split was read or stored, whatever its class names.
        Computed once for the same tensors unchanged (a feature cache asks at every
        validation; tieredImageNet's validation images take seconds)."""
        images, labels = self.images, self.labels
        if self._fingerprint is not None:
            (image_ref, image_version, label_ref, label_version), digest = self._fingerprint
            same = image_ref() is images and label_ref() is labels
            if same and (image_version, label_version) == (images._version, labels._version):
                return digest
        key = (weakref.ref(images), images._version, weakref.ref(labels), labels._version)
        self._fingerprint = key, self._digest()
        return self._fingerprint[1]

    def _digest(self) -> str:
        """`fingerprint`, computed."""
        digest = hashlib.sha256(repr(tuple(self.images.shape)).encode())
        for start in range(0, len(self.images), 4096):
            chunk = self.images[start : start + 4096].permute(0, 2, 3, 1).contiguous()
            digest.update(chunk.numpy())
        digest.update(self.labels.numpy().astype("<i8").tobytes())
        return digest.hexdigest()
