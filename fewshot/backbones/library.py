"""Backbones by name from timm and torchvision: `timm:NAME`, `torchvision:NAME`.

The library's model with its classifier removed, so it returns features [B, out_dim] like this
package's own backbones, and the input it was made for (square side, per-channel mean and std)
from timm's pretrained config or torchvision's weights transforms. timm is an optional
dependency (`pip install 'fewshot[timm]'`), imported only when such a name is asked for.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import nn

from fewshot.backbones.arguments import require_bool, require_images, require_int
from fewshot.runtime.errors import summary

LIBRARIES = ("timm", "torchvision")


@dataclass(frozen=True)
class ModelInput:
    """The input a library model was made for: its square side and per-channel mean and std of
    images in [0, 1] (three channels)."""

    side: int
    mean: tuple[float, ...]
    std: tuple[float, ...]


def library_name(name: str) -> tuple[str, str] | None:
    """('timm', 'resnet18') for 'timm:resnet18'; None for a name without a library prefix."""
    library, colon, model = name.partition(":")
    return (library, model) if colon and library in LIBRARIES else None


def _import(library: str, name: str) -> ModuleType:
    """The library module (imported only now: timm takes seconds), or a ValueError saying how
    to install it."""
    try:
        if library == "timm":
            import timm

            return timm
        import torchvision.models

        return torchvision
    except ImportError:
        raise ValueError(
            f"{name!r} needs {library}, which is not installed: pip install 'fewshot[{library}]'"
        ) from None


def _unknown(name: str, model: str, known: list[str]) -> ValueError:
    """'NAME is not a LIBRARY model', with the closest known names."""
    library = name.partition(":")[0]
    close = difflib.get_close_matches(model, known, n=3)
    hint = f"; close names: {', '.join(close)}" if close else ""
    return ValueError(f"{name!r} is not a {library} model{hint}")


def check_library_name(name: str) -> None:
    """Refuse (ValueError, one line) a name whose library is not installed or has no such
    model (timm: with its pretrained tag, e.g. vit_small_patch16_224.dino)."""
    library, model = _split(name)
    module = _import(library, name)
    if library == "timm":
        if not module.is_model(model):
            raise _unknown(name, model, module.list_models())
        try:  # the pretrained tag after the dot, if any
            module.models.get_pretrained_cfg(model)
        except RuntimeError:
            raise _unknown(name, model, module.list_pretrained(model.split(".")[0] + "*")) from None
    elif model not in module.models.list_models(module=module.models):
        raise _unknown(name, model, module.models.list_models(module=module.models))


def _split(name: str) -> tuple[str, str]:
    """(library, model) of a library backbone's name, or ValueError."""
    parts = library_name(name)
    if parts is None or not parts[1]:
        raise ValueError(f"a library backbone is timm:NAME or torchvision:NAME, got {name!r}")
    return parts


def model_input(name: str, options: dict[str, Any] | None = None) -> ModelInput | None:
    """The input size and normalisation of a library model (timm's pretrained config,
    torchvision's default weights' transforms), None where the library gives none; read
    without building the model. A timm `img_size` option is the side the model is built for."""
    check_library_name(name)
    library, model = _split(name)
    module = _import(library, name)
    if library == "timm":
        config = module.models.get_pretrained_cfg(model)
        if config is None:
            return None
        side = (options or {}).get("img_size", config.input_size[-1])
        side = side if isinstance(side, int) else config.input_size[-1]
        return ModelInput(side, tuple(config.mean), tuple(config.std))
    try:
        transforms = module.models.get_model_weights(model).DEFAULT.transforms()
    except (ValueError, AttributeError):  # a model without published weights
        return None
    return ModelInput(transforms.crop_size[0], tuple(transforms.mean), tuple(transforms.std))


def _timm_model(module: ModuleType, model: str, in_channels: int, fetch: bool, options: dict):
    """A timm model without its classifier (num_classes 0), and the classifier's name."""
    network = module.create_model(
        model, pretrained=fetch, num_classes=0, in_chans=in_channels, **options
    )
    classifier = network.pretrained_cfg.get("classifier") or ()
    return network, (classifier,) if isinstance(classifier, str) else tuple(classifier)


