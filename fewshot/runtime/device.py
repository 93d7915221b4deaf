"""Device choice and moving episode images to it."""

from __future__ import annotations

from collections.abc import Callable

import torch

from fewshot.datasets.augment import normalize
from fewshot.datasets.base import ImageSplit
from fewshot.errors import FewshotError


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available else cpu; 'cuda' without a GPU is a user error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise FewshotError("--device cuda was asked for, but no CUDA GPU is available")
    if name not in ("cpu", "cuda"):
        raise FewshotError(f"--device must be auto, cpu or cuda, not {name!r}")
    return torch.device(name)


def images_to_device(
    split: ImageSplit,
    index: torch.Tensor,
    device: torch.device,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    channels_last: bool = False,
) -> torch.Tensor:
    """Gather uint8 images split.images[index]; return them normalised (or transformed) on device.

    The gather and the copy stay uint8 (4x less traffic than float); pinned memory makes the
    host-to-GPU copy asynchronous.
    """
    batch = split.images[index.cpu()]
    if device.type == "cuda":
        batch = batch.pin_memory().to(device, non_blocking=True)
    images = transform(batch) if transform else normalize(batch, split.mean, split.std)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images
