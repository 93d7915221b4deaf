"""Evaluation over seeded test episodes: mean accuracy with a 95% confidence interval."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

import torch
from tqdm import tqdm

from fewshot.datasets.base import ImageSplit
from fewshot.datasets.batches import images_to_device
from fewshot.datasets.sampler import EpisodeSampler, EpisodeShape
from fewshot.datasets.varied import VariedSampler, VariedShape, index_shot, shape_shot
from fewshot.evaluation.stats import ci95
from fewshot.methods.base import Method
from fewshot.runtime.memory import MemoryTerm
from fewshot.runtime.signals import Stop, check_stop

# Seeded episodes are drawn from their stream in blocks of this many, whatever the episodes per
# batch: episode i is entry i % EPISODE_BLOCK of block i // EPISODE_BLOCK, a function of the seed
# and i alone. 8 is the batch that results were recorded with (fewshot eval's default, and
# validation's), so these are the very episodes those runs drew.
EPISODE_BLOCK = 8


@dataclass
class EvalResult:
    """Mean accuracy and 95% CI half-width, both in percent, over `episodes` episodes."""

    accuracy: float
    ci95: float
    episodes: int
    way: int
    shot: int
    query: int
    seed: int

    @classmethod
    def of(
        cls, accuracies: torch.Tensor, shape: EpisodeShape | VariedShape, seed: int
    ) -> EvalResult:
        """The summary of per-episode accuracies (fractions) as percentages (of varied
        episodes: their smallest way and largest shot)."""
        mean = 100 * float(accuracies.double().mean())
        ci = 100 * ci95(accuracies)
        return cls(mean, ci, len(accuracies), shape.way, shape.shot, shape.query, seed)

    def line(self) -> str:
        """The summary line printed by `fewshot eval`."""
        return f"accuracy: {self.accuracy:.2f} ± {self.ci95:.2f} %"


def seeded_episodes(
    split: ImageSplit, shape: EpisodeShape | VariedShape, episodes: int, seed: int
) -> Iterator[torch.Tensor]:
    """The first `episodes` seeded episodes of `split` as index tensors [b, way, pool], in
    batches of shape.episodes_per_batch (the last one smaller when they do not divide; varied
    episodes one at a time); a shape the split cannot give is refused here, before any
    batch."""
    if isinstance(shape, VariedShape):
        sampler = VariedSampler(split.labels, shape, seed, source=split.source)
        return (sampler.sample() for _ in range(episodes))
    blocks = replace(shape, episodes_per_batch=EPISODE_BLOCK)
    sampler = EpisodeSampler(split.labels, blocks, seed, source=split.source)
    return _rebatched(sampler, shape.episodes_per_batch, episodes)


def _rebatched(sampler: EpisodeSampler, batch: int, episodes: int) -> Iterator[torch.Tensor]:
    """The first `episodes` episodes of the sampler's blocks, in batches of `batch`."""
    pending: list[torch.Tensor] = []  # drawn episodes not handed out yet
    held = 0
    for start in range(0, episodes, batch):
        size = min(batch, episodes - start)
        while held < size:
            pending.append(sampler.sample())
            held += EPISODE_BLOCK
        drawn = torch.cat(pending)
        yield drawn[:size]
        pending, held = [drawn[size:]], held - size


def episodes_images(shape: EpisodeShape | VariedShape, episodes: int) -> int:
    """The images of `episodes` episodes of `shape` (varied: at their largest way): what an
    evaluation without the cache embeds."""
    way = shape.max_way if isinstance(shape, VariedShape) else shape.way
    return episodes * way * shape.pool


def cache_pays(
    method: Method, images: int, shape: EpisodeShape | VariedShape, episodes: int
) -> bool:
    """Whether embedding a split of `images` images once, `method`'s evaluation cache, costs
    less than embedding each of `episodes` episodes of `shape`: where it has one and the split
    has fewer images than the episodes."""
    return method.caches and images < episodes_images(shape, episodes)


