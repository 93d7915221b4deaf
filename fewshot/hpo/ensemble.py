"""EHG (paper Algorithm 3) and OEHG (Algorithm 4, Eq. 53-1..3) over train/validation splits.

- `ehg(estimator, problem, theta0, lam, split_data, gens)`: any estimator from
  `fewshot.hpo.hypergrad` (e.g. `functools.partial(rhg, steps=128)`) averaged over splits given
  as (train, val) data pairs.
- `optimize_offline(...)`: Algorithms 1-3, T outer steps on lam with an EHG estimate each.
- `oehg(...)`: Algorithm 4. U inner models advance `inner_steps` SGD steps per outer step, lam
  takes one outer step with their averaged hypergradient, and the deployed model takes a step
  with the new lam. The splits may be fixed data or a callable `(t, theta) -> [(train, val), ...]`,
  so a task can rebuild them as training goes (e.g. hyper-cleaning growing its validation sets).

The outer optimiser is a `torch.optim` optimiser over the leaves of lam (Adam by default), fed
with the computed hypergradients. Mini-batched data is drawn with one generator per split and
one for the deployed model, all derived from `seed` (`fewshot.hpo.batches.generators`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fewshot.hpo.batches import generators
from fewshot.hpo.hypergrad import Bilevel, Hypergradient, rhg
from fewshot.hpo.outer_log import log_outer_step
from fewshot.hpo.trees import Tree, tree_detach, tree_flatten, tree_mean
from fewshot.runtime.errors import FewshotError

Estimator = Callable[..., Hypergradient]  # (problem, theta0, lam, train, val, gen=...)
SplitData = Sequence[tuple[Any, Any]]  # [(train_data, val_data), ...], one pair per split
StepCallback = Callable[[int, Tree, Tree], None]  # (outer step, lam, deployed theta)
OuterOptimizer = Callable[[list[torch.Tensor]], torch.optim.Optimizer]


def ehg(
    estimator: Estimator,
    problem: Bilevel,
    theta0: Tree,
    lam: Tree,
    split_data: SplitData,
    gens: Sequence[torch.Generator | None] | None = None,
) -> Hypergradient:
    """The ensemble hypergradient: the mean estimate over splits; `theta` is the per-split list."""
    if not split_data:
        raise ValueError("ehg needs at least one split")
    gens = gens or [None] * len(split_data)
    results = [
        estimator(problem, theta0, lam, train, val, gen=gen)
        for (train, val), gen in zip(split_data, gens, strict=True)
    ]
    return Hypergradient(
        grad=tree_mean([r.grad for r in results]),
        theta=[r.theta for r in results],
        outer_loss=float(np.mean([r.outer_loss for r in results])),
    )


class OuterStep:
    """A torch.optim optimiser over detached copies of lam's leaves, stepped with given grads."""

    def __init__(self, lam0: Tree, make: OuterOptimizer) -> None:
        leaves, self._rebuild = tree_flatten(tree_detach(lam0))
        self._leaves = [leaf.clone().requires_grad_() for leaf in leaves]
        self.optimizer = make(self._leaves)

    def __call__(self, grad: Tree, t: int) -> Tree:
        """Outer step `t` with `grad`; the new lam (detached copies). A non-finite hypergradient
        is a FewshotError: it would turn lam, and every later number, into NaN."""
        grads = tree_flatten(grad)[0]
        if not all(bool(torch.isfinite(g).all()) for g in grads):
            raise FewshotError(
                f"the hypergradient of outer step {t + 1} is not finite: the inner problem "
                "diverged or its linear system is singular (AID-CG on a loss without curvature); "
                "try a smaller inner or outer learning rate, or another method"
            )
        for leaf, g in zip(self._leaves, grads, strict=True):
            leaf.grad = g.detach().to(leaf.dtype)
        self.optimizer.step()
        return self.value()

    def value(self) -> Tree:
        """The current lam as detached copies."""
        return self._rebuild([leaf.detach().clone() for leaf in self._leaves])