def _torchvision_model(
    module: ModuleType, name: str, model: str, side: int, fetch: bool, options: dict
):
    """A torchvision classification model with its last linear layer (the classifier) replaced
    by an identity, and that layer's name."""
    if model.startswith("vit_"):  # built for one image size (its position embeddings): `side`
        options = {**options, "image_size": side}
    network = module.models.get_model(model, weights="DEFAULT" if fetch else None, **options)
    linear = [n for n, m in network.named_modules() if isinstance(m, nn.Linear)]
    if not linear:
        raise ValueError(f"{name!r} has no linear classifier to remove")
    parent, _, child = linear[-1].rpartition(".")
    setattr(network.get_submodule(parent), child, nn.Identity())
    return network, (linear[-1],)


class LibraryBackbone(nn.Module):
    """A timm or torchvision model by name, without its classifier: images [B, C, H, W] ->
    features [B, out_dim].

    `pretrained` fetches the library's weights (network access; timm's tag in the name picks
    which, torchvision takes its default weights); a build on the meta device fetches nothing.
    Other options go to `timm.create_model` or `torchvision.models.get_model`. A torchvision
    model takes grayscale images with the channel repeated three times; timm builds its first
    layer for `in_channels`. `model_input` is what the model was made for (None if unknown).
    """

    def __init__(
        self,
        name: str,
        in_channels: int = 3,
        image_size: int = 224,
        pretrained: bool = False,
        **options: Any,
    ):
        super().__init__()
        require_int(name, "in_channels", in_channels, 1)
        require_int(name, "image_size", image_size, 1)
        require_bool(name, "pretrained", pretrained)
        check_library_name(name)
        library, model = _split(name)
        module = _import(library, name)
        # Shapes only on the meta device (settings checks, memory estimates): no download.
        fetch = pretrained and torch.empty(0).device.type != "meta"
        self.name, self.in_channels, self.image_size = name, in_channels, image_size
        self.repeat = 1
        try:
            if library == "timm":
                built = _timm_model(module, model, in_channels, fetch, options)
            else:
                if in_channels not in (1, 3):
                    raise ValueError(f"{name!r} takes 1 or 3 channels, got {in_channels}")
                self.repeat = 3 // in_channels
                built = _torchvision_model(module, name, model, image_size, fetch, options)
        except TypeError as e:  # an option the model's constructor does not take
            raise ValueError(f"{name!r} options {sorted(options)}: {summary(e)}") from None
        except AssertionError as e:  # a constructor's check of the size (torchvision's ViT)
            raise ValueError(
                f"{name!r} cannot take {in_channels}x{image_size}x{image_size} images: {summary(e)}"
            ) from None
        self.model, self.classifier = built
        self.model_input = model_input(name, options)
        self.out_dim = self._feature_dim()

    @torch.no_grad()
    def _feature_dim(self) -> int:
        """The feature length, from one eval-mode forward of a blank image (which changes no
        state); a ValueError names the image size the model cannot take."""
        parameter = next(self.model.parameters())
        side = self.image_size
        blank = torch.zeros(1, self.in_channels, side, side, device=parameter.device)
        was_training = self.training
        try:
            self.eval()
            features = self(blank.to(parameter.dtype))
        except (RuntimeError, AssertionError, ValueError) as e:
            raise ValueError(
                f"{self.name!r} cannot take {self.in_channels}x{side}x{side} images: {summary(e)}"
            ) from None
        finally:
            self.train(was_training)
        return features.shape[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Embed images [B, C, H, W] into [B, out_dim]."""
        require_images(self.name, x, self.in_channels, 1)
        features = self.model(x.expand(-1, 3, -1, -1) if self.repeat > 1 else x)
        # torchvision's GoogLeNet and Inception return (main, auxiliary outputs) in training.
        features = features[0] if isinstance(features, tuple) else features
        return features.flatten(1)

    def weight_keys(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A state dict of the library's model (as the library saves it) keyed as this
        module's, without the removed classifier's entries."""
        return {
            f"model.{key}": value
            for key, value in state.items()
            if not any(key.startswith(f"{c}.") for c in self.classifier)
        }
