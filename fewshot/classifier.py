"""`FewShotClassifier`: any model of the library classifying images in memory, scikit-learn style.

    clf = fewshot.FewShotClassifier("timm:resnet18", backbone_weights="resnet18.pth")
    clf.fit(support_images, ["cat", "cat", "dog", "dog"])
    clf.predict(query_images)        # ['dog', 'cat', ...]
    clf.predict_proba(query_images)  # tensor [n, 2], columns in clf.classes_ order

The model is a checkpoint (or run folder), a frozen backbone's name, or an `nn.Module` mapping
images to features; images are tensors ([N, C, H, W] or [C, H, W]; uint8 in 0..255 or float in
[0, 1]), PIL images or image paths, brought to the model's geometry and normalisation as
`fewshot predict` brings image files. Classification is `fewshot predict`'s: the same scores.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
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
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.methods.pmf import PMF
from fewshot.runtime.device import resolve_device
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.settings import build
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
    else the first support image's).
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
    ):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if image_size is not None and (not isinstance(image_size, int) or image_size < 1):
            raise ValueError(f"image_size must be an integer >= 1, got {image_size!r}")
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
        self.batch_size, self.image_size = batch_size, image_size
        self.device = _checked(lambda: resolve_device(device))
        frozen = isinstance(model, nn.Module) or names_backbone(os.fspath(model))
        values = {"amp": amp, "classifier": classifier}
        values["classifier_options"] = dict(classifier_options or {})
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
                module=model,
                image_size=image_size,
                mean=tuple(mean) if mean is not None else None,
                std=tuple(std) if std is not None else None,
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
        MAML family adapts at each `predict`); returns the classifier."""
        labels = _labels(support_labels)
        if self.model is None:
            self.model = self._load(support_images)
        support = self._images(support_images, "support_images")
        if len(labels) != len(support):
            raise ValueError(
                f"support_labels has {len(labels)} labels for {len(support)} support_images"
            )
        self.classes_ = sorted(set(labels), key=_order)
        if len(self.classes_) < 2:
            raise ValueError(f"support_labels must hold two classes or more, got {self.classes_}")
        index = {label: i for i, label in enumerate(self.classes_)}
        numbered = torch.tensor([index[label] for label in labels])
        order = torch.argsort(numbered, stable=True)  # class by class, as the heads read them
        self._labels, self._support = numbered[order].to(self.device), support[order]
        self._shots = torch.bincount(numbered).tolist()
        method = self.model.method
        _checked(lambda: method.check_way(len(self._shots)))
        shot = self._shots[0] if len(set(self._shots)) == 1 else None
        _checked(lambda: method.check_shot(shot))
        self._features = None
        if isinstance(method, EmbeddingMethod):  # its features serve every later predict
            with torch.no_grad():
                self._features = _checked(lambda: method.support_features(self._support))
        return self

    def predict_proba(self, query_images: Images) -> torch.Tensor:
        """Scores [n, classes] of each query image (a probability per class, columns in the
        order of `classes_`; the MAML family's as `fewshot predict` gives them), on the CPU."""
        if self.model is None or not self.classes_:
            raise ValueError("call fit(support_images, support_labels) before predicting")
        query = self._images(query_images, "query_images")
        method, batch = self.model.method, self.batch_size
        with torch.no_grad():
            if self._features is not None:
                scores = _checked(
                    lambda: method.scores_of(self._features, self._shots, query, batch)
                )
            else:  # the MAML family adapts to the support at every call
                scores = _checked(lambda: method.predict(self._support, self._labels, query, batch))
        return scores.float().cpu()

    def predict(self, query_images: Images) -> list:
        """The predicted label of each query image (one of `classes_`)."""
        best = self.predict_proba(query_images).argmax(dim=1).tolist()
        return [self.classes_[i] for i in best]

    def _load(self, first: Images) -> Model:
        """The model: the checkpoint's, or the frozen backbone's at the geometry it was made
        for where it says, else the first support image's (`image_size` sets the side)."""
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

    def _images(self, images: Images, name: str) -> torch.Tensor:
        """`images` as a normalised float batch on the device at the model's geometry; one
        ValueError naming the argument for anything else."""
        config = self.model.config
        channels, side = config["in_channels"], config["image_size"]
        batch = _as_floats(images, name, channels, side)
        mean, std = config.get("mean"), config.get("std")
        if mean is None:  # a frozen backbone without constants: the first support's, kept
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


def _checked(call: Any) -> Any:
    """`call()`, its one-line FewshotError raised as a ValueError (scikit-learn's kind)."""
    try:
        return call()
    except FewshotError as e:
        raise ValueError(str(e)) from None


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
    """The images one by one: a tensor batch's [C, H, W] tensors, or the sequence's items."""
    if isinstance(images, torch.Tensor):
        if images.dim() == 3:
            return [images]
        if images.dim() != 4:
            raise ValueError(f"{name} must be [N, C, H, W] or [C, H, W], got {tuple(images.shape)}")
        return list(images)
    if isinstance(images, str | os.PathLike | Image.Image):
        return [images]
    if not isinstance(images, Sequence) or not len(images):
        raise ValueError(f"{name} must be image tensors, PIL images or paths (a non-empty list)")
    return list(images)


def _geometry(images: Images) -> tuple[int, int]:
    """(channels, largest side) of the first image."""
    first = _items(images, "support_images")[0]
    if isinstance(first, torch.Tensor):
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


def _as_floats(images: Images, name: str, channels: int, side: int) -> torch.Tensor:
    """Images in [0, 1] as float32 [N, channels, side, side] (converted and resized)."""
    out = []
    for item in _items(images, name):
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
    if image.dim() != 3 or image.shape[0] not in (1, 3):
        raise ValueError(
            f"{name}: an image must be [C, H, W] with 1 or 3 channels, got {tuple(image.shape)}"
        )
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
