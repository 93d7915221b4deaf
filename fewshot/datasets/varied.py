"""Varied episodes, as Meta-Dataset draws them (Triantafillou et al. 2020): the way is drawn
per episode, each class gets its own shot from a random support budget, every class the same
number of queries.

An episode is an index tensor [1, way, pool] with pool = the largest shot + query: class c's
row holds its shots[c] support images, then its queries, then -1 up to the pool. The shots are
therefore in the index itself (`episode_shots`), so episodes travel as today's index tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from fewshot.datasets.sampler import EpisodeSampler, EpisodeShape, check_shape
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.settings import SettingError, refuse_unused


@dataclass(frozen=True)
class VariedShape:
    """Episodes of way .. max_way classes, each with 1 .. shot support images (a share of a
    budget of at most max_support images) and `query` queries; drawn one per batch."""

    way: int
    max_way: int
    shot: int
    max_support: int
    query: int
    episodes_per_batch: int = 1

    @property
    def pool(self) -> int:
        """Images per class of the largest episodes, on average: their support budget shared
        by max_way classes, plus the queries (what memory estimates size)."""
        return min(self.shot, -(-self.max_support // self.max_way)) + self.query

    def describe(self) -> str:
        """'5-50-way, 1-100-shot (at most 500 support images), 10-query varied episodes'."""
        return (
            f"{self.way}-{self.max_way}-way, 1-{self.shot}-shot (at most {self.max_support} "
            f"support images), {self.query}-query varied episodes"
        )


def episode_shots(index: torch.Tensor, query: int) -> torch.Tensor:
    """Support images per class [B, way] of varied episodes [B, way, pool] (see module)."""
    return (index >= 0).sum(dim=-1) - query


def index_shot(index: torch.Tensor, shot: int | VariedShape) -> int | torch.Tensor:
    """The shot of episodes `index` [B, way, pool] drawn with `shot`: itself, or the shots per
    class [B, way] of varied episodes."""
    return shot if isinstance(shot, int) else episode_shots(index, shot.query)


def shape_shot(shape: EpisodeShape | VariedShape) -> int | VariedShape:
    """What a method's solver takes as the shot of episodes of `shape` (see `index_shot`)."""
    return shape if isinstance(shape, VariedShape) else shape.shot


def check_varied(labels: torch.Tensor, shape: VariedShape, source: str = "") -> torch.Tensor:
    """Refuse varied episodes that the split of these labels (named `source`) cannot give, in
    one line; returns the size of every class. Each class must hold one support image and the
    queries; the budget must allow one support image per class of the largest way."""
    if not 1 <= shape.way <= shape.max_way:
        raise FewshotError(f"varied episodes need 1 <= way <= max way, got {shape}")
    if min(shape.shot, shape.query) < 1 or shape.episodes_per_batch != 1:
        raise FewshotError(f"varied episodes need shot, query >= 1 and one a batch: {shape}")
    if shape.max_support < shape.max_way:
        raise FewshotError(
            f"a support budget of {shape.max_support} images cannot give one image to each "
            f"class of a {shape.max_way}-way episode: raise --max-support or lower --max-way"
        )
    counts = torch.bincount(labels.long().cpu())
    where = f" in {source}" if source else ""
    if shape.way > len(counts):
        raise FewshotError(
            f"{shape.way}-way episodes need {shape.way} classes, {len(counts)}{where}"
        )
    smallest = int(counts.argmin())
    if counts[smallest] < shape.query + 1:
        raise FewshotError(
            f"varied episodes need 1 support image + {shape.query} queries per class, but "
            f"class {smallest}{where} has only {int(counts[smallest])}"
        )
    return counts


