"""Ridge-regression head (MetaOptNet-RR / R2D2), solved in the dual so d only enters via Grams."""

from __future__ import annotations

import torch

from fewshot.heads.episode_inputs import check_query, support_one_hot
from fewshot.runtime.errors import FewshotError


def ridge(
    query: torch.Tensor,
    support: torch.Tensor,
    support_labels: torch.Tensor,
    way: int,
    shot: int | None,
    lam: float = 50.0,
) -> torch.Tensor:
    """Return Q S^T (S S^T + lam I)^-1 Y [B, nq, way]: ridge regression onto one-hot targets."""
    if lam <= 0:
        raise FewshotError(f"ridge lam must be positive, got {lam}")
    targets = support_one_hot(support, support_labels, way, shot)
    check_query(query, support)
    eye = torch.eye(support.shape[1], dtype=support.dtype, device=support.device)
    regularized_gram = support @ support.transpose(1, 2) + lam * eye
    dual_coefficients = torch.cholesky_solve(targets, torch.linalg.cholesky(regularized_gram))
    # Primal weights S^T c [d, way] first: cheaper than Q S^T when way < queries.
    return query @ (support.transpose(1, 2) @ dual_coefficients)
