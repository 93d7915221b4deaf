"""Regularization task: inner problems against scikit-learn / cvxpy, hypergradients, short runs."""

from __future__ import annotations

import math
from dataclasses import replace

import cvxpy as cp
import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression, Ridge

from fewshot.datasets.libsvm import load_dataset
from fewshot.hpo.hypergrad import rhg
from fewshot.hpo.tasks.regularization import (
    Settings,
    default_inner_lr,
    linear_scores,
    make_problem,
    run,
)
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.settings import SettingError


@pytest.fixture(scope="module")
def heart():
    return load_dataset("heart", seed=0)


def _tensors(x, y):
    return torch.from_numpy(x), torch.from_numpy(y)


def _zeros(dim: int) -> dict[str, torch.Tensor]:
    return {"w": torch.zeros(dim, dtype=torch.float64), "b": torch.zeros((), dtype=torch.float64)}


def _solve(model: str, data, lam: float, steps: int) -> dict[str, torch.Tensor]:
    problem = make_problem(model, default_inner_lr(model, data[0].numpy()))
    log_lam = torch.tensor(math.log(lam), dtype=torch.float64)
    return problem.descend(_zeros(data[0].shape[1]), log_lam, data, steps)


def test_ridge_inner_solution_matches_sklearn():
    data = load_dataset("bodyfat", seed=0)
    x, y = data.x_observed, data.y_observed
    lam = 0.05
    theta = _solve("ridge", _tensors(x, y), lam, 4000)
    # sklearn minimises ||y - Xw - b||^2 + alpha ||w||^2, i.e. n times our objective.
    reference = Ridge(alpha=lam * len(y)).fit(x, y)
    assert np.allclose(theta["w"].numpy(), reference.coef_, atol=1e-6)
    assert abs(float(theta["b"]) - reference.intercept_) < 1e-6


def test_ridge_inner_descent_stays_stable_for_a_large_lambda():
    # lam = 100 puts the penalty's curvature 2 lam far above the data loss's L: a step of 1 / L
    # would diverge; the default step 1 / (L + 2 lam) converges to sklearn's solution.
    data = load_dataset("triazines", seed=0)
    x, y = data.x_observed, data.y_observed
    lam = 100.0
    assert 2 * lam > 2 / default_inner_lr("ridge", x)
    theta = _solve("ridge", _tensors(x, y), lam, 5000)
    reference = Ridge(alpha=lam * len(y)).fit(x, y)
    # the unpenalised intercept converges slowest (the step is small next to its curvature)
    assert np.allclose(theta["w"].numpy(), reference.coef_, rtol=1e-3, atol=1e-9)
    assert float(theta["b"]) == pytest.approx(reference.intercept_, rel=1e-4)


def test_logistic_inner_solution_matches_sklearn(heart):
    lam = 0.01
    theta = _solve("logistic", _tensors(heart.x_observed, heart.y_observed), lam, 6000)
    n = len(heart.y_observed)
    reference = LogisticRegression(C=1 / (2 * n * lam), tol=1e-12, max_iter=10_000)
    reference.fit(heart.x_observed, heart.y_observed)
    assert np.allclose(theta["w"].numpy(), reference.coef_[0], atol=1e-4)


def test_svm_inner_solution_approaches_the_cvxpy_optimum(heart):
    """Hinge loss is not smooth: gradient descent gets close in objective, not to 1e-6."""
    x, y = heart.x_observed, heart.y_observed
    lam = 0.01
    w, b = cp.Variable(x.shape[1]), cp.Variable()
    objective = cp.sum(cp.pos(1 - cp.multiply(y, x @ w + b))) / len(y) + lam * cp.sum_squares(w)
    optimum = cp.Problem(cp.Minimize(objective)).solve()
    theta = _solve("svm", _tensors(x, y), lam, 3000)
    problem = make_problem("svm", 1.0)
    reached = float(problem.inner_loss(theta, torch.tensor(math.log(lam)), _tensors(x, y)))
    assert optimum <= reached + 1e-9
    assert reached - optimum < 0.02 * optimum


