"""Embedding methods at test time: the `Adapter` interface, own-statistics BatchNorm, seeds."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Protocol

import torch
from torch import nn

from fewshot.datasets.base import ImageSplit
from fewshot.datasets.varied import VariedShape
from fewshot.methods.base import EpisodeSolver
from fewshot.runtime.memory import MemoryTerm
from fewshot.runtime.signals import Stop

BATCH_NORM_LAYERS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


@contextlib.contextmanager
def own_statistics(module: nn.Module) -> Iterator[None]:
    """Within it, the BatchNorm layers of `module` normalise every batch with its own
    statistics and leave their running statistics as they are; as before on leaving."""
    layers = [layer for layer in module.modules() if isinstance(layer, BATCH_NORM_LAYERS)]
    before = [(layer.training, layer.track_running_stats) for layer in layers]
    for layer in layers:
        layer.training, layer.track_running_stats = True, False
    try:
        yield
    finally:
        for layer, (training, tracking) in zip(layers, before, strict=True):
            layer.training, layer.track_running_stats = training, tracking


class Adapter(Protocol):
    """Adapts the backbone to each test episode (P>M>F's fine-tuning)."""

    def __call__(
        self, split: ImageSplit, shot: int | VariedShape, device: torch.device, stop: Stop | None
    ) -> EpisodeSolver:
        """The solver of `split`'s episodes."""

    def memory_terms(
        self, episodes: int, way: int, shot: int, device: torch.device
    ) -> list[MemoryTerm]:
        """What adapting to a batch of `episodes` episodes holds besides the evaluation."""


def episode_seeds(index: torch.Tensor, seed: int) -> torch.Tensor:
    """One seed per episode [B] (int64) from `seed` and the episode's image indices
    [B, way, pool], its identity in the split: an episode gets the same seed in any batch, at
    any position, with or without the cache."""
    salt = f"{seed}:".encode()
    rows = index.flatten(1).cpu().numpy().astype("<i8")
    digests = [hashlib.blake2b(salt + row.tobytes(), digest_size=8).digest() for row in rows]
    # 63 bits: a non-negative int64, as torch.Generator.manual_seed takes.
    return torch.tensor([int.from_bytes(d, "little") >> 1 for d in digests], dtype=torch.long)
