"""What a training checkpoint holds, and how a run continues from one exactly.

A checkpoint is taken at a step boundary (or between an epoch's training and its validation):
the run's settings, the method's weights, optimizer and AMP scaler, the progress (epoch, step,
the epoch's running sums, the metrics history), the sampler and every random stream (under
torchrun, every rank's). Restoring all of it makes the resumed run bit-identical to an
uninterrupted one on a CPU.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from fewshot.backbones import backbone_names, build_backbone, library_name
from fewshot.datasets import LIGHT_ON_DARK, NORMALIZATION, dataset_names
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sampler import EpisodeSampler, ImageBatchSampler
from fewshot.datasets.sources import Source
from fewshot.heads import head_names
from fewshot.methods import Method, build_method, method_names
from fewshot.methods.pretraining import build_pretrain_method
from fewshot.runtime.errors import FewshotError, summary
from fewshot.runtime.io import load_checkpoint
from fewshot.training.run_settings import RunSettings
from fewshot.training.settings import TrainSettings, checkpoint_settings, checkpoint_stage
from fewshot.training.state import Progress, RandomStreams

GEOMETRY_KEYS = ("in_channels", "image_size")
BATCHNORM_STATS = (".running_mean", ".running_var", ".num_batches_tracked")
# What a checkpoint needs to continue a run (an imported or evaluation-only one lacks them).
CONTINUATION_KEYS = ("model", "optimizer", "scaler", "progress", "sampler", "rng")


def non_finite(state: dict[str, torch.Tensor]) -> list[str]:
    """The names of the floating-point tensors of a state dict that hold a NaN or an infinity."""
    return [k for k, v in state.items() if v.is_floating_point() and not v.isfinite().all()]


def training_checkpoint(
    config: dict,
    method: Method,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    sampler: EpisodeSampler | ImageBatchSampler,
    progress: Progress,
    rngs: list[dict],
) -> dict:
    """Everything needed to evaluate the method or continue the run exactly; `rngs` holds
    every rank's random streams (one entry in a single process); the plug-ins its settings
    name, which must be installed wherever it is loaded (`plugins_needed`)."""
    return {
        "config": config,
        "plugins": plugins_needed(config),
        "model": method.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "progress": progress.to_dict(),
        "sampler": sampler.state_dict(),
        "rng": rngs[0],
        "rank_rngs": rngs,
    }


def plugins_needed(config: dict) -> list[dict[str, str | None]]:
    """What a checkpoint records of the plug-ins its run's settings name (its method, head,
    backbone, data set and --extra-data sets): each one's entry-point group, name, package and
    version (`RegistryNames.provenance`), checked where it is loaded
    (fewshot.runtime.plugins.check_installed)."""
    named = [
        (method_names(), config.get("method")),
        (head_names(), config.get("head")),
        (backbone_names(), config.get("backbone")),
        (dataset_names(), config.get("dataset")),
        *((dataset_names(), Source.parse(spec).dataset) for spec in config.get("extra_data", [])),
    ]
    records = (names.provenance(name) for names, name in named)
    return [record for record in records if record is not None]


def restore_training(
    ckpt: dict,
    path: str,
    method: Method,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    sampler: EpisodeSampler | ImageBatchSampler,
    streams: RandomStreams,
    steps_per_epoch: int,
    rank: int = 0,
) -> Progress:
    """Put a checkpoint's states in place and return its progress, refusing a checkpoint that
    cannot continue a run and damaged states (one line each). Each rank takes its own random
    streams when the checkpoint was saved by as many processes, else rank 0's."""
    missing = [key for key in CONTINUATION_KEYS if key not in ckpt]
    if missing:
        raise FewshotError(
            f"--resume {path}: cannot continue from it: it has no {', '.join(missing)} "
            "(an evaluation-only checkpoint?)"
        )
    try:
        method.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scaler.load_state_dict(ckpt["scaler"])
        progress = Progress.from_dict(ckpt["progress"], steps_per_epoch)
        sampler.load_state_dict(ckpt["sampler"])
        rngs = ckpt.get("rank_rngs") or [ckpt["rng"]]
        streams.load(rngs[rank] if rank < len(rngs) else rngs[0])
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as e:
        raise FewshotError(
            f"--resume {path}: the checkpoint is damaged ({type(e).__name__}: {summary(e)})"
        ) from None
    return progress


