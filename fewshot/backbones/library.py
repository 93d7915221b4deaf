"""Backbones by name from timm and torchvision: `timm:NAME`, `torchvision:NAME`.

The library's model with its classifier removed, so it returns features [B, out_dim] like this
package's own backbones, and the input it was made for (square side, per-channel mean and std)
from timm's pretrained config or torchvision's weights transforms. timm is an optional
dependency (`pip install 'fewshot[timm]'`), imported only when such a name is asked for.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import torch
from torch import nn

from fewshot.backbones.arguments import require_bool, require_images, require_int
from fewshot.runtime.errors import FewshotError, summary

LIBRARIES = ("timm", "torchvision")
# Seconds a connection to the weights' host may take before the network counts as absent.
PROBE_TIMEOUT = 5.0


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


def _weights_source(module: ModuleType, library: str, model: str) -> tuple[str, bool] | None:
    """Where the library fetches the model's pretrained weights from: (URL, True) for timm's
    Hugging Face hub, (URL, False) for a file URL (torch.hub's cache); None where it names
    none (the library then says so itself)."""
    if library == "timm":
        config = module.models.get_pretrained_cfg(model)
        if config is not None and config.hf_hub_id:
            from huggingface_hub import constants

            return constants.ENDPOINT, True
        return (config.url, False) if config is not None and config.url else None
    try:
        return module.models.get_model_weights(model).DEFAULT.url, False
    except (ValueError, AttributeError):  # a model without published weights
        return None


def _reachable(url: str) -> bool:
    """Whether the host of `url` takes a connection within PROBE_TIMEOUT seconds; through a
    proxy (which the libraries use, and this probe cannot) it is taken to."""
    if urllib.request.getproxies():
        return True
    parts = urlsplit(url)
    port = parts.port or (80 if parts.scheme == "http" else 443)
    try:
        socket.create_connection((parts.hostname, port), timeout=PROBE_TIMEOUT).close()
    except OSError:
        return False
    return True


def _in_torch_hub_cache(url: str) -> bool:
    """Whether torch.hub already holds the file of `url` (it then reads it, fetching nothing)."""
    name = os.path.basename(urlsplit(url).path)
    return os.path.isfile(os.path.join(torch.hub.get_dir(), "checkpoints", name))


def _unfetched(name: str, cause: str) -> FewshotError:
    """The one line for weights that cannot be fetched: how to give them instead."""
    return FewshotError(
        f"{name!r} with pretrained: true cannot fetch the library's weights ({cause}): download "
        "them where there is a network and pass the file with --backbone-weights FILE"
    )


@contextlib.contextmanager
def _fetching(name: str, source: tuple[str, bool] | None) -> Iterator[None]:
    """Around a build that fetches the library's weights: with no network, only weights the
    library already holds are read (timm's hub told it is offline, so it fails at once rather
    than after a minute of retries); a fetch that fails is one line naming
    --backbone-weights."""
    offline = source is not None and not _reachable(source[0])
    absent = f"no connection to {urlsplit(source[0]).hostname}" if source else ""
    if offline and not source[1] and not _in_torch_hub_cache(source[0]):
        raise _unfetched(name, absent)  # before torch.hub prints "Downloading" and waits
    hub = None
    if offline and source[1]:
        from huggingface_hub import constants as hub

        was_offline, hub.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE, True
    try:
        yield
    except OSError as e:  # urllib's URLError, the hub's errors (not in its cache), a full disk
        raise _unfetched(name, absent if offline else summary(e)) from None
    finally:
        if hub is not None:
            hub.HF_HUB_OFFLINE = was_offline


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
    which, torchvision takes its default weights; without a network, those the library holds
    already, else one line naming --backbone-weights); a build on the meta device fetches
    nothing.
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
        fetching = (
            _fetching(name, _weights_source(module, library, model))
            if fetch
            else contextlib.nullcontext()
        )
        try:
            if library == "timm":
                with fetching:
                    built = _timm_model(module, model, in_channels, fetch, options)
            else:
                if in_channels not in (1, 3):
                    raise ValueError(f"{name!r} takes 1 or 3 channels, got {in_channels}")
                self.repeat = 3 // in_channels
                with fetching:
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