def test_per_parameter_hypergradients_sum_to_the_scalar_one(heart):
    """With every lam_i equal, d/dlog lam = sum_i d/dlog lam_i (chain rule)."""
    data = _tensors(heart.x_observed, heart.y_observed)
    train = (data[0][:80], data[1][:80])
    val = (data[0][80:], data[1][80:])
    problem = make_problem("logistic", default_inner_lr("logistic", heart.x_observed))
    scalar = rhg(problem, _zeros(13), torch.tensor(-3.0, dtype=torch.float64), train, val, 30)
    vector = rhg(problem, _zeros(13), torch.full((13,), -3.0, dtype=torch.float64), train, val, 30)
    assert vector.grad.shape == (13,)
    assert torch.allclose(vector.grad.sum(), scalar.grad, rtol=1e-10)


def test_evaluate_counts_signs_against_labels():
    theta = {"w": torch.tensor([1.0, 0.0], dtype=torch.float64), "b": torch.tensor(0.0)}
    x = torch.tensor([[2.0, 0.0], [-1.0, 5.0], [0.5, 0.0], [-3.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64)
    loss, accuracy = linear_scores("svm", theta, (x, y))
    assert accuracy == 50.0
    assert loss == pytest.approx((0 + 0 + 1.5 + 4) / 4)


# The step counts each method reads (any other is refused: test_hpo_options).
STEPS = {
    "rhg": {"inner_steps": 16},
    "trhg": {"inner_steps": 16, "truncate": 4},
    "aid-fp": {"inner_steps": 16, "solver_steps": 5},
    "aid-cg": {"inner_steps": 16, "solver_steps": 5},
    "oehg": {},
}


@pytest.mark.parametrize("method", list(STEPS))
def test_short_runs_are_seeded_and_report_the_deployed_model(heart, method):
    settings = Settings(
        dataset="heart",
        model="logistic",
        method=method,
        out="unused",
        outer_steps=8,
        resplits=2,
        eval_points=4,
        **STEPS[method],
    )
    first, second = run(settings, heart), run(settings, heart)
    assert first.lam == second.lam and first.test_loss == second.test_loss
    assert len(first.lam) == 1 and first.lam[0] != pytest.approx(settings.init_lam, rel=1e-6)
    assert 0.0 < first.test_accuracy <= 100.0
    assert [step for step, _ in first.curve] == [2, 4, 6, 8]


def test_oehg_improves_on_its_initial_model(heart):
    """Hundreds of OEHG steps must beat the zero model (test loss log 2) by a clear margin."""
    settings = Settings(dataset="heart", model="logistic", method="oehg", out="unused")
    result = run(replace(settings, outer_steps=300), heart)
    assert result.test_loss < 0.8 * math.log(2.0)
    assert result.test_accuracy > 75.0


def test_user_errors(heart):
    base = {"dataset": "heart", "out": "unused"}
    with pytest.raises(SettingError, match="ridge does not fit heart"):
        Settings(**base, model="ridge", method="rhg")
    with pytest.raises(SettingError, match="method must be one of"):
        Settings(**base, model="svm", method="bogus")
    with pytest.raises(SettingError, match=r"gamma must be > 0 and < 1, got 1\.5"):
        Settings(**base, model="svm", method="rhg", gamma=1.5)
    with pytest.raises(SettingError, match="aid-cg cannot learn the svm"):
        Settings(**base, model="svm", method="aid-cg")
    pyrim = Settings(dataset="pyrim", out="unused", model="ridge", method="oehg", resplits=365)
    with pytest.raises(SettingError, match=r"resplits must be <= 364, got 365: .* 364 distinct"):
        run(pyrim, load_dataset("pyrim", 0))
    with pytest.raises(FewshotError, match="the data is heart, but the settings name pyrim"):
        run(pyrim, heart)


def test_truncation_is_checked_for_trhg_only():
    base = {"dataset": "heart", "out": "unused", "model": "svm", "inner_steps": 8}
    Settings(**base, method="rhg")  # rhg does not use --truncate (default 32)
    with pytest.raises(SettingError, match=r"truncate must be <= inner_steps \(8\), got 32"):
        Settings(**base, method="trhg", truncate=32)
