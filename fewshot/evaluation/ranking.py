"""The statistics of a leaderboard: per cell, who is separable from the best; across cells,
mean ranks with the Friedman test and the Nemenyi critical difference (Demšar 2006).

A cell is one evaluation setting (e.g. 5-way 1-shot) in which every model saw the very same
seeded episodes, so models are compared per episode (paired). Within a cell each model is
compared with the best by the paired t-test of `stats.paired_ci`, the (models - 1) p-values
Holm-adjusted as one family; a paired bootstrap over the episodes gives each model an interval
of ranks. Across cells the models are ranked by their mean rank; the Friedman test and the
critical-difference diagram need at least `CD_MIN_CELLS` cells.

Means that differ by less than 1e-9 (a fraction of an episode far below any real difference)
count as equal: float sums of the same accuracies in another order differ in their last bits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from fewshot.evaluation.stats import ci95, paired_ci
from fewshot.runtime.io import atomic_save_figure
from fewshot.runtime.shapes import shape_fault

ALPHA = 0.05
BOOTSTRAP_RESAMPLES = 1000
CD_MIN_CELLS = 10  # Demšar 2006: Friedman/Nemenyi need enough data sets; fewer -> no diagram

_TIE = 1e-9  # means (fractions) closer than this are equal
# The bootstrap's working memory per chunk of resamples: indices, counts and rank comparisons.
_CHUNK_BYTES = 200 * 2**20


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (monotone, capped at 1), in the input order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for step, i in enumerate(order):
        # The step-th smallest p is multiplied by the hypotheses still standing; the running
        # maximum keeps a larger raw p from getting a smaller adjusted one.
        running = max(running, min(1.0, (m - step) * p_values[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class Standing:
    """One model's line in one cell: accuracy, its paired difference to the best, its ranks."""

    name: str
    accuracy: float  # mean, percent
    ci95: float  # half-width, percent
    difference: float | None  # model - best, percent (None for the best itself)
    difference_ci95: float | None  # paired CI half-width, percent
    p_value: float | None  # raw paired t-test p
    p_holm: float | None  # Holm-adjusted over the cell's (models - 1) comparisons with the best
    tied: bool  # the best, or not separable from it (p_holm >= alpha)
    rank: float  # by mean accuracy, 1 = best; equal means share the average rank
    rank_low: int  # 95% rank interval of the paired bootstrap
    rank_high: int


@dataclass(frozen=True)
class CellRanking:
    """The standings of one cell, sorted by rank."""

    cell: str
    episodes: int
    best: str
    standings: list[Standing]


@dataclass(frozen=True)
class AcrossCells:
    """Mean ranks over cells, with the Friedman test and the Nemenyi critical difference."""

    models: list[str]  # the models present in every cell, by mean rank
    mean_ranks: dict[str, float]
    cells: int
    friedman_p: float | None
    critical_difference: float | None
    note: str


def rank_cell(
    cell: str,
    accuracies: dict[str, torch.Tensor],
    seed: int = 0,
    resamples: int = BOOTSTRAP_RESAMPLES,
    alpha: float = ALPHA,
) -> CellRanking:
    """Rank the models of one cell (per-episode accuracies in [0, 1], paired by episode).

    The best has the highest mean; equal means go to the first name in sorted order. The
    bootstrap resamples the episodes with `torch.randint(n, (resamples, n),
    generator=torch.Generator().manual_seed(seed))` (drawn in chunks of rows for large cells,
    which the CPU generator fills in the same order), the same indices for every model; on each
    resample a model's rank is 1 + the number of models with a higher mean (ties share the
    lowest rank number). Its interval is [floor(2.5th), ceil(97.5th)] percentile of its ranks
    (linear interpolation, as numpy.percentile).
    """
    names, values = _check_cell(accuracies)
    if resamples < 1:
        raise ValueError(f"the bootstrap needs at least one resample, got {resamples}")
    means = values.mean(dim=1)
    top = float(means.max())
    best = min(name for name, mean in zip(names, means.tolist(), strict=True) if mean >= top - _TIE)
    ranks = _average_ranks(means, _TIE)
    low, high = _bootstrap_rank_intervals(values, seed, resamples)

    b = names.index(best)
    others = [i for i in range(len(names)) if i != b]
    differences = {i: paired_ci(values[b], values[i]) for i in others}  # model - best
    p_holm = dict(zip(others, holm([differences[i].p_value for i in others]), strict=True))
    standings = []
    for i, name in enumerate(names):
        d = differences.get(i)
        standings.append(
            Standing(
                name=name,
                accuracy=100 * float(means[i]),
                ci95=100 * ci95(values[i]),
                difference=None if d is None else 100 * d.mean,
                difference_ci95=None if d is None else 100 * d.ci95,
                p_value=None if d is None else d.p_value,
                p_holm=p_holm.get(i),
                tied=d is None or p_holm[i] >= alpha,
                rank=float(ranks[i]),
                rank_low=int(low[i]),
                rank_high=int(high[i]),
            )
        )
    standings.sort(key=lambda s: (s.rank, s.name))
    return CellRanking(cell, values.shape[1], best, standings)


