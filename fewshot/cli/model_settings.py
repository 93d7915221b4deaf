"""`ModelSettings`: how a trained model classifies at test time (precision, --classifier, ...)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fewshot.heads import CLASSIFIERS, TRANSDUCTIVE, check_head, head_names
from fewshot.methods.adaptation import AdaptationMethod
from fewshot.methods.base import Method
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.methods.pmf import PMF, PmfAdapter, PmfOptions
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.precision import amp_setting
from fewshot.runtime.settings import (
    SettingError,
    check_fields,
    check_options,
    refuse_unused,
    setting,
)
from fewshot.training.model_source import (
    DEFAULT_CLASSIFIER,
    NORMALIZATIONS,
    Backbone,
    Model,
    given_module,
)

# BatchNorm's statistics at test time: the trained ones, each episode's own, or the support's
# with each query alone (`ModelSettings.prepare_batch_norm`).
BATCH_NORMS = ("running", "transductive", "per-query")


def method_label(config: dict) -> str:
    """How messages name a model's method: `--method NAME`, pretraining or a frozen backbone."""
    if config.get("stage") == "frozen":
        return "a frozen backbone"
    return f"--method {config['method']}" if "method" in config else "a pretrained model"


def checkpoint_setting() -> Any:
    """The --checkpoint field of a command that classifies with a trained model."""
    return setting(None, help="a .pt file written by fewshot train or pretrain (or its run folder)")


def frozen_backbone_setting(needs: str = "") -> Any:
    """The --backbone field of such a command: a frozen backbone in place of --checkpoint
    (`needs`: what else it needs, said in the help)."""
    return setting(
        None,
        help="instead of --checkpoint, a frozen backbone with no training: conv4, resnet12 "
        "(with --backbone-weights FILE), timm:NAME or torchvision:NAME, classified by "
        f"--classifier (default {DEFAULT_CLASSIFIER}){needs}",
    )


def check_model_choice(checkpoint: str | None, backbone: str | None) -> None:
    """Refuse a command given neither or both of --checkpoint and --backbone."""
    if checkpoint is None and backbone is None:
        raise SettingError("checkpoint", "is required, or --backbone for a frozen backbone")
    if checkpoint is not None and backbone is not None:
        raise SettingError("backbone", "and --checkpoint both name the model: give one")


