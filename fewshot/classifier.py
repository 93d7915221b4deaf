"""`FewShotClassifier`: any model of the library classifying images in memory, scikit-learn style.

    clf = fewshot.FewShotClassifier("timm:resnet18", backbone_weights="resnet18.pth")
    clf.fit(support_images, ["cat", "cat", "dog", "dog"])
    clf.predict(query_images)        # ['dog', 'cat', ...]
    clf.predict_proba(query_images)  # tensor [n, 2], columns in clf.classes_ order

The model is a checkpoint (or run folder), a frozen backbone's name, or an `nn.Module` mapping
images to features; images are tensors ([N, C, H, W] or [C, H, W]; uint8 in 0..255 or float in
[0, 1]), PIL images or image paths, brought to the model's geometry and normalisation as
`fewshot predict` brings image files, `batch_size` queries at a time. Classification is
`fewshot predict`'s: the same scores, the same polarity guard (`invert`) and the same refusal of
too few queries for a transductive classifier.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from fewshot.cli.compare import names_backbone
from fewshot.cli.model_settings import ModelSettings
from fewshot.datasets.augment import normalize_float
from fewshot.datasets.folder import channels_of
from fewshot.datasets.image_folder import converted, open_image, resized
from fewshot.heads import query_refusal
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.methods.pmf import PMF
from fewshot.runtime.device import resolve_device
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.settings import build
from fewshot.training.checkpoint import polarity_mismatch
from fewshot.training.model_source import (
    MODULE_PREFIX,
    Backbone,
    Model,
    checkpoint_model,
    frozen_model,
)

Images = torch.Tensor | Sequence[Any]
# The float dtypes taken as images in [0, 1] (float64 is cast: its precision is not used).
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# The arguments that do nothing for each kind of model, refused as the command line refuses
# them (with why), unless at their neutral value (NEUTRAL, else None).
UNUSED = {
    "checkpoint": (
        ("backbone_options", "backbone_weights", "normalization", "image_size", "mean", "std"),
        "a checkpoint: it reads images at its own size, with its own weights and normalisation",
    ),
    "name": (
        ("mean", "std"),
        "a backbone's name: its own constants normalise the images, else the support's",
    ),
    "module": (
        ("backbone_options", "backbone_weights"),
        "an nn.Module: build it with its options and weights before",
    ),
}
NEUTRAL = {"backbone_options": {}, "normalization": "auto"}


class FewShotClassifier:
    """A model that classifies query images from a few labelled support images (`fit`, then
    `predict` / `predict_proba`), batched on `device`.

    `model`: a checkpoint path (or run folder), a frozen backbone's name (conv4, resnet12,
    timm:NAME, torchvision:NAME; `backbone_weights`, `backbone_options`) or an `nn.Module`
    (frozen: put in eval mode, no gradients; `image_size`, `mean` and `std` where it does not
    say them). A frozen backbone classifies by `classifier` (default nearest centroid), a
    checkpoint by its own head unless `classifier` names one; a transductive classifier's
    scores of a query depend on the other queries of the same `predict` call (`transductive`).
    `image_size` also sets the side a frozen backbone reads (default: the one it was made for,
    else the first support image's). Arguments that do nothing for the model given are
    refused. `invert`: read every image as its negative (True), as it is (False), or (None)
    refuse support or query images that look like the negatives of the model's training
    images, as `fewshot predict --invert` does.
    """

    def __init__(
        self,
        model: str | os.PathLike | nn.Module,
        classifier: str | None = None,
        classifier_options: dict | None = None,
        *,
        device: str = "auto",
        amp: str = "auto",
        batch_size: int = 256,
        backbone_options: dict | None = None,
        backbone_weights: str | os.PathLike | None = None,
        normalization: str = "auto",
        image_size: int | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        invert: bool | None = None,
    ):
        _check_count("batch_size", batch_size)
        if image_size is not None:
            _check_count("image_size", image_size)
        if invert is not None and not isinstance(invert, bool):
            raise ValueError(f"invert must be True, False or None, got {invert!r}")
        if not isinstance(model, str | os.PathLike | nn.Module):
            raise ValueError(
                f"model must be a checkpoint path, a backbone name or an nn.Module, got a "
                f"{type(model).__name__}"
            )
        if classifier == PMF:
            raise ValueError(
                "classifier pmf fine-tunes the backbone on the seeded episodes of fewshot eval "
                "and compare; FewShotClassifier does not fine-tune"
            )
        if isinstance(model, nn.Module):
            kind = "module"
        elif names_backbone(os.fspath(model)):
            kind = "name"
        else:
            kind = "checkpoint"
        _refuse_unused(
            kind,
            {
                "backbone_options": backbone_options,
                "backbone_weights": backbone_weights,
                "normalization": normalization,
                "image_size": image_size,
                "mean": mean,
                "std": std,
            },
        )
        if normalization == "dataset" and (mean is not None or std is not None):
            raise ValueError(
                "mean and std do not apply with normalization='dataset': the support's "
                "statistics normalise the images"
            )
        self.batch_size, self.image_size, self.invert = batch_size, image_size, invert
        self.device = _checked(lambda: resolve_device(device))
        values = {"amp": amp, "classifier": classifier}
        values["classifier_options"] = dict(classifier_options or {})
        frozen = kind != "checkpoint"
        if frozen:  # these settings describe a frozen backbone only
            values["backbone_options"] = dict(backbone_options or {})
            values["backbone_weights"] = os.fspath(backbone_weights) if backbone_weights else None
            values["normalization"] = normalization
        self.settings = _checked(
            lambda: build(FrozenSettings if frozen else ModelSettings, [("flags", values)])
        )
        if isinstance(model, nn.Module):
            self.backbone: Backbone | None = Backbone(
                f"{MODULE_PREFIX}{type(model).__name__}",
                normalization=self.settings.normalization,
                module=model,
                image_size=image_size,
                mean=_constants("mean", mean),
                std=_constants("std", std),
            )
        elif frozen:
            self.backbone = self.settings.frozen(os.fspath(model))
        else:
            self.backbone = None
        self.source = model
        self.model: Model | None = None
        self.classes_: list = []

    @property
    def transductive(self) -> bool:
        """Whether a query's scores depend on the other queries of its `predict` call."""
        return self.model is not None and bool(self.model.method.transductive)

    def fit(self, support_images: Images, support_labels: Sequence[Any]) -> FewShotClassifier:
        """Read the labelled support images at the model's geometry (two classes or more; any
        hashable labels, `classes_` sorted) and embed them once (an embedding model's: the
        MAML family adapts at each `predict`); every earlier fit's state is replaced (the
        model reloaded: its geometry and normalisation are this support's where they are the
        support's); returns the classifier."""
        labels = _labels(support_labels)
        items = _items(support_images, "support_images")
        if len(labels) != len(items):
            raise ValueError(
                f"support_labels has {len(labels)} labels for {len(items)} support_images"
            )
        classes = sorted(set(labels), key=_order)
        if len(classes) < 2:
            raise ValueError(f"support_labels must hold two classes or more, got {classes}")
        self.classes_ = []  # until this fit succeeds, predict asks for one
        self.model = self._load(items[0])
        support = self._images(items, "support_images")
        index = {label: i for i, label in enumerate(classes)}
        numbered = torch.tensor([index[label] for label in labels])
        order = torch.argsort(numbered, stable=True)  # class by class, as the heads read them
        self._labels, self._support = numbered[order].to(self.device), support[order]
        self._shots = torch.bincount(numbered).tolist()
        method = self.model.method
        _checked(method.check_way, len(self._shots))
        _checked(method.check_shot, self._shots[0] if len(set(self._shots)) == 1 else None)
        self._features = None
        if isinstance(method, EmbeddingMethod):  # its features serve every later predict
            with torch.no_grad():
                self._features = _checked(method.support_features, self._support)
        self.classes_ = classes
        return self

    def predict_proba(self, query_images: Images) -> torch.Tensor:
        """Scores [n, classes] of each query image (a probability per class, columns in the
        order of `classes_`; the MAML family's as `fewshot predict` gives them), on the CPU;
        ValueError where a transductive `classifier` cannot classify so few queries together
        (its assumption and the classifiers that can, in one line)."""
        if self.model is None or not self.classes_:
            raise ValueError("call fit(support_images, support_labels) before predicting")
        items = _items(query_images, "query_images")
        refusal = query_refusal(self.settings.classifier, len(items), len(self.classes_))
        if refusal:
            raise ValueError(f"classifier {refusal}")
        method, batch = self.model.method, self.batch_size
        with torch.no_grad():
            if self._features is not None and not method.episode_statistics:
                # Converted and embedded `batch_size` at a time (the memory it takes is
                # bounded by that), then classified together as `scores_of` does.
                features = torch.cat(
                    [
                        _checked(method.embed, self._images(items[i : i + batch], "query_images"))
                        for i in range(0, len(items), batch)
                    ]
                )
                scores = _checked(method.classify, self._features, self._shots, features, batch)
            else:  # BatchNorm reads the statistics of all the queries at once: one batch
                query = self._images(items, "query_images")
                if self._features is not None:
                    scores = _checked(method.scores_of, self._features, self._shots, query, batch)
                else:  # the MAML family adapts to the support at every call
                    scores = _checked(method.predict, self._support, self._labels, query, batch)
        return scores.float().cpu()

    def predict(self, query_images: Images) -> list:
        """The predicted label of each query image (one of `classes_`)."""
        best = self.predict_proba(query_images).argmax(dim=1).tolist()
        return [self.classes_[i] for i in best]

    def _load(self, first: Any) -> Model:
        """The model, loaded anew: the checkpoint's, or the frozen backbone's at the geometry it
        was made for where it says, else the `first` support image's (`image_size` sets the
        side)."""
        if self.backbone is None:
            model = _checked(lambda: checkpoint_model(self.source, self.device))
        else:
            channels, side = _geometry(first)
            made_for = _checked(self.backbone.input_geometry)
            geometry = made_for[0] or channels, self.image_size or made_for[1] or side
            model = _checked(
                lambda: frozen_model(
                    self.backbone, None, None, geometry, self.device, self.settings.amp
                )
            )
        _checked(lambda: self.settings.prepare(model.method, model.config))
        return model

    def _images(self, items: list, name: str) -> torch.Tensor:
        """The images `items` as a normalised float batch on the device at the model's
        geometry, read as negatives where `invert` says (by default, refused where they look
        like the negatives of the model's training images); one ValueError naming the argument
        for anything else."""
        config = self.model.config
        channels, side = config["in_channels"], config["image_size"]
        batch = _as_floats(items, name, channels, side)
        if self.invert is None:
            mismatch = polarity_mismatch(config, batch, self.model.label)
            if mismatch and self.classes_:  # the support passed: it is the queries alone
                raise ValueError(
                    f"{name}: {mismatch}, unlike support_images: give both in one polarity "
                    "(invert=False reads them as they are)"
                )
            if mismatch:
                raise ValueError(
                    f"{name}: {mismatch}: invert=True reads them as negatives (invert=False: "
                    "as they are)"
                )
        elif self.invert:
            batch = 1 - batch
        mean, std = config.get("mean"), config.get("std")
        if mean is None:  # a frozen backbone without constants: this fit's support's, kept
            mean = batch.mean(dim=(0, 2, 3)).tolist()
            std = batch.std(dim=(0, 2, 3)).clamp(min=1e-6).tolist()
            config.update(mean=mean, std=std)
        return normalize_float(batch.to(self.device), mean, std)


class FrozenSettings(ModelSettings):
    """A frozen backbone's test-time settings (its options, weights and normalisation)."""

    @property
    def backbones(self) -> list[str]:
        """Any: the classifier names it apart from these settings."""
        return ["given"]


def _checked(call: Callable[..., Any], *args: Any) -> Any:
    """`call(*args)`, its one-line FewshotError raised as a ValueError (scikit-learn's kind)."""
    try:
        return call(*args)
    except FewshotError as e:
        raise ValueError(str(e)) from None


def _check_count(name: str, value: Any) -> None:
    """Refuse `value` of argument `name` unless it is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _refuse_unused(kind: str, given: dict[str, Any]) -> None:
    """Refuse an argument of `given` that does nothing for a model of `kind` (UNUSED)."""
    names, why = UNUSED[kind]
    for name in names:
        value = given[name]
        if value is not None and not (name in NEUTRAL and value == NEUTRAL[name]):
            raise ValueError(f"{name} does not apply to {why}")


def _constants(name: str, values: Sequence[float] | None) -> tuple[float, ...] | None:
    """`mean` or `std` as a tuple of 1 or 3 finite numbers (std positive), or None."""
    if values is None:
        return None
    try:
        numbers = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be 1 or 3 numbers, got {values!r}") from None
    positive = name != "std" or all(v > 0 for v in numbers)
    if len(numbers) not in (1, 3) or not all(np.isfinite(numbers)) or not positive:
        raise ValueError(f"{name} must be 1 or 3 finite numbers (std > 0), got {values!r}")
    return numbers


def _order(label: Any) -> tuple[str, Any]:
    """A sort key for labels of mixed types (numbers before strings, each by value)."""
    return (type(label).__name__, label)


def _labels(labels: Sequence[Any]) -> list:
    """Labels as a list of hashable values (tensors and arrays as Python numbers)."""
    if isinstance(labels, torch.Tensor | np.ndarray):
        if labels.ndim != 1:
            raise ValueError(f"support_labels must be one label per image, got {labels.shape}")
        return labels.tolist()
    if isinstance(labels, str) or not isinstance(labels, Sequence):
        raise ValueError(
            f"support_labels must be a sequence of labels, got {type(labels).__name__}"
        )
    try:
        [hash(label) for label in labels]
    except TypeError:
        raise ValueError("support_labels must hold hashable labels (str, int, ...)") from None
    return list(labels)


def _items(images: Images, name: str) -> list:
    """The images one by one, at least one: a tensor batch's [C, H, W] tensors (views, not
    copies), or the sequence's items."""
    if isinstance(images, torch.Tensor):
        if images.dim() == 3:  # one image
            _check_shape(images, name)
            return [images]
        if images.dim() != 4:
            raise ValueError(f"{name} must be [N, C, H, W] or [C, H, W], got {tuple(images.shape)}")
        if not len(images):
            raise ValueError(f"{name} holds no image (a tensor of shape {tuple(images.shape)})")
        return list(images)
    if isinstance(images, str | os.PathLike | Image.Image):
        return [images]
    if not isinstance(images, Sequence) or not len(images):
        raise ValueError(f"{name} must be image tensors, PIL images or paths (a non-empty list)")
    return list(images)