def across_cells(rankings: list[CellRanking], alpha: float = ALPHA) -> AcrossCells:
    """Mean ranks of the models present in every cell (average ranks of the mean accuracies
    within each cell), the Friedman test and the Nemenyi critical difference where there are at
    least `CD_MIN_CELLS` cells."""
    if not rankings:
        raise ValueError("a ranking across cells needs at least one cell")
    accuracy = [{s.name: s.accuracy for s in r.standings} for r in rankings]
    every = set.union(*(set(a) for a in accuracy))
    common = sorted(set.intersection(*(set(a) for a in accuracy)))
    cells, k = len(rankings), len(common)
    # [cells, models] of percent accuracies; the ranks are recomputed on the common models only.
    table = torch.tensor([[a[m] for m in common] for a in accuracy], dtype=torch.float64)
    ranks = torch.stack([_average_ranks(row, 100 * _TIE) for row in table]).mean(dim=0)
    mean_ranks = dict(
        sorted(zip(common, ranks.tolist(), strict=True), key=lambda item: (item[1], item[0]))
    )

    friedman_p = critical_difference = None
    if cells < CD_MIN_CELLS:
        note = (
            f"{cells} cell{'s' if cells > 1 else ''}: too few for a critical-difference diagram "
            f"(it needs at least {CD_MIN_CELLS})"
        )
    elif k < 2:
        note = f"{cells} cells but fewer than 2 models in every cell: nothing to rank across them"
    else:
        from scipy import stats  # here: scipy.stats takes half a second to import

        q = float(stats.studentized_range.ppf(1 - alpha, k, math.inf)) / math.sqrt(2)
        critical_difference = q * math.sqrt(k * (k + 1) / (6 * cells))
        cd = f"Nemenyi CD = {critical_difference:.3f} at alpha {alpha}"
        if k < 3:
            note = f"{cells} cells, 2 models: {cd} (the Friedman test needs at least 3 models)"
        else:
            friedman_p = float(stats.friedmanchisquare(*table.T.numpy()).pvalue)
            verdict = "the mean ranks differ" if friedman_p < alpha else "no difference shown"
            note = f"{cells} cells, {k} models: Friedman p = {friedman_p:.3g} ({verdict}), {cd}"
    missing = len(every) - k
    if missing:
        note += f"; {missing} model{'s' if missing > 1 else ''} missing from some cells left out"
    return AcrossCells(list(mean_ranks), mean_ranks, cells, friedman_p, critical_difference, note)


