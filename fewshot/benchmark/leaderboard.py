"""The leaderboard of a suite: per cell, every model ranked against the best with honest
statistics; across cells, mean ranks. Written as Markdown, CSV, JSON and figures.

Only results on the very same episodes are ranked together: every result of a cell must name
the same episodes' SHA-256 and data fingerprint, or the leaderboard is refused in one line that
says what differs.
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass
from pathlib import Path

from fewshot.benchmark.results import CellResult, model_key
from fewshot.benchmark.suites import Suite
from fewshot.evaluation.ranking import (
    AcrossCells,
    CellRanking,
    across_cells,
    plot_critical_difference,
    plot_differences,
    rank_cell,
)
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_write_json, atomic_write_text

FILES = ("leaderboard.md", "leaderboard.csv", "leaderboard.json", "differences.png")


@dataclass(frozen=True)
class Leaderboard:
    """A suite's leaderboard: its cells' rankings, the ranking across cells, and notes (what
    was left out, and why)."""

    suite: str
    episodes: dict[str, int]  # cell: the episodes ranked
    cells: list[CellRanking]
    across: AcrossCells
    notes: list[str]
    stored: list[str]  # the models whose results are all the zoo's stored ones

    def markdown(self, heading: str = "#") -> str:
        """The leaderboard as Markdown under a `heading` of that level: a table per cell, then
        the mean ranks."""
        lines = [f"{heading} Leaderboard: {self.suite}", ""]
        lines += [
            "Accuracy ± 95% CI (%) over each cell's episodes; the difference to the cell's best, "
            "paired by episode, ± its 95% CI, with the paired t-test's p-value Holm-corrected "
            "over the cell's comparisons; = marks the models not separable from the best "
            "(p >= 0.05); the rank's 95% interval is from a paired bootstrap over episodes. "
            "Models in bold were evaluated here, the others are the zoo's stored results.",
            "",
        ]
        for ranking in self.cells:
            lines += [f"{heading}# {ranking.cell} ({ranking.episodes} episodes)", ""]
            lines += [
                "| rank | model | accuracy | − best | p (Holm) | rank 95% |",
                "|---|---|---|---|---|---|",
            ]
            for s in ranking.standings:
                mark = "= " if s.tied else ""
                name = s.name if s.name in self.stored else f"**{s.name}**"
                diff = (
                    "best"
                    if s.difference is None
                    else f"{s.difference:+.2f} ± {s.difference_ci95:.2f}"
                )
                p = "" if s.p_holm is None else f"{s.p_holm:.3g}" if s.p_holm else "< 1e-300"
                lines.append(
                    f"| {mark}{s.rank:g} | {name} | {s.accuracy:.2f} ± {s.ci95:.2f} "
                    f"| {diff} | {p} | {s.rank_low}-{s.rank_high} |"
                )
            lines.append("")
        lines += [f"{heading}# Across cells", ""]
        if self.across.models:
            lines += ["| model | mean rank |", "|---|---|"]
            lines += [
                f"| {name} | {self.across.mean_ranks[name]:.2f} |" for name in self.across.models
            ]
            lines.append("")
        lines.append(self.across.note)
        lines += ["", *[f"- {note}" for note in self.notes]] if self.notes else []
        return "\n".join(lines).rstrip() + "\n"

    def csv(self) -> str:
        """One row per (cell, model)."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        header = ["cell", "episodes", "model", "accuracy", "ci95", "difference"]
        header += ["difference_ci95", "p_value", "p_holm", "tied", "rank", "rank_low", "rank_high"]
        writer.writerow(header)
        for ranking in self.cells:
            for s in ranking.standings:
                row = [ranking.cell, ranking.episodes, s.name, s.accuracy, s.ci95, s.difference]
                row += [s.difference_ci95, s.p_value, s.p_holm, s.tied, s.rank, s.rank_low]
                writer.writerow([*row, s.rank_high])
        return buffer.getvalue()

    def to_json(self) -> dict:
        """Everything in the leaderboard, as JSON."""
        return {
            "suite": self.suite,
            "cells": [asdict(ranking) for ranking in self.cells],
            "across": asdict(self.across),
            "notes": self.notes,
            "stored": self.stored,
        }


