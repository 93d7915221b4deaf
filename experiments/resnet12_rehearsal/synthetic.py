"""Synthetic images with learnable class structure: each class a fixed random pattern, each of
its images that pattern plus independent pixel noise. tests/test_configs.py trains every zoo
config on them; the rehearsal writes them to disk as a miniImageNet split."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fewshot.datasets.base import ImageSplit

# Patterns are drawn on a coarse grid and upsampled, so the paper's augmentation (a crop of a
# few pixels, colour jitter) leaves a class recognisable.
GRID = 6


def class_images(
    classes: int,
    per_class: int,
    channels: int,
    size: int,
    seed: int,
    contrast: float = 100.0,
    noise: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images [classes * per_class, C, size, size] and their labels (class-major): grey
    128 plus `contrast` times the class's pattern in [-1, 1], plus Gaussian noise of that
    standard deviation (in pixel levels)."""
    generator = torch.Generator().manual_seed(seed)
    coarse = 2 * torch.rand(classes, channels, GRID, GRID, generator=generator) - 1
    # Mirror-symmetric, so that a horizontal flip leaves the pattern as it is.
    coarse = (coarse + coarse.flip(-1)) / 2
    patterns = F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    pixels = torch.randn(classes, per_class, channels, size, size, generator=generator)
    images = 128 + contrast * patterns[:, None] + noise * pixels
    labels = torch.arange(classes).repeat_interleave(per_class)
    return images.round().clamp(0, 255).to(torch.uint8).flatten(0, 1), labels


def synthetic_split(
    classes: int, per_class: int, channels: int, size: int, seed: int, **levels: float
) -> ImageSplit:
    """class_images as an ImageSplit, normalised with grey 128 as the mean ('levels':
    contrast and noise)."""
    images, labels = class_images(classes, per_class, channels, size, seed, **levels)
    names = [f"synthetic{c:03d}" for c in range(classes)]
    mean, std = (0.5,) * channels, (0.25,) * channels
    return ImageSplit(images, labels, names, mean, std, f"synthetic {size}x{size} seed {seed}")
