"""`fewshot train`: a run from defaults, a config file and flags, or continuing a checkpoint."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from fewshot.config import TrainConfig, checkpoint_settings, read_config_file
from fewshot.device import resolve_device
from fewshot.distributed import init_distributed
from fewshot.io import load_checkpoint
from fewshot.run_folder import RunFolder
from fewshot.settings import Command, SettingError, check_fields, setting
from fewshot.train import Trainer


@dataclass(frozen=True)
class TrainRun:
    """How `fewshot train` is started: from a config file, or continuing a checkpoint."""

    config: str | None = setting(
        None, help="JSON config file (e.g. from models/); flags override it"
    )
    resume: str | None = setting(
        None, help="continue the run of this checkpoint (in its folder unless --out is given)"
    )
    overwrite: bool = setting(False, help="let a fresh run replace the run its --out folder holds")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.resume and self.overwrite:
            raise SettingError("overwrite", "cannot be combined with --resume")

    @cached_property
    def checkpoint(self) -> dict | None:
        """The contents of --resume (read once)."""
        return load_checkpoint(self.resume) if self.resume else None

    def sources(self) -> list[tuple[str, dict]]:
        """Layers under the flags: the resumed run's settings, the config file, and the
        resumed run's folder as --out."""
        layers = []
        if self.resume:
            layers.append(
                (f"checkpoint {self.resume}", checkpoint_settings(self.checkpoint, self.resume))
            )
        if self.config:
            layers.append((f"config file {self.config}", read_config_file(self.config)))
        if self.resume:
            layers.append(("--resume", {"out": str(Path(self.resume).parent)}))
        return layers


def run_train(run: TrainRun, config: TrainConfig) -> Path:
    """`fewshot train`: lock the run folder, read the data, train."""
    dist = init_distributed(resolve_device(config.device))
    with contextlib.ExitStack() as stack:
        folder = None
        if dist.is_main:  # refuse a busy or occupied folder before reading any data
            fresh = run.resume is None
            folder = stack.enter_context(RunFolder(config.out, fresh, run.overwrite))
        trainer = Trainer(config, resume=run.resume, checkpoint=run.checkpoint)
        if trainer.epoch >= config.epochs:
            print(f"the run already finished its {config.epochs} epochs (raise --epochs to go on)")
            return trainer.run_dir
        run_dir = trainer.fit(folder)
    if dist.is_main:
        print(f"checkpoints in {run_dir}: best.pt (best validation), last.pt")
    return run_dir


COMMANDS = [
    Command(
        ("train",),
        "episodic meta-training (resumable; see --resume)",
        (TrainRun, TrainConfig),
        run_train,
    )
]
