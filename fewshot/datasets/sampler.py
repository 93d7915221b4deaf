"""Seeded, vectorised episode sampling: episodes are index tensors into an ImageSplit."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fewshot.runtime.errors import FewshotError


@dataclass(frozen=True)
class EpisodeShape:
    """N-way, K-shot, Q-query episodes, B of them per batch."""

    way: int
    shot: int
    query: int
    episodes_per_batch: int = 1

    @property
    def pool(self) -> int:
        """Images per class in one episode (support + query)."""
        return self.shot + self.query


def check_shape(labels: torch.Tensor, shape: EpisodeShape, source: str = "") -> torch.Tensor:
    """Refuse episodes that the split of these labels (named `source`) cannot give: more
    classes than it has, or more images per class than its smallest class holds. Costs what
    the labels cost, whatever the shape, so it runs before anything is sized by the episodes;
    returns the size of every class."""
    if min(shape.way, shape.shot, shape.episodes_per_batch) < 1 or shape.query < 0:
        raise ValueError(f"an episode shape needs way, shot and batch >= 1: {shape}")
    counts = torch.bincount(labels.long().cpu())
    where = f" in {source}" if source else ""
    if shape.way > len(counts):
        raise FewshotError(
            f"{shape.way}-way episodes need {shape.way} classes, {len(counts)}{where}"
        )
    smallest = int(counts.argmin())
    if shape.pool > counts[smallest]:
        raise FewshotError(
            f"shot + query = {shape.pool} images per class, but class {smallest}{where} has "
            f"only {int(counts[smallest])}"
        )
    return counts


class EpisodeSampler:
    """Draws batches of episodes as indices [B, way, shot+query]; the first `shot` are support.

    The class table is built once, so drawing a batch is a handful of tensor ops. The same
    seed gives the very same episodes; `state_dict` lets training resume mid-stream.
    """

    def __init__(self, labels: torch.Tensor, shape: EpisodeShape, seed: int, source: str = ""):
        labels = labels.long().cpu()
        counts = check_shape(labels, shape, source)
        num_classes = len(counts)
        self.shape = shape
        order = torch.argsort(labels, stable=True)
        # table[c, j] = index of the j-th image of class c (padded with -1 for smaller classes)
        width = int(counts.max())
        offsets = torch.cumsum(counts, 0) - counts
        table = torch.full((num_classes, width), -1, dtype=torch.long)
        rank = torch.arange(len(labels)) - offsets[labels[order]]
        table[labels[order], rank] = order
        self.table, self.counts = table, counts
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self) -> torch.Tensor:
        """One batch of episodes: long tensor [B, way, shot+query] of dataset indices."""
        b, (c, width) = self.shape.episodes_per_batch, self.table.shape
        classes = torch.rand(b, c, generator=self.generator).argsort(dim=1)[:, : self.shape.way]
        # Random keys per image; padding gets +inf so it sorts last and is never picked.
        keys = torch.rand(b, self.shape.way, width, generator=self.generator)
        keys.masked_fill_(self.table[classes] < 0, float("inf"))
        picks = keys.argsort(dim=2)[:, :, : self.shape.pool]
        return torch.gather(self.table[classes], 2, picks)

    def state_dict(self) -> dict:
        """The RNG position, for exact resume."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved RNG position."""
        self.generator.set_state(state["generator"])


class ImageBatchSampler:
    """Draws batches of image indices for supervised pretraining: passes over the split in a
    seeded random order, each image once per pass (the last incomplete batch of a pass is
    dropped, as `DataLoader(drop_last=True)` does). `state_dict` lets training resume mid-pass.
    """

    def __init__(self, images: int, batch: int, seed: int, source: str = ""):
        if batch > images:
            where = f" in {source}" if source else ""
            raise FewshotError(f"--batch-size {batch} needs {batch} images, {images}{where}")
        self.images, self.batch = images, batch
        self.generator = torch.Generator().manual_seed(seed)
        self.order = torch.randperm(images, generator=self.generator)
        self.position = 0

    @property
    def batches_per_pass(self) -> int:
        """Full batches in one pass over the images."""
        return self.images // self.batch

    def sample(self) -> torch.Tensor:
        """The next batch: long tensor [batch] of dataset indices."""
        if self.position + self.batch > self.images:
            self.order = torch.randperm(self.images, generator=self.generator)
            self.position = 0
        batch = self.order[self.position : self.position + self.batch]
        self.position += self.batch
        return batch

    def state_dict(self) -> dict:
        """The pass's order and position and the RNG position, for exact resume."""
        return {
            "generator": self.generator.get_state(),
            "order": self.order.clone(),
            "position": self.position,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved position; ValueError when it is not one of these images."""
        order, position = state["order"], state["position"]
        if not (
            isinstance(order, torch.Tensor)
            and order.shape == (self.images,)
            and isinstance(position, int)
            and 0 <= position <= self.images
        ):
            raise ValueError(f"the sampler state is not a pass over {self.images} images")
        self.generator.set_state(state["generator"])
        self.order, self.position = order.long(), position
