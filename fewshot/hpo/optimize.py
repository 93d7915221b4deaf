"""The one entry point every HPO task calls: `optimize(method, problem, ..., splits, budget)`.

`METHODS` are the five ways to learn lam: the offline estimators RHG, T-RHG, AID-FP and AID-CG
(Algorithms 1-3, EHG when given several splits) and the online OEHG (Algorithm 4). The tasks'
settings (`fewshot.hpo.tasks.base.HpoSettings`) check the step counts each method uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from fewshot.hpo.ensemble import (
    Estimator,
    HpoResult,
    OuterOptimizer,
    SplitData,
    StepCallback,
    oehg,
    optimize_offline,
)
from fewshot.hpo.hypergrad import Bilevel, aid_cg, aid_fp, rhg, trhg
from fewshot.hpo.trees import Tree

METHODS = ("rhg", "trhg", "aid-fp", "aid-cg", "oehg")
OEHG_RESPLITS = 5  # the paper's U for OEHG (the other methods default to the one split)


@dataclass(frozen=True)
class Budget:
    """The step counts of a run; each method reads only its own.

    outer_steps: T, every method. inner_steps: K of RHG / T-RHG / AID (and the deployed model's
    training after them). truncate: T-RHG's back-propagated steps. solver_steps: AID's
    fixed-point / conjugate-gradient iterations. oehg_inner_steps: OEHG's steps per outer step.
    """

    outer_steps: int
    inner_steps: int = 128
    truncate: int = 32
    solver_steps: int = 20
    oehg_inner_steps: int = 1


def estimator(method: str, budget: Budget) -> Estimator:
    """The offline estimator of `method` with the budget's step counts."""
    k = budget.inner_steps
    estimators: dict[str, Callable[..., Any]] = {
        "rhg": partial(rhg, steps=k),
        "trhg": partial(trhg, steps=k, truncate=budget.truncate),
        "aid-fp": partial(aid_fp, steps=k, solver_steps=budget.solver_steps),
        "aid-cg": partial(aid_cg, steps=k, solver_steps=budget.solver_steps),
    }
    if method not in estimators:
        raise ValueError(f"no offline estimator {method!r}; choose from {', '.join(estimators)}")
    return estimators[method]


def optimize(
    method: str,
    problem: Bilevel,
    theta0: Tree,
    lam0: Tree,
    splits: SplitData | Callable[[int, Tree], SplitData],
    budget: Budget,
    *,
    outer_lr: float,
    seed: int = 0,
    deploy: Any = None,
    on_step: StepCallback | None = None,
    outer_optimizer: OuterOptimizer | None = None,
) -> HpoResult:
    """Learn lam from `lam0` with `method`; return lam, the deployed model and the losses.

    `splits`: [(train, val), ...] data pairs (fixed data or `Minibatches`), or for OEHG a
    callable (t, deployed theta) -> pairs. `deploy`: the deployed model's training data
    (default: the first split's). `seed` derives the generators that draw mini-batches. The
    outer optimiser is Adam with `outer_lr` unless `outer_optimizer` makes another.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    if method == "oehg":
        if deploy is None:
            if callable(splits):
                raise ValueError("oehg with callable splits needs the deployed model's data")
            deploy = splits[0][0]
        return oehg(
            problem,
            theta0,
            lam0,
            splits,
            deploy,
            budget.outer_steps,
            outer_lr,
            budget.oehg_inner_steps,
            on_step,
            seed=seed,
            outer_optimizer=outer_optimizer,
        )
    if callable(splits):
        raise ValueError(f"{method} needs fixed splits, not a callable")
    return optimize_offline(
        estimator(method, budget),
        problem,
        theta0,
        lam0,
        splits,
        budget.outer_steps,
        outer_lr,
        budget.inner_steps,
        on_step,
        seed=seed,
        deploy_data=deploy,
        outer_optimizer=outer_optimizer,
    )
