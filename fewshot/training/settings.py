"""Training settings: `TrainSettings`, `PretrainSettings`, config files, a checkpoint's settings."""

from __future__ import annotations

import contextlib
import copy
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from fewshot.backbones import training_defaults
from fewshot.datasets import FOLDER
from fewshot.datasets.sampler import EpisodeShape
from fewshot.datasets.varied import (
    MAX_SUPPORT,
    VARIED_HELP,
    VariedShape,
    check_varied_options,
    varied_shape,
)
from fewshot.heads import HEADS, check_head, head_names
from fewshot.methods import (
    METHODS,
    TRAINING_DEFAULTS,
    UNUSED_SETTINGS,
    Method,
    build_method,
    method_names,
)
from fewshot.methods.maml_family import VARIANTS
from fewshot.methods.pretraining import PRETRAIN_CLASSIFIERS, build_pretrain_method
from fewshot.methods.resplit import distinct_resplits
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.plugins import check_installed
from fewshot.runtime.settings import (
    SettingError,
    build,
    check_fields,
    check_options,
    layered_constructor,
    read_json_object,
    refuse_unused,
    setting,
)
from fewshot.training.run_settings import RunSettings


@layered_constructor
@dataclass
class TrainSettings(RunSettings):
    """Everything that defines an episodic training run (saved in every checkpoint)."""

    method: str = setting(
        "embedding",
        help="what trains and evaluates an episode (or a plug-in's: entry points fewshot.methods)",
        choices=method_names,
    )
    method_options: dict = setting(
        help="the method's keyword options as JSON (none for embedding)", default_factory=dict
    )
    head: str = setting(
        "protonet",
        help="classification head (embedding method); the protonet of ResNet-12 and of the "
        "timm: and torchvision: backbones divides squared distances by the dimension unless "
        "head options say otherwise (or a plug-in's: entry points fewshot.heads)",
        choices=head_names,
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
    init: str | None = setting(
        None,
        help="start from this checkpoint's weights: a fewshot pretrain checkpoint's backbone "
        "(Meta-Baseline), or the whole model of a fewshot train checkpoint of the same method "
        "and architecture (fine-tuning it, or training it on with another schedule)",
    )
    way: int = setting(5, help="classes per training episode (with --varied: the fewest)", low=1)
    shot: int = setting(1, help="support images per class (with --varied: the most)", low=1)
    query: int = setting(15, help="query images per class", low=1)
    varied: bool = setting(False, help=f"{VARIED_HELP}; validation's too")
    max_way: int | None = setting(None, help="--varied: the largest way (default: --way)", low=1)
    max_support: int = setting(
        MAX_SUPPORT, help="--varied: the most support images of an episode", low=1
    )
    episodes_per_epoch: int = setting(1000, help="training episodes per epoch", low=1)
    episodes_per_batch: int = setting(2, help="episodes per optimizer step", low=1)
    resplits: int = setting(1, help="U: re-splits of every episode (EHG); 1 = plain", low=1)

    @property
    def train_per_class(self) -> int:
        """The images every training class must have: an episode's shot (one, varied) + query."""
        return (1 if self.varied else self.shot) + self.query

    @property
    def val_per_class(self) -> int:
        """The images every validation class must have, as `train_per_class`."""
        return (1 if self.varied else self.val_shot) + self.val_query

    @property
    def train_shape(self) -> EpisodeShape | VariedShape:
        """The training episodes."""
        if self.varied:
            return varied_shape(self)
        return EpisodeShape(self.way, self.shot, self.query, self.episodes_per_batch)

    @property
    def val_shape(self) -> EpisodeShape | VariedShape:
        """The validation episodes (varied ones with --varied)."""
        if self.varied:
            shape = varied_shape(self)
            return replace(shape, way=self.val_way, shot=self.val_shot, query=self.val_query)
        return super().val_shape

    @classmethod
    def defaults_for(cls, values: dict) -> list[tuple[str, dict]]:
        """The layers under `values`: the training defaults of the backbone with the head
        they choose (for methods with a head), then those of the method."""
        method, backbone, head = (
            values.get(key, getattr(cls, key)) for key in ("method", "backbone", "head")
        )
        if not all(isinstance(v, str) for v in (method, backbone, head)):
            return []  # a wrong type: refused by the field check
        # A plug-in method is registered here, for its defaults; one that cannot be is
        # refused by the field check, naming the flag.
        with contextlib.suppress(FewshotError):
            method_names().find(method)
        layers = []
        if "head" not in UNUSED_SETTINGS.get(method, ()):
            pair = training_defaults(backbone).get(head, {})
            layers.append((f"--backbone {backbone} with --head {head}", copy.deepcopy(pair)))
        layers.append((f"--method {method}", copy.deepcopy(TRAINING_DEFAULTS.get(method, {}))))
        return layers

    def __post_init__(self) -> None:
        check_fields(self)
        self.val_way = self.val_way or self.way
        self.val_shot = self.val_shot or self.shot
        self.val_query = self.val_query or self.query
        self._check_common()
        check_varied_options(self)
        self._check_relations()

    def _check_varied_method(self, method: Method) -> None:
        """Refuse varied episodes that the method cannot read: the MAML family's classifier
        has --way outputs, and a Relation model of summed maps reads one shot."""
        if self.method in VARIANTS and self.max_way not in (None, self.way):
            raise SettingError(
                "max_way",
                f"must be --way {self.way} for --method {self.method} (its classifier has "
                f"--way outputs: only the shots vary), got {self.max_way}",
            )
        method.check_shot(None)

    def _check_varied_resplits(self) -> None:
        """U at most a quarter of the re-splits of the smallest varied episode, one shot a
        class: (1 + query)^way (see draw_varied_resplits)."""
        fewest = distinct_resplits(self.way, 1, self.query, at_most=4 * self.resplits)
        if 4 * self.resplits > fewest:
            raise SettingError(
                "resplits",
                f"must be <= {fewest // 4} with --varied: a quarter of the (1 + query)^way = "
                f"{fewest} re-splits of a {self.way}-way 1-shot {self.query}-query episode, "
                f"got {self.resplits}",
            )

    def _check_relations(self) -> None:
        """Checks that involve several fields."""
        if self.varied:
            self._check_varied_resplits()
        if self.episodes_per_epoch % self.episodes_per_batch:
            raise SettingError(
                "episodes_per_epoch",
                f"must be a multiple of episodes_per_batch ({self.episodes_per_batch}), "
                f"got {self.episodes_per_epoch}",
            )
        limit = distinct_resplits(self.way, self.shot, self.query, at_most=self.resplits)
        if self.resplits > limit and not self.varied:
            raise SettingError(
                "resplits",
                f"must be <= {limit}, the distinct re-splits of a {self.way}-way {self.shot}-shot "
                f"{self.query}-query episode (C({self.shot + self.query},{self.shot})^{self.way}),"
                f" got {self.resplits}",
            )
        if self.init and (self.backbone_weights or self.backbone_options.get("pretrained")):
            raise SettingError(
                "init", "and --backbone-weights or pretrained both give the backbone's weights"
            )
        # What the method or the optimizer never reads must keep its neutral value.
        owner = f"--method {self.method}"
        if self.method in VARIANTS:  # they differentiate through every weight they adapt
            refuse_unused(self, ["freeze_backbone"], owner)
        unused, neutral = UNUSED_SETTINGS.get(self.method, ()), TRAINING_DEFAULTS.get(self.method)
        refuse_unused(self, unused, owner, neutral)
        check_options("method_options", self.method_options, METHODS[self.method], self.method)
        channels, side = self.geometry
        # The method and its backbone check their own options; on the meta device building
        # them for the dataset's images costs nothing.
        try:
            with torch.device("meta"):
                method = build_method({**asdict(self), "in_channels": channels, "image_size": side})
        except ValueError as e:  # the backbone's
            raise SettingError("backbone_options", str(e)) from None
        if self.varied:
            self._check_varied_method(method)
        # A head's scale alone changes no prediction: such a run would train nothing.
        scale = getattr(method, "scale", None)
        what = f"{owner} (--head {self.head})" if self.method == "embedding" else owner
        if self.freeze_backbone and all(p is scale for p in method.head_parameters()):
            raise SettingError(
                "freeze_backbone",
                f"leaves nothing to train: {what} has no weight besides it; a frozen "
                f"backbone needs no training run: fewshot eval --backbone "
                f"{self.backbone} --backbone-weights FILE --dataset {self.dataset}",
            )
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


@dataclass
class PretrainSettings(RunSettings):
    """Everything that defines a pretraining run: supervised classification of every image of
    the train classes at once (Baseline, Baseline++, RFS), validated by few-shot episodes with
    nearest centroid. The defaults are RFS's recipe (Tian et al. 2020, Section 4: SGD 0.05,
    momentum 0.9, weight decay 5e-4, batch 64, 100 epochs, lr x0.1 at epochs 60 and 80)."""

    val_way: int | None = setting(None, help="validation way (default: 5)", low=1)
    val_shot: int | None = setting(None, help="validation shot (default: 1)", low=1)
    val_query: int | None = setting(None, help="validation query (default: 15)", low=1)
    epochs: int = setting(100, help="passes over the train images", low=1)
    lr: float = setting(0.05, help="base learning rate", above=0)
    lr_schedule: list = setting(
        help="[[epoch, factor], ...]: from that (0-based) epoch on, lr = base lr * factor",
        default_factory=lambda: [[60, 0.1], [80, 0.01]],
    )
    out: str = setting("runs/pretrain", help="run folder (checkpoints, metrics.jsonl)")
    classifier: str = setting(
        "linear",
        help="classifier over every train class: linear (Baseline, RFS) or cosine (Baseline++)",
        choices=PRETRAIN_CLASSIFIERS,
    )
    scale: float = setting(
        10.0, help="initial scale of the cosine classifier's logits (classifier cosine)", above=0
    )
    learn_scale: bool = setting(
        True, help="learn the cosine classifier's scale (classifier cosine; else fixed)"
    )
    batch_size: int = setting(64, help="images per optimizer step", low=1)

    stage = "pretrain"

    def __post_init__(self) -> None:
        check_fields(self)
        self.val_way = self.val_way or 5
        self.val_shot = self.val_shot or 1
        self.val_query = self.val_query or 15
        self._check_common()
        if self.classifier != "cosine":
            refuse_unused(self, ["scale", "learn_scale"], f"--classifier {self.classifier}")
        channels, side = self.geometry
        try:  # the backbone checks its options; free on the meta device
            with torch.device("meta"):
                build_pretrain_method(
                    {**asdict(self), "in_channels": channels, "image_size": side, "classes": 2}
                )
        except ValueError as e:
            raise SettingError("backbone_options", str(e)) from None


def read_config_file(path: str | Path) -> dict:
    """The settings of a JSON config file (keys starting with '_' are comments)."""
    values = read_json_object(path)
    return {k: v for k, v in values.items() if not k.startswith("_")}


def make_config(
    config_file: str | None, flags: dict, cls: type[RunSettings] = TrainSettings
) -> RunSettings:
    """Defaults (the method's own among them) <- config file <- command-line values, as the
    settings `cls` (TrainSettings, or PretrainSettings)."""
    layers = [(f"config file {config_file}", read_config_file(config_file))] if config_file else []
    return build(cls, [*layers, ("flags", flags)])


# Settings renamed since checkpoints were first written: older checkpoints still load.
RENAMED = {"ehg_splits": "resplits"}
# What a checkpoint's config holds besides its settings: the data's geometry, the number of
# classes a pretraining classifier covers, which command wrote it, the normalisation
# constants of its training images, and how the MAML family batched its problems there.
CONFIG_EXTRAS = ("in_channels", "image_size", "classes", "stage", "mean", "std", "batching")
STAGES: dict[str, type[RunSettings]] = {"train": TrainSettings, "pretrain": PretrainSettings}
STAGE_WORDS = {
    "train": "meta-training (fewshot train)",
    "pretrain": "pretraining (fewshot pretrain)",
}


def checkpoint_stage(ckpt: dict, path: str | Path) -> str:
    """Which command wrote a checkpoint: 'train' (checkpoints before pretraining existed say
    nothing) or 'pretrain'."""
    config = ckpt.get("config")
    if not isinstance(config, dict):
        raise FewshotError(f"{path} is not a fewshot training checkpoint (it has no config)")
    stage = config.get("stage", "train")
    if stage not in STAGES:
        raise FewshotError(f"{path} was written by an unknown stage {stage!r}")
    return stage


def checkpoint_settings(
    ckpt: dict, path: str | Path, expect: str | None = None, flag: str = ""
) -> dict:
    """The settings saved in a checkpoint, checked; settings added since it was written take
    their defaults (which reproduce how such runs behaved), renamed ones their new name, and
    those its method never read their neutral value (older runs accepted any). `expect`
    ('train' or 'pretrain') refuses a checkpoint of the other stage, naming `flag`; so is one
    whose recorded plug-ins are not installed (`check_installed`)."""
    stage = checkpoint_stage(ckpt, path)
    if expect and stage != expect:
        raise FewshotError(
            f"{flag + ' ' if flag else ''}{path} is a {STAGE_WORDS[stage]} checkpoint; "
            f"a {STAGE_WORDS[expect]} one is needed"
        )
    # Its plug-ins named with their packages where one is missing, before the settings
    # refuse their unknown names.
    check_installed(ckpt.get("plugins"), f"{flag + ' ' if flag else ''}{path}")
    config = ckpt["config"]
    unused = UNUSED_SETTINGS.get(config.get("method", TrainSettings.method), ())
    values = {
        RENAMED.get(k, k): v
        for k, v in config.items()
        if k not in CONFIG_EXTRAS and (stage != "train" or k not in unused)
    }
    if values.get("dataset") == FOLDER:  # the geometry the run read: no images needed now
        for key, extra in (("resize", "image_size"), ("channels", "in_channels")):
            if values.get(key) is None:
                values[key] = config.get(extra)
    return build(STAGES[stage], [(f"checkpoint {path}", values)]).to_dict()
