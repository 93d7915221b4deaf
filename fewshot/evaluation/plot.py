"""`fewshot plot`: learning curves of one or more runs from their metrics.jsonl."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fewshot.evaluation.metrics import read_metrics
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_save_figure, prepare_output
from fewshot.runtime.settings import Command, SettingError, check_fields, setting

IMAGE_SUFFIXES = (".png", ".pdf", ".svg")


@dataclass(frozen=True)
class PlotSettings:
    """`fewshot plot`: which runs, with which labels, into which image."""

    runs: list[str] = setting(help="run folders (or metrics.jsonl files)", positional=True)
    labels: list[str] | None = setting(None, help="one label per run (default: folder names)")
    out: str = setting("curves.png", help="image file to write (.png, .pdf, .svg)")
    overwrite: bool = setting(False, help="replace an existing --out file")

    def __post_init__(self) -> None:
        check_fields(self)
        if Path(self.out).suffix.lower() not in IMAGE_SUFFIXES:
            raise SettingError("out", f"must end in {', '.join(IMAGE_SUFFIXES)}, got {self.out!r}")
        if self.labels is not None and len(self.labels) != len(self.runs):
            raise FewshotError(f"--labels: {len(self.labels)} labels for {len(self.runs)} runs")


def run_plot(settings: PlotSettings) -> Path:
    """Training loss and validation accuracy ± 95% CI per epoch, and accuracy against time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = prepare_output(settings.out, settings.overwrite)
    labels = settings.labels or [Path(run).resolve().name for run in settings.runs]
    fig, (loss_ax, acc_ax, time_ax) = plt.subplots(1, 3, figsize=(14, 4))
    for run, label in zip(settings.runs, labels, strict=True):
        rows = read_metrics(run)
        epochs = [row.epoch for row in rows]
        acc = [row.val_acc for row in rows]
        ci = [row.val_ci95 for row in rows]
        minutes, total = [], 0.0
        for row in rows:
            total += row.seconds
            minutes.append(total / 60)
        loss_ax.plot(epochs, [row.train_loss for row in rows], label=label)
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
    atomic_save_figure(fig, out, dpi=120)  # a failed write keeps the previous image
    plt.close(fig)
    print(f"wrote {out}")
    return out


COMMANDS = [
    Command(
        ("plot",), "learning curves of runs from their metrics.jsonl", (PlotSettings,), run_plot
    )
]
