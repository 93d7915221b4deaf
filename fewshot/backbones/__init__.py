"""Embedding networks: plain nn.Modules with an `out_dim` attribute."""

from __future__ import annotations

from torch import nn

from fewshot.backbones.conv4 import Conv4
from fewshot.backbones.resnet12 import ResNet12
from fewshot.runtime.errors import FewshotError

BACKBONES = {"conv4": Conv4, "resnet12": ResNet12}
# Training settings a backbone starts from with a head (under a method's own, config files and
# flags). ResNet-12's features are large: unnormalised squared distances made SGD 0.1 diverge
# within 5 steps, so its ProtoNet divides them by the dimension, as MetaOptNet's does.
TRAINING_DEFAULTS: dict[str, dict[str, dict]] = {
    "resnet12": {"protonet": {"head_options": {"normalize_by_dim": True}}},
}


def build_backbone(name: str, in_channels: int, image_size: int, **options) -> nn.Module:
    """Construct a backbone by name for images of `in_channels` x `image_size` x `image_size`."""
    if name not in BACKBONES:
        raise FewshotError(f"unknown backbone {name!r}; choose from {', '.join(BACKBONES)}")
    return BACKBONES[name](in_channels=in_channels, image_size=image_size, **options)


__all__ = ["BACKBONES", "TRAINING_DEFAULTS", "Conv4", "ResNet12", "build_backbone"]
