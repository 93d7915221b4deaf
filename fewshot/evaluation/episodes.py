"""Evaluation over seeded test episodes: mean accuracy with a 95% confidence interval."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import asdict, astuple, dataclass
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
from fewshot.precision import amp_setting, precision_name
from fewshot.settings import Command, check_fields, seed_setting, setting
from fewshot.stats import ci95


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

    @classmethod
    def of(cls, accuracies: torch.Tensor, shape: EpisodeShape, seed: int) -> EvalResult:
        """The summary of per-episode accuracies (fractions) as percentages."""
        mean = 100 * float(accuracies.double().mean())
        return cls(mean, 100 * ci95(accuracies), len(accuracies), *astuple(shape)[:3], seed)

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
    return EvalResult.of(acc, shape, seed)


@dataclass(frozen=True, kw_only=True)
class EpisodeSettings:
    """Which seeded test episodes, drawn from which data, on which device."""

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
    amp: str = amp_setting()

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def shape(self) -> EpisodeShape:
        """The episode shape these settings ask for."""
        return EpisodeShape(self.way, self.shot, self.query, self.episodes_per_batch)

    def accuracies(self, model: FewShotModel, split: ImageSplit, config: dict) -> torch.Tensor:
        """Per-episode accuracies of `model` (trained with `config`) on these episodes, its
        backbone in this evaluation's precision (whatever it was trained in)."""
        model.amp = self.amp
        return episode_accuracies(
            model,
            split,
            self.shape,
            self.episodes,
            self.seed,
            resolve_device(self.device),
            cache=self.cache,
            head_options=config["eval_head_options"],
            progress=True,
        )


def load_trained(path: str, device: torch.device) -> tuple[FewShotModel, dict]:
    """A trained model in eval mode and its checked settings, from a `fewshot train` checkpoint."""
    ckpt = load_checkpoint(path)
    config = checkpoint_settings(ckpt, path)
    model, _ = load_model(ckpt, path, device)
    return model, config


@dataclass(frozen=True, kw_only=True)
class EvalSettings(EpisodeSettings):
    """`fewshot eval`: a checkpoint on seeded episodes, the result as JSON."""

    checkpoint: str = setting(help="a .pt file written by fewshot train")
    out: str | None = setting(None, help="JSON result path (default: next to the checkpoint)")
    per_episode: bool = setting(False, help="also write every episode's accuracy to the JSON")

    def result_path(self, dataset: str) -> Path:
        """Where the JSON result goes."""
        if self.out:
            return Path(self.out)
        name = f"eval_{dataset}_{self.split}_{self.way}w{self.shot}s_seed{self.seed}.json"
        return Path(self.checkpoint).with_name(name)


def run_eval(settings: EvalSettings) -> EvalResult:
    """`fewshot eval`: load a checkpoint, evaluate on seeded episodes, print and write JSON."""
    model, config = load_trained(settings.checkpoint, resolve_device(settings.device))
    dataset = settings.dataset or config["dataset"]
    out = settings.result_path(dataset)
    check_writable(out)  # before the work, not after it
    split = load_split(dataset, settings.split, settings.data_root)
    accuracies = settings.accuracies(model, split, config)
    result = EvalResult.of(accuracies, settings.shape, settings.seed)
    print(result.line())
    record = {**asdict(result), "checkpoint": settings.checkpoint, "dataset": dataset}
    precision = precision_name(settings.amp, resolve_device(settings.device).type)
    record.update(split=settings.split, cache=settings.cache, precision=precision)
    if settings.per_episode:
        record["accuracies"] = accuracies.tolist()
    atomic_write_json(record, out)
    return result


COMMANDS = [
    Command(("eval",), "evaluate a checkpoint on seeded test episodes", (EvalSettings,), run_eval)
]
