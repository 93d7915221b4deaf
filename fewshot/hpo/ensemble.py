"""Data re-splits, EHG (paper Algorithm 3) and OEHG (Algorithm 4, Eq. 53-1..3).

- `make_splits(n, gamma, count, seed)`: `count` distinct train/validation splits of n observed
  examples, validation share gamma, drawn without replacement among the C(n, n_val) splits.
- `ehg(estimator, problem, theta0, lam, split_data)`: any estimator from `fewshot.hpo.hypergrad`
  (e.g. `functools.partial(rhg, steps=128)`) averaged over splits given as (train, val) data pairs.
- `optimize_offline(...)`: Algorithms 1-3, T outer Adam steps on lam with an EHG estimate each.
- `oehg(...)`: Algorithm 4. U inner models advance `inner_steps` SGD steps per outer step, lam takes
  one Adam step with their averaged hypergradient, and the deployed model takes a step with the new
  lam. The splits may be fixed data or a callable `(t, theta) -> [(train, val), ...]`, so a task can
  rebuild them as training goes (e.g. hyper-cleaning growing its validation sets).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from fewshot.errors import FewshotError
from fewshot.hpo.hypergrad import Bilevel, Hypergradient, rhg
from fewshot.hpo.trees import Tree, tree_detach, tree_mean

Estimator = Callable[[Bilevel, Tree, Tree, Any, Any], Hypergradient]
SplitData = Sequence[tuple[Any, Any]]  # [(train_data, val_data), ...], one pair per split
StepCallback = Callable[[int, Tree, Tree], None]  # (outer step, lam, deployed theta)


@dataclass(frozen=True)
class Split:
    """Index arrays of one train/validation split of the observed examples."""

    train: np.ndarray
    val: np.ndarray


def validation_size(n: int, gamma: float) -> int:
    """The number of validation examples for validation share gamma in (0, 1)."""
    if not 0.0 < gamma < 1.0:
        raise FewshotError(f"--gamma {gamma} must lie strictly between 0 and 1")
    n_val = round(gamma * n)
    if not 1 <= n_val <= n - 1:
        raise FewshotError(
            f"--gamma {gamma} leaves an empty train or validation set of {n} examples"
        )
    return n_val


def make_splits(n: int, gamma: float, count: int, seed: int) -> list[Split]:
    """`count` distinct seeded splits of range(n), validation share gamma, without replacement."""
    n_val = validation_size(n, gamma)
    distinct = math.comb(n, n_val)
    if count < 1 or count > distinct:
        raise FewshotError(
            f"--splits {count}: {n} examples with {n_val} for validation allow only {distinct} "
            f"distinct splits; use 1..{distinct}"
        )
    rng = np.random.default_rng(seed)
    if distinct <= 4 * count:  # rejection would stall: draw among all splits directly
        chosen = rng.choice(distinct, size=count, replace=False)
        val_sets = [_combination(n, n_val, int(r)) for r in chosen]
    else:
        seen: set[tuple[int, ...]] = set()
        val_sets = []
        while len(val_sets) < count:
            val = tuple(sorted(rng.choice(n, size=n_val, replace=False).tolist()))
            if val not in seen:
                seen.add(val)
                val_sets.append(val)
    splits = []
    for val in val_sets:
        mask = np.zeros(n, dtype=bool)
        mask[list(val)] = True
        splits.append(Split(train=np.flatnonzero(~mask), val=np.flatnonzero(mask)))
    return splits


def _combination(n: int, k: int, rank: int) -> tuple[int, ...]:
    """The `rank`-th k-subset of range(n) in lexicographic order."""
    chosen = []
    start = 0
    for remaining in range(k, 0, -1):
        for item in range(start, n):
            block = math.comb(n - item - 1, remaining - 1)
            if rank < block:
                chosen.append(item)
                start = item + 1
                break
            rank -= block
    return tuple(chosen)


def ehg(
    estimator: Estimator, problem: Bilevel, theta0: Tree, lam: Tree, split_data: SplitData
) -> Hypergradient:
    """The ensemble hypergradient: the mean estimate over splits; `theta` is the per-split list."""
    if not split_data:
        raise ValueError("ehg needs at least one split")
    results = [estimator(problem, theta0, lam, train, val) for train, val in split_data]
    return Hypergradient(
        grad=tree_mean([r.grad for r in results]),
        theta=[r.theta for r in results],
        outer_loss=float(np.mean([r.outer_loss for r in results])),
    )


class TreeAdam:
    """Adam on the leaves of a hyperparameter pytree, fed with externally computed gradients."""

    def __init__(self, lam: Tree, lr: float) -> None:
        leaves, self._spec = tree_flatten(tree_detach(lam))
        self._leaves = [leaf.clone().requires_grad_() for leaf in leaves]
        self._opt = torch.optim.Adam(self._leaves, lr=lr)

    def step(self, grad: Tree) -> Tree:
        """Apply one Adam step with `grad` and return the new hyperparameters (detached)."""
        for leaf, g in zip(self._leaves, tree_flatten(grad)[0], strict=True):
            leaf.grad = g.detach().to(leaf.dtype)
        self._opt.step()
        return self.value()

    def value(self) -> Tree:
        """The current hyperparameters as a detached pytree."""
        return tree_unflatten([leaf.detach().clone() for leaf in self._leaves], self._spec)


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
) -> HpoResult:
    """Algorithms 1-3: each outer step re-trains from theta0 on every split and averages (EHG).

    The deployed model is theta0 trained `inner_steps` steps on the first split's training data
    with the current lam (what the paper evaluates for RHG/AID).
    """
    adam = TreeAdam(lam0, outer_lr)
    lam = adam.value()
    losses = []
    for t in range(outer_steps):
        h = ehg(estimator, problem, theta0, lam, split_data)
        losses.append(h.outer_loss)
        lam = adam.step(h.grad)
        if on_step is not None:
            on_step(t, lam, h.theta[0])
    theta = problem.descend(theta0, lam, split_data[0][0], inner_steps)
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
) -> HpoResult:
    """Algorithm 4 (OEHG): online ensemble hypergradient descent on lam with Adam.

    Per outer step t: every split's inner model advances `inner_steps` SGD steps from where it was
    (Eq. 53-1) and yields the hypergradient through those steps; lam takes an Adam step with their
    mean (Eq. 53-2); the deployed model takes `inner_steps` steps on `deploy_data` with the new lam
    (Eq. 53-3). `splits` may be a callable (t, deployed theta) -> [(train, val), ...].
    """
    adam = TreeAdam(lam0, outer_lr)
    lam = adam.value()
    theta = tree_detach(theta0)
    inner_thetas: list[Tree] | None = None
    losses = []
    for t in range(outer_steps):
        split_data = splits(t, theta) if callable(splits) else splits
        if inner_thetas is None:
            inner_thetas = [theta for _ in split_data]
        if len(inner_thetas) != len(split_data):
            raise ValueError(f"step {t}: {len(split_data)} splits, but {len(inner_thetas)} models")
        results = [
            rhg(problem, theta_i, lam, train, val, inner_steps)
            for theta_i, (train, val) in zip(inner_thetas, split_data, strict=True)
        ]
        inner_thetas = [r.theta for r in results]
        losses.append(float(np.mean([r.outer_loss for r in results])))
        lam = adam.step(tree_mean([r.grad for r in results]))
        theta = problem.descend(theta, lam, deploy_data, inner_steps)
        if on_step is not None:
            on_step(t, lam, theta)
    return HpoResult(lam, theta, losses)
