"""Evaluation over seeded test episodes: mean accuracy with a 95% confidence interval."""

from __future__ import annotations

import argparse
import functools
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from fewshot.datasets import load_split
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sampler import EpisodeSampler, EpisodeShape
from fewshot.device import images_to_device, resolve_device
from fewshot.ehg import episode_loss
from fewshot.errors import FewshotError
from fewshot.io import atomic_write_json, load_checkpoint
from fewshot.model import FewShotModel, load_model


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


@torch.no_grad()
def embed_split(
    model: FewShotModel, split: ImageSplit, device: torch.device, batch_size: int = 512
) -> torch.Tensor:
    """Embeddings [N, d] of every image of the split, in eval mode (computed once, batched)."""
    model.eval()
    chunks = []
    for start in range(0, len(split.labels), batch_size):
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
) -> torch.Tensor:
    """Per-episode query accuracies [episodes] on seeded episodes of `split`.

    With cache=True every image is embedded once and episodes index the cached features;
    this is exact because BatchNorm in eval mode makes embeddings episode-independent.
    """
    model.eval()
    sampler = EpisodeSampler(split.labels, shape, seed, source=split.source)
    features = embed_split(model, split, device) if cache else None
    # Evaluation-time head options, e.g. fewer SVM iterations.
    head = functools.partial(model.head, **(head_options or {}))
    accuracies = []
    batches = math.ceil(episodes / shape.episodes_per_batch)
    for _ in tqdm(range(batches), desc="eval", unit="batch", disable=not progress, leave=False):
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
) -> EvalResult:
    """Mean accuracy ± 95% CI (percent) over `episodes` seeded episodes."""
    acc = episode_accuracies(
        model, split, shape, episodes, seed, device, cache, head_options, progress
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


def run_eval(args: argparse.Namespace) -> EvalResult:
    """`fewshot eval`: load a checkpoint, evaluate on seeded episodes, print and write JSON."""
    if args.episodes < 2:
        raise FewshotError(
            f"--episodes must be at least 2 for a confidence interval, got {args.episodes}"
        )
    device = resolve_device(args.device)
    ckpt = load_checkpoint(args.checkpoint)
    model, config = load_model(ckpt, args.checkpoint, device)
    dataset = args.dataset or config["dataset"]
    split = load_split(dataset, args.split, args.data_root)
    shape = EpisodeShape(args.way, args.shot, args.query, args.episodes_per_batch)
    result = evaluate(
        model,
        split,
        shape,
        args.episodes,
        args.seed,
        device,
        cache=not args.no_cache,
        head_options=config.get("eval_head_options"),
        progress=True,
    )
    print(result.line())
    out = (
        Path(args.out)
        if args.out
        else Path(args.checkpoint).with_name(
            f"eval_{dataset}_{args.split}_{args.way}w{args.shot}s_seed{args.seed}.json"
        )
    )
    atomic_write_json(
        {
            **asdict(result),
            "checkpoint": str(args.checkpoint),
            "dataset": dataset,
            "split": args.split,
            "cache": not args.no_cache,
        },
        out,
    )
    return result


def add_parser(subparsers) -> None:
    """Add `fewshot eval`."""
    p = subparsers.add_parser("eval", help="evaluate a checkpoint on seeded test episodes")
    p.add_argument("--checkpoint", required=True, help="a .pt file written by fewshot train")
    p.add_argument("--dataset", help="dataset to evaluate on (default: the training dataset)")
    p.add_argument("--split", default="test")
    p.add_argument("--data-root", help="data folder (default: $FEWSHOT_DATA or the repo's data/)")
    p.add_argument("--way", type=int, default=5)
    p.add_argument("--shot", type=int, default=1)
    p.add_argument("--query", type=int, default=15)
    p.add_argument("--episodes", type=int, default=1000)
    p.add_argument("--episodes-per-batch", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--no-cache", action="store_true", help="embed every episode separately")
    p.add_argument("--out", help="JSON result path (default: next to the checkpoint)")
    p.set_defaults(func=run_eval)
