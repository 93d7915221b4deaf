"""`fewshot plot`: learning curves of one or more runs from their metrics.jsonl."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fewshot.errors import FewshotError
from fewshot.io import check_writable
from fewshot.settings import Command, check_fields, setting

# What `fewshot train` writes for every epoch and the plot needs.
METRICS = {"epoch", "train_loss", "val_acc", "val_ci95", "seconds"}


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The per-epoch rows of a run folder's metrics.jsonl (one-line errors naming the file)."""
    path = Path(run_dir) / "metrics.jsonl" if Path(run_dir).is_dir() else Path(run_dir)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise FewshotError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
            row["epoch"], row["train_loss"], row["val_acc"], row["val_ci95"], row["seconds"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise FewshotError(
                f"{path} line {number}: not a metrics row of fewshot train"
            ) from None
        rows.append(row)
    if not rows:
        raise FewshotError(f"{path} holds no finished epoch yet")
    return rows


@dataclass(frozen=True)
class PlotSettings:
    """`fewshot plot`: which runs, with which labels, into which image."""

    runs: list[str] = setting(help="run folders (or metrics.jsonl files)", positional=True)
    labels: list[str] | None = setting(None, help="one label per run (default: folder names)")
    out: str = setting("curves.png", help="image file to write (.png, .pdf, .svg)")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.labels is not None and len(self.labels) != len(self.runs):
            raise FewshotError(f"--labels: {len(self.labels)} labels for {len(self.runs)} runs")


def run_plot(settings: PlotSettings) -> Path:
    """Training loss and validation accuracy ± 95% CI per epoch, and accuracy against time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(settings.out)
    check_writable(out)
    labels = settings.labels or [Path(run).resolve().name for run in settings.runs]
    fig, (loss_ax, acc_ax, time_ax) = plt.subplots(1, 3, figsize=(14, 4))
    for run, label in zip(settings.runs, labels, strict=True):
        rows = read_metrics(run)
        epochs = [row["epoch"] for row in rows]
        acc = [row["val_acc"] for row in rows]
        ci = [row["val_ci95"] for row in rows]
        minutes, total = [], 0.0
        for row in rows:
            total += row["seconds"]
            minutes.append(total / 60)
        loss_ax.plot(epochs, [row["train_loss"] for row in rows], label=label)
        line = acc_ax.plot(epochs, acc, marker=".", label=label)[0]
        low, high = (
            [a - c for a, c in zip(acc, ci, strict=True)],
            [a + c for a, c in zip(acc, ci, strict=True)],
        )
        acc_ax.fill_between(epochs, low, high, color=line.get_color(), alpha=0.2)
        time_ax.plot(minutes, acc, marker=".", color=line.get_color(), label=label)
    loss_ax.set(xlabel="epoch", ylabel="training loss", title="training loss")
    acc_ax.set(xlabel="epoch", ylabel="validation accuracy (%)", title="validation ± 95% CI")
    time_ax.set(
        xlabel="training time (minutes)", ylabel="validation accuracy (%)", title="against time"
    )
    for ax in (loss_ax, acc_ax, time_ax):
        ax.grid(alpha=0.3)
    acc_ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    print(f"wrote {out}")
    return out


COMMANDS = [
    Command(
        ("plot",), "learning curves of runs from their metrics.jsonl", (PlotSettings,), run_plot
    )
]