def check_pairing(cell: str, results: list[CellResult]) -> None:
    """Refuse to rank results of one cell that are not on the very same episodes and data, or
    that share a display name."""
    named: dict[str, CellResult] = {}
    for result in results:
        twin = named.setdefault(result.name, result)
        if twin is not result:
            raise FewshotError(
                f"two models are named {result.name!r} in cell {cell}: {twin.path} and "
                f"{result.path} (give one another name with --name)"
            )
    first = results[0]
    for other in results[1:]:
        for what, one, two in (
            ("episodes (episodes_sha256", first.episodes_sha256, other.episodes_sha256),
            ("data (dataset_fingerprint", first.dataset_fingerprint, other.dataset_fingerprint),
        ):
            if one != two:
                raise FewshotError(
                    f"cell {cell}: {first.path} and {other.path} were evaluated on other "
                    f"{what} {one[:12]} and {two[:12]}): results on different episodes are "
                    "never ranked together"
                )


def check_names(results: list[CellResult]) -> None:
    """Refuse a name whose results (not the zoo's: a zoo row is its method's model of each
    cell) are of two models: a name's row is one model."""
    models: dict[str, CellResult] = {}
    for result in results:
        if result.stored:
            continue
        first = models.setdefault(result.name, result)
        if model_key(first.record) != model_key(result.record):
            raise FewshotError(
                f"{result.name!r} names two models: {first.path} and {result.path} were "
                "evaluated with other weights or settings (bench the other under another --name, "
                "or again with --overwrite)"
            )


def same_models(results: list[CellResult]) -> list[str]:
    """Notes on rows that are one model under two names (a user's checkpoint that is a zoo
    model, say): where every cell of one is the other's."""
    keys: dict[str, set[str]] = {}
    for result in results:
        keys.setdefault(result.name, set()).add(model_key(result.record))
    names = sorted(keys)
    return [
        f"{a} and {b} are the same model (the same weights, classifier and precision)"
        for i, a in enumerate(names)
        for b in names[i + 1 :]
        if keys[a] <= keys[b] or keys[b] <= keys[a]
    ]


def build_leaderboard(
    suite: Suite, results: list[CellResult], limit: int | None = None, seed: int = 0
) -> Leaderboard:
    """Rank every cell's results (the first `limit` episodes of each where given; a result
    with fewer episodes than ranked is left out, with a note)."""
    check_names(results)
    rankings, episodes = [], {}
    notes: list[str] = []
    short: dict[tuple[str, int, int], list[str]] = {}  # (model, has, ranked): its cells
    for cell in suite.cells:
        here = [r for r in results if r.cell == cell.name]
        if not here:
            notes.append(f"{cell.name}: no results")
            continue
        check_pairing(cell.name, here)
        count = min(limit or cell.episodes, cell.episodes)
        complete = [r for r in here if len(r.correct) >= count]
        for r in here:
            if r not in complete:
                short.setdefault((r.name, len(r.correct), count), []).append(cell.name)
        if not complete:
            continue
        accuracies = {r.name: r.accuracies(count) for r in complete}
        rankings.append(rank_cell(cell.name, accuracies, seed=seed))
        episodes[cell.name] = count
    notes += [
        f"{name} left out of {_cells(cells, suite)}: {has} of the {count} episodes ranked "
        f"(--limit {has} ranks it on the first {has})"
        for (name, has, count), cells in short.items()
    ]
    notes += same_models(results)
    if not rankings:
        raise FewshotError(f"suite {suite.id}: no results to rank")
    fresh = {r.name for r in results if not r.stored}
    stored = sorted({r.name for r in results if r.stored} - fresh)
    return Leaderboard(suite.id, episodes, rankings, across_cells(rankings), notes, stored)


def _cells(names: list[str], suite: Suite) -> str:
    """Cells as a note names them: 'every cell', or their names."""
    return "every cell" if len(names) == len(suite.cells) else ", ".join(names)


def write_leaderboard(board: Leaderboard, folder: Path) -> list[Path]:
    """Write the leaderboard into `folder` (FILES, and cd.png where the cells allow a
    critical-difference diagram); return the files written."""
    paths = [folder / name for name in FILES]
    atomic_write_text(board.markdown(), paths[0])
    atomic_write_text(board.csv(), paths[1])
    atomic_write_json(board.to_json(), paths[2])
    plot_differences(board.cells, paths[3])
    if board.across.critical_difference is not None:
        paths.append(folder / "cd.png")
        plot_critical_difference(board.across, paths[-1])
    return paths
