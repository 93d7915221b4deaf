"""Seeded train/validation re-splits of the observed examples (EHG's U splits).

`make_splits(n, gamma, resplits, seed)` draws `resplits` distinct splits without replacement among
the C(n, n_val) possible ones: by rejection while they are many (each draw is new with probability
at least 3/4), by drawing ranks and unranking them when `resplits` is a large share of them, and it
refuses an impossible number at once. `MAX_RESPLITS` bounds U for every command: each split keeps
its own model (OEHG) and its own copy of the training data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Each split holds its own copy of the training data and (OEHG) its own model, updated every
# outer step; the largest LIBSVM set here, a9a, takes 32 MB per copy.
MAX_RESPLITS = 1000
RESPLITS_LIMIT_REASON = (
    "each split holds its own copy of the training data and its own inner model, and "
    f"{MAX_RESPLITS} copies of a9a's training part alone take 32 GB of memory"
)


@dataclass(frozen=True)
class Split:
    """Index arrays of one train/validation split of the observed examples."""

    train: np.ndarray
    val: np.ndarray


def validation_size(n: int, gamma: float) -> int:
    """The number of validation examples among n for validation share gamma."""
    return round(gamma * n)


def make_splits(n: int, gamma: float, resplits: int, seed: int) -> list[Split]:
    """`resplits` distinct seeded splits of range(n) with validation share gamma."""
    n_val = validation_size(n, gamma)
    if not 1 <= n_val <= n - 1:
        raise ValueError(f"gamma {gamma} leaves an empty train or validation set of {n} examples")
    distinct = math.comb(n, n_val)
    if not 1 <= resplits <= distinct:
        raise ValueError(
            f"resplits must lie in 1..{distinct} ({n} examples with {n_val} for validation allow "
            f"only {distinct} distinct splits), got {resplits}"
        )
    rng = np.random.default_rng(seed)
    if distinct <= 4 * resplits:  # rejection would stall: draw ranks among all splits, unrank them
        chosen = rng.choice(distinct, size=resplits, replace=False)
        val_sets = [_combination(n, n_val, int(r)) for r in chosen]
    else:  # every draw is new with probability > 3/4: about 4/3 draws per split
        seen: set[tuple[int, ...]] = set()
        val_sets = []
        while len(val_sets) < resplits:
            val = tuple(sorted(rng.choice(n, size=n_val, replace=False).tolist()))
            if val not in seen:
                seen.add(val)
                val_sets.append(val)
    splits = []
    for val in val_sets:
        mask = np.zeros(n, dtype=bool)
        mask[list(val)] = True
        splits.append(Split(train=np.flatnonzero(~mask), val=np.flatnonzero(mask)))
    return splits


def _combination(n: int, k: int, rank: int) -> tuple[int, ...]:
    """The `rank`-th k-subset of range(n) in lexicographic order (O(n) binomials)."""
    chosen = []
    start = 0
    for remaining in range(k, 0, -1):
        for item in range(start, n):
            block = math.comb(n - item - 1, remaining - 1)
            if rank < block:
                chosen.append(item)
                start = item + 1
                break
            rank -= block
    return tuple(chosen)
