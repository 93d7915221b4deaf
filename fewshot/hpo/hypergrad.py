"""Hypergradient estimators RHG, T-RHG, AID-FP and AID-CG (paper Algorithms 1 and 2).

A bilevel problem is given as two pure functions of (theta, lam, data), where `theta` (model
parameters) and `lam` (hyperparameters) are any pytrees of tensors and `data` is whatever the loss
needs (a tuple of tensors, usually):

    inner_loss(theta, lam, train_data) -> scalar   # R^tr: what the inner SGD minimises over theta
    outer_loss(theta, lam, val_data)   -> scalar   # R^val: what lam should minimise

Every estimator runs `steps` inner gradient-descent steps theta_{k+1} = theta_k - lr grad R^tr
from `theta0` and returns a `Hypergradient`: the estimate of d R^val(theta_K(lam), lam) / d lam
(a pytree shaped like `lam`), the final inner parameters theta_K (detached) and R^val at theta_K.

- `rhg`: reverse-mode through all K steps (Franceschi et al. 2017), O(K) stored iterates.
- `trhg`: the same, back-propagating through the last `truncate` steps only (Shaban et al. 2019).
- `aid_fp`, `aid_cg`: implicit differentiation at theta_K: solve H v = grad_theta R^val with
  `solver_steps` fixed-point or conjugate-gradient iterations on Hessian-vector products, then
  hypergradient = grad_lam R^val - (d^2 R^tr / d lam d theta) v.

Nothing is global: the functions only read their arguments, so they compose with vmap-free loops
over data splits (see `fewshot.hpo.ensemble` for EHG and OEHG).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.func import grad, jvp, vjp

from fewshot.hpo.trees import Tree, tree_add, tree_detach, tree_dot, tree_zeros_like

Loss = Callable[[Tree, Tree, Any], torch.Tensor]


@dataclass(frozen=True)
class Bilevel:
    """A bilevel problem: inner (training) loss, outer (validation) loss, inner SGD step size."""

    inner_loss: Loss
    outer_loss: Loss
    inner_lr: float

    def step(self, theta: Tree, lam: Tree, data: Any) -> Tree:
        """One inner gradient-descent step theta - lr * grad_theta R^tr(theta, lam)."""
        return tree_add(theta, grad(self.inner_loss)(theta, lam, data), -self.inner_lr)

    def descend(self, theta: Tree, lam: Tree, data: Any, steps: int) -> list[Tree]:
        """The detached iterates theta_0 .. theta_steps of inner gradient descent."""
        lam = tree_detach(lam)
        iterates = [tree_detach(theta)]
        for _ in range(steps):
            iterates.append(tree_detach(self.step(iterates[-1], lam, data)))
        return iterates


@dataclass(frozen=True)
class Hypergradient:
    """An estimate of dR^val/dlam, with the inner solution it was taken at and R^val there."""

    grad: Tree
    theta: Tree
    outer_loss: float


def _outer_grads(problem: Bilevel, theta: Tree, lam: Tree, val: Any) -> tuple[Tree, Tree, float]:
    """(grad_theta R^val, grad_lam R^val, R^val) at (theta, lam)."""

    def loss_and_value(th: Tree, la: Tree) -> tuple[torch.Tensor, torch.Tensor]:
        value = problem.outer_loss(th, la, val)
        return value, value

    (g_theta, g_lam), value = grad(loss_and_value, argnums=(0, 1), has_aux=True)(theta, lam)
    return g_theta, g_lam, float(value)


def trhg(
    problem: Bilevel, theta0: Tree, lam: Tree, train: Any, val: Any, steps: int, truncate: int
) -> Hypergradient:
    """Truncated reverse hypergradient: back-propagate through the last `truncate` of `steps`."""
    if steps < 0 or not 0 <= truncate <= steps:
        raise ValueError(f"need 0 <= truncate ({truncate}) <= steps ({steps})")
    lam = tree_detach(lam)
    iterates = problem.descend(theta0, lam, train, steps)
    v, hyper, value = _outer_grads(problem, iterates[-1], lam, val)
    for theta_k in reversed(iterates[steps - truncate : steps]):
        # The VJP of one step gives both (I - lr H) v and -lr (d2R/dlam dtheta) v.
        _, step_vjp = vjp(lambda th, la: problem.step(th, la, train), theta_k, lam)
        v, hyper_k = step_vjp(v)
        hyper = tree_add(hyper, hyper_k)
    return Hypergradient(tree_detach(hyper), iterates[-1], value)


def rhg(
    problem: Bilevel, theta0: Tree, lam: Tree, train: Any, val: Any, steps: int
) -> Hypergradient:
    """Reverse hypergradient through all `steps` inner steps."""
    return trhg(problem, theta0, lam, train, val, steps, truncate=steps)


def _hessian_vp(problem: Bilevel, theta: Tree, lam: Tree, train: Any) -> Callable[[Tree], Tree]:
    """v -> (d^2 R^tr / d theta^2) v at (theta, lam), by forward-over-reverse differentiation."""
    inner_grad = grad(problem.inner_loss)
    return lambda v: jvp(lambda th: inner_grad(th, lam, train), (theta,), (v,))[1]


def _implicit_hypergrad(
    problem: Bilevel, theta: Tree, lam: Tree, train: Any, g_lam: Tree, v: Tree
) -> Tree:
    """grad_lam R^val - (d^2 R^tr / d lam d theta) v."""
    _, mixed_vjp = vjp(lambda la: grad(problem.inner_loss)(theta, la, train), lam)
    (mixed,) = mixed_vjp(v)
    return tree_detach(tree_add(g_lam, mixed, -1.0))


def aid_fp(
    problem: Bilevel,
    theta0: Tree,
    lam: Tree,
    train: Any,
    val: Any,
    steps: int,
    solver_steps: int,
    solver_lr: float | None = None,
) -> Hypergradient:
    """Implicit differentiation; H v = b solved by v <- v - eta (H v - b) (eta: inner lr)."""
    lam = tree_detach(lam)
    theta = problem.descend(theta0, lam, train, steps)[-1]
    b, g_lam, value = _outer_grads(problem, theta, lam, val)
    hvp = _hessian_vp(problem, theta, lam, train)
    eta = problem.inner_lr if solver_lr is None else solver_lr
    v = tree_zeros_like(b)
    for _ in range(solver_steps):
        v = tree_add(v, tree_add(hvp(v), b, -1.0), -eta)
    return Hypergradient(_implicit_hypergrad(problem, theta, lam, train, g_lam, v), theta, value)


def aid_cg(
    problem: Bilevel, theta0: Tree, lam: Tree, train: Any, val: Any, steps: int, solver_steps: int
) -> Hypergradient:
    """Implicit differentiation, H v = b solved by `solver_steps` conjugate-gradient iterations."""
    lam = tree_detach(lam)
    theta = problem.descend(theta0, lam, train, steps)[-1]
    b, g_lam, value = _outer_grads(problem, theta, lam, val)
    hvp = _hessian_vp(problem, theta, lam, train)
    v = tree_zeros_like(b)
    residual, direction = b, b
    rr = tree_dot(residual, residual)
    for _ in range(solver_steps):
        if rr <= torch.finfo(rr.dtype).tiny:  # solved exactly; another step would divide by zero
            break
        h_dir = hvp(direction)
        alpha = rr / tree_dot(direction, h_dir)
        v = tree_add(v, direction, alpha)
        residual = tree_add(residual, h_dir, -alpha)
        rr_next = tree_dot(residual, residual)
        direction = tree_add(residual, direction, rr_next / rr)
        rr = rr_next
    return Hypergradient(_implicit_hypergrad(problem, theta, lam, train, g_lam, v), theta, value)