def without_fetch(settings: dict) -> dict:
    """Settings whose library backbone fetches no pretrained weights: a checkpoint holds every
    weight of the model it builds."""
    options = {k: v for k, v in settings["backbone_options"].items() if k != "pretrained"}
    return {**settings, "backbone_options": options}


def trained_method(ckpt: dict, settings: dict, path: str | Path) -> Method:
    """The method of a checkpoint with its weights (in eval mode, on the CPU)."""
    config = ckpt["config"]
    keys = ("in_channels", "image_size", "classes") if "classes" in config else GEOMETRY_KEYS
    geometry = {key: config.get(key) for key in keys}
    if not all(isinstance(v, int) and v > 0 for v in geometry.values()) or "model" not in ckpt:
        raise FewshotError(f"{path} is not a fewshot training checkpoint (no image size or model)")
    pretrained = config.get("stage") == "pretrain"
    build = build_pretrain_method if pretrained else build_method
    method = build({**without_fetch(settings), **geometry})
    bad = non_finite(ckpt["model"])
    if bad:
        raise FewshotError(f"{path} holds non-finite weights ({', '.join(bad[:3])}); not using it")
    try:
        method.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        what = "pretraining" if pretrained else f"{settings['head']} head, {settings['method']}"
        raise FewshotError(
            f"{path} does not fit a {settings['backbone']} backbone ({what}): {summary(e)}"
        ) from None
    return method.eval()


@dataclass(frozen=True)
class InitWeights:
    """Weights a run starts from: its backbone's (`part` 'backbone') or its whole model's
    ('model'), each keyed as that part's state dict."""

    part: str
    state: dict[str, torch.Tensor]

    def load_into(self, method: Method) -> None:
        """Copy the weights into `method` (the backbone, or all of it)."""
        (method.backbone if self.part == "backbone" else method).load_state_dict(self.state)


def init_weights(
    path: str | Path, settings: TrainSettings, geometry: tuple[int, int]
) -> InitWeights:
    """The weights of `--init`: the backbone of a `fewshot pretrain` checkpoint (the rest of
    the model keeps its initialisation), or the whole model of a `fewshot train` checkpoint of
    the same method and architecture (to fine-tune it on other data or train it on with
    another schedule). Refused in one line when the checkpoint is of another backbone,
    method, architecture or image geometry."""
    try:
        ckpt = load_checkpoint(path)
    except FewshotError as e:
        raise FewshotError(f"--init: {e}") from None
    stage = checkpoint_stage(ckpt, path)
    saved = checkpoint_settings(ckpt, path, stage, "--init")
    config = ckpt["config"]
    have = (config.get("in_channels"), config.get("image_size"))
    if saved["backbone"] != settings.backbone or have != geometry:
        raise FewshotError(
            f"--init {path}: a {saved['backbone']} backbone for {have[0]}x{have[1]}x{have[1]} "
            f"images; this run trains a {settings.backbone} on {settings.dataset} "
            f"({geometry[0]}x{geometry[1]}x{geometry[1]})"
        )
    model = ckpt.get("model", {})
    if stage == "pretrain":
        part, want = "backbone", backbone_shapes(settings, geometry)
        state = {
            k.removeprefix("backbone."): v for k, v in model.items() if k.startswith("backbone.")
        }
        # The MAML family's BatchNorm keeps no running statistics: the pretrained ones go.
        state = {k: v for k, v in state.items() if k in want or not k.endswith(BATCHNORM_STATS)}
        trained = f"pretrained with --backbone-options {json.dumps(saved['backbone_options'])}"
        mine = f"this run has {json.dumps(settings.backbone_options)}"
    else:
        if saved["method"] != settings.method:
            raise FewshotError(
                f"--init {path}: a --method {saved['method']} model; this run trains --method "
                f"{settings.method}"
            )
        part, want, state = "model", method_shapes(settings, geometry), dict(model)
        trained = f"trained with {architecture(saved)}"
        mine = f"this run has {architecture(settings.to_dict())}"
    bad = non_finite(state)
    if not state or bad:
        raise FewshotError(f"--init {path}: no finite {part} weights ({', '.join(bad[:3])})")
    misfit = first_misfit(state, want)
    if misfit is not None:
        raise FewshotError(
            f"--init {path}: its {part} does not fit this run's ({misfit}: "
            f"{shape_text(state.get(misfit))} there, {shape_text(want.get(misfit))} here); it was "
            f"{trained}, {mine}"
        )
    return InitWeights(part, state)


