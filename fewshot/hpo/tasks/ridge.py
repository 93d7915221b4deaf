"""Ridge regression as a bilevel problem with a closed-form inner solution and exact hypergradient.

Inner: R^tr(theta, lam) = ||X theta - y||^2 / n + lam ||theta||^2, solved by
theta*(lam) = (X'X/n + lam I)^{-1} X'y/n. Outer: R^val(theta) = ||X_val theta - y_val||^2 / m.
Then d theta*/d lam = -(X'X/n + lam I)^{-1} theta*, which gives the exact hypergradient; it is the
ground truth every estimator in `fewshot.hpo.hypergrad` is tested against (paper Section 5).
"""

from __future__ import annotations

import torch

from fewshot.hpo.hypergrad import Bilevel

Data = tuple[torch.Tensor, torch.Tensor]  # (X of shape (n, d), y of shape (n,))


def squared_error(theta: torch.Tensor, data: Data) -> torch.Tensor:
    """Mean squared residual ||X theta - y||^2 / n."""
    x, y = data
    return ((x @ theta - y) ** 2).mean()


def ridge_inner_loss(theta: torch.Tensor, lam: torch.Tensor, data: Data) -> torch.Tensor:
    """R^tr: mean squared error plus lam times the squared norm of theta."""
    return squared_error(theta, data) + lam * (theta**2).sum()


def ridge_outer_loss(theta: torch.Tensor, lam: torch.Tensor, data: Data) -> torch.Tensor:
    """R^val: mean squared error (does not depend on lam directly)."""
    return squared_error(theta, data)


def _gram(lam: float | torch.Tensor, data: Data) -> torch.Tensor:
    """X'X/n + lam I."""
    x, _ = data
    return x.T @ x / x.shape[0] + lam * torch.eye(x.shape[1], dtype=x.dtype)


def ridge_solution(lam: float | torch.Tensor, data: Data) -> torch.Tensor:
    """theta*(lam) = (X'X/n + lam I)^{-1} X'y/n."""
    x, y = data
    return torch.linalg.solve(_gram(lam, data), x.T @ y / x.shape[0])


def ridge_hypergradient(lam: float | torch.Tensor, train: Data, val: Data) -> torch.Tensor:
    """The exact d R^val(theta*(lam)) / d lam."""
    theta = ridge_solution(lam, train)
    dtheta = -torch.linalg.solve(_gram(lam, train), theta)
    xv, yv = val
    return 2.0 * ((xv @ theta - yv) @ (xv @ dtheta)) / xv.shape[0]


def ridge_smoothness(lam: float, data: Data) -> float:
    """The Lipschitz constant of grad R^tr: 2 (largest eigenvalue of X'X/n + lam I)."""
    return 2.0 * float(torch.linalg.eigvalsh(_gram(lam, data))[-1])


def ridge_problem(inner_lr: float) -> Bilevel:
    """The ridge bilevel problem with the given inner step size."""
    return Bilevel(ridge_inner_loss, ridge_outer_loss, inner_lr)