def evaluation_terms(
    method: Method, shape: EpisodeShape | VariedShape, episodes: int, images: int, cache: bool
) -> list[MemoryTerm]:
    """Lower bounds of evaluating `episodes` episodes of `shape` on a split of `images` images,
    on the shapes that will run: batches of at most `episodes` episodes (see `_rebatched`),
    and the method's cache where `cache` is on."""
    batch = min(shape.episodes_per_batch, episodes)
    way = shape.max_way if isinstance(shape, VariedShape) else shape.way
    return method.evaluation_terms(batch, way, shape.pool, shape.shot, images, cache)


def episode_accuracies(
    method: Method,
    split: ImageSplit,
    shape: EpisodeShape | VariedShape,
    episodes: int,
    seed: int,
    device: torch.device,
    cache: bool | None = None,
    progress: bool = False,
    stop: Stop | None = None,
    batches: Iterable[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Per-episode query accuracies [episodes] on seeded episodes of `split`, in eval mode;
    the same whatever shape.episodes_per_batch (see EPISODE_BLOCK).

    `cache` lets the method reuse work across episodes where that is exact (embedding
    methods embed every image once; None: where that pays, `cache_pays`). `stop` is polled
    between batches (Interrupted is raised when it reports a signal). `batches`: the episodes
    (index tensors in batches of shape.episodes_per_batch, e.g. a manifest's) in place of the
    seeded ones.
    """
    if cache is None:
        cache = cache_pays(method, len(split.labels), shape, episodes)
    method.eval()
    if batches is None:  # drawn before the solver's work
        batches = seeded_episodes(split, shape, episodes, seed)
    solve = method.solver(split, shape_shot(shape), device, cache, stop)
    accuracies = []
    total = math.ceil(episodes / shape.episodes_per_batch)
    bar = tqdm(batches, total=total, desc="eval", unit="batch", disable=not progress, leave=False)
    for index in bar:
        check_stop(stop)
        accuracies.append(solve(index))  # stays on the device: no sync per batch
    return torch.cat(accuracies).cpu()


def evaluate(
    method: Method,
    split: ImageSplit,
    shape: EpisodeShape | VariedShape,
    episodes: int,
    seed: int,
    device: torch.device,
    cache: bool | None = None,
    progress: bool = False,
    stop: Stop | None = None,
) -> EvalResult:
    """Mean accuracy ± 95% CI (percent) over `episodes` seeded episodes (`cache` as
    `episode_accuracies`)."""
    acc = episode_accuracies(method, split, shape, episodes, seed, device, cache, progress, stop)
    return EvalResult.of(acc, shape, seed)


def episode_records(
    method: Method,
    split: ImageSplit,
    shape: EpisodeShape | VariedShape,
    episodes: int,
    seed: int,
    device: torch.device,
    files: list[str] | None = None,
    batches: Iterable[torch.Tensor] | None = None,
) -> list[dict]:
    """What each seeded episode was: its classes (split labels), the split indices of its
    support and query images per class (and their `files`, one per image of the split, where
    given), the episode position of the class each query was given (by `Method.predict`, the
    episode's own path, with the episode's seeds) and its accuracy. Varied episodes list each
    class's own number of support images. `batches`: other episodes (`episode_accuracies`)."""
    records = []
    for batch in batches or seeded_episodes(split, shape, episodes, seed):
        shots = index_shot(batch, shape_shot(shape))
        for number, index in enumerate(batch):
            way = index.shape[0]
            counts = [shots] * way if isinstance(shots, int) else shots[number].tolist()
            rows = [row[row >= 0] for row in index]  # a varied episode's padding dropped
            support = [row[:count] for row, count in zip(rows, counts, strict=True)]
            query = [row[count:] for row, count in zip(rows, counts, strict=True)]
            labels = torch.arange(way, device=device).repeat_interleave(
                torch.tensor(counts, device=device)
            )
            scores = method.predict(
                images_to_device(split, torch.cat(support), device),
                labels,
                images_to_device(split, torch.cat(query), device),
                episode=index,
            )
            predicted = scores.argmax(dim=1).view(way, -1).cpu()
            truth = torch.arange(way)[:, None]
            record = {
                "classes": split.labels[index[:, 0]].tolist(),
                "support": [row.tolist() for row in support],
                "query": [row.tolist() for row in query],
                "predicted": predicted.tolist(),
                "accuracy": float((predicted == truth).float().mean()),
            }
            if files:
                record["files"] = [[files[i] for i in row.tolist()] for row in rows]
            records.append(record)
    return records
