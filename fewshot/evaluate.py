"""Evaluation over seeded test episodes: mean accuracy with a 95% confidence interval."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from fewshot.config import DEVICES, checkpoint_settings
from fewshot.datasets import dataset_names, load_split
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sampler import EpisodeSampler, EpisodeShape
from fewshot.device import images_to_device, resolve_device
from fewshot.ehg import episode_loss
from fewshot.interrupt import Interrupted
from fewshot.io import atomic_write_json, check_writable, load_checkpoint
from fewshot.model import FewShotModel, load_model
from fewshot.settings import Command, check_fields, seed_setting, setting


def ci95(accuracies: torch.Tensor) -> float:
    """Half-width of the 95% CI of the mean: 1.96 * s / sqrt(n), s with ddof=1."""
    n = accuracies.numel()
    if n < 2:
        raise ValueError("a confidence interval needs at least two episodes")
    return 1.96 * float(accuracies.double().std(unbiased=True)) / math.sqrt(n)


@dataclass
class EvalResult:
    """Mean accuracy and 95% CI half-width, both in percent, over `episodes` episodes."""

    accuracy: float
    ci95: float
    episodes: int
    way: int
    shot: int
    query: int
    seed: int

    def line(self) -> str:
        """The summary line printed by `fewshot eval`."""
        return f"accuracy: {self.accuracy:.2f} ± {self.ci95:.2f} %"


Stop = Callable[[], int | None]  # returns the number of a signal that asks to stop, or None


def _check_stop(stop: Stop | None) -> None:
    """Raise Interrupted when `stop` reports a signal."""
    signum = stop() if stop is not None else None
    if signum:
        raise Interrupted(signum)


@torch.no_grad()
def embed_split(
    model: FewShotModel,
    split: ImageSplit,
    device: torch.device,
    batch_size: int = 512,
    stop: Stop | None = None,
) -> torch.Tensor:
    """Embeddings [N, d] of every image of the split, in eval mode (computed once, batched)."""
    model.eval()
    chunks = []
    for start in range(0, len(split.labels), batch_size):
        _check_stop(stop)
        images = images_to_device(
            split, torch.arange(start, min(start + batch_size, len(split.labels))), device
        )
        chunks.append(model.embed(images))
    return torch.cat(chunks)


@torch.no_grad()
def episode_accuracies(
    model: FewShotModel,
    split: ImageSplit,
    shape: EpisodeShape,
    episodes: int,
    seed: int,
    device: torch.device,
    cache: bool = True,
    head_options: dict | None = None,
    progress: bool = False,
    stop: Stop | None = None,
) -> torch.Tensor:
    """Per-episode query accuracies [episodes] on seeded episodes of `split`.

    With cache=True every image is embedded once and episodes index the cached features;
    this is exact because BatchNorm in eval mode makes embeddings episode-independent.
    `stop` is polled between batches (Interrupted is raised when it reports a signal).
    """
    model.eval()
    sampler = EpisodeSampler(split.labels, shape, seed, source=split.source)
    features = embed_split(model, split, device, stop=stop) if cache else None
    # Evaluation-time head options, e.g. fewer SVM iterations.
    head = functools.partial(model.head, **(head_options or {}))
    accuracies = []
    batches = math.ceil(episodes / shape.episodes_per_batch)
    for _ in tqdm(range(batches), desc="eval", unit="batch", disable=not progress, leave=False):
        _check_stop(stop)
        index = sampler.sample()
        if features is not None:
            emb = features[index.to(device)]
        else:
            emb = model.embed(images_to_device(split, index.flatten(), device))
            emb = emb.view(*index.shape, -1)
        _, acc = episode_loss(emb, head, model.scale, shape.shot)
        accuracies.append(acc)  # stays on the device: no synchronisation per batch
    return torch.cat(accuracies)[:episodes].cpu()


def evaluate(
    model: FewShotModel,
    split: ImageSplit,
    shape: EpisodeShape,
    episodes: int,
    seed: int,
    device: torch.device,
    cache: bool = True,
    head_options: dict | None = None,
    progress: bool = False,
    stop: Stop | None = None,
) -> EvalResult:
    """Mean accuracy ± 95% CI (percent) over `episodes` seeded episodes."""
    acc = episode_accuracies(
        model, split, shape, episodes, seed, device, cache, head_options, progress, stop
    )
    return EvalResult(
        100 * float(acc.double().mean()),
        100 * ci95(acc),
        episodes,
        shape.way,
        shape.shot,
        shape.query,
        seed,
    )


@dataclass(frozen=True)
class EvalSettings:
    """`fewshot eval`: which checkpoint, on which seeded episodes."""

    checkpoint: str = setting(help="a .pt file written by fewshot train")
    dataset: str | None = setting(
        None, help="dataset to evaluate on (default: the training dataset)", choices=dataset_names
    )
    split: str = setting("test", help="split to draw the episodes from")
    data_root: str | None = setting(
        None, help="data folder (default: $FEWSHOT_DATA or the repository's data/)"
    )
    way: int = setting(5, help="classes per episode", low=1)
    shot: int = setting(1, help="support images per class", low=1)
    query: int = setting(15, help="query images per class", low=1)
    episodes: int = setting(1000, help="number of seeded episodes (>= 2 for a CI)", low=2)
    episodes_per_batch: int = setting(8, help="episodes per head call", low=1)
    seed: int = seed_setting(0, help="seed of the test episodes")
    device: str = setting("auto", help="auto = cuda when available, else cpu", choices=DEVICES)
    cache: bool = setting(True, help="embed every image once (--no-cache: every episode)")
    out: str | None = setting(None, help="JSON result path (default: next to the checkpoint)")

    def __post_init__(self) -> None:
        check_fields(self)

    def result_path(self, dataset: str) -> Path:
        """Where the JSON result goes."""
        if self.out:
            return Path(self.out)
        name = f"eval_{dataset}_{self.split}_{self.way}w{self.shot}s_seed{self.seed}.json"
        return Path(self.checkpoint).with_name(name)


def run_eval(settings: EvalSettings) -> EvalResult:
    """`fewshot eval`: load a checkpoint, evaluate on seeded episodes, print and write JSON."""
    device = resolve_device(settings.device)
    ckpt = load_checkpoint(settings.checkpoint)
    config = checkpoint_settings(ckpt, settings.checkpoint)
    model, _ = load_model(ckpt, settings.checkpoint, device)
    dataset = settings.dataset or config["dataset"]
    out = settings.result_path(dataset)
    check_writable(out)  # before the work, not after it
    split = load_split(dataset, settings.split, settings.data_root)
    shape = EpisodeShape(settings.way, settings.shot, settings.query, settings.episodes_per_batch)
    result = evaluate(
        model,
        split,
        shape,
        settings.episodes,
        settings.seed,
        device,
        cache=settings.cache,
        head_options=config["eval_head_options"],
        progress=True,
    )
    print(result.line())
    record = {**asdict(result), "checkpoint": settings.checkpoint, "dataset": dataset}
    atomic_write_json({**record, "split": settings.split, "cache": settings.cache}, out)
    return result


COMMANDS = [
    Command(("eval",), "evaluate a checkpoint on seeded test episodes", (EvalSettings,), run_eval)
]
