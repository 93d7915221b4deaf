"""The cvxpy lasso and SVM ground truths: solutions and exact hypergradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.svm import SVC

from fewshot.datasets.libsvm import load_dataset
from fewshot.hpo.tasks.ground_truth import (
    ground_truth_path,
    lasso_hypergradient,
    lasso_solution,
    svm_hypergradient,
    svm_solution,
)


@pytest.fixture(scope="module")
def triazines():
    data = load_dataset("triazines", seed=0)
    x, y = data.x_observed, data.y_observed
    return (x[:30], y[:30]), (x[30:], y[30:])


def _val_mse(lam: float, train, val) -> float:
    w, b = lasso_solution(lam, train)
    return float(np.mean((val[0] @ w + b - val[1]) ** 2))


def test_solution_satisfies_the_lasso_optimality_conditions(triazines):
    (x, y), _ = triazines
    lam = 0.01
    w, b = lasso_solution(lam, (x, y))
    grad = 2.0 / len(y) * x.T @ (x @ w + b - y)  # of the smooth part
    active = w != 0
    assert np.allclose(grad[active], -lam * np.sign(w[active]), atol=1e-6)
    assert np.all(np.abs(grad[~active]) <= lam + 1e-6)
    assert abs(np.mean(x @ w + b - y)) < 1e-8  # the free intercept zeroes the mean residual


@pytest.mark.parametrize("lam", [0.001, 0.01, 0.03])
def test_exact_hypergradient_matches_finite_differences(triazines, lam):
    train, val = triazines
    h = 1e-4
    numeric = (
        _val_mse(lam * math.exp(h), train, val) - _val_mse(lam * math.exp(-h), train, val)
    ) / (2 * h)
    assert lasso_hypergradient(lam, train, val) == pytest.approx(numeric, rel=1e-5)


def test_ground_truth_path_moves_against_the_hypergradient(triazines):
    train, val = triazines
    start = 0.03
    path = ground_truth_path([(train, val)], start, outer_steps=3, outer_lr=0.1)
    assert len(path) == 3
    # The first Adam step moves log lam by -lr * sign(hypergradient).
    step = math.log(path[0] / start)
    assert step == pytest.approx(-0.1 * np.sign(lasso_hypergradient(start, train, val)), rel=1e-3)


@pytest.fixture(scope="module")
def heart():
    data = load_dataset("heart", seed=0)
    x, y = data.x_observed, data.y_observed
    return (x[:80], y[:80]), (x[80:], y[80:])


@pytest.mark.parametrize("lam", [0.003, 0.05])
def test_svm_solution_matches_libsvm(heart, lam):
    (x, y), _ = heart
    w, b = svm_solution(lam, (x, y))
    # mean hinge + lam ||w||^2, times 1 / (2 lam): 1/2 ||w||^2 + C sum hinge with C = 1/(2 lam n)
    reference = SVC(kernel="linear", C=1.0 / (2 * lam * len(y)), tol=1e-10).fit(x, y)
    assert np.allclose(w, reference.coef_[0], atol=1e-4)
    assert b == pytest.approx(reference.intercept_[0], abs=1e-3)


def test_svm_ground_truth_path_moves_against_the_hypergradient(heart):
    train, val = heart
    start = 0.01
    grad = svm_hypergradient(start, train, val)
    assert grad != 0.0
    path = ground_truth_path([(train, val)], start, 2, 0.1, hypergradient=svm_hypergradient)
    assert math.log(path[0] / start) == pytest.approx(-0.1 * np.sign(grad), rel=1e-3)