def adam(lr: float) -> OuterOptimizer:
    """The default outer optimiser: torch.optim.Adam with learning rate `lr`."""
    return lambda params: torch.optim.Adam(params, lr=lr)


@dataclass(frozen=True)
class HpoResult:
    """Final hyperparameters, the deployed model and the per-step mean validation loss."""

    lam: Tree
    theta: Tree
    outer_losses: list[float]


def optimize_offline(
    estimator: Estimator,
    problem: Bilevel,
    theta0: Tree,
    lam0: Tree,
    split_data: SplitData,
    outer_steps: int,
    outer_lr: float,
    inner_steps: int,
    on_step: StepCallback | None = None,
    seed: int = 0,
    deploy_data: Any = None,
    outer_optimizer: OuterOptimizer | None = None,
) -> HpoResult:
    """Algorithms 1-3: each outer step re-trains from theta0 on every split and averages (EHG).

    The deployed model is theta0 trained `inner_steps` steps with the final lam on `deploy_data`
    (default: the first split's training data), what the paper evaluates for RHG/AID.
    """
    step = OuterStep(lam0, outer_optimizer or adam(outer_lr))
    deploy_gen, *gens = generators(seed, len(split_data) + 1)
    lam = step.value()
    losses = []
    for t in range(outer_steps):
        h = ehg(estimator, problem, theta0, lam, split_data, gens)
        losses.append(h.outer_loss)
        lam = step(h.grad, t)
        log_outer_step(t, h.grad, lam, h.outer_loss)
        if on_step is not None:
            on_step(t, lam, h.theta[0])
    deploy = split_data[0][0] if deploy_data is None else deploy_data
    theta = problem.descend(theta0, lam, deploy, inner_steps, deploy_gen)
    return HpoResult(lam, theta, losses)


def oehg(
    problem: Bilevel,
    theta0: Tree,
    lam0: Tree,
    splits: SplitData | Callable[[int, Tree], SplitData],
    deploy_data: Any,
    outer_steps: int,
    outer_lr: float,
    inner_steps: int = 1,
    on_step: StepCallback | None = None,
    seed: int = 0,
    outer_optimizer: OuterOptimizer | None = None,
) -> HpoResult:
    """Algorithm 4 (OEHG): online ensemble hypergradient descent on lam (Adam by default).

    Per outer step t: every split's inner model advances `inner_steps` SGD steps from where it was
    (Eq. 53-1) and yields the hypergradient through those steps; lam takes an outer step with
    their mean (Eq. 53-2); the deployed model takes `inner_steps` steps on `deploy_data` with the
    new lam (Eq. 53-3). `splits` may be a callable (t, deployed theta) -> [(train, val), ...].
    """
    step = OuterStep(lam0, outer_optimizer or adam(outer_lr))
    lam = step.value()
    theta = tree_detach(theta0)
    inner_thetas: list[Tree] | None = None
    gens: list[torch.Generator] = []
    losses = []
    for t in range(outer_steps):
        split_data = splits(t, theta) if callable(splits) else splits
        if inner_thetas is None:
            inner_thetas = [theta for _ in split_data]
            deploy_gen, *gens = generators(seed, len(split_data) + 1)
        if len(inner_thetas) != len(split_data):
            raise ValueError(f"step {t}: {len(split_data)} splits, but {len(inner_thetas)} models")
        results = [
            rhg(problem, theta_i, lam, train, val, inner_steps, gen=gen)
            for theta_i, (train, val), gen in zip(inner_thetas, split_data, gens, strict=True)
        ]
        inner_thetas = [r.theta for r in results]
        losses.append(float(np.mean([r.outer_loss for r in results])))
        grad = tree_mean([r.grad for r in results])
        lam = step(grad, t)
        log_outer_step(t, grad, lam, losses[-1])
        theta = problem.descend(theta, lam, deploy_data, inner_steps, deploy_gen)
        if on_step is not None:
            on_step(t, lam, theta)
    return HpoResult(lam, theta, losses)
