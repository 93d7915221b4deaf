"""Confidence intervals for accuracies: per episode, paired on shared episodes, across seeds.

Two models tested on the same seeded episodes share most of their episode-to-episode
variance, so their difference is measured per episode (the paired interval, often several
times narrower than two separate ones). Claims about a training method need the variance
across training seeds: a t interval over a handful of seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fewshot.runtime.shapes import shape_fault


def ci95(accuracies: torch.Tensor) -> float:
    """Half-width of the 95% CI of the mean: 1.96 * s / sqrt(n), s with ddof=1."""
    n = accuracies.numel()
    if n < 2:
        raise ValueError("a confidence interval needs at least two episodes")
    return 1.96 * float(accuracies.double().std(unbiased=True)) / math.sqrt(n)


@dataclass(frozen=True)
class Difference:
    """Mean of b - a over paired values, its 95% CI half-width and a two-sided p-value."""

    mean: float
    ci95: float
    p_value: float
    n: int
    test: str


def paired_ci(a: torch.Tensor, b: torch.Tensor) -> Difference:
    """b - a per episode (same seeded episodes): mean ± 1.96 s / sqrt(n) (ddof=1, as `ci95`)
    and the paired t-test's p-value."""
    for name, values in (("a", a), ("b", b)):
        fault = shape_fault(values.shape, ("episodes",))
        if fault:
            raise ValueError(f"paired values {name} {fault}: one value per episode")
    if len(a) != len(b):
        raise ValueError(f"paired values must be of one length, got {len(a)} and {len(b)} episodes")
    diff = b.double() - a.double()
    return Difference(float(diff.mean()), ci95(diff), _paired_t_p(a, b), len(diff), "paired t-test")


def seeds_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean over training seeds ± the t-based 95% half-width t_{0.975, n-1} s / sqrt(n)."""
    n = len(values)
    if n < 2:
        raise ValueError("an interval across seeds needs at least two seeds")
    from scipy import stats  # here: scipy.stats takes half a second to import

    x = torch.tensor(values, dtype=torch.float64)
    t = float(stats.t.ppf(0.975, n - 1))
    return float(x.mean()), t * float(x.std(unbiased=True)) / math.sqrt(n)


def paired_seeds_ci(a: Sequence[float], b: Sequence[float]) -> Difference:
    """b_i - a_i across seeds i (seed i of each arm paired): mean ± t interval, paired t-test."""
    if len(a) != len(b):
        raise ValueError(f"paired arms need as many seeds each, got {len(a)} and {len(b)}")
    diff = [y - x for x, y in zip(a, b, strict=True)]
    mean, half = seeds_ci(diff)
    p = _paired_t_p(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64))
    return Difference(mean, half, p, len(diff), "paired t-test across seeds")


def _paired_t_p(a: torch.Tensor, b: torch.Tensor) -> float:
    """Two-sided p-value of the paired t-test of b against a (1.0 when all differences are 0)."""
    from scipy import stats

    diff = (b.double() - a.double()).numpy()
    if not diff.any():
        return 1.0
    return float(stats.ttest_rel(b.double().numpy(), a.double().numpy()).pvalue)
