"""Test-time classifiers on frozen features, batched over episodes like the heads.

- `centroid`: nearest class mean (SimpleShot), optionally on CL2N features.
- `cosine`: Meta-Baseline's cosine similarity to the class means (a training head too).
- `logistic`: RFS's L2-penalised multinomial logistic regression (`fewshot.heads.logistic`).
- `finetune`: A Closer Look's Baseline / Baseline++ classifier trained on the support.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fewshot.heads.episode_inputs import check_query, class_means, support_one_hot, unit_length
from fewshot.heads.logistic import logistic
from fewshot.heads.protonet import protonet
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.shapes import shape_fault

FINETUNE_CLASSIFIERS = ("linear", "cosine")


def centroid(
    query: torch.Tensor,
    support: torch.Tensor,
    support_labels: torch.Tensor,
    way: int,
    shot: int | None,
    cl2n: bool = False,
    center: torch.Tensor | None = None,
) -> torch.Tensor:
    """Return -|query - class mean|^2 [B, nq, way] (SimpleShot), on CL2N features if cl2n.

    CL2N: subtract `center` (the base classes' mean feature [d], from the caller), then
    L2-normalise every query and support feature before the class means are taken.
    """
    support_one_hot(support, support_labels, way, shot)
    check_query(query, support)
    if not cl2n:
        if center is not None:
            raise FewshotError("centroid center is only used with cl2n=True")
        return protonet(query, support, support_labels, way, shot)
    if center is None:
        raise FewshotError("centroid cl2n=True needs center: the base-class mean feature [dim]")
    if not isinstance(center, torch.Tensor):
        raise FewshotError(
            f"centroid center must be a tensor [dim] = [{support.shape[2]}], got a "
            f"{type(center).__name__}"
        )
    fault = shape_fault(center.shape, ("dim",), {"dim": support.shape[2]})
    if fault:
        raise FewshotError(f"centroid center {fault}, as the support features")
    center = center.to(device=support.device, dtype=support.dtype)
    support = unit_length(support - center, dim=2)
    query = unit_length(query - center, dim=2)
    return protonet(query, support, support_labels, way, shot)


def cosine(
    query: torch.Tensor,
    support: torch.Tensor,
    support_labels: torch.Tensor,
    way: int,
    shot: int | None,
) -> torch.Tensor:
    """Return cos(query, class mean) [B, nq, way] in [-1, 1] (Meta-Baseline; the caller scales)."""
    one_hot = support_one_hot(support, support_labels, way, shot)
    check_query(query, support)
    # The means of the raw features, normalised after: Meta-Baseline's order.
    prototypes = class_means(one_hot, support, shot)
    return unit_length(query, dim=2) @ unit_length(prototypes, dim=2).transpose(1, 2)


def finetune(
    query: torch.Tensor,
    support: torch.Tensor,
    support_labels: torch.Tensor,
    way: int,
    shot: int | None,
    classifier: str = "linear",
    steps: int = 100,
    lr: float = 0.01,
    weight_decay: float = 0.001,
    scale: float = 10.0,
    seed: int | torch.Tensor = 0,
    dampening: float = 0.9,
) -> torch.Tensor:
    """Return the query logits [B, nq, way] of a fresh classifier trained on the support
    (A Closer Look: Baseline "linear", Baseline++ "cosine"); `steps` SGD steps, no tolerance.

    Linear: logits x W + b. Cosine: scale * cos(x, w_c), no bias. W [B, d, way] (and b) start
    as nn.Linear's default, U(-1/sqrt(d), 1/sqrt(d)), drawn on the CPU in the features' dtype
    from torch.Generator().manual_seed(seed): torch.rand(B, d, way) then torch.rand(B, way),
    each mapped by 2u - 1 times the bound. `seed` may instead hold one seed per episode
    (an integer tensor [B]): episode b then starts where a batch of one with seed[b] would,
    whatever the batch it is in (evaluation passes each episode's seed). Training:
    cross-entropy (mean over the support) of every episode at once, SGD with momentum 0.9,
    `dampening` and `weight_decay` on all the parameters (the paper's code: lr 0.01,
    dampening 0.9, weight decay 0.001), but full-batch for `steps` steps where the paper takes
    100 epochs of shuffled batches of 4. Episodes do not interact: the loss is a sum over
    episodes and SGD acts elementwise. Runs with autograd on even under no_grad, on features
    detached from their graph; the logits are detached.
    """
    if classifier not in FINETUNE_CLASSIFIERS:
        raise FewshotError(
            f"finetune classifier must be one of {', '.join(FINETUNE_CLASSIFIERS)}, "
            f"got {classifier!r}"
        )
    if steps < 1:
        raise FewshotError(f"finetune steps must be at least 1, got {steps}")
    if not lr > 0 or not weight_decay >= 0 or not scale > 0 or not 0 <= dampening < 1:
        raise FewshotError(
            f"finetune needs lr > 0, weight_decay >= 0, scale > 0 and 0 <= dampening < 1, got "
            f"lr={lr}, weight_decay={weight_decay}, scale={scale}, dampening={dampening}"
        )
    support_one_hot(support, support_labels, way, shot)
    check_query(query, support)
    episodes, samples, dim = support.shape
    features, query = support.detach(), query.detach()
    labels = support_labels.to(support.device).long().flatten()
    linear = classifier == "linear"
    if isinstance(seed, torch.Tensor):
        if seed.shape != (episodes,) or seed.is_floating_point() or seed.dtype == torch.bool:
            raise FewshotError(
                f"finetune seed must be an integer or {episodes} integer seeds (one per "
                f"episode), got a {seed.dtype} tensor of shape {tuple(seed.shape)}"
            )
        drawn = [_initial_classifier(s, 1, dim, way, support.dtype, linear) for s in seed.tolist()]
        start = [torch.cat(parts) for parts in zip(*drawn, strict=True)]
    else:
        start = _initial_classifier(seed, episodes, dim, way, support.dtype, linear)
    parameters = [part.to(support.device).requires_grad_() for part in start]
    weight, bias = parameters[0], parameters[1] if linear else None

    def scores(x: torch.Tensor) -> torch.Tensor:
        if bias is None:
            return scale * unit_length(x, dim=2) @ F.normalize(weight, dim=1)
        return torch.baddbmm(bias.unsqueeze(1), x, weight)

    optimizer = torch.optim.SGD(
        parameters, lr=lr, momentum=0.9, dampening=dampening, weight_decay=weight_decay
    )
    with torch.enable_grad():
        for _ in range(steps):
            losses = F.cross_entropy(scores(features).flatten(0, 1), labels, reduction="none")
            # Each episode's mean, summed: episode b's gradient is its own mean loss's.
            loss = losses.view(episodes, samples).mean(dim=1).sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        return scores(query)


def _initial_classifier(
    seed: int, episodes: int, dim: int, way: int, dtype: torch.dtype, bias: bool
) -> list[torch.Tensor]:
    """nn.Linear's default start of `episodes` classifiers, drawn on the CPU from
    torch.Generator().manual_seed(seed): weights [episodes, dim, way], then biases
    [episodes, way] if `bias`, U(-1/sqrt(dim), 1/sqrt(dim))."""
    generator = torch.Generator().manual_seed(seed)
    bound = 1 / math.sqrt(dim)
    shapes = [(episodes, dim, way), (episodes, way)][: 2 if bias else 1]
    draws = [torch.rand(*shape, generator=generator, dtype=dtype) for shape in shapes]
    return [(2 * draw - 1) * bound for draw in draws]


__all__ = ["FINETUNE_CLASSIFIERS", "centroid", "cosine", "finetune", "logistic"]
