"""EHG for episodic training: re-split each episode's pooled images U times, embed once.

An episode's embeddings are laid out [B, way, pool, d] with pool = shot + query. A re-split
is, for every class, a permutation of the pool whose first `shot` entries are support.
The EHG loss is the mean query loss over U distinct re-splits; since the mean of gradients
is the gradient of the mean, one backward gives the averaged meta-gradient.

Varied episodes (fewshot.datasets.varied) come one per batch with a shot per class: `shot` is
then a long tensor [1, way] and the pool is the largest shot + query, class c's row holding
shot[c] support and `query` query entries, then padding that is never read. Their re-splits
permute each class's own entries; heads get the support flat, with `shot=None`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

# head(query[B, nq, d], support[B, ns, d], support_labels[B, ns], way, shot) -> logits[B, nq, way]
# (shot None: unequal shots, counted from the labels)
Head = Callable[..., torch.Tensor]
# An episode's shot: one for every class, or one per class of a varied episode [1, way].
Shot = int | torch.Tensor


def varied_entries(shots: torch.Tensor, pool: int) -> torch.Tensor:
    """[1, way, pool] mask of a varied episode's support and query entries (not padding)."""
    query = pool - int(shots.max())
    return torch.arange(pool, device=shots.device) < shots[..., None] + query


def embed_varied(
    embed: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor, shots: torch.Tensor
) -> torch.Tensor:
    """Embeddings [1, way, pool, d] of a varied episode's images [1, way, pool, C, H, W]:
    `embed` ([N, C, H, W] -> [N, d]) of its real entries alone, in one call, so that
    BatchNorm's batch statistics are theirs; the padding's are zeros, never read."""
    entries = varied_entries(shots.to(images.device), images.shape[2])
    features = embed(images[entries])
    embeddings = features.new_zeros(*entries.shape, features.shape[1])
    embeddings[entries] = features
    return embeddings


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

    def draw(n: int) -> torch.Tensor:
        return torch.rand(n, way, pool, generator=generator).argsort(dim=-1)

    return _distinct(perm, shot, draw)


def draw_varied_resplits(
    shots: torch.Tensor, pool: int, u: int, generator: torch.Generator
) -> torch.Tensor:
    """U distinct re-splits [U, 1, way, pool] of a varied episode with `shots` [1, way] (see the
    module): each class's shot + query entries permuted, its padding after them; 0 = original.
    Uniform draws redrawn until distinct: the settings keep U at most a quarter of the fewest
    re-splits a varied episode can have, (1 + query)^way, so each redraw mostly succeeds."""
    way = shots.shape[1]
    padding = ~varied_entries(shots, pool)[0]  # [way, pool]

    def draw(n: int) -> torch.Tensor:
        keys = torch.rand(n, way, pool, generator=generator).masked_fill(padding, float("inf"))
        return keys.argsort(dim=-1)

    perm = draw(u).unsqueeze(1)
    perm[0] = torch.arange(pool)
    return _distinct(perm, shots, draw)


def _distinct(perm: torch.Tensor, shot: Shot, draw: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """Redraw (`draw(n)` -> n permutations [n, way, pool]) every re-split of `perm` that
    repeats the support sets of an earlier one of its episode, until none does."""
    while True:
        dup = _repeats(perm, shot)
        if not dup.any():
            return perm
        perm[dup] = draw(int(dup.sum()))


def _repeats(perm: torch.Tensor, shot: Shot) -> torch.Tensor:
    """[U, B] mask: the re-split has the same support sets as an earlier one of its episode."""
    u, b, way, pool = perm.shape
    limit = shot if isinstance(shot, int) else shot[..., None]
    first = (torch.arange(pool) < limit).expand_as(perm)  # positions that are support
    support = torch.zeros(u, b, way, pool, dtype=torch.bool).scatter_(3, perm, first)
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
    embeddings: torch.Tensor, perm: torch.Tensor | None, shot: Shot
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Form U*B head problems from embeddings [B, way, pool, d] and re-splits [U, B, way, pool].

    perm=None means the original split alone (U=1, no copy). Returns query [U*B, way*Q, d],
    support [U*B, way*shot, d] (a varied episode's: [U, sum of its shots, d]) and their labels.
    """
    b, way, pool, d = embeddings.shape
    if perm is None:
        u, views = 1, embeddings
    else:
        u = perm.shape[0]
        index = perm.to(embeddings.device)[..., None].expand(u, b, way, pool, d)
        views = torch.gather(embeddings.expand(u, b, way, pool, d), 3, index)
    if not isinstance(shot, int):
        return _varied_problems(views.reshape(u, way, pool, d), shot)
    labels = torch.arange(way, device=embeddings.device)[:, None]
    support = views[..., :shot, :].reshape(u * b, way * shot, d)
    query = views[..., shot:, :].reshape(u * b, way * (pool - shot), d)
    support_labels = labels.expand(way, shot).reshape(1, -1).expand(u * b, -1)
    query_labels = labels.expand(way, pool - shot).reshape(1, -1).expand(u * b, -1)
    return query, support, support_labels, query_labels


def _varied_problems(
    views: torch.Tensor, shots: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`resplit_episodes` of one varied episode's U views [U, way, pool, d] with `shots` [1, way]:
    class c's first shots[c] entries are support, the next `query` its queries."""
    u, way, pool, _ = views.shape
    shots = shots[0].cpu()
    query = pool - int(shots.max())
    classes, places = (torch.arange(pool) < shots[:, None]).nonzero(as_tuple=True)
    query_places = shots[:, None] + torch.arange(query)  # [way, query]
    device = views.device
    support = views[:, classes.to(device), places.to(device)]
    queries = views[:, torch.arange(way, device=device)[:, None], query_places.to(device)]
    query_labels = torch.arange(way, device=device).repeat_interleave(query)
    return (
        queries.flatten(1, 2),
        support,
        classes.to(device).expand(u, -1),
        query_labels.expand(u, -1),
    )


def episode_loss(
    embeddings: torch.Tensor,
    head: Head,
    scale: torch.Tensor,
    shot: Shot,
    perm: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
    loss: str = "cross_entropy",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean query loss over the re-splits `perm` (None: the original split only), and the
    query accuracy of each of the U*B problems. `loss` "mse": the squared error of the
    logits' sigmoids against one-hot targets (Relation Networks), else cross-entropy.

    embeddings: [B, way, pool, d] with the first `shot` of each class as the original support.
    """
    logits, query_labels = episode_logits(embeddings, head, scale, shot, perm)
    if loss == "mse":
        targets = F.one_hot(query_labels, logits.shape[-1]).to(logits.dtype)
        value = F.mse_loss(torch.sigmoid(logits), targets)
    else:
        value = F.cross_entropy(
            logits.flatten(0, 1), query_labels.flatten(), label_smoothing=label_smoothing
        )
    return value, query_accuracy(logits, query_labels)


def episode_logits(
    embeddings: torch.Tensor,
    head: Head,
    scale: torch.Tensor,
    shot: Shot,
    perm: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The scaled query logits [U*B, nq, way] of the head problems of the re-splits `perm`
    (None: the original split only) of embeddings [B, way, pool, d], and the queries' labels
    [U*B, nq]."""
    way = embeddings.shape[1]
    query, support, support_labels, query_labels = resplit_episodes(embeddings, perm, shot)
    head_shot = shot if isinstance(shot, int) else None
    return scale * head(query, support, support_labels, way, head_shot), query_labels


def query_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The query accuracy [P] of each of P problems from its logits [P, nq, way] and labels
    [P, nq]."""
    return (logits.argmax(-1) == labels).float().mean(-1)


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
