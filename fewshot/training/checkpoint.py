"""What a training checkpoint holds, and how a run continues from one exactly.

A checkpoint is taken at a step boundary (or between an epoch's training and its validation):
the model, optimizer and AMP scaler, epoch and step, the epoch's running sums, the metrics
history, and every random stream (under torchrun, every rank's). Restoring all of it makes the
resumed run bit-identical to an uninterrupted one on a CPU.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

import torch

from fewshot.config import RESUMABLE_KEYS, checkpoint_settings
from fewshot.errors import FewshotError, summary

if TYPE_CHECKING:
    from fewshot.train import Trainer

# What a checkpoint needs to continue a run (an imported or evaluation-only one lacks them).
RESUME_KEYS = ("model", "optimizer", "epoch", "step", "best_val", "sampler", "rng")


def rng_state(trainer: Trainer) -> dict:
    """This process's random streams."""
    return {
        "torch": torch.get_rng_state(),
        "split": trainer.split_rng.get_state(),
        "augment": trainer.augment_rng.get_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def checkpoint_state(trainer: Trainer) -> dict:
    """Everything needed to evaluate the model or continue the run exactly."""
    state = {
        "config": trainer.model_config,
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "scaler": trainer.scaler.state_dict(),
        "epoch": trainer.epoch,
        "step": trainer.step,
        "best_val": trainer.best_val,
        "progress": {
            "loss_sum": trainer.loss_sum,
            "acc_sum": trainer.acc_sum,
            "seconds": trainer.seconds,
        },
        "history": trainer.history,
        "sampler": trainer.sampler.state_dict(),
        "rng": rng_state(trainer),
    }
    if trainer.rank_rngs is not None:
        state["rank_rngs"] = trainer.rank_rngs
    return state


def restore(trainer: Trainer, ckpt: dict, path: str) -> None:
    """Continue the run of checkpoint `path` in `trainer`, refusing other settings, a checkpoint
    that cannot continue a run, and damaged states (one line each)."""
    saved = checkpoint_settings(ckpt, path)
    mine = trainer.config.to_dict()
    diff = sorted(k for k in mine if k not in RESUMABLE_KEYS and saved.get(k) != mine[k])
    if diff:
        changes = ", ".join(f"{k} ({saved.get(k)!r} -> {mine[k]!r})" for k in diff)
        raise FewshotError(
            f"--resume {path}: the run's settings differ in {changes}; only "
            f"{', '.join(RESUMABLE_KEYS)} may change when a run is resumed"
        )
    missing = [key for key in RESUME_KEYS if key not in ckpt]
    if missing:
        raise FewshotError(
            f"--resume {path}: cannot continue from it: it has no {', '.join(missing)} "
            "(an evaluation-only checkpoint?)"
        )
    try:
        _load_state(trainer, ckpt)
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as e:
        raise FewshotError(
            f"--resume {path}: the checkpoint is damaged ({type(e).__name__}: {summary(e)})"
        ) from None


def _load_state(trainer: Trainer, ckpt: dict) -> None:
    """Put every saved state in place (raising whatever torch raises on damaged states)."""
    trainer.model.load_state_dict(ckpt["model"])
    trainer.optimizer.load_state_dict(ckpt["optimizer"])
    if "scaler" in ckpt:  # checkpoints from before AMP have none (and ran without it)
        trainer.scaler.load_state_dict(ckpt["scaler"])
    counters = (ckpt["epoch"], ckpt["step"])
    if not all(isinstance(c, int) and c >= 0 for c in counters):
        raise ValueError(f"epoch and step must be counts, got {counters}")
    if counters[1] > trainer.steps_per_epoch:
        raise ValueError(f"step {counters[1]} is past the {trainer.steps_per_epoch} of an epoch")
    trainer.epoch, trainer.step = counters
    trainer.best_val = float(ckpt["best_val"])
    progress = ckpt.get("progress", {})
    trainer.loss_sum = float(progress.get("loss_sum", 0.0))
    trainer.acc_sum = float(progress.get("acc_sum", 0.0))
    trainer.seconds = float(progress.get("seconds", 0.0))
    trainer.history = list(ckpt.get("history") or _logged_history(trainer))
    trainer.sampler.load_state_dict(ckpt["sampler"])
    # Each rank takes its own streams when the checkpoint has them (saved by as many
    # processes); otherwise (another process count) rank 0's.
    rank_rngs = ckpt.get("rank_rngs")
    same_world = rank_rngs is not None and len(rank_rngs) == trainer.dist.world
    rng = rank_rngs[trainer.dist.rank] if same_world else ckpt["rng"]
    torch.set_rng_state(rng["torch"])
    trainer.split_rng.set_state(rng["split"])
    trainer.augment_rng.set_state(rng["augment"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def _logged_history(trainer: Trainer) -> list[dict]:
    """For checkpoints older than the saved history: the rows already in metrics.jsonl."""
    path = trainer.run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [row for row in rows if row.get("epoch", math.inf) <= trainer.epoch]
