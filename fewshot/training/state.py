"""The resumable state a training run owns besides weights and optimizer: its progress and its
random streams. `fewshot.training.checkpoint` converts both to and from a checkpoint."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch


@dataclass
class Progress:
    """Where the run is: epoch and step, the best validation so far, the current epoch's
    running sums (so its metrics row covers all its steps) and one metrics row per epoch."""

    epoch: int = 0
    step: int = 0
    best_val: float = -1.0
    loss_sum: float = 0.0
    acc_sum: float = 0.0
    seconds: float = 0.0
    history: list[dict] = field(default_factory=list)

    def add_step(self, loss: float, acc: float, seconds: float) -> None:
        """Count one finished optimizer step."""
        self.step += 1
        self.loss_sum += loss
        self.acc_sum += acc
        self.seconds += seconds

    def next_epoch(self) -> None:
        """Start the next epoch's counters and sums."""
        self.epoch, self.step = self.epoch + 1, 0
        self.loss_sum, self.acc_sum, self.seconds = 0.0, 0.0, 0.0

    def to_dict(self) -> dict:
        """Plain values (checkpoint-safe)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict, steps_per_epoch: int) -> Progress:
        """The progress of a checkpoint; ValueError on counters that cannot be."""
        progress = cls(**values)
        counters = (progress.epoch, progress.step)
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counters):
            raise ValueError(f"epoch and step must be counts, got {counters}")
        if progress.step > steps_per_epoch:
            raise ValueError(f"step {progress.step} is past the {steps_per_epoch} of an epoch")
        for name in ("best_val", "loss_sum", "acc_sum", "seconds"):
            setattr(progress, name, float(getattr(progress, name)))
        progress.history = list(progress.history)
        return progress


class RandomStreams:
    """The random streams of one process: torch's global one (weights, dropout), and separate
    ones for re-splits and augmentation, so that turning EHG or augmentation on leaves the
    episodes unchanged."""

    def __init__(self, seed: int, rank: int = 0):
        self.resplit = torch.Generator().manual_seed(seed + 1)
        self.augment = torch.Generator().manual_seed(seed + 2 + rank)

    def state(self) -> dict:
        """Every stream's position."""
        return {
            "torch": torch.get_rng_state(),
            "resplit": self.resplit.get_state(),
            "augment": self.augment.get_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }

    def load(self, state: dict) -> None:
        """Continue every stream from a saved position."""
        torch.set_rng_state(state["torch"])
        self.resplit.set_state(state["resplit"])
        self.augment.set_state(state["augment"])
        if state["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