class ClassifierNames:
    """--classifier's names: every test-time classifier and pmf; `in` also finds a plug-in
    head (entry point group `fewshot.heads`), which classifies frozen features as any does."""

    def __iter__(self) -> Iterator[str]:
        return iter((*CLASSIFIERS, PMF))

    def __contains__(self, name: object) -> bool:
        return name == PMF or name in CLASSIFIERS or name in head_names()


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """How a trained model classifies: its precision and test-time classifier."""

    amp: str = amp_setting()
    classifier: str | None = setting(
        None,
        help="test-time classifier on the model's frozen features (embedding methods and "
        "pretrained models; default: the model's own head, nearest centroid for a pretrained "
        "one), or pmf: P>M>F's fine-tuning of the backbone on each episode's support",
        choices=lambda: ClassifierNames(),
    )
    classifier_options: dict = setting(
        help="the classifier's keyword options as JSON, e.g. '{\"cl2n\": true}' (centroid: "
        "SimpleShot's centring on the base-class mean and L2 normalisation), '{\"C\": 1}' or "
        '\'{"steps": 50, "lr": 1e-3}\' (pmf; without lr: chosen on validation episodes; '
        '"batched": a batch\'s episodes at once, default on a GPU)',
        default_factory=dict,
    )

    batch_norm: str | None = setting(
        None,
        help="BatchNorm's statistics: running (the trained ones; embedding methods' default), "
        "transductive (each episode's own: of its support, then of all its queries; the MAML "
        "family's default, and how Relation Networks' code evaluates) or per-query (fewshot "
        "predict, MAML family: the support and each query alone)",
        choices=BATCH_NORMS,
    )
    inner_steps: int | None = setting(
        None,
        help="MAML family: gradient steps on each test episode's support (default: the "
        "checkpoint's eval_inner_steps; the MAML paper tests Omniglot models with 3)",
        low=0,
    )
    backbone_options: dict = setting(
        help="a frozen backbone's keyword options as JSON; for timm: and torchvision: those "
        "of the library's constructor, and '{\"pretrained\": true}' for the library's weights "
        "(network access; without it, download them elsewhere and give --backbone-weights)",
        default_factory=dict,
    )
    backbone_weights: str | None = setting(
        None,
        help="a frozen backbone's weights: a state dict file (of the library's model for "
        "timm:/torchvision:, its classifier's entries ignored), loaded without running code",
    )
    normalization: str = setting(
        "auto",
        help="a frozen backbone's images normalised with the data's mean and std or with the "
        "timm:/torchvision: backbone's own (auto: the backbone's where it has them for the "
        "images' channels)",
        choices=NORMALIZATIONS,
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.backbones:
            refuse_unused(
                self,
                ["backbone_options", "backbone_weights", "normalization"],
                "a checkpoint (they describe a frozen backbone: --backbone)",
            )
        if self.backbone_weights and self.backbone_options.get("pretrained"):
            raise SettingError(
                "backbone_weights", "and pretrained both give the backbone's weights"
            )
        if self.batch_norm == "transductive" and self.classifier == PMF:
            raise SettingError(
                "batch_norm",
                "transductive does not apply with --classifier pmf: it fine-tunes the backbone "
                "on each episode with the trained statistics",
            )
        if self.classifier is None:
            if self.classifier_options:
                raise SettingError("classifier_options", "needs --classifier")
        elif self.classifier == PMF:
            check_options("classifier_options", self.classifier_options, PmfOptions, PMF)
            try:
                PmfOptions(**self.classifier_options)
            except FewshotError as e:
                raise SettingError("classifier_options", str(e)) from None
        else:
            check_options(
                "classifier_options", self.classifier_options, CLASSIFIERS[self.classifier]
            )
            # Its own checks, before any data: the values, then the shape it cannot take.
            for key, (way, shot) in (("classifier_options", (2, 1)), *self.classifier_shape()):
                try:
                    check_head(self.classifier, way, shot, self.classifier_options)
                except FewshotError as e:
                    raise SettingError(key, str(e)) from None

    def classifier_shape(self) -> list[tuple[str, tuple[int, int]]]:
        """The setting that sets the episodes' shape and that shape, where it is known."""
        return []

    @property
    def backbones(self) -> list[str]:
        """The frozen backbones these settings name (none: checkpoints only)."""
        return []

    def frozen(self, name: str) -> Backbone:
        """The frozen backbone `name` with these settings' options and weights, or the module
        given from Python under that name."""
        given = given_module(name)
        if given is not None:
            return given
        return Backbone(name, self.backbone_options, self.backbone_weights, self.normalization)

    def classifier_name(self, model: Model) -> str | None:
        """The test-time classifier a result records: --classifier, a frozen backbone's
        default, or None (the model's own head)."""
        return self.classifier or (DEFAULT_CLASSIFIER if model.frozen else None)

    @property
    def transductive(self) -> bool:
        """Whether the classifier also uses each episode's unlabelled queries, or BatchNorm
        their statistics."""
        return self.classifier in TRANSDUCTIVE or self.batch_norm == "transductive"

    def prepare(self, method: Method, config: dict) -> None:
        """Give a trained method (of checkpoint settings `config`) this evaluation's precision,
        whatever it was trained in, its --batch-norm and the --classifier (refused, before any
        data, for methods that do not classify embeddings)."""
        method.amp = self.amp
        self.prepare_batch_norm(method, config)
        if self.inner_steps is not None:
            if not isinstance(method, AdaptationMethod):
                raise FewshotError(
                    f"--inner-steps does not apply to {method_label(config)}: only the MAML "
                    "family adapts to a test episode by gradient steps"
                )
            method.eval_inner_steps = self.inner_steps
        if self.classifier is None:
            return
        if not isinstance(method, EmbeddingMethod):
            raise FewshotError(
                f"--classifier does not apply to {method_label(config)}: it adapts its whole "
                "network to every episode rather than classifying fixed features"
            )
        if self.classifier == PMF:
            method.use_adapter(PmfAdapter(method, PmfOptions(**self.classifier_options)))
        else:
            method.use_classifier(self.classifier, self.classifier_options)

    def prepare_batch_norm(self, method: Method, config: dict) -> None:
        """--batch-norm, refused where the method has no such statistics: running for the MAML
        family (it keeps none), per-query for embedding methods."""
        if self.batch_norm is None:
            return
        name = method_label(config)
        if isinstance(method, EmbeddingMethod) and method.episode_statistics:
            if self.batch_norm != "transductive":
                raise FewshotError(
                    f"--batch-norm {self.batch_norm} does not apply to {name} of a MAML-family "
                    "checkpoint: its backbone keeps no running statistics and reads each "
                    "episode's (transductive)"
                )
        elif isinstance(method, EmbeddingMethod):
            if self.batch_norm == "per-query":
                raise FewshotError(
                    f"--batch-norm per-query does not apply to {name}: with its trained "
                    "statistics (running, the default) each image's embedding is its own already"
                )
            if self.batch_norm == "transductive":
                method.use_episode_statistics()
        elif self.batch_norm == "running":
            raise FewshotError(
                f"--batch-norm running does not apply to {name}: it keeps no running statistics "
                "and normalises with those of the images it adapts to (transductive or per-query)"
            )
        else:
            method.transductive = self.batch_norm == "transductive"
