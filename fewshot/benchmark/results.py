"""Benchmark result files: one per (model, cell), with every episode's correct queries.

A result is the record `fewshot eval` writes (the model's identity, how it classified, the
episodes' SHA-256 and the data's fingerprint, the accuracy) with the model's display name, the
suite and cell, and the number of queries it got right in each episode. The zoo's stored
results are files of the same form, shipped in the checkout's `models/bench/SUITE/`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from fewshot.runtime.errors import FewshotError

# The zoo's stored results in a checkout: models/bench/SUITE/MODEL/CELL.json.
STORED = Path(__file__).resolve().parents[2] / "models" / "bench"
MAX_RESULT_BYTES = 1 << 24  # 2000 episodes take 10 KB; a larger file is not a result
KEYS = ("name", "suite", "cell", "episodes_sha256", "dataset_fingerprint", "correct", "queries")


# What names the model of a result: its weights, how it classified, at which precision.
MODEL_KEYS = ("checkpoint_sha256", "backbone", "backbone_options", "backbone_sha256")
MODEL_KEYS += ("backbone_weights_sha256", "normalization", "classifier", "classifier_options")
MODEL_KEYS += ("batch_norm", "inner_steps", "precision")


def model_key(record: dict) -> str:
    """The model a result's record was evaluated with, as one string (equal for equal models)."""
    return json.dumps({key: record.get(key) for key in MODEL_KEYS}, sort_keys=True)


def slug(name: str) -> str:
    """A display name as a folder name: lower-case words joined by '-'."""
    return re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-.") or "model"


@dataclass(frozen=True)
class CellResult:
    """One model's result in one cell, read from `path` (`stored`: one of the zoo's)."""

    name: str
    suite: str
    cell: str
    episodes_sha256: str
    dataset_fingerprint: str
    correct: torch.Tensor  # [episodes] queries right in each episode
    queries: int  # queries in each episode
    path: Path
    stored: bool
    record: dict

    def accuracies(self, episodes: int | None = None) -> torch.Tensor:
        """Per-episode accuracies (fractions, float64) of the first `episodes` (default all)."""
        return self.correct[:episodes].double() / self.queries


def correct_counts(accuracies: torch.Tensor, queries: int) -> list[int]:
    """Per-episode accuracies as the queries right in each episode (exact integers)."""
    return [round(value) for value in (accuracies.double() * queries).tolist()]


def read_result(path: Path, stored: bool) -> CellResult:
    """A result file, checked: the keys a result has, of their types."""
    try:
        if path.stat().st_size > MAX_RESULT_BYTES:
            raise ValueError(f"over {MAX_RESULT_BYTES >> 20} MiB")
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise FewshotError(f"result file {path} cannot be read: {e}") from None
    missing = [key for key in KEYS if not isinstance(record, dict) or key not in record]
    if missing:
        raise FewshotError(f'result file {path} is not a bench result: no "{missing[0]}"')
    correct, queries = record["correct"], record["queries"]
    if not isinstance(queries, int) or queries < 1:
        raise FewshotError(f'result file {path}: "queries" must be an integer >= 1')
    if not isinstance(correct, list) or not all(
        isinstance(c, int) and 0 <= c <= queries for c in correct
    ):
        raise FewshotError(f'result file {path}: "correct" must list integers 0..{queries}')
    text = {key: record[key] for key in KEYS[:5]}
    if not all(isinstance(value, str) for value in text.values()):
        raise FewshotError(f"result file {path}: {', '.join(KEYS[:5])} must be strings")
    return CellResult(
        **text,
        correct=torch.tensor(correct, dtype=torch.long),
        queries=queries,
        path=path,
        stored=stored,
        record=record,
    )


def read_results(folder: Path, suite: str, stored: bool) -> list[CellResult]:
    """Every result in `folder` (MODEL/CELL.json); a result of another suite is refused."""
    results = [read_result(path, stored) for path in sorted(folder.glob("*/*.json"))]
    for result in results:
        if result.suite != suite:
            raise FewshotError(
                f"result file {result.path} is of suite {result.suite}, not {suite}: "
                f"{folder} holds another suite's results"
            )
    return results