class VariedSampler:
    """Draws varied episodes one at a time as indices [1, way, pool] (see the module); the same
    seed gives the very same episodes, `state_dict` lets training resume mid-stream.

    Per episode, as Meta-Dataset: way ~ U{way .. max_way}; a support budget
    min(max_support, sum_c ceil(beta * a_c)) with beta ~ U(0, 1] and a_c = min(shot,
    n_c - query) the support images class c can give; class c's share of the budget beyond one
    image per class is proportional to alpha_c * n_c with log alpha_c ~ U[log 1/2, log 2], capped
    at a_c.
    """

    def __init__(self, labels: torch.Tensor, shape: VariedShape, seed: int, source: str = ""):
        labels = labels.long().cpu()
        self.counts = check_varied(labels, shape, source)
        self.shape = shape
        order = torch.argsort(labels, stable=True)
        offsets = torch.cumsum(self.counts, 0) - self.counts
        self.members = [order[o : o + n] for o, n in zip(offsets, self.counts, strict=True)]
        self.generator = torch.Generator().manual_seed(seed)

    def draw_shots(self, classes: torch.Tensor) -> torch.Tensor:
        """The support images of each drawn class [way] (see the class docstring)."""
        s, g = self.shape, self.generator
        sizes = self.counts[classes].double()
        available = (sizes - s.query).clamp(max=s.shot)
        beta = 1.0 - float(torch.rand((), generator=g, dtype=torch.float64))  # (0, 1]
        budget = min(s.max_support, int(torch.ceil(beta * available).sum()))
        log_alpha = torch.empty(len(classes), dtype=torch.float64).uniform_(
            math.log(0.5), math.log(2.0), generator=g
        )
        weights = log_alpha.exp() * sizes
        extra = torch.floor(weights / weights.sum() * (budget - len(classes)))
        return torch.minimum(extra + 1, available).long()

    def sample(self) -> torch.Tensor:
        """One varied episode: long tensor [1, way, pool] of dataset indices, -1 past each
        class's support and queries."""
        s, g = self.shape, self.generator
        high = min(s.max_way, len(self.counts))
        way = int(torch.randint(s.way, high + 1, (), generator=g))
        classes = torch.randperm(len(self.counts), generator=g)[:way]
        shots = self.draw_shots(classes)
        pool = int(shots.max()) + s.query
        index = torch.full((1, way, pool), -1, dtype=torch.long)
        for row, (c, shot) in enumerate(zip(classes.tolist(), shots.tolist(), strict=True)):
            members = self.members[c]
            picks = torch.randperm(len(members), generator=g)[: shot + s.query]
            index[0, row, : len(picks)] = members[picks]
        return index

    def state_dict(self) -> dict:
        """The RNG position, for exact resume."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved RNG position."""
        self.generator.set_state(state["generator"])


def episode_sampler(
    labels: torch.Tensor, shape: EpisodeShape | VariedShape, seed: int, source: str = ""
) -> EpisodeSampler | VariedSampler:
    """The seeded sampler of episodes of `shape`, fixed or varied (refusing, in one line, a
    shape the split of `labels`, named `source`, cannot give)."""
    if isinstance(shape, VariedShape):
        return VariedSampler(labels, shape, seed, source)
    return EpisodeSampler(labels, shape, seed, source)


def check_episode_shape(
    labels: torch.Tensor, shape: EpisodeShape | VariedShape, source: str = ""
) -> None:
    """Refuse, in one line, episodes of `shape` (fixed or varied) that the split of `labels`
    (named `source`) cannot give."""
    if isinstance(shape, VariedShape):
        check_varied(labels, shape, source)
    else:
        check_shape(labels, shape, source)


# The settings of varied episodes, shared by `fewshot train` and the evaluation commands.
VARIED_HELP = (
    "Meta-Dataset-style varied episodes, one per batch: a way drawn per episode from --way to "
    "--max-way, each class a share of a random support budget (1 to --shot images, at most "
    "--max-support in all), --query queries per class"
)
MAX_SUPPORT = 500  # Meta-Dataset's cap on an episode's support images


def check_varied_options(settings: Any) -> None:
    """Refuse, naming the flag, --max-way or --max-support without --varied, and a max way
    under --way or over the support budget; `settings` has the fields varied, way, max_way
    and max_support."""
    if not settings.varied:
        refuse_unused(settings, ["max_way", "max_support"], "fixed episodes (no --varied)")
        return
    max_way = settings.max_way or settings.way
    if max_way < settings.way:
        raise SettingError("max_way", f"must be at least --way {settings.way}, got {max_way}")
    if settings.max_support < max_way:
        raise SettingError(
            "max_support",
            f"must give one support image to each class of a {max_way}-way episode, got "
            f"{settings.max_support}",
        )


def varied_shape(settings: Any) -> VariedShape:
    """The varied episodes of checked settings (see `check_varied_options`)."""
    max_way = settings.max_way or settings.way
    return VariedShape(settings.way, max_way, settings.shot, settings.max_support, settings.query)


def varied_name(settings: Any) -> str:
    """A file name's part for varied episodes, e.g. 'varied5-50w100s500S10q'."""
    shape = varied_shape(settings)
    return f"varied{shape.way}-{shape.max_way}w{shape.shot}s{shape.max_support}S{shape.query}q"
