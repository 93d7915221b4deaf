"""Gradient-based hyperparameter optimisation (paper: ensemble hypergradients, EHG and OEHG).

A bilevel problem is two pure loss functions of (theta, lam, data) plus an inner step size,
`Bilevel(inner_loss, outer_loss, inner_lr)`; theta and lam are any pytrees of tensors.

- `fewshot.hpo.hypergrad`: the estimators `rhg`, `trhg`, `aid_fp`, `aid_cg`, each returning a
  `Hypergradient(grad, theta, outer_loss)`.
- `fewshot.hpo.ensemble`: seeded train/validation re-splits (`make_splits`), EHG (the estimate
  averaged over U splits) and OEHG (paper Algorithm 4, U inner models advanced online).
- `fewshot.hpo.ridge`: ridge regression's closed-form inner solution and exact hypergradient.
"""

from fewshot.hpo.ensemble import HpoResult, Split, ehg, make_splits, oehg, optimize_offline
from fewshot.hpo.hypergrad import Bilevel, Hypergradient, aid_cg, aid_fp, rhg, trhg

__all__ = [
    "Bilevel",
    "HpoResult",
    "Hypergradient",
    "Split",
    "aid_cg",
    "aid_fp",
    "ehg",
    "make_splits",
    "oehg",
    "optimize_offline",
    "rhg",
    "trhg",
]
