"""Driving the `fewshot` commands from a study: runs started, resumed or skipped, and
evaluations cached as their JSON, so that a study can be stopped and run again. The commands
run in the study's process, as typed on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fewshot.cli.main import main as fewshot_main
from fewshot.runtime.io import (
    atomic_write_json,
    atomic_write_text,
    file_sha256,
    load_checkpoint,
)


def fewshot(*args: str) -> None:
    """Run a fewshot command, stopping the study if it fails."""
    print("$ fewshot", " ".join(args), flush=True)
    if fewshot_main(list(args)) != 0:
        raise SystemExit(f"failed: fewshot {' '.join(args)}")


def config_overrides(data_root: str | None, **sizes: int | None) -> list[str]:
    """Flags replacing a config's settings: --data-root and every size given (None: keep the
    config's), e.g. episodes_per_epoch=4 -> --episodes-per-epoch 4."""
    flags = ["--data-root", data_root] if data_root else []
    for name, value in sizes.items():
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", str(value)]
    return flags


def finished(run: str, epochs: int) -> bool:
    """Whether the run folder's last.pt holds its final epoch."""
    last = Path(run) / "last.pt"
    return last.is_file() and load_checkpoint(last)["progress"]["epoch"] >= epochs


def train(command: str, config: str, run: str, epochs: int, *flags: str) -> None:
    """Start, resume or skip one run of `fewshot train` or `fewshot pretrain`."""
    if finished(run, epochs):
        return
    last = Path(run) / "last.pt"
    if last.is_file():
        fewshot(command, "--resume", str(last))
    else:
        fewshot(command, "--config", config, "--out", run, *flags)


def stale(cached: Path, checkpoint: str) -> bool:
    """Whether an evaluation's JSON names another checkpoint (or frozen backbone's weights)
    content than the file now at `checkpoint` (a file gone keeps its evaluation)."""
    record = json.loads(cached.read_text())
    recorded = record.get("checkpoint_sha256", record.get("backbone_weights_sha256"))
    return Path(checkpoint).is_file() and recorded not in (None, file_sha256(checkpoint))


def evaluate(
    checkpoint: str,
    flags: list[str],
    way: int,
    shot: int,
    episodes: int,
    out: Path,
    per_batch: int = 8,
    frozen: list[str] | None = None,
) -> torch.Tensor:
    """Per-episode accuracies of one model on `episodes` seeded test episodes (seed 0, the
    same whatever `per_batch`, the episodes per classifier call), cached in `out` (the JSON of
    `fewshot eval --per-episode`; made again when it tested another file than the checkpoint
    now there, e.g. a model shipped since). With `frozen` (the flags naming a backbone and its
    data set) the checkpoint is that frozen backbone's `--backbone-weights`."""
    model = [*frozen, "--backbone-weights"] if frozen else ["--checkpoint"]
    if not out.is_file() or stale(out, checkpoint):
        fewshot(
            "eval", *model, checkpoint, *flags, "--way", str(way), "--shot", str(shot),
            "--episodes", str(episodes), "--seed", "0", "--per-episode", "--out", str(out),
            "--episodes-per-batch", str(per_batch),
        )  # fmt: skip
    return torch.tensor(json.loads(out.read_text())["accuracies"])


def compare_seeds(
    a: list[str], b: list[str], way: int, shot: int, episodes: int, out: Path, flags: list[str]
) -> dict:
    """`fewshot compare-seeds` of two arms' last checkpoints on seeded episodes (cached)."""
    if not out.is_file():
        fewshot(
            "compare-seeds", "--a", *[f"{r}/last.pt" for r in a], "--b",
            *[f"{r}/last.pt" for r in b], *flags, "--way", str(way), "--shot", str(shot),
            "--episodes", str(episodes), "--seed", "0", "--out", str(out),
        )  # fmt: skip
    return json.loads(out.read_text())


def percent(mean: float, half: float, signed: bool = False) -> str:
    """'98.75 ± 0.12' (or '+0.31 ± 0.08') from fractions."""
    return f"{100 * mean:{'+' if signed else ''}.2f} ± {100 * half:.2f}"


# Omniglot's four test settings (way, shot), as the papers report them.
OMNIGLOT_SETTINGS = [(5, 1), (5, 5), (20, 1), (20, 5)]
SETTING_KEYS = [f"{way}-way {shot}-shot" for way, shot in OMNIGLOT_SETTINGS]


def markdown_header(*columns: str) -> list[str]:
    """A markdown table's header and rule lines."""
    return ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]


def markdown_row(*cells: str) -> str:
    """One markdown table row."""
    return "| " + " | ".join(cells) + " |"


def write_results(results: dict, markdown: str, folder: Path) -> None:
    """A study's results.json and results.md in its folder; the tables printed."""
    atomic_write_json(results, folder / "results.json")
    atomic_write_text(markdown, folder / "results.md")
    print(markdown)
