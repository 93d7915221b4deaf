"""EHG for episodic training: re-split each episode's pooled images U times, embed once.

An episode's embeddings are laid out [B, way, pool, d] with pool = shot + query. A re-split
is, for every class, a permutation of the pool whose first `shot` entries are support.
The EHG loss is the mean query loss over U distinct re-splits; since the mean of gradients
is the gradient of the mean, one backward gives the averaged meta-gradient.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

# head(query[B, nq, d], support[B, ns, d], support_labels[B, ns], way, shot) -> logits[B, nq, way]
Head = Callable[..., torch.Tensor]


def distinct_resplits(way: int, shot: int, query: int, at_most: int | None = None) -> int:
    """Number of distinct support/query re-splits of one episode: C(shot+query, shot)^way;
    with `at_most`, the smaller of it and `at_most`, in time bounded by `at_most` whatever the
    way (a million-way power would take seconds and gigabytes)."""
    per_class = math.comb(shot + query, shot)
    if at_most is None or per_class == 1:
        return per_class**way
    total = 1
    for _ in range(way):
        total *= per_class
        if total >= at_most:
            return at_most
    return total


def draw_resplits(
    batch: int, way: int, shot: int, query: int, u: int, generator: torch.Generator
) -> torch.Tensor:
    """U distinct re-splits per episode as pool permutations [U, B, way, pool]; 0 = original.

    Sampling without replacement among re-splits, in bounded time for every allowed U: when U
    is at most a quarter of the distinct re-splits, uniform draws are redrawn until distinct (each
    redraw collides with probability < 1/4); otherwise U - 1 distinct re-split numbers are drawn
    at once and decoded.
    """
    available = distinct_resplits(way, shot, query, at_most=4 * u)
    if not 1 <= u <= available:
        raise ValueError(f"U = {u} is not between 1 and the episode's distinct re-splits")
    if 4 * u > available:
        return _enumerated_resplits(batch, way, shot, query, u, generator)
    pool = shot + query
    perm = torch.rand(u, batch, way, pool, generator=generator).argsort(dim=-1)
    perm[0] = torch.arange(pool)
    while True:
        dup = _repeats(perm, shot)
        if not dup.any():
            return perm
        redraw = torch.rand(int(dup.sum()), way, pool, generator=generator).argsort(dim=-1)
        perm[dup] = redraw


def _repeats(perm: torch.Tensor, shot: int) -> torch.Tensor:
    """[U, B] mask: the re-split has the same support sets as an earlier one of its episode."""
    u, b, way, pool = perm.shape
    support = torch.zeros(u, b, way, pool, dtype=torch.bool)
    support.scatter_(3, perm[..., :shot], True)
    rows = support.flatten(2).numpy()
    dup = torch.zeros(u, b, dtype=torch.bool)
    for episode in range(b):
        seen: set[bytes] = set()
        for r in range(u):
            key = rows[r, episode].tobytes()
            dup[r, episode] = key in seen
            seen.add(key)
    return dup


def _enumerated_resplits(
    batch: int, way: int, shot: int, query: int, u: int, generator: torch.Generator
) -> torch.Tensor:
    """Re-splits numbered 0 .. M-1 (0 = original), U - 1 distinct non-zero numbers per episode.

    Re-split number r, read in base C(pool, shot), gives each class's support set as its digit:
    the digit-th `shot`-subset of the pool in lexicographic order (subset 0 = the first `shot`).
    """
    pool = shot + query
    subsets = torch.tensor(list(itertools.combinations(range(pool), shot)))  # [C, shot]
    in_support = torch.zeros(len(subsets), pool, dtype=torch.bool)
    in_support.scatter_(1, subsets, True)
    # The permutation of each subset: its members first, then the rest, each in pool order.
    orders = torch.argsort((~in_support).long(), dim=1, stable=True)  # [C, pool]
    total = distinct_resplits(way, shot, query)
    numbers = torch.stack(
        [torch.randperm(total - 1, generator=generator)[: u - 1] + 1 for _ in range(batch)]
    )  # [B, U-1]
    numbers = torch.cat([torch.zeros(batch, 1, dtype=torch.long), numbers], dim=1).T  # [U, B]
    powers = len(subsets) ** torch.arange(way)
    digits = numbers[..., None] // powers % len(subsets)  # [U, B, way]
    return orders[digits]


def resplit_episodes(
    embeddings: torch.Tensor, perm: torch.Tensor | None, shot: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Form U*B head problems from embeddings [B, way, pool, d] and re-splits [U, B, way, pool].

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
    loss: str = "cross_entropy",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean query loss over the re-splits `perm` (None: the original split only), and the
    query accuracy of each of the U*B problems. `loss` "mse": the squared error of the
    logits' sigmoids against one-hot targets (Relation Networks), else cross-entropy.

    embeddings: [B, way, pool, d] with the first `shot` of each class as the original support.
    """
    way = embeddings.shape[1]
    query, support, support_labels, query_labels = resplit_episodes(embeddings, perm, shot)
    logits = scale * head(query, support, support_labels, way, shot)
    if loss == "mse":
        targets = F.one_hot(query_labels, way).to(logits.dtype)
        value = F.mse_loss(torch.sigmoid(logits), targets)
    else:
        value = F.cross_entropy(
            logits.flatten(0, 1), query_labels.flatten(), label_smoothing=label_smoothing
        )
    accuracy = (logits.argmax(-1) == query_labels).float().mean(-1)
    return value, accuracy


def reembedding_gradients(
    embed: Callable[[torch.Tensor], torch.Tensor],
    parameters: list[torch.Tensor],
    images: torch.Tensor,
    head: Head,
    scale: torch.Tensor,
    shot: int,
    perm: torch.Tensor,
    label_smoothing: float = 0.0,
    loss: str = "cross_entropy",
) -> list[torch.Tensor]:
    """Reference (and naive) EHG: each re-split's meta-gradient on its own forward, then averaged.

    images: [B, way, pool, C, H, W]. Costs U backbone passes; used to test `episode_loss`
    and as the baseline in the EHG benchmark.
    """
    u, b, way, pool = perm.shape
    total = [torch.zeros_like(p) for p in parameters]
    for order in perm.to(images.device):
        index = order.view(b, way, pool, 1, 1, 1).expand_as(images)
        reordered = torch.gather(images, 2, index)
        emb = embed(reordered.flatten(0, 2)).view(b, way, pool, -1)
        value, _ = episode_loss(emb, head, scale, shot, None, label_smoothing, loss)
        for acc, grad in zip(total, torch.autograd.grad(value, parameters), strict=True):
            acc += grad / u
    return total
