"""`fewshot train` and `fewshot pretrain`: a run from defaults, a config file and flags, or
continuing a checkpoint; both on the one trainer."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from fewshot.runtime.device import resolve_device
from fewshot.runtime.distributed import close_distributed, init_distributed
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import load_checkpoint
from fewshot.runtime.run_folder import RunFolder
from fewshot.runtime.settings import Command, SettingError, check_fields, setting
from fewshot.runtime.signals import Interrupted
from fewshot.training.run_settings import CHANGEABLE_ON_RESUME, RunSettings
from fewshot.training.run_setup import initial_weights
from fewshot.training.settings import (
    PretrainSettings,
    TrainSettings,
    checkpoint_settings,
    read_config_file,
)
from fewshot.training.trainer import Trainer


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

    stage = "train"  # which command's checkpoints --resume takes

    def __post_init__(self) -> None:
        check_fields(self)
        if self.resume and self.overwrite:
            raise SettingError("overwrite", "cannot be combined with --resume")

    @cached_property
    def checkpoint(self) -> dict | None:
        """The contents of --resume (read once)."""
        return load_checkpoint(self.resume) if self.resume else None

    @cached_property
    def resumed_settings(self) -> dict | None:
        """The settings of the run --resume continues (checked once)."""
        if not self.resume:
            return None
        return checkpoint_settings(self.checkpoint, self.resume, self.stage, "--resume")

    def sources(self) -> list[tuple[str, dict]]:
        """Layers under the flags: the resumed run's settings, the config file, and the
        resumed run's folder as --out."""
        layers = []
        if self.resume:
            layers.append((f"checkpoint {self.resume}", self.resumed_settings))
        if self.config:
            layers.append((f"config file {self.config}", read_config_file(self.config)))
        if self.resume:
            layers.append(("--resume", {"out": str(Path(self.resume).parent)}))
        return layers

    def check_resumable(self, settings: RunSettings) -> None:
        """Refuse a resumed run whose settings changed beyond how long, where and on what."""
        if not self.resume:
            return
        saved, mine = self.resumed_settings, settings.to_dict()
        diff = sorted(k for k in mine if k not in CHANGEABLE_ON_RESUME and saved[k] != mine[k])
        if diff:
            changes = ", ".join(f"{k} ({saved[k]!r} -> {mine[k]!r})" for k in diff)
            raise FewshotError(
                f"--resume {self.resume}: the run's settings differ in {changes}; only "
                f"{', '.join(CHANGEABLE_ON_RESUME)} may change when a run is resumed"
            )


@dataclass(frozen=True)
class PretrainRun(TrainRun):
    """How `fewshot pretrain` is started: from a config file, or continuing a checkpoint."""

    stage = "pretrain"


def run_train(run: TrainRun, settings: RunSettings) -> Path:
    """`fewshot train` or `fewshot pretrain`: lock the run folder, read the data, train."""
    run.check_resumable(settings)
    device = resolve_device(settings.device)
    dist = init_distributed(device)
    per_step, flag = (
        (settings.batch_size, "--batch-size")
        if isinstance(settings, PretrainSettings)
        else (settings.episodes_per_batch, "--episodes-per-batch")
    )
    if dist.world > 1 and per_step % dist.world:
        raise FewshotError(f"{flag} {per_step} must be divisible by the {dist.world} processes")
    try:
        run_dir = _train(run, settings, device, dist)
    except Interrupted:  # every rank stops at the same step
        close_distributed(dist, agreed=True)
        raise
    except BaseException:
        close_distributed(dist, agreed=False)
        raise
    close_distributed(dist, agreed=True)
    return run_dir


def _train(run: TrainRun, settings: RunSettings, device, dist) -> Path:
    """Train in the locked run folder (rank 0 holds the lock)."""
    device = dist.device(device)
    init = None if run.resume else initial_weights(settings)  # before the folder is made
    with contextlib.ExitStack() as stack:
        folder = None
        if dist.is_main:  # refuse a busy or occupied folder before reading any data
            # A run continued into another folder must not replace a run held there.
            own = run.resume and Path(settings.out).resolve() == Path(run.resume).parent.resolve()
            folder = stack.enter_context(RunFolder(settings.out, not own, run.overwrite))
        resume = (run.resume, run.checkpoint) if run.resume else None
        trainer = Trainer(settings, device, dist, resume=resume, init=init)
        if trainer.progress.epoch >= settings.epochs:
            epochs = settings.epochs
            print(f"the run already finished its {epochs} epochs (raise --epochs to go on)")
            return trainer.run_dir
        run_dir = trainer.fit(folder)
    if dist.is_main:
        print(f"checkpoints in {run_dir}: best.pt (best validation), last.pt")
    return run_dir


COMMANDS = [
    Command(
        ("train",),
        "episodic meta-training (resumable; see --resume)",
        (TrainRun, TrainSettings),
        run_train,
    ),
    Command(
        ("pretrain",),
        "supervised pretraining on every train class at once (Baseline, Baseline++, RFS), "
        "validated by nearest-centroid episodes (resumable; see --resume)",
        (PretrainRun, PretrainSettings),
        run_train,
    ),
]