def architecture(settings: dict) -> str:
    """The options that shape a model's weights, as JSON (for refusals)."""
    return json.dumps({k: settings[k] for k in ("backbone_options", "method_options")})


def meta_method(settings: RunSettings, geometry: tuple[int, int]) -> Method:
    """The run's model built on the meta device (shapes, no memory)."""
    built = {**settings.to_dict(), "in_channels": geometry[0], "image_size": geometry[1]}
    with torch.device("meta"):
        if settings.stage == "pretrain":  # any number of classes: the backbone is the same
            return build_pretrain_method({**built, "classes": 2})
        return build_method(built)


def method_shapes(settings: TrainSettings, geometry: tuple[int, int]) -> dict[str, torch.Size]:
    """The shapes of the run's whole model."""
    return {k: v.shape for k, v in meta_method(settings, geometry).state_dict().items()}


def backbone_shapes(settings: RunSettings, geometry: tuple[int, int]) -> dict[str, torch.Size]:
    """The shapes of the run's backbone weights."""
    return {k: v.shape for k, v in meta_method(settings, geometry).backbone.state_dict().items()}


def first_misfit(state: dict[str, torch.Tensor], want: dict[str, torch.Size]) -> str | None:
    """The first key (the wanted ones first) that one of the state dict and the wanted shapes
    lacks or that has another shape there; None when they fit."""
    return next(
        (
            k
            for k in {**want, **state}
            if k not in want or k not in state or want[k] != state[k].shape
        ),
        None,
    )


def backbone_weights(settings: RunSettings, geometry: tuple[int, int]) -> dict[str, torch.Tensor]:
    """The state dict of --backbone-weights keyed as the run's backbone (`fit_weights`),
    refused in one line when it is a fewshot checkpoint (a run starts from one by --init)."""
    path = settings.backbone_weights
    state = weights_file(path)
    if "config" in state and "model" in state:
        raise FewshotError(
            f"--backbone-weights {path} is a fewshot checkpoint, not a backbone's state dict: "
            "start from it with --init"
        )
    want = backbone_shapes(settings, geometry)
    return fit_weights(state, path, settings.backbone, settings.backbone_options, geometry, want)


def weights_file(path: str | Path) -> dict:
    """The dict a --backbone-weights file holds, read without running code."""
    try:
        return load_checkpoint(path)
    except FewshotError as e:
        raise FewshotError(f"--backbone-weights: {e}") from None


def fit_weights(
    state: dict,
    path: str | Path,
    name: str,
    options: dict,
    geometry: tuple[int, int],
    want: dict[str, torch.Size],
) -> dict[str, torch.Tensor]:
    """The state dict `state` (of file `path`) keyed as backbone `name` (of weight shapes
    `want`), refused in one line naming the file when it holds anything but named tensors,
    does not fit the backbone (the first mismatching key) or holds non-finite weights."""
    wrong = next((k for k, v in state.items() if not isinstance(v, torch.Tensor)), None)
    if wrong is not None:
        raise FewshotError(
            f"--backbone-weights {path} is not a state dict: its entry {wrong!r} is not a tensor"
        )
    if library_name(name):  # the library model's keys, classifier left out
        with torch.device("meta"):
            built = build_backbone(name, *geometry, **options)
        state = built.weight_keys(state)
    misfit = first_misfit(state, want)
    if misfit is not None:
        raise FewshotError(
            f"--backbone-weights {path} does not fit --backbone {name}: first "
            f"mismatching key {misfit.removeprefix('model.')!r} ({shape_text(state.get(misfit))}"
            f" in the file, {shape_text(want.get(misfit))} here)"
        )
    bad = non_finite(state)
    if bad:
        raise FewshotError(f"--backbone-weights {path} holds non-finite weights ({bad[0]})")
    return state


def shape_text(shape: torch.Size | torch.Tensor | None) -> str:
    """A weight's shape as 64x3x3x3, or 'none'."""
    if shape is None:
        return "none"
    return "x".join(map(str, shape.shape if isinstance(shape, torch.Tensor) else shape))


