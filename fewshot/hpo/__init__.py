"""Gradient-based hyperparameter optimisation (paper: ensemble hypergradients, EHG and OEHG).

A bilevel problem is two pure loss functions of (theta, lam, batch) plus an inner step size,
`Bilevel(inner_loss, outer_loss, inner_lr)`; theta and lam are trees of tensors (`trees`).

- `fewshot.hpo.optimize`: `optimize(method, problem, theta0, lam0, splits, budget, ...)`, the one
  entry point every task calls, with the methods (`METHODS`) and their defaults and checks.
- `fewshot.hpo.hypergrad`: the estimators `rhg`, `trhg`, `aid_fp`, `aid_cg`.
- `fewshot.hpo.ensemble`: EHG (`ehg`, `optimize_offline`) and OEHG (`oehg`).
- `fewshot.hpo.splits`: seeded distinct train/validation re-splits (`make_splits`).
- `fewshot.hpo.batches`: `Minibatches`, drawn by the estimators from explicit generators.
- `fewshot.hpo.tasks`: the paper's tasks; `fewshot.hpo.cli`: the `fewshot hpo` commands.
"""

from fewshot.hpo.batches import Minibatches
from fewshot.hpo.ensemble import HpoResult, ehg, oehg, optimize_offline
from fewshot.hpo.hypergrad import Bilevel, Hypergradient, aid_cg, aid_fp, rhg, trhg
from fewshot.hpo.optimize import METHODS, Budget, optimize
from fewshot.hpo.splits import Split, make_splits

__all__ = [
    "METHODS",
    "Bilevel",
    "Budget",
    "HpoResult",
    "Hypergradient",
    "Minibatches",
    "Split",
    "aid_cg",
    "aid_fp",
    "ehg",
    "make_splits",
    "oehg",
    "optimize",
    "optimize_offline",
    "rhg",
    "trhg",
]
