"""Tensor shapes refused in words: which dimension is wrong, what it should be, what it is.

`shape_fault(shape, layout, exact, at_least)` names the first dimension of `shape` that breaks
a rule, e.g. "expects 1 channel, got 3 (shape (3, 3, 28, 28) is [N, C, H, W])", so a refusal
says "channel" where it would otherwise leave the user to count the positions of a tuple.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

# Dimensions counted in items: (one, several).
COUNTED = {
    "N": ("image", "images"),
    "B": ("episode", "episodes"),
    "C": ("channel", "channels"),
    "way": ("class", "classes"),
    "pool": ("image per class", "images per class"),
    "episodes": ("episode", "episodes"),
    "samples": ("support sample", "support samples"),
    "queries": ("query", "queries"),
    "dim": ("feature", "features"),
}
# Dimensions measured in pixels.
MEASURED = {"H": "height", "W": "width"}


def _count(dimension: str, size: int) -> str:
    """'1 channel', '3 channels'."""
    one, several = COUNTED[dimension]
    return f"{size} {one if size == 1 else several}"


def shape_fault(
    shape: Sequence[int],
    layout: Sequence[str],
    exact: Mapping[str, int] | None = None,
    at_least: Mapping[str, int] | None = None,
) -> str | None:
    """The first dimension of `shape` (named by `layout`: N, B, C, H, W, way, pool, episodes,
    samples, queries, dim) that differs from `exact` or is below `at_least`, in words:
    'expects 1 channel, got 3 (shape (3, 3, 28, 28) is [N, C, H, W])'; a wrong number of
    dimensions first; None when the shape is right."""
    exact, at_least = exact or {}, at_least or {}
    names = f"[{', '.join(layout)}]"
    shape = tuple(shape)
    if len(shape) != len(layout):
        plural = "s" if len(layout) > 1 else ""
        return f"expects {len(layout)} dimension{plural} {names}, got {len(shape)}: shape {shape}"
    where = f"(shape {shape} is {names})"
    for dimension, size in zip(layout, shape, strict=True):
        want, low = exact.get(dimension), at_least.get(dimension)
        if want is not None and size != want:
            if dimension in MEASURED:
                return f"expects {MEASURED[dimension]} {want}, got {size} {where}"
            return f"expects {_count(dimension, want)}, got {size} {where}"
        if low is not None and size < low:
            if dimension in MEASURED:
                return f"expects a {MEASURED[dimension]} of at least {low}, got {size} {where}"
            return f"expects at least {_count(dimension, low)}, got {size} {where}"
    return None


def describe_tensor(value: Any) -> str:
    """'a torch.uint8 tensor of shape (2, 3)' (or the type of a non-tensor), for refusals."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"