def plot_differences(rankings: list[CellRanking], path: Path) -> None:
    """Per cell (one subplot each), every model's paired difference to the best with its 95% CI
    (error bars), tied models marked."""
    if not rankings:
        raise ValueError("no cells to plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    columns = min(3, len(rankings))
    rows = math.ceil(len(rankings) / columns)
    most = max(len(r.standings) for r in rankings)
    fig, axes = plt.subplots(
        rows, columns, figsize=(5 * columns, rows * (1 + 0.35 * most)), squeeze=False
    )
    for ax, ranking in zip(axes.flat, rankings, strict=False):
        # The best on top: y counts down the standings.
        for y, s in enumerate(reversed(ranking.standings)):
            color = "tab:blue" if s.tied else "tab:red"
            ax.errorbar(
                s.difference or 0.0,
                y,
                xerr=s.difference_ci95 or 0.0,
                fmt="o",
                color=color,
                markerfacecolor=color if s.tied else "white",
                capsize=3,
            )
        ax.set_yticks(range(len(ranking.standings)), [s.name for s in reversed(ranking.standings)])
        ax.axvline(0, color="grey", linewidth=0.8)
        ax.set(
            title=f"{ranking.cell} ({ranking.episodes} episodes)",
            xlabel="difference to the best (percentage points)",
        )
        ax.grid(axis="x", alpha=0.3)
    for ax in axes.flat[len(rankings) :]:
        ax.axis("off")
    handles = [
        Line2D([], [], marker="o", color="tab:blue", linestyle="", label="tied with the best"),
        Line2D(
            [],
            [],
            marker="o",
            color="tab:red",
            markerfacecolor="white",
            linestyle="",
            label="worse than the best (Holm-adjusted paired t-test)",
        ),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize="small")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    atomic_save_figure(fig, path, dpi=120)
    plt.close(fig)


def plot_critical_difference(summary: AcrossCells, path: Path) -> None:
    """A critical-difference diagram (Demšar): mean ranks on an axis, the CD bar, and lines
    joining models within CD of each other; ValueError if summary.critical_difference is None."""
    cd = summary.critical_difference
    if cd is None:
        raise ValueError(f"no critical difference to draw: {summary.note}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = len(summary.models)
    ranks = [summary.mean_ranks[m] for m in summary.models]  # ascending
    left = (k + 1) // 2  # the better half is labelled on the left, the rest on the right
    step = 0.4
    fig, ax = plt.subplots(figsize=(8, 1.6 + 0.25 * k))
    fig.subplots_adjust(left=0.22, right=0.78, top=0.95, bottom=0.05)
    ax.set_xlim(1, k)
    ax.set_ylim(-(left + 1) * step - 0.2, 1.0)
    ax.axis("off")
    ax.hlines(0, 1, k, color="black")
    for tick in range(1, k + 1):
        ax.vlines(tick, 0, 0.1, color="black")
        ax.text(tick, 0.15, str(tick), ha="center", va="bottom", fontsize="small")
    ax.hlines(0.7, 1, 1 + cd, color="black", linewidth=2)
    ax.text(1 + cd / 2, 0.75, f"CD = {cd:.2f}", ha="center", va="bottom", fontsize="small")
    for i, (name, rank) in enumerate(zip(summary.models, ranks, strict=True)):
        on_left = i < left
        depth = -(i + 1 if on_left else k - i) * step
        end = 1 - 0.05 if on_left else k + 0.05
        ax.plot([rank, rank, end], [0, depth, depth], color="black", linewidth=0.8, clip_on=False)
        ax.text(
            end - 0.05 if on_left else end + 0.05,
            depth,
            f"{name} ({rank:.2f})",
            ha="right" if on_left else "left",
            va="center",
            fontsize="small",
        )
    # Cliques: the maximal runs of models whose mean ranks lie within CD of each other.
    cliques: list[tuple[int, int]] = []
    for i in range(k):
        j = max(j for j in range(i, k) if ranks[j] - ranks[i] <= cd)
        if j > i and not any(end >= j for _, end in cliques):
            cliques.append((i, j))
    for c, (i, j) in enumerate(cliques):
        y = -0.1 - 0.08 * c
        ax.hlines(y, ranks[i] - 0.03, ranks[j] + 0.03, color="black", linewidth=3)
    atomic_save_figure(fig, path, dpi=120)
    plt.close(fig)


def _check_cell(accuracies: dict[str, torch.Tensor]) -> tuple[list[str], torch.Tensor]:
    """The names in sorted order and their accuracies as one [models, episodes] float64 tensor;
    ValueError naming the model whose accuracies cannot be paired with the others'."""
    if not accuracies:
        raise ValueError("a cell needs at least one model")
    names = sorted(accuracies)
    first = names[0]
    for name in names:
        values = accuracies[name]
        fault = shape_fault(values.shape, ("episodes",), at_least={"episodes": 2})
        if fault:
            raise ValueError(f"model {name!r}: accuracies {fault}: one value per episode")
        if len(values) != len(accuracies[first]):
            raise ValueError(
                f"model {name!r} has {len(values)} episodes, {first!r} has "
                f"{len(accuracies[first])}: every model of a cell must see the same episodes"
            )
        # Also catches NaN, and percentages given where fractions are expected.
        if not bool(((values >= 0) & (values <= 1)).all()):
            raise ValueError(
                f"model {name!r}: accuracies must be fractions in [0, 1] per episode, got "
                f"values from {float(values.min()):g} to {float(values.max()):g}"
            )
    return names, torch.stack([accuracies[name].double().cpu() for name in names])


def _average_ranks(values: torch.Tensor, tie: float) -> torch.Tensor:
    """Ranks of 1-D `values`, 1 = highest; values within `tie` share the average rank."""
    higher = (values.unsqueeze(0) > values.unsqueeze(1) + tie).sum(dim=1)
    equal = ((values.unsqueeze(0) - values.unsqueeze(1)).abs() <= tie).sum(dim=1)
    return 1 + higher.double() + (equal.double() - 1) / 2


def _bootstrap_rank_intervals(
    values: torch.Tensor, seed: int, resamples: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each model's 95% rank interval over paired bootstrap resamples of the episodes."""
    k, n = values.shape
    generator = torch.Generator().manual_seed(seed)
    rows = max(1, _CHUNK_BYTES // (24 * n + k * k))
    ranks = []
    for start in range(0, resamples, rows):
        indices = torch.randint(n, (min(rows, resamples - start), n), generator=generator)
        # A resample's means as (how often each episode was drawn) @ accuracies: no
        # [models, resamples, n] gather.
        counts = torch.zeros(indices.shape, dtype=torch.float64)
        counts.scatter_add_(1, indices, torch.ones_like(counts))
        means = counts @ values.T / n  # [chunk, models]
        higher = means.unsqueeze(1) > means.unsqueeze(2) + _TIE  # [chunk, model, other]
        ranks.append(1 + higher.sum(dim=2).double())
    all_ranks = torch.cat(ranks)
    bounds = torch.quantile(all_ranks, torch.tensor([0.025, 0.975], dtype=torch.float64), dim=0)
    return bounds[0].floor().long(), bounds[1].ceil().long()
