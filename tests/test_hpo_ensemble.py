"""Re-splits, EHG and OEHG on ridge regression, checked against closed-form hypergradients."""

from __future__ import annotations

import itertools
import math
import time
from functools import partial

import numpy as np
import pytest
import torch

from fewshot.hpo import Bilevel, Budget, Minibatches, optimize
from fewshot.hpo.ensemble import ehg, oehg, optimize_offline
from fewshot.hpo.hypergrad import aid_cg, aid_fp, rhg, trhg
from fewshot.hpo.splits import make_splits
from fewshot.hpo.tasks.ridge import (
    ridge_hypergradient,
    ridge_problem,
    ridge_smoothness,
    ridge_solution,
)
from fewshot.runtime.errors import FewshotError


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
        (10, 0.0, 1, "gamma 0.0"),
        (10, 1.0, 1, "gamma 1.0"),
        (10, 0.01, 1, "empty"),
    ],
)
def test_bad_split_requests_raise_clear_errors(n, gamma, count, message):
    with pytest.raises(ValueError, match=message):
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


def test_outer_optimiser_is_torch_optim_with_the_hypergradient():
    """One outer SGD step from lam0 moves lam by -lr times the (converged) exact hypergradient."""
    x, y = _regression(24, 4, seed=2)
    data = _split_data(x, y, make_splits(24, 0.25, 1, seed=0))
    lam0 = torch.tensor(0.5, dtype=torch.float64)
    problem = ridge_problem(1.0 / ridge_smoothness(0.5, data[0][0]))
    result = optimize(
        "rhg",
        problem,
        torch.zeros(4, dtype=torch.float64),
        lam0,
        data,
        Budget(outer_steps=1, inner_steps=400),
        outer_lr=0.1,
        outer_optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
    )
    exact = ridge_hypergradient(0.5, *data[0])
    assert float(result.lam) == pytest.approx(0.5 - 0.1 * float(exact), rel=1e-6)
    assert float(lam0) == 0.5  # the caller's lam0 is not stepped in place


def test_split_counts_up_to_all_distinct_splits_take_bounded_time():
    start = time.perf_counter()
    every = make_splits(12, 0.5, math.comb(12, 6), seed=0)  # all 924: enumerated and unranked
    assert len({tuple(s.val) for s in every}) == 924
    many = make_splits(30, 0.2, 1000, seed=0)  # rejection among C(30, 6) = 593775
    assert len({tuple(s.val) for s in many}) == 1000
    with pytest.raises(ValueError, match="allow only"):
        make_splits(100, 0.2, 10**30, seed=0)  # impossible: refused without drawing
    assert time.perf_counter() - start < 10


def _assert_same_result(a, b) -> None:
    assert torch.equal(a.lam, b.lam) and a.outer_losses == b.outer_losses
    assert torch.equal(a.theta, b.theta)


@pytest.mark.parametrize("method", ["rhg", "trhg", "aid-fp", "aid-cg", "oehg"])
def test_optimize_dispatches_to_the_methods_algorithm(ridge_splits, method):
    data, _, problem, _ = ridge_splits
    theta0, lam0 = torch.zeros(8, dtype=torch.float64), torch.tensor(0.7, dtype=torch.float64)
    budget = Budget(outer_steps=4, inner_steps=12, truncate=5, solver_steps=6)
    result = optimize(method, problem, theta0, lam0, data, budget, outer_lr=0.05)
    if method == "oehg":
        direct = oehg(problem, theta0, lam0, data, data[0][0], 4, 0.05, 1)
    else:
        estimator = {
            "rhg": partial(rhg, steps=12),
            "trhg": partial(trhg, steps=12, truncate=5),
            "aid-fp": partial(aid_fp, steps=12, solver_steps=6),
            "aid-cg": partial(aid_cg, steps=12, solver_steps=6),
        }[method]
        direct = optimize_offline(estimator, problem, theta0, lam0, data, 4, 0.05, 12)
    _assert_same_result(result, direct)


def _minibatch_problem() -> Bilevel:
    """Ridge regression with a fixed step size, for (x, y) mini-batches."""
    return Bilevel(ridge_problem(0.0).inner_loss, ridge_problem(0.0).outer_loss, 0.02)


def test_mini_batches_are_drawn_by_the_caller_from_seeded_generators():
    x, y = _regression(60, 3, seed=4)
    splits = make_splits(60, 0.25, 2, seed=0)
    data = [(Minibatches((x[s.train], y[s.train]), 8), (x[s.val], y[s.val])) for s in splits]
    theta0, lam0 = torch.zeros(3, dtype=torch.float64), torch.tensor(0.2, dtype=torch.float64)
    budget = Budget(outer_steps=5, inner_steps=6)

    def run(method: str, seed: int = 3, **options):
        return optimize(
            method, _minibatch_problem(), theta0, lam0, data, budget, outer_lr=0.1, seed=seed,
            **options,
        )  # fmt: skip

    for method in ("rhg", "oehg"):
        _assert_same_result(run(method), run(method))
        assert not torch.equal(run(method).lam, run(method, seed=4).lam)
    # The deployed model draws from its own generator: other deployment data leaves the
    # splits' batches, hence lam and the validation losses, exactly as they were.
    plain, moved = run("oehg"), run("oehg", deploy=Minibatches((x[:20], y[:20]), 5))
    assert torch.equal(moved.lam, plain.lam) and moved.outer_losses == plain.outer_losses
    assert not torch.equal(moved.theta, plain.theta)


def test_calling_a_loss_again_does_not_change_the_run():
    x, y = _regression(40, 3, seed=5)
    data = [(Minibatches((x[:30], y[:30]), 4), (x[30:], y[30:]))]
    problem = _minibatch_problem()

    def twice(theta, lam, batch):
        problem.inner_loss(theta, lam, batch)  # an extra evaluation, e.g. for logging
        return problem.inner_loss(theta, lam, batch)

    noisy = Bilevel(twice, problem.outer_loss, problem.inner_lr)
    theta0, lam0 = torch.zeros(3, dtype=torch.float64), torch.tensor(0.2, dtype=torch.float64)
    budget = Budget(outer_steps=4, inner_steps=5)
    plain = optimize("oehg", problem, theta0, lam0, data, budget, outer_lr=0.1)
    _assert_same_result(plain, optimize("oehg", noisy, theta0, lam0, data, budget, outer_lr=0.1))


def test_a_full_batch_is_the_whole_set_every_draw():
    x, y = torch.arange(10.0)[:, None], torch.arange(10)
    full = Minibatches((x, y), 10).draw(None)
    assert torch.equal(full[0], x) and torch.equal(full[1], y)
    gen = torch.Generator().manual_seed(0)
    xb, yb = Minibatches((x, y), 4).draw(gen)
    assert len(set(yb.tolist())) == 4 and torch.equal(xb[:, 0], yb.float())  # rows aligned
    with pytest.raises(ValueError, match="generator"):
        Minibatches((x, y), 4).draw(None)


def test_a_non_finite_hypergradient_stops_the_run(ridge_splits):
    data = ridge_splits[0]
    diverging = ridge_problem(1e3)  # a step size far beyond 2 / L: theta overflows
    with pytest.raises(FewshotError, match="hypergradient of outer step 1 is not finite"):
        theta0, lam0 = torch.zeros(8, dtype=torch.float64), torch.tensor(0.5, dtype=torch.float64)
        optimize("rhg", diverging, theta0, lam0, data, Budget(1, 200), outer_lr=0.1)


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
