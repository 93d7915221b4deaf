"""Mini-batches for the inner SGD, drawn by the estimators from an explicit seeded generator.

A loss never draws its own data: an estimator calls `draw(data, gen)` before every loss
evaluation and passes the batch in. Fixed data (any tuple of tensors, a full-batch problem) is
returned as it is; `Minibatches` returns `size` rows drawn without replacement by `gen`, so a run
is a function of the generators it is given (`generators(seed, count)`), whatever else calls the
losses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class Minibatches:
    """Row-aligned tensors to be drawn in batches of `size` rows (size >= rows: all of them)."""

    tensors: tuple[torch.Tensor, ...]
    size: int

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.size}")
        if len({len(t) for t in self.tensors}) != 1:
            raise ValueError("Minibatches tensors must have the same number of rows")
        if self.full:
            # The same x every step: column-major storage turns autograd's weight gradient
            # x^T @ grad into a plain GEMM (about 1.5x faster linear layers on CPU).
            first, *rest = self.tensors
            if first.dim() == 2:
                object.__setattr__(self, "tensors", (first.T.contiguous().T, *rest))

    @property
    def rows(self) -> int:
        """The number of rows."""
        return len(self.tensors[0])

    @property
    def full(self) -> bool:
        """Whether every draw is the whole set (full-batch gradient descent)."""
        return self.size >= self.rows

    def draw(self, gen: torch.Generator | None) -> tuple[torch.Tensor, ...]:
        """`size` rows drawn without replacement with `gen` (the whole set, in order, if full)."""
        if self.full:
            return self.tensors
        if gen is None:
            raise ValueError("mini-batched data needs a generator to draw from")
        rows = torch.randperm(self.rows, generator=gen)[: self.size]
        rows = rows.to(self.tensors[0].device)
        return tuple(t[rows] for t in self.tensors)


def draw(data: Any, gen: torch.Generator | None) -> Any:
    """The batch the next loss evaluation sees: a draw from `Minibatches`, else `data` itself."""
    return data.draw(gen) if isinstance(data, Minibatches) else data


def generators(seed: int, count: int) -> list[torch.Generator]:
    """`count` independent CPU generators derived from `seed` (numpy's SeedSequence)."""
    children = np.random.SeedSequence(seed).spawn(count)
    states = [int(child.generate_state(1, np.uint64)[0]) >> 1 for child in children]
    return [torch.Generator().manual_seed(state) for state in states]
