"""`RunSettings`: what every training run shares (data, backbone, validation, optimizer, ...)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from pathlib import Path

import torch

from fewshot.backbones import BACKBONES, backbone_names, build_backbone, library_name
from fewshot.backbones.library import check_library_name, model_input
from fewshot.datasets import (
    FOLDER,
    GEOMETRY,
    channels_setting,
    check_data_options,
    dataset_geometry,
    dataset_names,
    resize_setting,
)
from fewshot.datasets.augment import PAPER_PADDING
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sampler import EpisodeShape
from fewshot.datasets.sources import Source
from fewshot.datasets.varied import VariedShape
from fewshot.runtime.device import device_setting
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.precision import amp_setting
from fewshot.runtime.settings import (
    SettingError,
    check_options,
    refuse_unused,
    seed_setting,
    setting,
)
from fewshot.training.compiled import COMPILE_MODES

# Keys a run may change when it is resumed: how long, where, on what and how fast it runs.
CHANGEABLE_ON_RESUME = ("epochs", "out", "device", "data_root", "compile")


@dataclass
class RunSettings:
    """What every training run shares, episodic or pretraining: data, backbone, validation
    episodes, optimizer, precision, seed, device and run folder."""

    dataset: str = setting("omniglot", help="dataset name", choices=dataset_names)
    data_root: str | None = setting(
        None, help="data folder (default: $FEWSHOT_DATA or the repository's data/)"
    )
    resize: int | None = resize_setting()
    channels: int | None = channels_setting()
    train_split: str = setting("train", help="split to train on (e.g. train, trainval)")
    val_split: str = setting("val", help="split to validate on")
    extra_data: list[str] = setting(
        help="more data sets to train on, NAME or NAME:ROOT each (folder:ROOT for a folder of "
        "your images), read at the run's image size: each batch of episodes comes from one "
        "data set, drawn at random; validation stays on --dataset's",
        default_factory=list,
    )
    backbone: str = setting(
        "conv4",
        help=f"embedding network: {', '.join(BACKBONES)}, a plug-in's (entry points "
        "fewshot.backbones), or a library's model by name, "
        "timm:NAME (pip install 'fewshot[timm]') or torchvision:NAME, its classifier removed "
        "(a folder data set is resized to its input size unless --resize is given)",
    )
    backbone_options: dict = setting(
        help="backbone keyword options as JSON, e.g. '{\"drop_block_size\": 2}'; for timm: and "
        "torchvision: those of the library's constructor, and '{\"pretrained\": true}' for "
        "the library's weights (network access; timm's tag in the name picks which)",
        default_factory=dict,
    )
    backbone_weights: str | None = setting(
        None,
        help="start the backbone from this state dict file (of the library's model for "
        "timm:/torchvision:, its classifier's entries ignored), loaded without running code",
    )
    backbone_lr: float | None = setting(
        None, help="base learning rate of the backbone (default: --lr), on --lr-schedule", above=0
    )
    freeze_backbone: bool = setting(
        False, help="train no backbone weight: no gradients to it, kept in eval mode"
    )
    normalization: str = setting(
        "auto",
        help="normalise images with the dataset's mean and std or with the timm:/torchvision: "
        "backbone's own (auto: the backbone's where the library gives one for the images' "
        "channels)",
        choices=("auto", "dataset", "backbone"),
    )
    val_way: int | None = setting(None, help="validation way (default: --way)", low=1)
    val_shot: int | None = setting(None, help="validation shot (default: --shot)", low=1)
    val_query: int | None = setting(None, help="validation query (default: --query)", low=1)
    val_episodes: int = setting(500, help="seeded validation episodes per epoch", low=2)
    val_seed: int = seed_setting(1234, help="seed of the validation episodes")
    epochs: int = setting(60, help="training epochs", low=1)
    optimizer: str = setting(
        "sgd",
        help="sgd (Nesterov momentum) or adam; the MAML family defaults to adam, lr 0.001, "
        "no weight decay or schedule",
        choices=("sgd", "adam"),
    )
    lr: float = setting(0.1, help="base learning rate", above=0)
    momentum: float = setting(0.9, help="SGD momentum (optimizer sgd)", low=0, below=1)
    weight_decay: float = setting(5e-4, help="L2 weight decay", low=0)
    lr_schedule: list = setting(
        help="[[epoch, factor], ...]: from that (0-based) epoch on, lr = base lr * factor",
        default_factory=lambda: [[20, 0.06], [40, 0.012], [50, 0.0024]],
    )
    label_smoothing: float = setting(
        0.0, help="label smoothing of the loss (embedding method, pretraining)", low=0, below=1
    )
    augment: bool = setting(
        False, help="MetaOptNet's training augmentation (84x84 and 32x32 datasets)"
    )
    channels_last: bool = setting(
        True,
        help="channels_last memory format for the backbone (embedding method, anil and "
        "pretraining; the MAML family defaults to off)",
    )
    amp: str = amp_setting()
    compile: str = setting(
        "off",
        help="torch.compile the backbone in the training steps (validation stays eager): "
        "default fuses its operations, reduce-overhead also replays them as CUDA graphs; the "
        "first step compiles (tens of seconds); not for the MAML family (they "
        "differentiate through adapted weights, or run ANIL's backbone in threads)",
        choices=COMPILE_MODES,
    )
    seed: int = seed_setting(0, help="seed of the episodes, splits, augmentation and weights")
    device: str = device_setting()
    out: str = setting("runs/default", help="run folder (checkpoints, metrics.jsonl)")

    # What the run's checkpoints say they are (see checkpoint_settings).
    stage = "train"

    def _check_common(self) -> None:
        """Checks of the shared fields that involve several of them."""
        if not self.out.strip():
            raise SettingError("out", "must name a folder")
        for i, entry in enumerate(self.lr_schedule):
            if not _is_schedule_entry(entry):
                raise SettingError(
                    "lr_schedule",
                    f"entry {i} must be [epoch >= 0 (an integer), factor > 0], got {entry!r}",
                )
        if self.optimizer != "sgd":
            refuse_unused(self, ["momentum"], f"--optimizer {self.optimizer}")
        if self.freeze_backbone:
            refuse_unused(self, ["backbone_lr"], "--freeze-backbone")
        check_data_options(self)
        self._check_backbone()
        self._check_extra_data()
        side = self.geometry[1]
        if self.augment and side not in PAPER_PADDING:
            raise SettingError(
                "augment",
                f"does not apply to --dataset {self.dataset}: MetaOptNet's augmentation is "
                f"defined for {' and '.join(f'{s}x{s}' for s in PAPER_PADDING)} images, not "
                f"{side}x{side}",
            )

    def _check_backbone(self) -> None:
        """Refuse an unknown backbone, a library one that is not installed, has no such model
        or cannot take the images (built on the meta device: free), and a normalisation the
        backbone does not give; a folder data set takes a library model's input size."""
        library = library_name(self.backbone)
        if not library:
            try:
                known = self.backbone in backbone_names()  # a plug-in's is registered
            except FewshotError as e:
                raise SettingError("backbone", f"{self.backbone}: {e}") from None
            if not known:
                raise SettingError(
                    "backbone",
                    f"must be one of {', '.join(BACKBONES)}, timm:NAME or torchvision:NAME, "
                    f"got {self.backbone!r}",
                )
            check_options("backbone_options", self.backbone_options, BACKBONES[self.backbone])
        else:
            try:
                check_library_name(self.backbone)
            except ValueError as e:
                raise SettingError("backbone", str(e)) from None
            taken = sorted({"in_channels", "image_size"} & set(self.backbone_options))
            if taken:
                raise SettingError(
                    "backbone_options",
                    f"cannot set {', '.join(taken)}: the images' geometry does (--channels, "
                    "--resize)",
                )
            if self.backbone_weights and self.backbone_options.get("pretrained"):
                raise SettingError(
                    "backbone_weights", "and pretrained both give the backbone's weights"
                )
            given = model_input(self.backbone, self.backbone_options)
            if self.dataset == FOLDER and self.resize is None and given:
                self.resize = given.side
            try:
                with torch.device("meta"):
                    build_backbone(self.backbone, *self.geometry, **self.backbone_options)
            except ValueError as e:
                key = "backbone_options" if self.backbone_options else "backbone"
                raise SettingError(key, str(e)) from None
        if self.normalization == "backbone" and self.backbone_normalization is None:
            raise SettingError(
                "normalization",
                f"backbone needs a timm: or torchvision: backbone whose library gives a mean "
                f"and std for {self.geometry[0]}-channel images, not {self.backbone}",
            )

    @cached_property
    def extra_sources(self) -> list[Source]:
        """The data sets of --extra-data."""
        try:
            return [Source.parse(spec) for spec in self.extra_data]
        except ValueError as e:
            raise SettingError("extra_data", str(e)) from None

    def _check_extra_data(self) -> None:
        """Refuse an --extra-data set that is unknown, repeats another, lacks a folder's root,
        or whose images are of another geometry than the run's (a folder is read at it); a
        data set is the same however its root is spelled."""
        seen = {Source(self.dataset, self.data_root).images()}
        for spec, source in zip(self.extra_data, self.extra_sources, strict=True):
            if source.dataset not in dataset_names():
                raise SettingError(
                    "extra_data",
                    f"{spec}: unknown dataset {source.dataset!r}; choose from "
                    f"{', '.join(dataset_names())}",
                )
            if source.dataset == FOLDER and not source.data_root:
                raise SettingError("extra_data", f"{spec}: a folder needs its root, folder:ROOT")
            if source.data_root and not Path(source.data_root).is_dir():
                raise SettingError("extra_data", f"{spec}: {source.data_root} is not a folder")
            if source.images() in seen:
                raise SettingError("extra_data", f"{spec}: the run trains on it already")
            seen.add(source.images())
            if source.dataset != FOLDER and GEOMETRY[source.dataset] != self.geometry:
                given, want = (
                    "x".join(map(str, (g[0], g[1], g[1])))
                    for g in (GEOMETRY[source.dataset], self.geometry)
                )
                raise SettingError(
                    "extra_data",
                    f"{spec}: its images are {given}, the run's {want} (--dataset "
                    f"{self.dataset}); join data sets of one size, or folders (read at the "
                    "run's)",
                )

    @cached_property
    def backbone_normalization(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """The library backbone's own (mean, std) where it has them for the images' channels,
        else None (the dataset's apply)."""
        if not library_name(self.backbone) or self.normalization == "dataset":
            return None
        given = model_input(self.backbone, self.backbone_options)
        if given is None or len(given.mean) != self.geometry[0]:
            return None
        return given.mean, given.std

    def normalized(self, data: ImageSplit) -> ImageSplit:
        """`data` with the normalisation the run's images take (--normalization)."""
        if self.backbone_normalization is None:
            return data
        mean, std = self.backbone_normalization
        return replace(data, mean=mean, std=std)

    @cached_property
    def geometry(self) -> tuple[int, int]:
        """(channels, side) of the training images, known before any is decoded."""
        return dataset_geometry(
            self.dataset, self.data_root, self.train_split, self.resize, self.channels
        )

    @property
    def train_per_class(self) -> int:
        """The images every training class must have: one, for batches of single images."""
        return 1

    def split_needs(self) -> list[tuple[str, int]]:
        """The splits a run reads (train, validation), each with the images its every class
        must have."""
        return [
            (self.train_split, self.train_per_class),
            (self.val_split, self.val_per_class),
        ]

    @property
    def val_per_class(self) -> int:
        """The images every validation class must have: an episode's shot + query."""
        return self.val_shot + self.val_query

    @property
    def val_shape(self) -> EpisodeShape | VariedShape:
        """The validation episodes, in batches of 8."""
        return EpisodeShape(self.val_way, self.val_shot, self.val_query, 8)

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


def _is_schedule_entry(entry: object) -> bool:
    """[epoch, factor] with an integer epoch >= 0 and a finite factor > 0."""
    if not (isinstance(entry, list) and len(entry) == 2):
        return False
    epoch, factor = entry
    is_number = isinstance(factor, int | float) and not isinstance(factor, bool)
    return (
        isinstance(epoch, int)
        and not isinstance(epoch, bool)
        and epoch >= 0
        and is_number
        and math.isfinite(factor)
        and factor > 0
    )
