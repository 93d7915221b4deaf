"""Embedding networks: plain nn.Modules with an `out_dim` attribute.

Another package's backbone joins by an entry point of the group `fewshot.backbones` naming its
nn.Module class, constructed as cls(in_channels=C, image_size=S, **backbone_options); its
features are checked on its first batch.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fewshot.backbones.conv4 import Conv4
from fewshot.backbones.library import LibraryBackbone, library_name
from fewshot.backbones.resnet12 import ResNet12
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.plugins import RegistryNames, described, require_signature
from fewshot.runtime.shapes import describe_tensor

BACKBONES: dict[str, type[nn.Module]] = {"conv4": Conv4, "resnet12": ResNet12}
# Training settings a backbone starts from with a head (under a method's own, config files and
# flags). ResNet-12's features are large: unnormalised squared distances made SGD 0.1 diverge
# within 5 steps, so its ProtoNet divides them by the dimension, as MetaOptNet's does.
TRAINING_DEFAULTS: dict[str, dict[str, dict]] = {
    "resnet12": {"protonet": {"head_options": {"normalize_by_dim": True}}},
}
# timm's and torchvision's models give large unnormalised features too (timm's resnet10t on
# Omniglot: loss 2e13 in 20 SGD 0.1 steps without the division, 1.4 with it).
LIBRARY_TRAINING_DEFAULTS = TRAINING_DEFAULTS["resnet12"]


def training_defaults(name: str) -> dict[str, dict]:
    """The training settings backbone `name` starts from, per head (TRAINING_DEFAULTS, or
    LIBRARY_TRAINING_DEFAULTS for timm:NAME and torchvision:NAME)."""
    return LIBRARY_TRAINING_DEFAULTS if library_name(name) else TRAINING_DEFAULTS.get(name, {})


def _adopt_backbone(name: str, plugin: object) -> None:
    """Register a plug-in backbone; TypeError unless it is an nn.Module class constructed with
    in_channels and image_size."""
    if not (isinstance(plugin, type) and issubclass(plugin, nn.Module)):
        raise TypeError(f"must name an nn.Module class, not {described(plugin)}")
    require_signature(
        plugin,
        "an nn.Module class taking in_channels and image_size, its options with defaults",
        in_channels=1,
        image_size=1,
    )
    BACKBONES[name] = plugin


_NAMES = RegistryNames("fewshot.backbones", "backbone", BACKBONES.keys(), _adopt_backbone)


def backbone_names() -> RegistryNames:
    """The names of BACKBONES: `name in backbone_names()` also finds and registers a plug-in
    backbone (entry point group `fewshot.backbones`)."""
    return _NAMES


def build_backbone(name: str, in_channels: int, image_size: int, **options) -> nn.Module:
    """Construct a backbone by name for images of `in_channels` x `image_size` x `image_size`:
    one of BACKBONES or a plug-in's, or a library's model as timm:NAME or torchvision:NAME
    (LibraryBackbone)."""
    if library_name(name):
        return LibraryBackbone(name, in_channels=in_channels, image_size=image_size, **options)
    if name not in _NAMES:
        raise FewshotError(
            f"unknown backbone {name!r}; choose from {', '.join(BACKBONES)}, timm:NAME or "
            "torchvision:NAME"
        )
    built = BACKBONES[name](in_channels=in_channels, image_size=image_size, **options)
    if not (isinstance(getattr(built, "out_dim", None), int) and built.out_dim > 0):
        # A plug-in's: the methods and the memory estimates read the embedding's size.
        raise FewshotError(f"backbone {name!r} has no out_dim attribute (a positive integer)")
    shape = getattr(built, "feature_map", None)
    if shape is not None and not (
        isinstance(shape, tuple)
        and len(shape) == 3
        and all(isinstance(v, int) and v > 0 for v in shape)
        and math.prod(shape) == built.out_dim
    ):  # a plug-in's: Relation Networks read its features as maps of this shape
        raise FewshotError(
            f"{_NAMES.label(name)} has feature_map {shape!r}, not the (channels, height, width) "
            f"of its {built.out_dim} features (out_dim)"
        )
    # The geometry it was built for, which the memory estimates read (a plug-in need not
    # keep it itself).
    built.in_channels, built.image_size = in_channels, image_size
    if _NAMES.plugin(name) is not None:
        _check_first_features(built, name)
    return built


def _check_first_features(backbone: nn.Module, name: str) -> None:
    """Check plug-in backbone `name`'s features on its first batch (wherever it runs first:
    the memory estimate's blank images, a training step, an evaluation): float [N, out_dim]
    for N images, else refused in one line naming it, what it returned and its out_dim,
    before a method reads them (a vector per image of another length, or a number)."""

    def check(module: nn.Module, args: tuple, features: object) -> None:
        want = (len(args[0]), module.out_dim)
        if not (
            isinstance(features, torch.Tensor)
            and features.is_floating_point()
            and features.shape == want
        ):
            raise FewshotError(
                f"{_NAMES.label(name)} returned {describe_tensor(features)} for {want[0]} "
                f"images; a backbone returns float features [N, out_dim] = {list(want)} (its "
                f"out_dim is {module.out_dim})"
            )
        handle.remove()  # checked: no cost on the batches after

    handle = backbone.register_forward_hook(check)


__all__ = [
    "BACKBONES",
    "TRAINING_DEFAULTS",
    "Conv4",
    "LibraryBackbone",
    "ResNet12",
    "backbone_names",
    "build_backbone",
    "library_name",
    "training_defaults",
]