def _geometry(first: Any) -> tuple[int, int]:
    """(channels, largest side) of the first support image."""
    if isinstance(first, torch.Tensor):
        _check_shape(first, "support_images")
        return first.shape[0], max(first.shape[1:])
    with _pil(first, "support_images") as img:
        return channels_of(img.mode), max(img.size)


def _pil(item: Any, name: str) -> contextlib.AbstractContextManager[Image.Image]:
    """A PIL image of a path (closed on leaving) or a PIL image (left open: the caller's);
    ValueError naming `name` for anything else."""
    if isinstance(item, Image.Image):
        return contextlib.nullcontext(item)
    if not isinstance(item, str | os.PathLike):
        raise ValueError(
            f"{name} must hold tensors, PIL images or paths, got {type(item).__name__}"
        )
    try:
        return open_image(Path(item))
    except (OSError, ValueError) as e:
        raise ValueError(f"{name}: cannot read image {item}: {e}") from None


def _as_floats(items: list, name: str, channels: int, side: int) -> torch.Tensor:
    """Images in [0, 1] as float32 [N, channels, side, side] (converted and resized)."""
    out = []
    for item in items:
        if isinstance(item, torch.Tensor):
            out.append(_tensor_image(item, name, channels, side))
            continue
        with _pil(item, name) as img:
            pixels = np.asarray(resized(converted(img, "L" if channels == 1 else "RGB"), side))
        tensor = torch.from_numpy(pixels.reshape(side, side, channels).copy())
        out.append(tensor.permute(2, 0, 1).float().div(255))
    return torch.stack(out)


