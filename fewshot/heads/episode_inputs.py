"""Validation of a batch of head inputs and the one-hot support targets every head needs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fewshot.runtime.errors import FewshotError
from fewshot.runtime.shapes import shape_fault


def support_one_hot(
    support: torch.Tensor, support_labels: torch.Tensor, way: int, shot: int | None
) -> torch.Tensor:
    """Check support[B, ns, d] and labels[B, ns] (`shot` per class, or shot None: every class
    at least once, in any counts); return the labels one-hot [B, ns, way]."""
    if not support.is_floating_point():
        raise FewshotError(
            f"support must be a float tensor [episodes, samples, dim], got {support.dtype} "
            f"of shape {tuple(support.shape)}"
        )
    fault = shape_fault(support.shape, ("episodes", "samples", "dim"))
    if fault:
        raise FewshotError(f"support {fault}")
    episodes, samples = support.shape[:2]
    fault = shape_fault(
        support_labels.shape, ("episodes", "samples"), {"episodes": episodes, "samples": samples}
    )
    if fault:
        raise FewshotError(f"support_labels {fault}, one label per support sample")
    if support_labels.is_floating_point() or support_labels.dtype == torch.bool:
        raise FewshotError(f"support_labels must be integer class ids, got {support_labels.dtype}")
    if shot is None:
        if way < 1:
            raise FewshotError(f"way must be at least 1, got way={way}")
    elif way < 1 or shot < 1 or support.shape[1] != way * shot:
        raise FewshotError(
            f"support has {support.shape[1]} samples per episode but way={way} x shot={shot} "
            f"= {way * shot}; pass the episode's way and shot (shot=None: unequal shots)"
        )
    classes = torch.arange(way, device=support.device)
    one_hot = (support_labels.to(support.device).unsqueeze(-1) == classes).to(support.dtype)
    counts = one_hot.sum(dim=1)
    if shot is not None:
        # Out-of-range labels give all-zero rows, so one count check catches them and imbalance.
        if not bool((counts == shot).all()):
            raise FewshotError(
                f"each episode's support_labels must hold every class 0..{way - 1} exactly "
                f"{shot} times (shot=None: unequal shots)"
            )
        return one_hot
    if not bool((one_hot.sum(dim=2) == 1).all()):
        raise FewshotError(
            f"support_labels must be class ids 0..{way - 1}, got "
            f"{int(support_labels.min())}..{int(support_labels.max())}"
        )
    empty = (counts == 0).nonzero()
    if len(empty):
        episode, label = empty[0].tolist()
        raise FewshotError(
            f"class {label} has no support image in episode {episode}: each episode's "
            f"support_labels must hold every class 0..{way - 1} at least once"
        )
    return one_hot


def class_counts(one_hot: torch.Tensor, shot: int | None) -> torch.Tensor | int:
    """Each class's support count [B, way, 1] from the one-hot [B, ns, way] if shot is None,
    else the integer shot itself."""
    # Dividing by the integer as before keeps equal shots bit for bit: a CUDA division by a
    # scalar multiplies by its reciprocal, a division by a tensor does not.
    return one_hot.sum(dim=1).unsqueeze(2) if shot is None else shot


def class_means(one_hot: torch.Tensor, features: torch.Tensor, shot: int | None) -> torch.Tensor:
    """The class means [B, way, d] of features [B, ns, d] with labels one-hot [B, ns, way]."""
    return one_hot.transpose(1, 2) @ features / class_counts(one_hot, shot)


def check_query(query: torch.Tensor, support: torch.Tensor) -> None:
    """Check that query[B, nq, d] matches support[B, ns, d] in episodes, dim and dtype."""
    episodes, _, dim = support.shape
    layout = ("episodes", "queries", "dim")
    fault = shape_fault(query.shape, layout, {"episodes": episodes, "dim": dim})
    if fault:
        raise FewshotError(f"query {fault}, as support {tuple(support.shape)}")
    if query.dtype != support.dtype:
        raise FewshotError(f"query is {query.dtype}, support {support.dtype}: they must match")


def unit_length(x: torch.Tensor, dim: int) -> torch.Tensor:
    """`x` scaled to unit L2 length along `dim`, as F.normalize, but first divided by its
    largest magnitude there (detached: the scale changes no direction): features of any finite
    size, 1e37 included, whose squared norm would overflow to inf and normalise to zeros."""
    largest = x.detach().abs().amax(dim=dim, keepdim=True).clamp(min=torch.finfo(x.dtype).tiny)
    return F.normalize(x / largest, dim=dim)
