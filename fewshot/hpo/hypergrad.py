"""Hypergradient estimators RHG, T-RHG, AID-FP and AID-CG (paper Algorithms 1 and 2).

A bilevel problem is given as two pure functions of (theta, lam, batch), where `theta` (model
parameters) and `lam` (hyperparameters) are trees of tensors (`fewshot.hpo.trees`) and `batch`
is whatever the loss needs (a tuple of tensors, usually):

    inner_loss(theta, lam, train_batch) -> scalar   # R^tr: what the inner SGD minimises over theta
    outer_loss(theta, lam, val_batch)   -> scalar   # R^val: what lam should minimise

The estimators take the training and validation data of a split: fixed data (full batch), or
`fewshot.hpo.batches.Minibatches`, from which they draw every step's batch with the generator
`gen` they are given. The losses only see the batches, so calling one twice changes nothing.

Every estimator runs `steps` inner gradient-descent steps theta_{k+1} = theta_k - lr grad R^tr
from `theta0` and returns a `Hypergradient`: the estimate of d R^val(theta_K(lam), lam) / d lam
(a pytree shaped like `lam`), the final inner parameters theta_K (detached) and R^val at theta_K.

- `rhg`: reverse-mode through all K steps (Franceschi et al. 2017), O(K) stored iterates.
- `trhg`: the same, back-propagating through the last `truncate` steps only (Shaban et al. 2019).
- `aid_fp`, `aid_cg`: implicit differentiation at theta_K: solve H v = grad_theta R^val with
  `solver_steps` fixed-point or conjugate-gradient iterations on Hessian-vector products, then
  hypergradient = grad_lam R^val - (d^2 R^tr / d lam d theta) v. Where H is not positive
  definite (a non-convex inner loss), conjugate gradient stops at the first direction of
  non-positive curvature and keeps the iterate it has, as Newton-CG does.

Nothing is global: the functions only read their arguments (they differentiate with
torch.autograd on detached copies) and advance the generator they are given, so they compose
freely with loops over data splits (see `fewshot.hpo.ensemble` for EHG and OEHG).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fewshot.hpo.batches import draw
from fewshot.hpo.trees import (
    Tree,
    tree_add,
    tree_detach,
    tree_dot,
    tree_flatten,
    tree_leaves,
    tree_map,
    tree_zeros_like,
)

Loss = Callable[[Tree, Tree, Any], torch.Tensor]
Generator = torch.Generator | None
# theta0, or a function of lam giving it: MAML's initialisation is the outer variable itself.
Initial = Tree | Callable[[Tree], Tree]


def start(theta0: Initial, lam: Tree) -> Tree:
    """The inner starting point at `lam`."""
    return theta0(lam) if callable(theta0) else theta0


def _with_grad(tree: Tree) -> Tree:
    """Detached copies of the leaves that autograd will differentiate with respect to."""
    return tree_map(lambda x: x.detach().requires_grad_(), tree)


def _grad(
    output: torch.Tensor,
    wrt: Tree,
    grad_outputs: Tree | None = None,
    create_graph: bool = False,
    retain_graph: bool | None = None,
) -> Tree:
    """d output / d wrt as a tree shaped like `wrt` (zeros where output does not depend on it).

    `output` may be a tree too, contracted with the matching `grad_outputs` (a VJP).
    """
    leaves, rebuild = tree_flatten(wrt)
    cotangents = None if grad_outputs is None else tree_flatten(grad_outputs)[0]
    grads = torch.autograd.grad(
        tree_flatten(output)[0],
        leaves,
        grad_outputs=cotangents,
        create_graph=create_graph,
        retain_graph=retain_graph,
        allow_unused=True,
    )
    return rebuild(
        [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads, strict=True)]
    )


@dataclass(frozen=True)
class Bilevel:
    """A bilevel problem: inner (training) loss, outer (validation) loss, inner SGD step size.

    `inner_lr` is a number or a function of lam (e.g. 1 / the smoothness of the whole inner loss,
    penalty included, so that gradient descent stays stable whatever lam becomes).
    """

    inner_loss: Loss
    outer_loss: Loss
    inner_lr: float | Callable[[Tree], float | torch.Tensor]

    def step(
        self,
        theta: Tree,
        lam: Tree,
        batch: Any,
        create_graph: bool = False,
        first_order: bool = False,
    ) -> Tree:
        """One inner step theta - lr grad_theta R^tr on `batch`; differentiable if asked
        (`first_order`: through theta and the step size, the gradient taken as a constant)."""
        with torch.enable_grad():
            if not create_graph:
                theta, lam = _with_grad(theta), tree_detach(lam)
            loss = self.inner_loss(theta, lam, batch)
            g = _grad(loss, theta, create_graph=create_graph and not first_order)
            new = tree_add(theta, g, -self.lr(lam))
        return new if create_graph else tree_detach(new)

    def lr(self, lam: Tree) -> float | torch.Tensor:
        """The inner step size at `lam`."""
        return self.inner_lr(lam) if callable(self.inner_lr) else self.inner_lr

    def descend(
        self, theta: Initial, lam: Tree, data: Any, steps: int, gen: Generator = None
    ) -> Tree:
        """theta after `steps` inner gradient-descent steps (detached), a batch drawn each."""
        theta = tree_detach(start(theta, tree_detach(lam)))
        for _ in range(steps):
            theta = self.step(theta, lam, draw(data, gen))
        return theta


@dataclass(frozen=True)
class Hypergradient:
    """An estimate of dR^val/dlam, with the inner solution it was taken at and R^val there."""

    grad: Tree
    theta: Tree
    outer_loss: float


def trhg(
    problem: Bilevel,
    theta0: Initial,
    lam: Tree,
    train: Any,
    val: Any,
    steps: int,
    truncate: int,
    gen: Generator = None,
    first_order: bool = False,
) -> Hypergradient:
    """Truncated reverse hypergradient: back-propagate through the last `truncate` of `steps`.

    A `theta0` that is a function of lam is differentiated too when the window covers every
    step (MAML); `first_order` drops the second-order terms of the steps (first-order MAML).
    """
    if steps < 0 or not 0 <= truncate <= steps:
        raise ValueError(f"need 0 <= truncate ({truncate}) <= steps ({steps})")
    theta = problem.descend(theta0, lam, train, steps - truncate, gen)
    with torch.enable_grad():
        lam = _with_grad(lam)
        differentiable = callable(theta0) and truncate == steps
        theta = start(theta0, lam) if differentiable else _with_grad(theta)
        for _ in range(truncate):
            theta = problem.step(theta, lam, draw(train, gen), True, first_order)
        value = problem.outer_loss(theta, lam, draw(val, gen))
        hyper = _grad(value, lam)
    return Hypergradient(tree_detach(hyper), tree_detach(theta), float(value.detach()))


def rhg(
    problem: Bilevel,
    theta0: Initial,
    lam: Tree,
    train: Any,
    val: Any,
    steps: int,
    gen: Generator = None,
    first_order: bool = False,
) -> Hypergradient:
    """Reverse hypergradient through all `steps` inner steps."""
    return trhg(problem, theta0, lam, train, val, steps, steps, gen, first_order)


def _implicit(
    problem: Bilevel,
    theta0: Initial,
    lam: Tree,
    train: Any,
    val: Any,
    steps: int,
    solve: Callable[[Callable[[Tree], Tree], Tree], Tree],
    gen: Generator,
) -> Hypergradient:
    """AID: v = solve(hvp, grad_theta R^val) at theta_K; grad_lam R^val - (d2R^tr/dlam dtheta) v.

    The Hessian system is that of one training batch (the whole set when full-batch).
    """
    theta = problem.descend(theta0, lam, train, steps, gen)
    with torch.enable_grad():
        theta, lam = _with_grad(theta), _with_grad(lam)
        value = problem.outer_loss(theta, lam, draw(val, gen))
        b, g_lam = _grad(value, (theta, lam))
        inner = problem.inner_loss(theta, lam, draw(train, gen))
        inner_grad = _grad(inner, theta, create_graph=True)

        def hvp(v: Tree) -> Tree:
            return tree_detach(_grad(inner_grad, theta, grad_outputs=v, retain_graph=True))

        v = solve(hvp, tree_detach(b))
        mixed = _grad(inner_grad, lam, grad_outputs=v)
    return Hypergradient(
        tree_detach(tree_add(g_lam, mixed, -1.0)), tree_detach(theta), float(value.detach())
    )


def aid_fp(
    problem: Bilevel,
    theta0: Initial,
    lam: Tree,
    train: Any,
    val: Any,
    steps: int,
    solver_steps: int,
    solver_lr: float | None = None,
    gen: Generator = None,
) -> Hypergradient:
    """Implicit differentiation; H v = b solved by v <- v - eta (H v - b) (eta: inner lr)."""
    eta = float(problem.lr(lam)) if solver_lr is None else solver_lr

    def fixed_point(hvp: Callable[[Tree], Tree], b: Tree) -> Tree:
        v = tree_zeros_like(b)
        for _ in range(solver_steps):
            v = tree_add(v, tree_add(hvp(v), b, -1.0), -eta)
        return v

    return _implicit(problem, theta0, lam, train, val, steps, fixed_point, gen)


def aid_cg(
    problem: Bilevel,
    theta0: Initial,
    lam: Tree,
    train: Any,
    val: Any,
    steps: int,
    solver_steps: int,
    gen: Generator = None,
    per_problem: bool = False,
    damping: float = 0.0,
) -> Hypergradient:
    """Implicit differentiation; H v = b solved by `solver_steps` conjugate-gradient iterations.

    `per_problem`: theta's leaves carry a leading axis of independent problems (their Hessian is
    block diagonal), each solved by its own conjugate gradient, as if one at a time.
    `damping`: solve (H + damping I) v = b instead (Tikhonov damping, as in Hessian-free
    optimisation: a system far from positive definite, or ill conditioned, made tractable).
    """

    def dot(a: Tree, b: Tree) -> torch.Tensor:
        """<a, b>, per problem when asked ([P]), else a scalar."""
        if not per_problem:
            return tree_dot(a, b)
        return sum(
            (x * y).flatten(1).sum(1) for x, y in zip(tree_leaves(a), tree_leaves(b), strict=True)
        )

    def step(a: Tree, b: Tree, scale: torch.Tensor) -> Tree:
        """a + scale * b, `scale` per problem when asked."""
        if scale.dim() == 0:
            return tree_add(a, b, scale)
        return tree_map(lambda x, y: x + scale.view(-1, *[1] * (y.dim() - 1)) * y, a, b)

    def conjugate_gradient(hvp: Callable[[Tree], Tree], b: Tree) -> Tree:
        v = tree_zeros_like(b)
        residual, direction = b, b
        rr = dot(residual, residual)
        tiny = torch.finfo(rr.dtype).tiny
        live = rr > tiny  # a problem solved exactly stays where it is
        for _ in range(solver_steps):
            if not live.any():  # every problem has stopped
                break
            h_dir = hvp(direction)
            if damping:
                h_dir = tree_add(h_dir, direction, damping)
            curvature = dot(direction, h_dir)
            # A direction of non-positive curvature: H is not positive definite there, and CG's
            # step along it would be meaningless; the problem keeps what it has (Newton-CG's
            # rule, Nocedal & Wright, Algorithm 7.1).
            live = live & (curvature > 0)
            alpha = torch.where(live, rr / torch.where(live, curvature, 1.0), 0.0)
            v = step(v, direction, alpha)
            residual = step(residual, h_dir, -alpha)
            rr_next = dot(residual, residual)
            direction = step(residual, direction, torch.where(live, rr_next / rr, 0.0))
            rr = rr_next
            live = live & (rr > tiny)
        return v

    return _implicit(problem, theta0, lam, train, val, steps, conjugate_gradient, gen)
