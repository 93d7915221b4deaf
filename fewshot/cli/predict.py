"""`fewshot predict`: classify new images from a few labelled ones with a trained model.

The support is a folder of class folders, the queries image files or folders of them; both are
read at the checkpoint's geometry (resized and converted, said once) and normalised as its
training images; drawings of the other polarity than the model's data set (Omniglot's own dark
ink on white paper, for a model trained on its light-on-dark images), in the support or in the
queries, are refused unless `--invert` reads them as negatives. A transductive classifier is
refused too few queries to classify together (`fewshot.heads.query_refusal`) and says what it
assumes of them. Every query gets the predicted class and a score per class, printed as a
summary per class and written as CSV or JSON (`--out`).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from fewshot.cli.model_settings import (
    ModelSettings,
    check_model_choice,
    checkpoint_setting,
    frozen_backbone_setting,
)
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.batches import images_to_device
from fewshot.datasets.folder import Listing, decode_listing, first_image, list_classes, list_images
from fewshot.heads import query_assumption, query_refusal
from fewshot.methods.base import Method
from fewshot.methods.pmf import PMF
from fewshot.runtime.device import device_setting, resolve_device
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_write_json, atomic_write_text, prepare_output
from fewshot.runtime.settings import Command, SettingError, refuse_unused, setting
from fewshot.training.checkpoint import as_trained, polarity_mismatch
from fewshot.training.model_source import (
    Model,
    checkpoint_model,
    frozen_model,
)

OUT_SUFFIXES = (".csv", ".json")


@dataclass(frozen=True)
class Prediction:
    """What `predict` found: per query image its path and scores per class [n, way]."""

    classes: list[str]
    paths: list[str]
    scores: torch.Tensor
    score_name: str
    transductive: bool

    @property
    def predicted(self) -> list[str]:
        """The predicted class name of each query."""
        return [self.classes[i] for i in self.scores.argmax(dim=1).tolist()]

    def rows(self) -> list[dict]:
        """One record per query: its path, the predicted class and the score of each class."""
        return [
            {"path": path, "class": label, "scores": dict(zip(self.classes, row, strict=True))}
            for path, label, row in zip(
                self.paths, self.predicted, self.scores.tolist(), strict=True
            )
        ]

    def csv(self) -> str:
        """The rows as CSV: path, predicted class, then one column per class."""
        text = io.StringIO()
        writer = csv.writer(text)
        writer.writerow(["path", "class", *self.classes])
        for row in self.rows():
            writer.writerow(
                [row["path"], row["class"], *(f"{v:.6g}" for v in row["scores"].values())]
            )
        return text.getvalue()

    def summary(self) -> list[str]:
        """One line per class: how many queries it got and their mean score for it."""
        labels = self.scores.argmax(dim=1)
        lines = []
        for i, name in enumerate(self.classes):
            mine = labels == i
            mean = (
                f", mean {self.score_name} {self.scores[mine, i].mean():.3f}" if mine.any() else ""
            )
            lines.append(f"{name}: {int(mine.sum())} of {len(labels)} queries{mean}")
        return lines


@dataclass(frozen=True, kw_only=True)
class PredictSettings(ModelSettings):
    """`fewshot predict`: a checkpoint, a support folder and query images."""

    checkpoint: str | None = checkpoint_setting()
    backbone: str | None = frozen_backbone_setting()
    resize: int | None = setting(
        None,
        help="a frozen backbone's input side: every image resized to N x N (default: the side "
        "a timm:/torchvision: backbone was made for, else the first support image's)",
        low=1,
    )
    support: str = setting(help="folder of class folders: the labelled images, as many per class")
    query: list[str] = setting(help="image files or folders of them to classify")
    invert: bool | None = setting(
        None,
        help="read every image as its negative (255 - value): dark drawings on light paper "
        "for a model trained on light ones on dark, as Omniglot's (by default a support or "
        "queries that look so are refused, naming this flag; --no-invert reads them as they "
        "are)",
    )
    out: str | None = setting(None, help="write the predictions as .csv or .json")
    overwrite: bool = setting(False, help="replace the file at --out")
    batch_size: int = setting(256, help="query images per forward pass", low=1)
    device: str = device_setting()

    @property
    def backbones(self) -> list[str]:
        """--backbone, where given."""
        return [self.backbone] if self.backbone else []

    def model(self, support: Listing, device: torch.device) -> Model:
        """The checkpoint's model, or the frozen backbone's at the geometry it was made for
        where it says, else the support's first image's (--resize sets the side)."""
        if self.checkpoint is not None:
            return checkpoint_model(self.checkpoint, device)
        backbone = self.frozen(self.backbone)
        _, (channels, width, height) = first_image(support)
        made_for = backbone.input_geometry()
        geometry = made_for[0] or channels, self.resize or made_for[1] or max(width, height)
        return frozen_model(backbone, None, None, geometry, device, self.amp)

    def __post_init__(self) -> None:
        check_model_choice(self.checkpoint, self.backbone)
        if self.backbone is None:
            refuse_unused(self, ["resize"], "a checkpoint (it reads images at its own size)")
        super().__post_init__()
        if self.out is not None and Path(self.out).suffix not in OUT_SUFFIXES:
            raise SettingError("out", f"must end in {' or '.join(OUT_SUFFIXES)}, got {self.out!r}")
        if self.classifier_options.get("cl2n"):
            raise SettingError(
                "classifier_options",
                "cl2n needs the training split's mean feature, which fewshot eval computes; "
                "predict does not read the training data",
            )
        if self.classifier == PMF:
            raise SettingError(
                "classifier",
                "pmf fine-tunes the backbone on the seeded episodes of fewshot eval and "
                "compare; predict does not fine-tune",
            )


def read_images(listing: Listing, model: Model, what: str) -> ImageSplit:
    """A listing's images at the geometry of `model`, normalised as its training images;
    resizing or converting said once."""
    config = model.config
    channels, side = config["in_channels"], config["image_size"]
    first, (have, width, height) = first_image(listing)
    if have != channels or (width, height) != (side, side):
        print(
            f"{what}: images such as {first} ({have}x{width}x{height}) are read as "
            f"{channels}x{side}x{side}, the geometry of {model.label}"
        )
    return as_trained(config, decode_listing(listing, channels, side, True, True), model.label)


def reads_negatives(
    settings: PredictSettings, model: Model, support: ImageSplit, query: ImageSplit
) -> bool:
    """--invert or --no-invert as given; by default no, and a support or queries that look
    like the negatives of the model's training images are refused: their predictions would be
    noise (queries of the other polarity alone: 15 % on 5-way Omniglot problems)."""
    if settings.invert is not None:
        return settings.invert
    support_off = polarity_mismatch(model.config, support, model.label)
    query_off = polarity_mismatch(model.config, query, model.label)
    if support_off and query_off:
        raise FewshotError(
            f"{settings.support}: {support_off} (the queries too): --invert reads them as "
            "negatives (--no-invert: as they are)"
        )
    if support_off or query_off:  # --invert would turn the other set: one polarity first
        where, off, other = (
            (settings.support, support_off, "the queries")
            if support_off
            else ("--query", query_off, "the support")
        )
        raise FewshotError(
            f"{where}: {off}, unlike {other}: give support and queries in one polarity "
            "(--no-invert reads them as they are)"
        )
    return False


def negative(images: ImageSplit) -> ImageSplit:
    """The images as their negatives (255 - value), otherwise the same."""
    return replace(images, images=255 - images.images)


def run_predict(settings: PredictSettings) -> Prediction:
    """`fewshot predict`: load a checkpoint (or a frozen backbone) and the images, classify,
    print and write."""
    device = resolve_device(settings.device)
    out = prepare_output(settings.out, settings.overwrite) if settings.out else None
    support_listing = list_classes(Path(settings.support))
    model = settings.model(support_listing, device)
    method, config = model.method, model.config
    settings.prepare(method, config)
    counts = {name: len(paths) for name, paths in support_listing.classes.items()}
    if len(counts) < 2:
        raise FewshotError(
            f"{settings.support}: the support needs two classes or more, got "
            f"{', '.join(f'{k!r}: {v}' for k, v in counts.items())}"
        )
    method.check_way(len(counts))
    shots = set(counts.values())
    method.check_shot(shots.pop() if len(shots) == 1 else None)  # None: unequal counts
    query_listing = list_images([Path(p) for p in settings.query])
    refusal = query_refusal(settings.classifier, len(query_listing.images), len(counts))
    if refusal:
        raise FewshotError(f"--classifier {refusal}")
    support = read_images(support_listing, model, "support")
    if "mean" not in config:  # a frozen backbone without constants: the support's, for both
        config.update(mean=list(support.mean), std=list(support.std))
    query = read_images(query_listing, model, "query")
    if reads_negatives(settings, model, support, query):
        print("support and query: read as negatives (--invert)")
        support, query = negative(support), negative(query)
    scores = classify(method, support, query, device, settings.batch_size)
    result = Prediction(
        support.class_names,
        [str(p) for p in query_listing.images],
        scores.cpu(),
        method.score_name,
        method.transductive,
    )
    if result.transductive:
        assumption = query_assumption(settings.classifier, len(result.classes))
        said = f"; {assumption}" if assumption else ""
        print(f"transductive: each query's scores also depend on the other queries{said}")
    print("\n".join(result.summary()))
    if out is not None:
        write_prediction(result, out, model)
        print(f"predictions in {settings.out}")
    return result


def classify(
    method: Method, support: ImageSplit, query: ImageSplit, device: torch.device, batch: int
) -> torch.Tensor:
    """The queries' scores: from the features kept in a frozen backbone's feature cache
    (each image set embedded once for every later command), else from the images."""
    if getattr(method, "feature_cache", None) is not None and method.caches:
        with torch.no_grad():
            features = method.split_features(support, device).to(device)[None]
            queries = method.split_features(query, device).to(device)
            shots = torch.bincount(support.labels).tolist()  # class by class, as read
            return method.classify(features, shots, queries, batch)
    everything = torch.arange(len(support.labels))
    return method.predict(
        images_to_device(support, everything, device),
        support.labels.to(device),
        images_to_device(query, torch.arange(len(query.labels)), device),
        batch,
    )


def write_prediction(result: Prediction, out: Path, model: Model) -> None:
    """The predictions as CSV, or as JSON with what made them (the model's identity)."""
    if out.suffix == ".csv":
        atomic_write_text(result.csv(), out)
        return
    record = {
        **model.identity,
        "classes": result.classes,
        "score": result.score_name,
        "transductive": result.transductive,
        "predictions": result.rows(),
    }
    atomic_write_json(record, out)


COMMANDS = [
    Command(
        ("predict",),
        "classify image files from a few labelled ones (a support folder of class folders)",
        (PredictSettings,),
        run_predict,
    )
]
