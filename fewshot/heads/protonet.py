"""ProtoNet head: logits are negative squared distances to the class means of the support."""

from __future__ import annotations

import torch

from fewshot.heads.episode_inputs import check_query, support_one_hot


def protonet(
    query: torch.Tensor,
    support: torch.Tensor,
    support_labels: torch.Tensor,
    way: int,
    shot: int,
    normalize_by_dim: bool = False,
) -> torch.Tensor:
    """Return -|query - prototype|^2 [B, nq, way] (divided by d if normalize_by_dim)."""
    one_hot = support_one_hot(support, support_labels, way, shot)
    check_query(query, support)
    prototypes = one_hot.transpose(1, 2) @ support / shot
    query_norms = query.pow(2).sum(dim=2, keepdim=True)
    prototype_norms = prototypes.pow(2).sum(dim=2).unsqueeze(1)
    # |q|^2 - 2 q.p + |p|^2 avoids materialising the [B, nq, way, d] differences.
    sq_dist = torch.baddbmm(
        query_norms + prototype_norms, query, prototypes.transpose(1, 2), alpha=-2.0
    )
    if normalize_by_dim:
        sq_dist = sq_dist / query.shape[2]
    return -sq_dist
