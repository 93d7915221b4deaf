"""Confidence intervals: per episode, paired on shared episodes, and across training seeds,
against hand computations and scipy."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch
from scipy import stats

from fewshot.evaluation.stats import ci95, paired_ci, paired_seeds_ci, seeds_ci


def test_ci95_is_sample_std_over_sqrt_n():
    acc = torch.tensor([0.5, 0.75, 1.0, 0.25, 1.0])
    want = 1.96 * statistics.stdev([0.5, 0.75, 1.0, 0.25, 1.0]) / math.sqrt(5)
    assert ci95(acc) == pytest.approx(want, rel=1e-12)
    assert ci95(torch.tensor([0.4, 0.6])) == pytest.approx(
        1.96 * 0.1414213562373095 / 1.4142135623730951
    )
    with pytest.raises(ValueError):
        ci95(torch.tensor([1.0]))


def test_paired_ci_by_hand():
    a = torch.tensor([0.6, 0.8, 0.4, 1.0])
    b = torch.tensor([0.8, 0.8, 0.6, 1.0])
    d = paired_ci(a, b)
    # differences 0.2, 0, 0.2, 0: mean 0.1, sample sd sqrt(0.04/3), 1.96 sd / 2
    assert d.mean == pytest.approx(0.1)
    assert d.ci95 == pytest.approx(1.96 * math.sqrt(0.04 / 3) / 2)
    # t = 0.1 / (sd / 2) = sqrt(3) with 3 degrees of freedom
    assert d.p_value == pytest.approx(2 * stats.t.sf(math.sqrt(3), 3))
    assert d.n == 4


def test_paired_interval_is_narrower_when_episodes_share_their_difficulty():
    rng = np.random.default_rng(0)
    difficulty = rng.uniform(0.4, 1.0, 2000)  # what both models find hard or easy
    a = torch.tensor(np.clip(difficulty + rng.normal(0, 0.03, 2000), 0, 1))
    b = torch.tensor(np.clip(difficulty + 0.01 + rng.normal(0, 0.03, 2000), 0, 1))
    d = paired_ci(a, b)
    assert d.ci95 < ci95(a) / 3  # several times narrower than either model's own interval
    assert d.mean - d.ci95 > 0 and d.p_value < 1e-6
    ref = stats.ttest_rel(b.numpy(), a.numpy())
    assert d.p_value == pytest.approx(ref.pvalue, rel=1e-9)


def test_seed_intervals_are_t_intervals():
    values = [0.951, 0.962, 0.948, 0.957, 0.955]
    mean, half = seeds_ci(values)
    low, high = stats.t.interval(0.95, 4, loc=np.mean(values), scale=stats.sem(values))
    assert mean == pytest.approx(np.mean(values))
    assert (mean - half, mean + half) == pytest.approx((low, high))
    other = [v + 0.004 + 0.001 * (i % 2) for i, v in enumerate(values)]
    d = paired_seeds_ci(values, other)
    assert d.mean == pytest.approx(0.0044)
    assert d.p_value == pytest.approx(stats.ttest_rel(other, values).pvalue)
    with pytest.raises(ValueError):
        seeds_ci([0.9])


def test_paired_values_of_another_shape_are_named():
    with pytest.raises(ValueError, match=r"paired values b expects 1 dimension \[episodes\]"):
        paired_ci(torch.zeros(4), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="must be of one length, got 4 and 3 episodes"):
        paired_ci(torch.zeros(4), torch.zeros(3))
