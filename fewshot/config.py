"""Training configuration: defaults, JSON config files, command-line overrides."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from fewshot.errors import FewshotError


@dataclass
class TrainConfig:
    """Everything that defines a training run (saved in every checkpoint)."""

    dataset: str = "omniglot"
    data_root: str | None = None
    train_split: str = "train"
    val_split: str = "val"
    backbone: str = "conv4"
    backbone_options: dict = field(default_factory=dict)
    head: str = "protonet"
    head_options: dict = field(default_factory=dict)
    eval_head_options: dict = field(default_factory=dict)
    way: int = 5
    shot: int = 1
    query: int = 15
    val_way: int | None = None
    val_shot: int | None = None
    val_query: int | None = None
    val_episodes: int = 500
    val_seed: int = 1234
    epochs: int = 60
    episodes_per_epoch: int = 1000
    episodes_per_batch: int = 2
    ehg_splits: int = 1
    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    # [[epoch, factor], ...]: from `epoch` on, lr = base lr * factor (MetaOptNet's schedule).
    lr_schedule: list = field(default_factory=lambda: [[20, 0.06], [40, 0.012], [50, 0.0024]])
    label_smoothing: float = 0.0
    augment: bool = False
    channels_last: bool = True
    amp: str = "off"  # off | bf16 | fp16: autocast for the backbone
    seed: int = 0
    device: str = "auto"
    out: str = "runs/default"

    def __post_init__(self) -> None:
        self.val_way = self.val_way or self.way
        self.val_shot = self.val_shot or self.shot
        self.val_query = self.val_query or self.query
        if self.optimizer not in ("sgd", "adam"):
            raise FewshotError(f"optimizer must be sgd or adam, not {self.optimizer!r}")
        if self.episodes_per_epoch < self.episodes_per_batch:
            raise FewshotError("--episodes-per-epoch must be at least --episodes-per-batch")
        if self.epochs < 1:
            raise FewshotError(f"--epochs must be >= 1, got {self.epochs}")

    def lr_factor(self, epoch: int) -> float:
        """Learning-rate multiplier in `epoch` (0-based) under the step schedule."""
        factor = 1.0
        for start, value in sorted(self.lr_schedule):
            if epoch >= start:
                factor = value
        return factor

    def to_dict(self) -> dict:
        """Plain dict (JSON- and checkpoint-safe)."""
        return asdict(self)


def read_config_file(path: str | Path) -> dict:
    """Read a JSON config file, refusing unknown keys with their name."""
    path = Path(path)
    try:
        values = json.loads(path.read_text())
    except FileNotFoundError:
        raise FewshotError(f"config file not found: {path}") from None
    except json.JSONDecodeError as e:
        raise FewshotError(f"config file {path} is not valid JSON: {e}") from None
    known = {f.name for f in fields(TrainConfig)}
    values.pop("_comment", None)
    values.pop("results", None)
    unknown = sorted(set(values) - known)
    if unknown:
        raise FewshotError(f"config file {path}: unknown keys {', '.join(unknown)}")
    return values


def make_config(config_file: str | None, overrides: dict) -> TrainConfig:
    """Defaults <- config file <- command-line values that were given (not None)."""
    values = read_config_file(config_file) if config_file else {}
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return TrainConfig(**values)
    except TypeError as e:
        raise FewshotError(f"bad configuration: {e}") from None
