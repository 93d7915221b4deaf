"""Building a Trainer in tests as `fewshot train` does: device resolved, checkpoint read once."""

from __future__ import annotations

from fewshot.runtime.device import resolve_device
from fewshot.runtime.io import load_checkpoint
from fewshot.training.settings import TrainSettings
from fewshot.training.trainer import Trainer


def make_trainer(settings: TrainSettings, resume: str | None = None, data=None) -> Trainer:
    """A Trainer on the settings' device, continuing checkpoint `resume` if given."""
    checkpoint = (resume, load_checkpoint(resume)) if resume else None
    return Trainer(settings, resolve_device(settings.device), data=data, resume=checkpoint)
