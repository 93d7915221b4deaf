"""What a training checkpoint holds, and how a run continues from one exactly.

A checkpoint is taken at a step boundary (or between an epoch's training and its validation):
the run's settings, the method's weights, optimizer and AMP scaler, the progress (epoch, step,
the epoch's running sums, the metrics history), the sampler and every random stream (under
torchrun, every rank's). Restoring all of it makes the resumed run bit-identical to an
uninterrupted one on a CPU.
"""

from __future__ import annotations

from pathlib import Path

import torch

from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sampler import EpisodeSampler
from fewshot.methods import Method, build_method
from fewshot.runtime.errors import FewshotError, summary
from fewshot.runtime.io import load_checkpoint
from fewshot.training.settings import checkpoint_settings
from fewshot.training.state import Progress, RandomStreams

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
    sampler: EpisodeSampler,
    progress: Progress,
    rngs: list[dict],
) -> dict:
    """Everything needed to evaluate the method or continue the run exactly; `rngs` holds
    every rank's random streams (one entry in a single process)."""
    return {
        "config": config,
        "model": method.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "progress": progress.to_dict(),
        "sampler": sampler.state_dict(),
        "rng": rngs[0],
        "rank_rngs": rngs,
    }


def restore_training(
    ckpt: dict,
    path: str,
    method: Method,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    sampler: EpisodeSampler,
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


def trained_method(ckpt: dict, settings: dict, path: str | Path) -> Method:
    """The method of a checkpoint with its weights (in eval mode, on the CPU)."""
    config = ckpt["config"]
    geometry = {key: config.get(key) for key in ("in_channels", "image_size")}
    if not all(isinstance(v, int) and v > 0 for v in geometry.values()) or "model" not in ckpt:
        raise FewshotError(f"{path} is not a fewshot training checkpoint (no image size or model)")
    method = build_method({**settings, **geometry})
    bad = non_finite(ckpt["model"])
    if bad:
        raise FewshotError(f"{path} holds non-finite weights ({', '.join(bad[:3])}); not using it")
    try:
        method.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise FewshotError(
            f"{path} does not fit a {settings['backbone']} backbone with the {settings['head']} "
            f"head ({settings['method']} method): {summary(e)}"
        ) from None
    return method.eval()


def load_trained(path: str | Path, device: torch.device) -> tuple[Method, dict]:
    """A trained method in eval mode on `device` and its checked settings with the image
    geometry it expects, from a checkpoint written by `fewshot train` (or imported)."""
    ckpt = load_checkpoint(path)
    settings = checkpoint_settings(ckpt, path)
    method = trained_method(ckpt, settings, path).to(device)
    geometry = {key: ckpt["config"][key] for key in ("in_channels", "image_size")}
    return method, {**settings, **geometry}


def checkpoint_file(path: str | Path) -> Path:
    """A checkpoint path, or a run folder's best.pt."""
    path = Path(path)
    if not path.is_dir():
        return path
    if not (path / "best.pt").is_file():
        raise FewshotError(f"{path} is a folder without best.pt; name a checkpoint file")
    return path / "best.pt"


def check_fits(config: dict, data: ImageSplit, path: str | Path) -> None:
    """Refuse data of other channels or image size than the checkpoint's, before any forward."""
    want = (config["in_channels"], config["image_size"])
    have = (data.channels, data.image_size)
    if want != have:
        raise FewshotError(
            f"{path} expects {want[0]}x{want[1]}x{want[1]} images; {data.source} has "
            f"{have[0]}x{have[1]}x{have[1]}"
        )
