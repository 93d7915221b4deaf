"""Training settings: every field checked when built, from defaults, JSON files or flags."""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from fewshot.backbones import BACKBONES
from fewshot.backbones import TRAINING_DEFAULTS as BACKBONE_DEFAULTS
from fewshot.datasets import GEOMETRY, dataset_names
from fewshot.datasets.augment import PAPER_PADDING
from fewshot.heads import HEADS, check_head
from fewshot.methods import (
    METHODS,
    TRAINING_DEFAULTS,
    UNUSED_SETTINGS,
    build_method,
    method_names,
)
from fewshot.methods.resplit import distinct_resplits
from fewshot.runtime.device import device_setting
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.precision import amp_setting
from fewshot.runtime.settings import (
    SettingError,
    build,
    check_fields,
    check_options,
    read_json_object,
    refuse_unused,
    seed_setting,
    setting,
)

# Keys a run may change when it is resumed: how long, where and on what it runs.
CHANGEABLE_ON_RESUME = ("epochs", "out", "device", "data_root")


@dataclass
class TrainSettings:
    """Everything that defines a training run (saved in every checkpoint)."""

    dataset: str = setting("omniglot", help="dataset name", choices=dataset_names)
    data_root: str | None = setting(
        None, help="data folder (default: $FEWSHOT_DATA or the repository's data/)"
    )
    train_split: str = setting("train", help="split to train on (e.g. train, trainval)")
    val_split: str = setting("val", help="split to validate on")
    method: str = setting(
        "embedding", help="what trains and evaluates an episode", choices=method_names
    )
    method_options: dict = setting(
        help="the method's keyword options as JSON (none for embedding)", default_factory=dict
    )
    backbone: str = setting("conv4", help="embedding network", choices=tuple(BACKBONES))
    backbone_options: dict = setting(
        help="backbone keyword options as JSON, e.g. '{\"drop_block_size\": 2}'",
        default_factory=dict,
    )
    head: str = setting(
        "protonet",
        help="classification head (embedding method); ResNet-12's protonet divides "
        "squared distances by the dimension unless head options say otherwise",
        choices=tuple(HEADS),
    )
    head_options: dict = setting(
        help="head keyword options as JSON, e.g. '{\"lam\": 50}' (embedding method)",
        default_factory=dict,
    )
    eval_head_options: dict = setting(
        help="head options for validation and testing only (e.g. fewer SVM iterations; "
        "embedding method)",
        default_factory=dict,
    )
    way: int = setting(5, help="classes per training episode", low=1)
    shot: int = setting(1, help="support images per class", low=1)
    query: int = setting(15, help="query images per class", low=1)
    val_way: int | None = setting(None, help="validation way (default: --way)", low=1)
    val_shot: int | None = setting(None, help="validation shot (default: --shot)", low=1)
    val_query: int | None = setting(None, help="validation query (default: --query)", low=1)
    val_episodes: int = setting(500, help="seeded validation episodes per epoch", low=2)
    val_seed: int = seed_setting(1234, help="seed of the validation episodes")
    epochs: int = setting(60, help="training epochs", low=1)
    episodes_per_epoch: int = setting(1000, help="training episodes per epoch", low=1)
    episodes_per_batch: int = setting(2, help="episodes per optimizer step", low=1)
    resplits: int = setting(1, help="U: re-splits of every episode (EHG); 1 = plain", low=1)
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
        0.0, help="label smoothing of the query loss (embedding method)", low=0, below=1
    )
    augment: bool = setting(
        False, help="MetaOptNet's training augmentation (84x84 and 32x32 datasets)"
    )
    channels_last: bool = setting(
        True,
        help="channels_last memory format for the backbone (embedding method and anil; the "
        "MAML family defaults to off)",
    )
    amp: str = amp_setting()
    seed: int = seed_setting(0, help="seed of the episodes, splits, augmentation and weights")
    device: str = device_setting()
    out: str = setting("runs/default", help="run folder (checkpoints, metrics.jsonl)")

    @classmethod
    def defaults_for(cls, values: dict) -> list[tuple[str, dict]]:
        """The layers under `values`: the training defaults of the backbone with the head
        they choose (for methods with a head), then those of the method."""
        method, backbone, head = (
            values.get(key, getattr(cls, key)) for key in ("method", "backbone", "head")
        )
        if not all(isinstance(v, str) for v in (method, backbone, head)):
            return []  # a wrong type: refused by the field check
        layers = []
        if "head" not in UNUSED_SETTINGS.get(method, ()):
            pair = BACKBONE_DEFAULTS.get(backbone, {}).get(head, {})
            layers.append((f"--backbone {backbone} with --head {head}", copy.deepcopy(pair)))
        layers.append((f"--method {method}", copy.deepcopy(TRAINING_DEFAULTS.get(method, {}))))
        return layers

    def __post_init__(self) -> None:
        check_fields(self)
        self.val_way = self.val_way or self.way
        self.val_shot = self.val_shot or self.shot
        self.val_query = self.val_query or self.query
        self._check_relations()

    def _check_relations(self) -> None:
        """Checks that involve several fields."""
        if not self.out.strip():
            raise SettingError("out", "must name a folder")
        if self.episodes_per_epoch % self.episodes_per_batch:
            raise SettingError(
                "episodes_per_epoch",
                f"must be a multiple of episodes_per_batch ({self.episodes_per_batch}), "
                f"got {self.episodes_per_epoch}",
            )
        limit = distinct_resplits(self.way, self.shot, self.query)
        if self.resplits > limit:
            raise SettingError(
                "resplits",
                f"must be <= {limit}, the distinct re-splits of a {self.way}-way {self.shot}-shot "
                f"{self.query}-query episode (C({self.shot + self.query},{self.shot})^{self.way}),"
                f" got {self.resplits}",
            )
        for i, entry in enumerate(self.lr_schedule):
            if not _is_schedule_entry(entry):
                raise SettingError(
                    "lr_schedule",
                    f"entry {i} must be [epoch >= 0 (an integer), factor > 0], got {entry!r}",
                )
        # What the method or the optimizer never reads must keep its neutral value.
        owner = f"--method {self.method}"
        unused, neutral = UNUSED_SETTINGS.get(self.method, ()), TRAINING_DEFAULTS.get(self.method)
        refuse_unused(self, unused, owner, neutral)
        if self.optimizer != "sgd":
            refuse_unused(self, ["momentum"], f"--optimizer {self.optimizer}")
        check_options("method_options", self.method_options, METHODS[self.method], self.method)
        check_options("backbone_options", self.backbone_options, BACKBONES[self.backbone])
        channels, side = GEOMETRY[self.dataset]
        if self.augment and side not in PAPER_PADDING:
            raise SettingError(
                "augment",
                f"does not apply to --dataset {self.dataset}: MetaOptNet's augmentation is "
                f"defined for {' and '.join(f'{s}x{s}' for s in PAPER_PADDING)} images, not "
                f"{side}x{side}",
            )
        # The method and its backbone check their own options; on the meta device building
        # them for the dataset's images costs nothing.
        try:
            with torch.device("meta"):
                build_method({**asdict(self), "in_channels": channels, "image_size": side})
        except ValueError as e:  # the backbone's
            raise SettingError("backbone_options", str(e)) from None
        for key in ("head_options", "eval_head_options"):
            check_options(key, getattr(self, key), HEADS[self.head])
        # The head refuses what it cannot solve (e.g. SVM C <= 0, or way 1), per phase.
        phases = {"head_options": (self.way, self.shot, self.head_options)}
        phases["eval_head_options"] = (
            self.val_way,
            self.val_shot,
            {**self.head_options, **self.eval_head_options},
        )
        for key, (way, shot, options) in phases.items():
            try:
                check_head(self.head, way, shot, options)
            except FewshotError as e:
                raise SettingError(key if getattr(self, key) else "head", str(e)) from None

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


