"""Several data sets in one run (`--extra-data`): their training splits joined into one
ImageSplit, each batch of episodes drawn from one of them at a time, as Meta-Dataset trains.

The joined split holds its sources one after another (images, and classes renumbered after the
previous source's), in memory: a copy of every source's images. Its `parts` name each source
with its image count, which `SourceSampler` reads to draw a source, then that source's own
episodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from fewshot.datasets import resolve_data_root
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sampler import EpisodeSampler, EpisodeShape
from fewshot.datasets.varied import VariedSampler, VariedShape, episode_sampler
from fewshot.runtime.errors import FewshotError


@dataclass(frozen=True)
class Source:
    """One data set of `--extra-data`: a dataset name and its data root (None: the default)."""

    dataset: str
    data_root: str | None = None

    @classmethod
    def parse(cls, spec: str) -> Source:
        """`NAME` or `NAME:ROOT` (a folder data set needs its ROOT, the images' folder)."""
        name, _, root = spec.partition(":")
        if not name:
            raise ValueError(f"{spec!r} names no dataset: give NAME or NAME:ROOT")
        return cls(name, root or None)

    def images(self) -> tuple[str, Path | None]:
        """What tells two sources' images apart: the dataset and its data root resolved (the
        default root where none is given), so that `ROOT/`, `ROOT/../ROOT` or a link to ROOT
        are ROOT."""
        try:
            root = resolve_data_root(self.data_root).resolve()
        except FewshotError:  # not a folder: refused when its data is read; as spelled here
            root = Path(self.data_root).resolve() if self.data_root else None
        return self.dataset, root


def join_splits(named: list[tuple[str, ImageSplit]]) -> ImageSplit:
    """The splits (each named) as one: images one after another, classes renumbered after the
    previous split's and named NAME/CLASS, the first split's normalisation."""
    first = named[0][1]
    offsets = torch.tensor([0, *[s.num_classes for _, s in named]]).cumsum(0)
    return ImageSplit(
        torch.cat([s.images for _, s in named]),
        torch.cat([s.labels + offset for (_, s), offset in zip(named, offsets, strict=False)]),
        [f"{name}/{c}" for name, s in named for c in s.class_names],
        mean=first.mean,
        std=first.std,
        source=" + ".join(s.source for _, s in named),
        files=tuple(f for _, s in named for f in s.files),
        parts=tuple((name, len(s.labels)) for name, s in named),
    )


class SourceSampler:
    """Draws each batch from one source of a joined split (uniformly at random), as that
    source's own sampler (`make(labels, seed, name)`, fixed or varied episodes) draws it,
    with the indices moved to the source's place in the joined split (padding stays -1)."""

    def __init__(self, labels: torch.Tensor, parts: tuple, seed: int, make):
        self.generator = torch.Generator().manual_seed(seed)
        self.samplers, self.starts = [], []
        start = 0
        for i, (name, images) in enumerate(parts):
            own = labels[start : start + images]
            if len(own) == 0:
                raise FewshotError(f"{name}: no training images")
            self.samplers.append(make(own - own.min(), seed + 1 + i, name))
            self.starts.append(start)
            start += images

    @property
    def shape(self):
        """The episode shape every source's sampler draws."""
        return self.samplers[0].shape

    def sample(self) -> torch.Tensor:
        """One batch of episodes of one source, as indices into the joined split."""
        i = int(torch.randint(len(self.samplers), (), generator=self.generator))
        index = self.samplers[i].sample()
        return torch.where(index >= 0, index + self.starts[i], index)

    def state_dict(self) -> dict:
        """The RNG positions (the source draw's and every source's), for exact resume."""
        return {
            "generator": self.generator.get_state(),
            "sources": [s.state_dict() for s in self.samplers],
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from saved RNG positions."""
        self.generator.set_state(state["generator"])
        for sampler, own in zip(self.samplers, state["sources"], strict=True):
            sampler.load_state_dict(own)


def training_sampler(
    data: ImageSplit, shape: EpisodeShape | VariedShape, seed: int
) -> EpisodeSampler | VariedSampler | SourceSampler:
    """The seeded sampler of a training split's episodes: a joined split's draws each batch
    from one source (`SourceSampler`), a split of one source as `episode_sampler`."""
    if len(data.parts) < 2:
        return episode_sampler(data.labels, shape, seed, data.source)
    return SourceSampler(
        data.labels,
        data.parts,
        seed,
        lambda labels, own_seed, name: episode_sampler(labels, shape, own_seed, name),
    )
