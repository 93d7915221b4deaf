"""Evaluation over seeded test episodes: mean accuracy with a 95% confidence interval."""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass

import torch
from tqdm import tqdm

from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sampler import EpisodeSampler, EpisodeShape
from fewshot.evaluation.stats import ci95
from fewshot.methods.base import Method
from fewshot.runtime.signals import Stop, check_stop


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
    def of(cls, accuracies: torch.Tensor, shape: EpisodeShape, seed: int) -> EvalResult:
        """The summary of per-episode accuracies (fractions) as percentages."""
        mean = 100 * float(accuracies.double().mean())
        return cls(mean, 100 * ci95(accuracies), len(accuracies), *astuple(shape)[:3], seed)

    def line(self) -> str:
        """The summary line printed by `fewshot eval`."""
        return f"accuracy: {self.accuracy:.2f} ± {self.ci95:.2f} %"


def episode_accuracies(
    method: Method,
    split: ImageSplit,
    shape: EpisodeShape,
    episodes: int,
    seed: int,
    device: torch.device,
    cache: bool = True,
    progress: bool = False,
    stop: Stop | None = None,
) -> torch.Tensor:
    """Per-episode query accuracies [episodes] on seeded episodes of `split`, in eval mode.

    `cache` lets the method reuse work across episodes where that is exact (embedding
    methods embed every image once). `stop` is polled between batches (Interrupted is raised
    when it reports a signal).
    """
    method.eval()
    sampler = EpisodeSampler(split.labels, shape, seed, source=split.source)
    solve = method.solver(split, shape.shot, device, cache, stop)
    accuracies = []
    batches = math.ceil(episodes / shape.episodes_per_batch)
    for _ in tqdm(range(batches), desc="eval", unit="batch", disable=not progress, leave=False):
        check_stop(stop)
        accuracies.append(solve(sampler.sample()))  # stays on the device: no sync per batch
    return torch.cat(accuracies)[:episodes].cpu()


def evaluate(
    method: Method,
    split: ImageSplit,
    shape: EpisodeShape,
    episodes: int,
    seed: int,
    device: torch.device,
    cache: bool = True,
    progress: bool = False,
    stop: Stop | None = None,
) -> EvalResult:
    """Mean accuracy ± 95% CI (percent) over `episodes` seeded episodes."""
    acc = episode_accuracies(method, split, shape, episodes, seed, device, cache, progress, stop)
    return EvalResult.of(acc, shape, seed)
