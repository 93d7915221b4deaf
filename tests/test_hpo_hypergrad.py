"""Every hypergradient estimator converges to ridge regression's closed-form hypergradient."""

from __future__ import annotations

import pytest
import torch

from fewshot.hpo.batches import Minibatches
from fewshot.hpo.hypergrad import Bilevel, aid_cg, aid_fp, rhg, trhg
from fewshot.hpo.tasks.ridge import (
    ridge_hypergradient,
    ridge_inner_loss,
    ridge_outer_loss,
    ridge_problem,
    ridge_smoothness,
    ridge_solution,
)

LAM = 0.3


@pytest.fixture(scope="module")
def ridge_data():
    """A small float64 regression problem split into train and validation."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 5, generator=g, dtype=torch.float64)
    beta = torch.randn(5, generator=g, dtype=torch.float64)
    y = x @ beta + 0.5 * torch.randn(60, generator=g, dtype=torch.float64)
    train, val = (x[:40], y[:40]), (x[40:], y[40:])
    problem = ridge_problem(1.0 / ridge_smoothness(LAM, train))
    return problem, train, val


def _relative_error(estimate: torch.Tensor, exact: torch.Tensor) -> float:
    return float((estimate - exact).abs() / exact.abs())


def test_closed_form_hypergradient_matches_finite_differences(ridge_data):
    _, train, val = ridge_data
    h = 1e-6

    def f(lam):
        return ridge_outer_loss(ridge_solution(lam, train), lam, val)

    numeric = (f(LAM + h) - f(LAM - h)) / (2 * h)
    assert _relative_error(ridge_hypergradient(LAM, train, val), numeric) < 1e-6


@pytest.mark.parametrize(
    "estimate",
    [
        lambda p, t0, lam, tr, va: rhg(p, t0, lam, tr, va, steps=600),
        lambda p, t0, lam, tr, va: trhg(p, t0, lam, tr, va, steps=600, truncate=300),
        lambda p, t0, lam, tr, va: aid_fp(p, t0, lam, tr, va, steps=600, solver_steps=600),
        lambda p, t0, lam, tr, va: aid_cg(p, t0, lam, tr, va, steps=600, solver_steps=10),
    ],
    ids=["rhg", "trhg", "aid-fp", "aid-cg"],
)
def test_estimators_match_closed_form_at_large_k(ridge_data, estimate):
    problem, train, val = ridge_data
    lam = torch.tensor(LAM, dtype=torch.float64)
    result = estimate(problem, torch.zeros(5, dtype=torch.float64), lam, train, val)
    exact = ridge_hypergradient(LAM, train, val)
    assert _relative_error(result.grad, exact) < 1e-4
    assert torch.allclose(result.theta, ridge_solution(LAM, train), atol=1e-8)


def test_rhg_error_shrinks_as_k_grows(ridge_data):
    problem, train, val = ridge_data
    lam = torch.tensor(LAM, dtype=torch.float64)
    exact = ridge_hypergradient(LAM, train, val)
    theta0 = torch.zeros(5, dtype=torch.float64)
    errors = [
        _relative_error(rhg(problem, theta0, lam, train, val, k).grad, exact) for k in (5, 20, 80)
    ]
    assert errors[0] > errors[1] > errors[2]


def test_rhg_equals_autograd_through_unrolled_steps(ridge_data):
    """The reverse pass matches plain autograd through the same K unrolled steps (any K)."""
    problem, train, val = ridge_data
    lam = torch.tensor(LAM, dtype=torch.float64, requires_grad=True)
    theta = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    for _ in range(7):
        (g,) = torch.autograd.grad(ridge_inner_loss(theta, lam, train), theta, create_graph=True)
        theta = theta - problem.inner_lr * g
    (reference,) = torch.autograd.grad(ridge_outer_loss(theta, lam, val), lam)
    estimate = rhg(problem, torch.zeros(5, dtype=torch.float64), lam.detach(), train, val, 7)
    assert torch.allclose(estimate.grad, reference, rtol=1e-12)


def test_trhg_with_zero_truncation_is_the_direct_gradient(ridge_data):
    """With no steps differentiated the estimate is grad_lam R^val, which is 0 for ridge."""
    problem, train, val = ridge_data
    lam = torch.tensor(LAM, dtype=torch.float64)
    result = trhg(problem, torch.zeros(5, dtype=torch.float64), lam, train, val, 50, truncate=0)
    assert float(result.grad) == 0.0


def test_estimators_accept_parameter_and_hyperparameter_pytrees(ridge_data):
    """theta as a dict of two blocks and lam as a tuple of two per-block penalties."""
    _, train, val = ridge_data

    def inner(theta, lam, data):
        flat = torch.cat([theta["head"], theta["tail"]])
        penalty = lam[0] * (theta["head"] ** 2).sum() + lam[1] * (theta["tail"] ** 2).sum()
        return ridge_outer_loss(flat, None, data) + penalty

    def outer(theta, lam, data):
        return ridge_outer_loss(torch.cat([theta["head"], theta["tail"]]), None, data)

    problem = Bilevel(inner, outer, 1.0 / ridge_smoothness(LAM, train))
    theta0 = {
        "head": torch.zeros(2, dtype=torch.float64),
        "tail": torch.zeros(3, dtype=torch.float64),
    }
    lam = (torch.tensor(LAM, dtype=torch.float64), torch.tensor(LAM, dtype=torch.float64))
    exact = ridge_hypergradient(LAM, train, val)
    for result in (
        rhg(problem, theta0, lam, train, val, 600),
        aid_cg(problem, theta0, lam, train, val, 600, 10),
    ):
        assert set(result.theta) == {"head", "tail"}
        # Both penalties equal LAM, so their partial derivatives sum to the scalar hypergradient.
        assert _relative_error(result.grad[0] + result.grad[1], exact) < 1e-4


def test_trhg_rejects_truncation_longer_than_the_run(ridge_data):
    problem, train, val = ridge_data
    with pytest.raises(ValueError, match="truncate"):
        trhg(problem, torch.zeros(5, dtype=torch.float64), torch.tensor(LAM), train, val, 3, 4)


def test_full_size_minibatches_are_plain_full_batch_descent(ridge_data):
    """Minibatches of the whole set are the fixed data (stored column-major: equal to rounding)."""
    problem, train, val = ridge_data
    lam = torch.tensor(LAM, dtype=torch.float64)
    theta0 = torch.zeros(5, dtype=torch.float64)
    fixed = aid_cg(problem, theta0, lam, train, val, 30, 5)
    drawn = aid_cg(problem, theta0, lam, Minibatches(train, 40), Minibatches(val, 20), 30, 5)
    assert torch.allclose(fixed.grad, drawn.grad, rtol=1e-12, atol=0)
    assert torch.allclose(fixed.theta, drawn.theta, rtol=1e-12, atol=0)


@pytest.mark.parametrize("per_problem", [False, True])
def test_conjugate_gradient_stops_a_problem_at_non_positive_curvature(per_problem):
    """Inner loss 1/2 theta' A theta - lam' theta, outer loss sum(theta): the hypergradient is
    A^-1 (1, 1) as far as conjugate gradient gets. For A = diag(3, -1) its first step reaches
    v = (1, 1) and its next direction, (2, 6), has curvature 3*4 - 36 < 0: AID-CG stops there
    (plain CG would go on to A^-1 (1, 1) = (1/3, -1), a solve of an indefinite system).
    A = diag(3, 1), solved alongside (per problem), reaches its exact solve (1/3, 1)."""
    curvatures = torch.tensor([[3.0, -1.0], [3.0, 1.0]], dtype=torch.float64)
    expected = torch.tensor([[1.0, 1.0], [1 / 3, 1.0]], dtype=torch.float64)
    if not per_problem:
        curvatures, expected = curvatures[0], expected[0]

    def inner(theta, lam, batch):
        return 0.5 * (curvatures * theta**2).sum() - (lam * theta).sum()

    def outer(theta, lam, batch):
        return theta.sum()

    problem = Bilevel(inner, outer, 0.1)
    zeros = torch.zeros_like(curvatures)
    result = aid_cg(problem, zeros, zeros, None, None, 0, 5, per_problem=per_problem)
    torch.testing.assert_close(result.grad, expected, rtol=1e-12, atol=1e-12)