def _tensor_image(image: torch.Tensor, name: str, channels: int, side: int) -> torch.Tensor:
    """One image tensor [C, H, W] (uint8, or float in [0, 1]) at the model's geometry."""
    _check_shape(image, name)
    if image.dtype == torch.uint8:
        image = image.float().div(255)
    elif image.dtype in FLOATS:
        image = image.float()
        low, high = float(image.min()), float(image.max())
        if not (low >= 0 and high <= 1):
            raise ValueError(
                f"{name}: float images must be in [0, 1] (uint8 in 0..255), got values in "
                f"[{low:.3g}, {high:.3g}]"
            )
    else:
        raise ValueError(f"{name}: images must be uint8 or float, got {image.dtype}")
    if image.shape[0] != channels:  # grayscale repeated, or colour as luminance (ITU-R 601)
        weights = torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)
        image = image.expand(3, -1, -1) if channels == 3 else (image * weights).sum(0, True)
    if image.shape[1:] != (side, side):
        image = F.interpolate(image[None], (side, side), mode="bilinear", antialias=True)[0]
    return image.clamp(0, 1)


def _check_shape(image: torch.Tensor, name: str) -> None:
    """Refuse an image tensor of argument `name` unless [C, H, W], 1 or 3 channels, H, W >= 1."""
    if image.dim() != 3 or image.shape[0] not in (1, 3) or not image.shape[1:].numel():
        raise ValueError(
            f"{name}: an image must be [C, H, W] with 1 or 3 channels and H, W >= 1, got "
            f"{tuple(image.shape)}"
        )
