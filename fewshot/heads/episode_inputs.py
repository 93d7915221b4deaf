"""Validation of a batch of head inputs and the one-hot support targets every head needs."""

from __future__ import annotations

import torch

from fewshot.runtime.errors import FewshotError
from fewshot.runtime.shapes import shape_fault


def support_one_hot(
    support: torch.Tensor, support_labels: torch.Tensor, way: int, shot: int
) -> torch.Tensor:
    """Check support[B, ns, d] and labels[B, ns]; return the labels one-hot [B, ns, way]."""
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
    if way < 1 or shot < 1 or support.shape[1] != way * shot:
        raise FewshotError(
            f"support has {support.shape[1]} samples per episode but way={way} x shot={shot} "
            f"= {way * shot}; pass the episode's way and shot"
        )
    classes = torch.arange(way, device=support.device)
    one_hot = (support_labels.to(support.device).unsqueeze(-1) == classes).to(support.dtype)
    # Out-of-range labels give all-zero rows, so one count check catches them and imbalance.
    if not bool((one_hot.sum(dim=1) == shot).all()):
        raise FewshotError(
            f"each episode's support_labels must hold every class 0..{way - 1} exactly {shot} times"
        )
    return one_hot


def check_query(query: torch.Tensor, support: torch.Tensor) -> None:
    """Check that query[B, nq, d] matches support[B, ns, d] in episodes, dim and dtype."""
    episodes, _, dim = support.shape
    layout = ("episodes", "queries", "dim")
    fault = shape_fault(query.shape, layout, {"episodes": episodes, "dim": dim})
    if fault:
        raise FewshotError(f"query {fault}, as support {tuple(support.shape)}")
    if query.dtype != support.dtype:
        raise FewshotError(f"query is {query.dtype}, support {support.dtype}: they must match")
