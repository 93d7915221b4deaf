"""EHG for episodic training: re-split each episode's pooled images U times, embed once.

An episode's embeddings are laid out [B, way, pool, d] with pool = shot + query. A split
is, for every class, a permutation of the pool whose first `shot` entries are support.
The EHG loss is the mean query loss over U distinct splits; since the mean of gradients
is the gradient of the mean, one backward gives the averaged meta-gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from fewshot.errors import FewshotError

# head(query[B, nq, d], support[B, ns, d], support_labels[B, ns], way, shot) -> logits[B, nq, way]
Head = Callable[..., torch.Tensor]


def distinct_splits(way: int, shot: int, query: int) -> int:
    """Number of distinct support/query splits of one episode: C(shot+query, shot)^way."""
    return math.comb(shot + query, shot) ** way


def check_splits(num_splits: int, way: int, shot: int, query: int) -> None:
    """Refuse U < 1 or U above the number of distinct splits an episode allows."""
    if num_splits < 1:
        raise FewshotError(f"--ehg-splits must be >= 1, got {num_splits}")
    limit = distinct_splits(way, shot, query)
    if num_splits > limit:
        raise FewshotError(
            f"--ehg-splits {num_splits} exceeds the {limit} distinct splits of a {way}-way "
            f"{shot}-shot {query}-query episode (C({shot + query},{shot})^{way})"
        )


def draw_splits(
    batch: int, way: int, shot: int, query: int, num_splits: int, generator: torch.Generator
) -> torch.Tensor:
    """U distinct splits per episode as pool permutations [U, B, way, pool]; split 0 = original.

    Splits are drawn uniformly and redrawn until no two of an episode share the same
    support sets (sampling without replacement among splits).
    """
    check_splits(num_splits, way, shot, query)
    pool = shot + query
    perm = torch.rand(num_splits, batch, way, pool, generator=generator).argsort(dim=-1)
    perm[0] = torch.arange(pool)
    earlier = torch.ones(num_splits, num_splits, dtype=torch.bool).tril(-1)
    while True:
        support = torch.zeros(num_splits, batch, way, pool, dtype=torch.bool)
        support.scatter_(3, perm[..., :shot], True)
        flat = support.flatten(2)  # [U, B, way*pool]
        same = (flat[:, None] == flat[None]).all(-1)  # [U, U, B]
        dup = (same & earlier[..., None]).any(1)  # [U, B]: equals an earlier split
        if not dup.any():
            return perm
        redraw = torch.rand(int(dup.sum()), way, pool, generator=generator).argsort(dim=-1)
        perm[dup] = redraw


def split_episodes(
    embeddings: torch.Tensor, perm: torch.Tensor | None, shot: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Form U*B head problems from embeddings [B, way, pool, d] and splits [U, B, way, pool].

    perm=None means the original split alone (U=1, no copy). Returns query [U*B, way*Q, d],
    support [U*B, way*shot, d] and their labels.
    """
    b, way, pool, d = embeddings.shape
    if perm is None:
        u, views = 1, embeddings
    else:
        u = perm.shape[0]
        index = perm.to(embeddings.device)[..., None].expand(u, b, way, pool, d)
        views = torch.gather(embeddings.expand(u, b, way, pool, d), 3, index)
    labels = torch.arange(way, device=embeddings.device)[:, None]
    support = views[..., :shot, :].reshape(u * b, way * shot, d)
    query = views[..., shot:, :].reshape(u * b, way * (pool - shot), d)
    support_labels = labels.expand(way, shot).reshape(1, -1).expand(u * b, -1)
    query_labels = labels.expand(way, pool - shot).reshape(1, -1).expand(u * b, -1)
    return query, support, support_labels, query_labels


def episode_loss(
    embeddings: torch.Tensor,
    head: Head,
    scale: torch.Tensor,
    shot: int,
    perm: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean query loss over the splits `perm` (None: the original split only), and the
    query accuracy of each of the U*B problems.

    embeddings: [B, way, pool, d] with the first `shot` of each class as the original support.
    """
    way = embeddings.shape[1]
    query, support, support_labels, query_labels = split_episodes(embeddings, perm, shot)
    logits = scale * head(query, support, support_labels, way, shot)
    loss = F.cross_entropy(
        logits.flatten(0, 1), query_labels.flatten(), label_smoothing=label_smoothing
    )
    accuracy = (logits.argmax(-1) == query_labels).float().mean(-1)
    return loss, accuracy


def reembedding_gradients(
    embed: Callable[[torch.Tensor], torch.Tensor],
    parameters: list[torch.Tensor],
    images: torch.Tensor,
    head: Head,
    scale: torch.Tensor,
    shot: int,
    perm: torch.Tensor,
    label_smoothing: float = 0.0,
) -> list[torch.Tensor]:
    """Reference (and naive) EHG: each split's meta-gradient on its own forward, then averaged.

    images: [B, way, pool, C, H, W]. Costs U backbone passes; used to test `episode_loss`
    and as the baseline in the EHG benchmark.
    """
    u, b, way, pool = perm.shape
    total = [torch.zeros_like(p) for p in parameters]
    for split in perm.to(images.device):
        index = split.view(b, way, pool, 1, 1, 1).expand_as(images)
        reordered = torch.gather(images, 2, index)
        emb = embed(reordered.flatten(0, 2)).view(b, way, pool, -1)
        loss, _ = episode_loss(emb, head, scale, shot, None, label_smoothing)
        for acc, grad in zip(total, torch.autograd.grad(loss, parameters), strict=True):
            acc += grad / u
    return total
