"""Moving a batch of a split's images to the device, normalised or augmented there."""

from __future__ import annotations

from collections.abc import Callable

import torch

from fewshot.datasets.augment import normalize
from fewshot.datasets.base import ImageSplit


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


def episode_images(
    split: ImageSplit,
    index: torch.Tensor,
    device: torch.device,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    channels_last: bool = False,
) -> torch.Tensor:
    """The images [*index.shape, C, H, W] of episodes `index` [B, way, pool] on the device (see
    `images_to_device`); a varied episode's padding (-1) gets the split's first image, which no
    method reads."""
    images = images_to_device(split, index.flatten().clamp(min=0), device, transform, channels_last)
    return images.view(*index.shape, *images.shape[1:])
