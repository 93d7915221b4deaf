"""The bias-variance diagnostic: closed forms, the decomposition, and variance falling as 1/U."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fewshot.hpo.splits import make_splits
from fewshot.hpo.tasks.bias_variance import (
    bias_variance_table,
    per_split_hypergradients,
    sample_regression,
    summarize,
)
from fewshot.hpo.tasks.ridge import ridge_hypergradient


@pytest.fixture(scope="module")
def rows():
    return bias_variance_table(lams=np.linspace(0.3, 3.0, 8), inner_steps=8, repeats=400, seed=0)


def test_batched_rhg_converges_to_every_splits_closed_form():
    x, y = sample_regression(22, 5, seed=3)
    lams = np.array([0.3, 1.0, 3.0])
    exact, estimate, val_sets = per_split_hypergradients(x, y, lams, 1 / 11, 400, seed=0)
    assert exact.shape == estimate.shape == (3, 231) and len(set(val_sets)) == 231
    assert np.allclose(estimate, exact, rtol=1e-4, atol=1e-10)
    # Spot-check one entry against the unbatched closed form.
    split = make_splits(22, 1 / 11, 231, seed=0)[17]
    one = ridge_hypergradient(1.0, (x[split.train], y[split.train]), (x[split.val], y[split.val]))
    assert exact[1, 17] == pytest.approx(float(one), rel=1e-12)


def test_error_decomposes_into_bias_and_variance(rows):
    for r in rows:
        assert r.error == pytest.approx(r.bias2 + r.variance, rel=0.05, abs=1e-12)


def test_few_inner_steps_give_a_visible_bias_that_more_steps_remove(rows):
    assert max(r.bias2 for r in rows) > 1e-6
    converged = bias_variance_table(lams=np.array([0.3]), inner_steps=200, repeats=10, seed=0)
    assert converged[0].bias2 < 1e-12


def test_ensemble_variance_falls_as_one_over_u(rows):
    summary = {s["splits"]: s for s in summarize(rows)}
    base = summary[1]["variance"]
    for count in (2, 4, 8):
        ratio = summary[count]["variance"] * count / base
        assert 0.8 < ratio < 1.2, (count, ratio)
        # and it tracks the without-replacement prediction var_1 (V - U) / (U (V - 1)).
        assert summary[count]["variance"] == pytest.approx(
            summary[count]["predicted_variance"], rel=0.2
        )


def test_sampled_data_is_seeded():
    a, b = sample_regression(10, 2, 4), sample_regression(10, 2, 4)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