def normalization(config: dict, dataset: str, path: str | Path) -> dict:
    """The per-channel mean and std a checkpoint's model was trained on, checked: as recorded
    in its config, else (written before they were) its built-in dataset's ({}: unknown)."""
    if "mean" not in config and "std" not in config:
        known = NORMALIZATION.get(dataset)
        return {"mean": list(known[0]), "std": list(known[1])} if known else {}
    mean, std = config.get("mean"), config.get("std")
    numbers = all(
        isinstance(v, list)
        and v
        and all(isinstance(x, int | float) and math.isfinite(x) for x in v)
        for v in (mean, std)
    )
    if not (numbers and len(mean) == len(std) and min(std) > 0):
        raise FewshotError(f"{path} has damaged normalisation constants: mean {mean}, std {std}")
    return {"mean": mean, "std": std}


def load_trained(path: str | Path, device: torch.device) -> tuple[Method, dict]:
    """A trained method in eval mode on `device` and its checked settings with the image
    geometry and normalisation it expects, from a checkpoint written by `fewshot train`
    (or imported)."""
    ckpt = load_checkpoint(path)
    settings = checkpoint_settings(ckpt, path)
    method = trained_method(ckpt, settings, path).to(device)
    method.source = str(path)
    geometry = {key: ckpt["config"][key] for key in GEOMETRY_KEYS}
    scale = normalization(ckpt["config"], settings["dataset"], path)
    return method, {**settings, **geometry, **scale, "stage": checkpoint_stage(ckpt, path)}


def checkpoint_file(path: str | Path) -> Path:
    """A checkpoint path, or a run folder's best.pt."""
    path = Path(path)
    if not path.is_dir():
        return path
    if not (path / "best.pt").is_file():
        raise FewshotError(f"{path} is a folder without best.pt; name a checkpoint file")
    return path / "best.pt"


def as_trained(config: dict, data: ImageSplit, path: str | Path) -> ImageSplit:
    """`data` as the model of checkpoint `path` (settings `config`, from `load_trained`) sees
    it: refused in one line when of other channels or image size, normalised with the
    constants of the model's training images (its own where the checkpoint does not say)."""
    check_fits(config, data, path)
    if "mean" not in config:
        return data
    if len(config["mean"]) != data.channels:
        raise FewshotError(
            f"{path} has {len(config['mean'])} normalisation constants for its "
            f"{data.channels}-channel images: damaged"
        )
    return replace(data, mean=tuple(config["mean"]), std=tuple(config["std"]))


def polarity_mismatch(
    config: dict, data: ImageSplit | torch.Tensor, path: str | Path
) -> str | None:
    """Why `data` (a split, or images: uint8 in 0..255 or float in [0, 1]) looks like the
    negatives of what the model of checkpoint `path` (settings `config`) was trained on, or
    None: mostly light images for a model trained on light drawings on a dark ground
    (Omniglot's own PNG files for a model of the library's Omniglot: 53 % at 20-way 1-shot
    with the zoo ProtoNet, 91 % read as negatives)."""
    dataset = config.get("dataset")
    images = data.images if isinstance(data, ImageSplit) else data
    if dataset not in LIGHT_ON_DARK or not len(images):
        return None
    white = 255 if images.dtype == torch.uint8 else 1
    light = float(images.sum(dtype=torch.float64)) / (white * images.numel())
    if light <= 0.5:
        return None
    return (
        f"its images are mostly light (mean {light:.2f} of 1) and {path} was trained on "
        f"{dataset}'s light drawings on a dark ground"
    )


def check_fits(config: dict, data: ImageSplit, path: str | Path) -> None:
    """Refuse data of other channels or image size than the checkpoint's, before any forward."""
    check_geometry(config, (data.channels, data.image_size), data.source, path)


def check_geometry(config: dict, geometry: tuple[int, int], source: str, path: str | Path) -> None:
    """Refuse images of `geometry` (channels, side) from `source` for the model of checkpoint
    `path` (settings `config`) when it expects others: callable from metadata, before any
    image is read."""
    want = (config["in_channels"], config["image_size"])
    if want != tuple(geometry):
        have = tuple(geometry)
        raise FewshotError(
            f"{path} expects {want[0]}x{want[1]}x{want[1]} images; {source} has "
            f"{have[0]}x{have[1]}x{have[1]}"
        )
