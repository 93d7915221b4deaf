"""Arithmetic on parameter pytrees (nested dicts/tuples/lists of tensors)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

Tree = Any  # a tensor or a nested container of tensors
Theta = dict[str, torch.Tensor]  # named parameters, the pytree the HPO tasks use


def tree_add(a: Tree, b: Tree, scale: float | torch.Tensor = 1.0) -> Tree:
    """a + scale * b, leaf by leaf."""
    return tree_map(lambda x, y: x + scale * y, a, b)


def tree_scale(a: Tree, scale: float | torch.Tensor) -> Tree:
    """scale * a, leaf by leaf."""
    return tree_map(lambda x: scale * x, a)


def tree_dot(a: Tree, b: Tree) -> torch.Tensor:
    """The inner product sum_i <a_i, b_i> over all leaves."""
    return sum((x * y).sum() for x, y in zip(tree_leaves(a), tree_leaves(b), strict=True))


def tree_zeros_like(a: Tree) -> Tree:
    """A tree of zeros shaped like `a`."""
    return tree_map(torch.zeros_like, a)


def tree_detach(a: Tree) -> Tree:
    """Detach every leaf from any autograd graph."""
    return tree_map(lambda x: x.detach(), a)


def tree_mean(trees: list[Tree]) -> Tree:
    """The leaf-wise average of a non-empty list of equally shaped trees."""
    return tree_map(lambda *xs: torch.stack(xs).mean(0), *trees)
