"""The metrics row: what `fewshot train` logs for every epoch in metrics.jsonl, declared once
for the trainer that writes it and the commands that read it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from fewshot.runtime.errors import FewshotError


@dataclass(frozen=True)
class MetricsRow:
    """One finished epoch: its mean training loss and accuracy over all its steps, the
    validation accuracy ± 95% CI (percent), the seconds spent in steps and the precision."""

    epoch: int
    lr: float
    train_loss: float
    train_acc: float
    val_acc: float
    val_ci95: float
    seconds: float
    precision: str

    def to_dict(self) -> dict:
        """The JSON object of metrics.jsonl."""
        return asdict(self)


def metrics_row(
    epoch: int,
    lr: float,
    steps: int,
    loss_sum: float,
    acc_sum: float,
    seconds: float,
    val: tuple[float, float],
    precision: str,
) -> dict:
    """The row of an epoch (1-based) from its running sums over `steps` steps and (val, ci)."""
    steps = max(1, steps)
    row = MetricsRow(epoch, lr, loss_sum / steps, 100 * acc_sum / steps, *val, seconds, precision)
    return row.to_dict()


def _is_number(value: object) -> bool:
    """An int or float, not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def read_metrics(run: str | Path) -> list[MetricsRow]:
    """The rows of a run folder's metrics.jsonl (or of that file), one-line errors naming the
    file and line."""
    path = Path(run) / "metrics.jsonl" if Path(run).is_dir() else Path(run)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise FewshotError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            values = json.loads(line)
            row = MetricsRow(**{f.name: values[f.name] for f in fields(MetricsRow)})
        except (json.JSONDecodeError, KeyError, TypeError, RecursionError):
            problem = "not a metrics row of fewshot train"
            raise FewshotError(f"{path} line {number}: {problem}") from None
        numbers = [getattr(row, f.name) for f in fields(MetricsRow) if f.name != "precision"]
        if not all(_is_number(v) for v in numbers):
            raise FewshotError(f"{path} line {number}: a metrics value is not a number")
        rows.append(row)
    if not rows:
        raise FewshotError(f"{path} holds no finished epoch yet")
    return rows
