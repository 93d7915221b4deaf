"""What a training run starts from: its data, optimizer and initial weights, and whether it fits."""

from __future__ import annotations

from pathlib import Path

import torch

from fewshot.datasets import FOLDER, check_split, load_split
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sources import join_splits
from fewshot.methods import Method
from fewshot.runtime.memory import MemoryTerm, check_memory
from fewshot.training.checkpoint import InitWeights, backbone_weights, init_weights
from fewshot.training.run_settings import RunSettings
from fewshot.training.settings import TrainSettings


def base_lrs(settings: RunSettings) -> list[float]:
    """The base learning rate of each parameter group: --lr, then --backbone-lr if given."""
    return [settings.lr] if settings.backbone_lr is None else [settings.lr, settings.backbone_lr]


def make_optimizer(settings: RunSettings, method: Method) -> torch.optim.Optimizer:
    """SGD with Nesterov momentum (the paper's setting) or Adam, over one parameter group, or
    the head's and the backbone's apart (--backbone-lr), or the head's alone (--freeze-backbone)."""
    if settings.freeze_backbone:
        groups = [{"params": method.head_parameters()}]
    elif settings.backbone_lr is not None:
        groups = [{"params": method.head_parameters()}, {"params": method.backbone.parameters()}]
    else:
        groups = [{"params": method.parameters()}]
    for group, lr in zip(groups, base_lrs(settings), strict=True):
        group["lr"] = lr
    if settings.optimizer == "adam":
        decay = settings.weight_decay
        return torch.optim.Adam(groups, settings.lr, weight_decay=decay)
    return torch.optim.SGD(
        groups,
        settings.lr,
        momentum=settings.momentum,
        nesterov=settings.momentum > 0,
        weight_decay=settings.weight_decay,
    )


def initial_weights(settings: RunSettings) -> InitWeights | None:
    """The weights a run starts from (--init or --backbone-weights), checked; None without."""
    if settings.backbone_weights:
        return InitWeights("backbone", backbone_weights(settings, settings.geometry))
    if not (isinstance(settings, TrainSettings) and settings.init):
        return None
    return init_weights(settings.init, settings, settings.geometry)


def read_data(settings: RunSettings) -> tuple[ImageSplit, ImageSplit]:
    """The train and validation splits of a run, all checked before any image is decoded;
    the training split joined with those of --extra-data (fewshot.datasets.sources)."""
    needs = settings.split_needs()
    (train_split, per_class), _ = needs
    for split, count in needs:
        check_split(settings.dataset, split, settings.data_root, count)
    for source in settings.extra_sources:
        check_split(source.dataset, train_split, source.data_root, per_class)
    train, val = (
        load_split(
            settings.dataset,
            split,
            settings.data_root,
            resize=settings.resize,
            channels=settings.channels,
            per_class=count,
        )
        for split, count in needs
    )
    if not settings.extra_sources:
        return train, val
    channels, side = settings.geometry
    named = [(source_name(settings.dataset, settings.data_root), train)]
    for source in settings.extra_sources:
        folder = source.dataset == FOLDER  # read at the run's geometry
        extra = load_split(
            source.dataset,
            train_split,
            source.data_root,
            resize=side if folder else None,
            channels=channels if folder else None,
            per_class=per_class,
        )
        named.append((source_name(source.dataset, source.data_root), extra))
    return join_splits(named), val


def source_name(dataset: str, data_root: str | None) -> str:
    """A data set's name in a joined split: its own, or a folder's name."""
    return f"folder:{Path(data_root).name}" if dataset == FOLDER and data_root else dataset


def check_model_size(build, config: dict, device: torch.device) -> None:
    """Refuse, before any weight is allocated, a model whose parameters with their gradients
    and the optimizer's two moments cannot fit (built on the meta device to count them)."""
    with torch.device("meta"):
        count = sum(p.numel() for p in build(config).parameters())
    what = f"the model's {count} parameters, their gradients and the optimizer's state"
    check_memory(
        [MemoryTerm(16 * count, what, "--method-options or --backbone-options")],
        device,
        "the model",
    )
