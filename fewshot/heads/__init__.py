"""Few-shot classification heads: batched (query, support, labels, way, shot) -> logits."""

from __future__ import annotations

from collections.abc import Callable

import torch

from fewshot.heads.protonet import protonet
from fewshot.heads.ridge import ridge
from fewshot.heads.svm import svm
from fewshot.runtime.errors import FewshotError

Head = Callable[..., torch.Tensor]

HEADS: dict[str, Head] = {"protonet": protonet, "ridge": ridge, "svm": svm}


def get_head(name: str) -> Head:
    """Return the head registered under name."""
    if name not in HEADS:
        raise FewshotError(f"unknown head {name!r}; choose one of {', '.join(sorted(HEADS))}")
    return HEADS[name]


__all__ = ["HEADS", "Head", "get_head", "protonet", "ridge", "svm"]
