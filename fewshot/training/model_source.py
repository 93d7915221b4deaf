"""What a test-time command classifies with: a fewshot checkpoint, or a frozen backbone.

A frozen backbone (`--backbone NAME` with `--backbone-weights FILE` or `--backbone-options`, or
an `nn.Module` from Python) is resolved into what a checkpoint gives: a method in eval mode, the
settings it reads images with (geometry, normalisation, the data set it is evaluated on), and
the identity its results record (name, options and the SHA-256 of its weights), so that every
classifier, the caches, `compare`'s pairing and the result records serve it unchanged. It is a
pretrained model with no classifier of its own: nearest centroid unless `--classifier` says.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fewshot.backbones import build_backbone, library_name
from fewshot.backbones.library import model_input
from fewshot.datasets import FOLDER, dataset_geometry, resolve_data_root
from fewshot.methods.base import Method
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.methods.feature_cache import backbone_digest
from fewshot.runtime.cache import cache_folder
from fewshot.runtime.errors import FewshotError, summary
from fewshot.runtime.io import check_writable, file_sha256
from fewshot.training.checkpoint import (
    BATCHNORM_STATS,
    checkpoint_file,
    fit_weights,
    load_trained,
    normalization,
    weights_file,
)

# A frozen backbone has no trained classifier: it classifies by this test-time one by default.
DEFAULT_CLASSIFIER = "centroid"
# Names given to an nn.Module passed from Python (a command line cannot name one).
MODULE_PREFIX = "module:"
NORMALIZATIONS = ("auto", "dataset", "backbone")
# The modules given from Python for the call in progress, by the names its settings use.
_GIVEN: dict[str, Backbone] = {}
# Where a fewshot checkpoint keeps its backbone's weights: the embedding and comparison methods'
# `backbone`, the MAML family's functional network's.
BACKBONE_PREFIXES = ("backbone.", "network.backbone.")
# The seed of a frozen backbone's initialisation where no weights are given (a random floor).
INIT_SEED = 0


@dataclass
class Model:
    """A model ready for test episodes: the method (eval mode, on its device), the settings it
    reads images with (`load_trained`'s keys), how messages name it, what results record of it
    (`identity`), and its checkpoint file (None for a frozen backbone)."""

    method: Method
    config: dict
    label: str
    identity: dict
    checkpoint: Path | None = None

    @property
    def frozen(self) -> bool:
        """Whether this is a frozen backbone rather than a checkpoint."""
        return self.checkpoint is None


@contextlib.contextmanager
def given_modules(backbones: list[Backbone]) -> Iterator[None]:
    """Within it, settings that name these modules' backbones (`module:NAME`) find them."""
    _GIVEN.update({backbone.name: backbone for backbone in backbones})
    try:
        yield
    finally:
        for backbone in backbones:
            _GIVEN.pop(backbone.name, None)


def given_module(name: str) -> Backbone | None:
    """The module given from Python under `name`, if any; a `module:` name without one is
    refused (only Python code can give a module)."""
    if name in _GIVEN:
        return _GIVEN[name]
    if name.startswith(MODULE_PREFIX):
        raise FewshotError(
            f"--backbone {name}: a module: name stands for an nn.Module given from Python "
            "(fewshot.evaluate(backbone=module)); the command line takes a backbone's name"
        )
    return None


def checkpoint_model(path: str | Path, device: torch.device) -> Model:
    """The model of a fewshot checkpoint (or a run folder's best.pt)."""
    checkpoint = checkpoint_file(path)
    method, config = load_trained(checkpoint, device)
    identity = {"checkpoint": str(checkpoint), "checkpoint_sha256": file_sha256(checkpoint)}
    return Model(method, config, str(checkpoint), identity, checkpoint)


@dataclass(frozen=True)
class Backbone:
    """A frozen backbone as a command names it: a registered or library name with its
    options and weights file, or a module from Python (`module`, named `name`) with the input
    it takes where the module does not say (`image_size`, `mean`, `std`)."""

    name: str
    options: dict = field(default_factory=dict)
    weights: str | None = None
    normalization: str = "auto"
    module: nn.Module | None = None
    image_size: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    @property
    def label(self) -> str:
        """How messages name it: `--backbone NAME`, or the module's name."""
        return self.name if self.module is not None else f"--backbone {self.name}"

    def input_geometry(self) -> tuple[int | None, int | None]:
        """(channels, side) the backbone was made for, each None where it does not say: the
        checkpoint that lends its weights (both), a library model's config, timm's
        `pretrained_cfg` or an `image_size` of a module (the side)."""
        given = self._given_input()
        side = self.image_size or (given[1] if given else None)
        return (given[0] if given else None), side

    def _given_input(self) -> tuple[int | None, int, tuple, tuple] | None:
        """(channels or None, side, mean, std) the backbone says it takes, or None."""
        if self.module is not None:
            config = getattr(self.module, "pretrained_cfg", None)  # a timm model's
            if isinstance(config, dict) and {"input_size", "mean", "std"} <= set(config):
                size, mean, std = config["input_size"], config["mean"], config["std"]
                return size[0], size[-1], tuple(mean), tuple(std)
            given = getattr(self.module, "model_input", None)  # fewshot's LibraryBackbone
            return (None, given.side, given.mean, given.std) if given is not None else None
        lent = lent_config(self.weights) if self.weights else None
        if lent is not None:  # as the model was trained: its geometry and normalisation
            scale = normalization(lent, lent.get("dataset"), self.weights)
            mean, std = tuple(scale.get("mean", ())), tuple(scale.get("std", ()))
            return lent.get("in_channels"), lent.get("image_size"), mean, std
        if not library_name(self.name):
            return None
        try:
            given = model_input(self.name, self.options)
        except ValueError as e:  # a misspelt name, read here first for a folder's geometry
            raise FewshotError(f"--backbone {self.name}: {e}") from None
        return (None, given.side, given.mean, given.std) if given else None

    def own_normalization(self, channels: int) -> tuple[tuple, tuple] | None:
        """The backbone's own (mean, std) for `channels`-channel images as --normalization
        chooses (auto: where it has them), else None: the data's apply."""
        if self.normalization == "dataset":
            return None
        if self.mean is not None and self.std is not None:
            given = (None, 0, self.mean, self.std)
        else:
            given = self._given_input()
        if given is None or len(given[2]) != channels:
            if self.normalization == "backbone":
                raise FewshotError(
                    f"--normalization backbone: {self.label} gives no mean and std for "
                    f"{channels}-channel images"
                )
            return None
        return tuple(given[2]), tuple(given[3])

    def build(self, geometry: tuple[int, int], device: torch.device) -> tuple[nn.Module, bool]:
        """The backbone for (channels, side) images with its weights, frozen in eval mode on
        `device`, and whether it keeps no BatchNorm statistics of its own (a MAML-family
        backbone: each episode's are used); one line on an unknown name, options or images
        it cannot take, or weights that do not fit, before any image is embedded."""
        if self.module is not None:
            self.module.to(device).eval()
            return GivenModule(self.module, *geometry, self.name).to(device), False
        try:
            with torch.device("meta"):  # shapes only: a bad name or option costs nothing
                shapes = build_backbone(self.name, *geometry, **self._no_fetch()).state_dict()
        except TypeError as e:  # an option the constructor does not take
            raise FewshotError(f"--backbone-options for {self.name}: {summary(e)}") from None
        except ValueError as e:
            raise FewshotError(f"--backbone {self.name}: {e}") from None
        want = {key: value.shape for key, value in shapes.items()}
        state, no_statistics = None, False
        if self.weights:
            state = weights_file(self.weights)
            if "config" in state and "model" in state:
                state = self._checkpoint_backbone(state)
                no_statistics = not any(key.endswith(BATCHNORM_STATS) for key in state)
                if no_statistics:  # the fresh ones stay, unused: each episode's normalise
                    want = {k: v for k, v in want.items() if not k.endswith(BATCHNORM_STATS)}
            state = fit_weights(state, self.weights, self.name, self.options, geometry, want)
        try:
            with torch.random.fork_rng(devices=[]):  # weights without a file: seeded, the
                torch.manual_seed(INIT_SEED)  # same backbone in every command
                backbone = build_backbone(self.name, *geometry, **self.options)
        except (ValueError, TypeError) as e:
            raise FewshotError(f"--backbone {self.name}: {summary(e)}") from None
        if state is not None:
            backbone.load_state_dict(state, strict=not no_statistics)
        return backbone.to(device).eval(), no_statistics

    def _checkpoint_backbone(self, ckpt: dict) -> dict:
        """The backbone's entries of a fewshot checkpoint (as `--backbone-weights`), refused
        in one line when its backbone is not this one (another name or options)."""
        config = ckpt["config"] if isinstance(ckpt["config"], dict) else {}
        name, options = config.get("backbone"), config.get("backbone_options", {})
        if (name, options) != (self.name, self._no_fetch()):
            raise FewshotError(
                f"--backbone-weights {self.weights} is the checkpoint of a {name} backbone with "
                f"options {json.dumps(options)}; give --backbone {name} --backbone-options "
                f"'{json.dumps(options)}'"
            )
        model = ckpt["model"] if isinstance(ckpt["model"], dict) else {}
        for prefix in BACKBONE_PREFIXES:
            state = {k.removeprefix(prefix): v for k, v in model.items() if k.startswith(prefix)}
            if state:
                return state
        raise FewshotError(f"--backbone-weights {self.weights}: the checkpoint has no backbone")

    def _no_fetch(self) -> dict:
        """The options without `pretrained` (a meta-device build fetches nothing anyway)."""
        return {k: v for k, v in self.options.items() if k != "pretrained"}

    def identity(self, built: nn.Module) -> dict:
        """Everything that decides the features it computes, as results record it (and the
        feature cache is keyed by: `features_identity`): its name, options, the SHA-256 of the
        `built` backbone's class, weights and buffers (a random initialisation, a library's
        download, a file's or a module's weights alike) and of its weights file, whose path is
        recorded beside; its normalisation where chosen; a module's class and structure."""
        record: dict[str, Any] = {"backbone": self.name, "backbone_options": self.options}
        record["backbone_sha256"] = backbone_digest(built, "")
        if self.weights:
            record["backbone_weights"] = str(self.weights)
            record["backbone_weights_sha256"] = file_sha256(self.weights)
        if self.normalization != "auto":
            record["normalization"] = self.normalization
        if self.module is not None:
            record.update(module_identity(self.module))
        return record


def module_identity(module: nn.Module) -> dict:
    """What identifies a module's computation as far as it can be read: its class (module and
    name) and its structure (the SHA-256 of its repr: layers and their settings); what its
    forward does with plain attributes cannot be read, so its features are not kept on disk."""
    kind = type(module)
    structure = hashlib.sha256(repr(module).encode()).hexdigest()
    return {"module_class": f"{kind.__module__}.{kind.__qualname__}", "module_structure": structure}


def features_identity(identity: dict) -> str:
    """The part of a model's identity that decides its features (not the paths it names) as
    one string, for the feature cache's key: the one identity results record, so that an
    option added to it cannot be left out of the key."""
    kept = {key: value for key, value in identity.items() if key not in IDENTITY_PATHS}
    return json.dumps(kept, sort_keys=True)


# The paths an identity records beside their files' SHA-256: where a file was, not what it is.
IDENTITY_PATHS = ("backbone_weights", "checkpoint")


def frozen_model(
    backbone: Backbone,
    dataset: str | None,
    data_root: str | None,
    geometry: tuple[int, int],
    device: torch.device,
    amp: str = "auto",
) -> Model:
    """A frozen backbone as a model for images of `geometry` (channels, side), read from
    `dataset` (None: images without a data set, as predict's) and normalised with the
    backbone's own constants where it has them (else the data's own)."""
    built, no_statistics = backbone.build(geometry, device)
    # Nearest centroid (DEFAULT_CLASSIFIER) as a pretrained model classifies: the prototype
    # head at a fixed scale of 1, which --classifier replaces and pmf fine-tunes through.
    method = EmbeddingMethod(built, "protonet", amp=amp).to(device).eval()
    if no_statistics:  # as the MAML family normalises: each episode's statistics
        method.use_episode_statistics(backbone_only=True)
    method.source = backbone.label
    config: dict[str, Any] = {
        "stage": "frozen",
        "dataset": dataset,
        "train_split": "train",
        "val_split": "val",
        "in_channels": geometry[0],
        "image_size": geometry[1],
        "resize": geometry[1] if dataset == FOLDER else None,
        "channels": geometry[0] if dataset == FOLDER else None,
        "data_root": str(resolve_data_root(data_root).resolve()) if dataset == FOLDER else None,
        "backbone": backbone.name,
        "backbone_options": backbone.options,
    }
    scale = backbone.own_normalization(geometry[0])
    if scale is not None:
        config.update(mean=list(scale[0]), std=list(scale[1]))
    identity = backbone.identity(built)
    method.feature_identity = features_identity(identity)
    # A module from Python may compute otherwise with the same class, structure and weights
    # (a plain attribute read by its forward): its features are embedded anew by each command.
    if not no_statistics and backbone.module is None:
        use_feature_cache(method)
    return Model(method, config, backbone.label, identity)


def module_device(module: nn.Module) -> torch.device:
    """The device of a module's first parameter or buffer (the CPU for a module of none)."""
    first = next(itertools.chain(module.parameters(), module.buffers()), None)
    return first.device if first is not None else torch.device("cpu")


class GivenModule(nn.Module):
    """An nn.Module from Python as a backbone: images [B, C, H, W] of one geometry -> flat
    features [B, out_dim], with the attributes the library's backbones have."""

    def __init__(self, module: nn.Module, in_channels: int, image_size: int, label: str):
        super().__init__()
        self.module, self.label = module, label
        self.in_channels, self.image_size = in_channels, image_size
        self.out_dim = self._feature_dim()

    @torch.no_grad()
    def _feature_dim(self) -> int:
        """The feature length, from two blank images; one line naming the module when it
        cannot take such images or does not return a tensor [B, ...] of them."""
        side, device = self.image_size, module_device(self.module)
        blank = torch.zeros(2, self.in_channels, side, side, device=device)
        try:
            features = self.module(blank)
        except Exception as e:  # whatever the user's module raises: named, not a traceback
            raise FewshotError(
                f"{self.label} cannot take {self.in_channels}x{side}x{side} images: "
                f"{type(e).__name__}: {summary(e)}"
            ) from None
        if not isinstance(features, torch.Tensor) or features.dim() < 2 or len(features) != 2:
            shape = tuple(features.shape) if isinstance(features, torch.Tensor) else None
            raise FewshotError(
                f"{self.label} must map images [B, C, H, W] to features [B, d]; for 2 images "
                f"it returned {shape or type(features).__name__}"
            )
        return features[0].numel()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """The module's features of `images`, flattened to [B, out_dim]."""
        return self.module(images).flatten(1)


def frozen_geometry(
    backbone: Backbone,
    dataset: str,
    data_root: str | None,
    split: str,
    resize: int | None,
    channels: int | None,
) -> tuple[int, int]:
    """(channels, side) a frozen backbone reads `dataset` at, from metadata (no image read):
    a folder data set at the geometry the backbone was made for unless --resize and
    --channels say otherwise; a built-in one at its own."""
    if dataset == FOLDER:
        made_for = backbone.input_geometry()
        channels, resize = channels or made_for[0], resize or made_for[1]
    return dataset_geometry(dataset, data_root, split, resize, channels)


@functools.cache
def _lent_config(file: tuple[str, int, int]) -> dict | None:
    """The config of the fewshot checkpoint `file` (its path, modification time and size: a
    changed file is read anew), None for a plain state dict."""
    state = weights_file(file[0])
    config = state.get("config")
    return config if "model" in state and isinstance(config, dict) else None


def lent_config(path: str | Path) -> dict | None:
    """The config of a --backbone-weights file that is a fewshot checkpoint (it lends its
    backbone), read once however often it is asked; None for a plain state dict."""
    try:
        stat = Path(path).stat()
    except OSError:
        return None  # named by the reading itself, with the flag
    return _lent_config((str(path), stat.st_mtime_ns, stat.st_size))


def use_feature_cache(method: EmbeddingMethod) -> None:
    """A frozen backbone's features of an image set, kept in the user's cache folder (keyed
    by the weights, precision and images: never stale) for every later command; where that
    folder cannot be written, each command embeds anew."""
    folder = cache_folder()
    if folder is None:
        return
    try:
        check_writable(folder / "features" / ".probe")
    except FewshotError:
        return
    method.use_feature_cache(folder / "features")


def result_folder_name(name: str) -> str:
    """A backbone's name as a folder name (timm:vit_small.dino -> timm-vit_small.dino)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "backbone"
