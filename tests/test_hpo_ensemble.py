"""Re-splits, EHG and OEHG on ridge regression, checked against closed-form hypergradients."""

from __future__ import annotations

import itertools
import math
from functools import partial

import numpy as np
import pytest
import torch

from fewshot.errors import FewshotError
from fewshot.hpo.ensemble import TreeAdam, ehg, make_splits, oehg, optimize_offline
from fewshot.hpo.hypergrad import aid_cg, rhg
from fewshot.hpo.ridge import ridge_hypergradient, ridge_problem, ridge_smoothness, ridge_solution


def _regression(n: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = x @ torch.randn(d, generator=g, dtype=torch.float64)
    return x, y + 1.5 * torch.randn(n, generator=g, dtype=torch.float64)


def _split_data(x, y, splits):
    return [((x[s.train], y[s.train]), (x[s.val], y[s.val])) for s in splits]


def test_splits_are_distinct_disjoint_seeded_and_sized():
    splits = make_splits(30, 0.2, 8, seed=3)
    assert len({tuple(s.val) for s in splits}) == 8
    for s in splits:
        assert len(s.val) == 6 and len(s.train) == 24
        assert sorted(np.concatenate([s.train, s.val]).tolist()) == list(range(30))
    again = make_splits(30, 0.2, 8, seed=3)
    assert all((a.val == b.val).all() for a, b in zip(splits, again, strict=True))
    assert any(
        (a.val != b.val).any() for a, b in zip(splits, make_splits(30, 0.2, 8, 4), strict=True)
    )


def test_all_distinct_splits_can_be_drawn_when_few_exist():
    splits = make_splits(6, 1 / 3, math.comb(6, 2), seed=0)
    assert {tuple(s.val) for s in splits} == set(itertools.combinations(range(6), 2))


@pytest.mark.parametrize(
    ("n", "gamma", "count", "message"),
    [
        (6, 1 / 3, 16, "only 15 distinct splits"),
        (10, 0.0, 1, "--gamma 0.0"),
        (10, 1.0, 1, "--gamma 1.0"),
        (10, 0.01, 1, "empty"),
    ],
)
def test_bad_split_requests_raise_clear_errors(n, gamma, count, message):
    with pytest.raises(FewshotError, match=message):
        make_splits(n, gamma, count, seed=0)


def test_ehg_of_converged_estimators_is_the_mean_closed_form_hypergradient():
    x, y = _regression(24, 4, seed=1)
    data = _split_data(x, y, make_splits(24, 0.25, 5, seed=0))
    lam = torch.tensor(0.4, dtype=torch.float64)
    problem = ridge_problem(1.0 / max(ridge_smoothness(0.4, tr) for tr, _ in data))
    exact = torch.stack([ridge_hypergradient(0.4, tr, va) for tr, va in data]).mean()
    for estimator in (partial(rhg, steps=400), partial(aid_cg, steps=400, solver_steps=10)):
        result = ehg(estimator, problem, torch.zeros(4, dtype=torch.float64), lam, data)
        assert float((result.grad - exact).abs() / exact.abs()) < 1e-4
        assert len(result.theta) == 5


def test_tree_adam_matches_torch_adam_on_a_quadratic():
    target = torch.tensor([1.0, -2.0])
    adam = TreeAdam({"a": torch.zeros(2)}, lr=0.1)
    ref = torch.zeros(2, requires_grad=True)
    ref_opt = torch.optim.Adam([ref], lr=0.1)
    for _ in range(20):
        lam = adam.step({"a": 2 * (adam.value()["a"] - target)})
        ref_opt.zero_grad()
        ((ref - target) ** 2).sum().backward()
        ref_opt.step()
    assert torch.allclose(lam["a"], ref.detach())


def _mean_exact_hypergradient(lam: float, data) -> float:
    return float(torch.stack([ridge_hypergradient(lam, tr, va) for tr, va in data]).mean())


def _bisect_root(f, lo: float, hi: float) -> float:
    assert f(lo) < 0 < f(hi)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi)


@pytest.fixture(scope="module")
def ridge_splits():
    x, y = _regression(40, 8, seed=0)
    data = _split_data(x, y, make_splits(40, 0.25, 4, seed=0))
    lam_star = _bisect_root(lambda lam: _mean_exact_hypergradient(lam, data), 1e-3, 50.0)
    lr = 1.0 / max(ridge_smoothness(lam_star, tr) for tr, _ in data)
    return data, lam_star, ridge_problem(lr), (x, y)


def test_oehg_reaches_the_minimiser_of_the_averaged_validation_loss(ridge_splits):
    data, lam_star, problem, observed = ridge_splits
    theta0 = torch.zeros(8, dtype=torch.float64)
    result = oehg(
        problem, theta0, torch.tensor(1.0, dtype=torch.float64), data, observed, 1500, 0.01
    )
    lam = float(result.lam)
    assert abs(lam - lam_star) < 0.05 * lam_star + 0.02, (lam, lam_star)
    # The deployed model tracks the ridge solution on its data for the final lam.
    assert torch.allclose(result.theta, ridge_solution(lam, observed), atol=1e-3)


def test_offline_ehg_reaches_the_same_minimiser(ridge_splits):
    data, lam_star, problem, _ = ridge_splits
    estimator = partial(aid_cg, steps=60, solver_steps=10)
    theta0 = torch.zeros(8, dtype=torch.float64)
    result = optimize_offline(
        estimator,
        problem,
        theta0,
        torch.tensor(0.6, dtype=torch.float64),
        data,
        outer_steps=100,
        outer_lr=0.02,
        inner_steps=60,
    )
    assert abs(float(result.lam) - lam_star) < 0.05 * lam_star + 0.02
    assert torch.allclose(result.theta, ridge_solution(float(result.lam), data[0][0]), atol=1e-6)


def test_oehg_accepts_splits_from_a_callable(ridge_splits):
    data, _, problem, observed = ridge_splits
    theta0 = torch.zeros(8, dtype=torch.float64)
    lam0 = torch.tensor(1.0, dtype=torch.float64)
    seen = []

    def splits_at(t, theta):
        seen.append((t, theta.shape))
        return data if t % 2 == 0 else data[::-1]

    fixed = oehg(problem, theta0, lam0, data, observed, 6, 0.01)
    from_callable = oehg(problem, theta0, lam0, splits_at, observed, 6, 0.01)
    assert [t for t, _ in seen] == list(range(6)) and seen[0][1] == (8,)
    # Reversing the split order swaps which inner model sees which split: a different run.
    assert not torch.equal(fixed.lam, from_callable.lam)
    same = oehg(problem, theta0, lam0, lambda t, theta: data, observed, 6, 0.01)
    assert torch.equal(fixed.lam, same.lam) and torch.equal(fixed.theta, same.theta)
