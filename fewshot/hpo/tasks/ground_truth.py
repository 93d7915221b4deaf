"""Exact ("ground truth") lasso and SVM hyperparameter paths from cvxpy inner solutions (Fig. 7-3).

The inner lasso problem  min_{w,b} mean((X w + b - y)^2) + lam ||w||_1  is solved exactly by
cvxpy. Where the active set A = {i: w_i != 0} is locally constant, the optimality condition
(2/n) Z'(Z u - y) + lam s = 0 with Z = [X_A 1], u = (w_A, b), s = (sign w_A, 0) gives
du/dlam = -((2/n) Z'Z)^{-1} s, hence the exact hypergradient of the validation MSE. The curve is
the log lam trajectory of Adam driven by this exact hypergradient averaged over the splits, the
reference that RHG/AID(+EHG) trajectories are compared with.

The SVM  min_{w,b} mean(max(0, 1 - y (X w + b))) + lam ||w||^2  has a solution that is piecewise
smooth in lam (Hastie et al.'s regularization path), so its hypergradient is taken as a central
difference in log lam of the validation hinge loss at exact cvxpy solutions.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import cvxpy as cp
import numpy as np
import torch

Arrays = tuple[np.ndarray, np.ndarray]
ACTIVE_TOL = 1e-7  # |w_i| below this counts as exactly zero (solver precision)
Hypergradient = Callable[[float, Arrays, Arrays], float]


def _solve(objective: cp.Expression) -> None:
    """Minimise to near machine precision (hypergradients are taken from these solutions)."""
    cp.Problem(cp.Minimize(objective)).solve(
        solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12
    )


def lasso_solution(lam: float, train: Arrays) -> tuple[np.ndarray, float]:
    """(w, b) minimising mean((X w + b - y)^2) + lam ||w||_1, solved by cvxpy."""
    x, y = train
    w, b = cp.Variable(x.shape[1]), cp.Variable()
    _solve(cp.sum_squares(x @ w + b - y) / len(y) + lam * cp.norm1(w))
    weights = np.where(np.abs(w.value) < ACTIVE_TOL, 0.0, w.value)
    return weights, float(b.value)


def lasso_hypergradient(lam: float, train: Arrays, val: Arrays) -> float:
    """The exact d (validation MSE at the lasso solution) / d log lam."""
    weights, bias = lasso_solution(lam, train)
    active = np.flatnonzero(weights)
    x, _ = train
    z = np.hstack([x[:, active], np.ones((len(x), 1))])
    signs = np.append(np.sign(weights[active]), 0.0)
    # lstsq: with more active features than examples the system is singular (take min-norm).
    du = -np.linalg.lstsq(2.0 / len(x) * z.T @ z, signs, rcond=None)[0]
    xv, yv = val
    zv = np.hstack([xv[:, active], np.ones((len(xv), 1))])
    residual = xv @ weights + bias - yv
    return lam * float(2.0 / len(yv) * residual @ (zv @ du))


def svm_solution(lam: float, train: Arrays) -> tuple[np.ndarray, float]:
    """(w, b) minimising mean(max(0, 1 - y (X w + b))) + lam ||w||^2, solved by cvxpy."""
    x, y = train
    w, b = cp.Variable(x.shape[1]), cp.Variable()
    _solve(cp.sum(cp.pos(1 - cp.multiply(y, x @ w + b))) / len(y) + lam * cp.sum_squares(w))
    return w.value, float(b.value)


def svm_hypergradient(lam: float, train: Arrays, val: Arrays, step: float = 1e-4) -> float:
    """d (validation hinge loss at the SVM solution) / d log lam, a central difference."""

    def val_loss(log_lam: float) -> float:
        w, b = svm_solution(math.exp(log_lam), train)
        return float(np.mean(np.maximum(0.0, 1.0 - val[1] * (val[0] @ w + b))))

    return (val_loss(math.log(lam) + step) - val_loss(math.log(lam) - step)) / (2 * step)


def ground_truth_path(
    split_data: list[tuple[Arrays, Arrays]],
    init_lam: float,
    outer_steps: int,
    outer_lr: float,
    hypergradient: Hypergradient = lasso_hypergradient,
) -> list[float]:
    """lam after each Adam step on log lam driven by the exact split-averaged hypergradient."""
    log_lam = torch.tensor(math.log(init_lam), dtype=torch.float64, requires_grad=True)
    adam = torch.optim.Adam([log_lam], lr=outer_lr)
    path = []
    for _ in range(outer_steps):
        lam = math.exp(float(log_lam.detach()))
        grad = np.mean([hypergradient(lam, train, val) for train, val in split_data])
        log_lam.grad = torch.tensor(grad, dtype=torch.float64)
        adam.step()
        path.append(math.exp(float(log_lam.detach())))
    return path
