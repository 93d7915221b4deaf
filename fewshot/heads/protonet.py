"""ProtoNet head: logits are negative squared distances to the class means of the support."""

from __future__ import annotations

import torch

from fewshot.heads.episode_inputs import check_query, class_means, support_one_hot


def squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a_i - b_j|^2 [B, n, m] of the rows of a [B, n, d] and b [B, m, d]."""
    # |a|^2 - 2 a.b + |b|^2 avoids materialising the [B, n, m, d] differences.
    norms = a.pow(2).sum(dim=2, keepdim=True) + b.pow(2).sum(dim=2).unsqueeze(1)
    return torch.baddbmm(norms, a, b.transpose(1, 2), alpha=-2.0)


def protonet(
    query: torch.Tensor,
    support: torch.Tensor,
    support_labels: torch.Tensor,
    way: int,
    shot: int | None,
    normalize_by_dim: bool = False,
) -> torch.Tensor:
    """Return -|query - prototype|^2 [B, nq, way] (divided by d if normalize_by_dim)."""
    one_hot = support_one_hot(support, support_labels, way, shot)
    check_query(query, support)
    prototypes = class_means(one_hot, support, shot)
    sq_dist = squared_distances(query, prototypes)
    if normalize_by_dim:
        sq_dist = sq_dist / query.shape[2]
    return -sq_dist