def read_config_file(path: str | Path) -> dict:
    """The settings of a JSON config file (keys starting with '_' are comments)."""
    values = read_json_object(path)
    return {k: v for k, v in values.items() if not k.startswith("_")}


def make_config(config_file: str | None, flags: dict) -> TrainSettings:
    """Defaults (the method's own among them) <- config file <- command-line values."""
    layers = [(f"config file {config_file}", read_config_file(config_file))] if config_file else []
    return build(TrainSettings, [*layers, ("flags", flags)])


# Settings renamed since checkpoints were first written: older checkpoints still load.
RENAMED = {"ehg_splits": "resplits"}


def checkpoint_settings(ckpt: dict, path: str | Path) -> dict:
    """The TrainSettings saved in a checkpoint, checked; settings added since it was written
    take their defaults (which reproduce how such runs behaved), renamed ones their new name,
    and those its method never read their neutral value (older runs accepted any)."""
    config = ckpt.get("config")
    if not isinstance(config, dict):
        raise FewshotError(f"{path} is not a fewshot training checkpoint (it has no config)")
    unused = UNUSED_SETTINGS.get(config.get("method", TrainSettings.method), ())
    values = {
        RENAMED.get(k, k): v
        for k, v in config.items()
        if k not in ("in_channels", "image_size") and k not in unused
    }
    return build(TrainSettings, [(f"checkpoint {path}", values)]).to_dict()
