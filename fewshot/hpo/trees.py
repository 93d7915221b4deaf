"""Arithmetic on parameter trees: a tensor, or dicts / lists / tuples nesting tensors.

Plain Python over the three container types (no private torch module): leaves are visited in
the containers' own order (a dict's insertion order), the order torch's pytree utilities use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Tree = Any  # a tensor or a nested dict / list / tuple of tensors
Theta = dict[str, torch.Tensor]  # named parameters, the tree the HPO tasks use


def tree_leaves(tree: Tree) -> list[Any]:
    """The leaves of `tree` in order."""
    if isinstance(tree, dict):
        return [leaf for value in tree.values() for leaf in tree_leaves(value)]
    if isinstance(tree, list | tuple):
        return [leaf for value in tree for leaf in tree_leaves(value)]
    return [tree]


def tree_flatten(tree: Tree) -> tuple[list[Any], Callable[[list[Any]], Tree]]:
    """(leaves, rebuild): `rebuild(new_leaves)` is `tree` with its leaves replaced in order."""

    def rebuild(leaves: list[Any]) -> Tree:
        it = iter(leaves)
        return tree_map(lambda _: next(it), tree)

    return tree_leaves(tree), rebuild


def tree_map(f: Callable[..., Any], tree: Tree, *rest: Tree) -> Tree:
    """`f` applied leaf by leaf to `tree` and the equally shaped trees `rest`."""
    if isinstance(tree, dict):
        return {k: tree_map(f, v, *(r[k] for r in rest)) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        mapped = [tree_map(f, v, *(r[i] for r in rest)) for i, v in enumerate(tree)]
        return type(tree)(mapped) if type(tree) in (list, tuple) else type(tree)(*mapped)
    return f(tree, *rest)


def tree_add(a: Tree, b: Tree, scale: float | torch.Tensor = 1.0) -> Tree:
    """a + scale * b, leaf by leaf."""
    return tree_map(lambda x, y: x + scale * y, a, b)


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
