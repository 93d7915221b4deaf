"""The method interface: what turns a batch of episodes into a loss and a test episode into
accuracies. The trainer, the evaluator and the command line know only this interface."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fewshot.datasets.base import ImageSplit
from fewshot.datasets.batches import images_to_device
from fewshot.runtime.signals import Stop

# index [B, way, pool] of a split's images -> query accuracy of each episode [B]
EpisodeSolver = Callable[[torch.Tensor], torch.Tensor]


class Method(nn.Module):
    """A few-shot method: `forward` is the training loss, `solver` evaluates test episodes.

    Images arrive as [B, way, pool, C, H, W] with the first `shot` of every class as the
    original support; `resplits` [U, B, way, pool] reorders each class's pool (first `shot`
    entries = support) or is None for the original split alone.
    """

    amp: str = "auto"  # the backbone's autocast (fewshot.runtime.precision), resolved per call

    def forward(
        self, images: torch.Tensor, resplits: torch.Tensor | None, shot: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean query loss over the U*B problems and the query accuracy of each."""
        raise NotImplementedError

    def check_way(self, way: int) -> None:
        """Refuse episodes of a way the method cannot solve (any way, unless overridden)."""

    def accuracy(self, images: torch.Tensor, shot: int) -> torch.Tensor:
        """Query accuracy of each test episode [B] (images [B, way, pool, C, H, W])."""
        raise NotImplementedError

    def solver(
        self, split: ImageSplit, shot: int, device: torch.device, cache: bool, stop: Stop | None
    ) -> EpisodeSolver:
        """How test episodes of `split` are solved; `cache` lets a method reuse work across
        episodes where that is exact (embedding methods embed every image once)."""

        def solve(index: torch.Tensor) -> torch.Tensor:
            images = images_to_device(split, index.flatten(), device)
            return self.accuracy(images.view(*index.shape, *images.shape[1:]), shot)

        return solve
