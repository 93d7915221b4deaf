"""EHG cost: time per training step for U = 1, 2, 5, 10, side by side, against naive re-embedding.

Each configuration runs the real `Trainer.train_step` (embed once, U*B head problems in one
batched call) and the naive reference that re-embeds every split (`reembedding_gradients`),
on synthetic 84x84 images, in one process. Ratios are to U=1 of the same configuration.

    python -m benchmarks.bench_ehg                     # full grid (slow on a CPU)
    python -m benchmarks.bench_ehg --backbones conv4 --shots 1 --repeats 3
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from fewshot.datasets.base import ImageSplit
from fewshot.methods.resplit import draw_resplits, reembedding_gradients
from fewshot.training.settings import TrainSettings
from fewshot.training.trainer import Trainer


def synthetic_split(classes: int, per_class: int, size: int) -> ImageSplit:
    """Random uint8 RGB images, `per_class` for each of `classes` classes."""
    gen = torch.Generator().manual_seed(0)
    shape = (classes * per_class, 3, size, size)
    images = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
    labels = torch.arange(classes).repeat_interleave(per_class)
    return ImageSplit(
        images,
        labels,
        [str(c) for c in range(classes)],
        (0.5,) * 3,
        (0.25,) * 3,
        "synthetic",
    )


def sync(device: torch.device) -> None:
    """Wait for queued GPU work so that wall times are real."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, repeats: int, device: torch.device) -> float:
    """Median seconds of `fn()` over `repeats` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def naive_step(trainer: Trainer, splits: int) -> None:
    """One step of the naive EHG: every split re-embedded, gradients averaged, optimizer step."""
    cfg = trainer.settings
    index = trainer.batches.sampler.sample()
    images = trainer.train_data.images[index.flatten()].to(trainer.device)
    images = images.float().div(255).view(*index.shape, *images.shape[1:])
    perm = draw_resplits(*index.shape[:2], cfg.shot, cfg.query, splits, trainer.streams.resplit)
    model = trainer.method
    params = [p for p in model.parameters() if p.requires_grad]
    grads = reembedding_gradients(
        model.embed, params, images, model.head, model.scale, cfg.shot, perm, loss=model.loss
    )
    for p, g in zip(params, grads, strict=True):
        p.grad = g
    trainer.optimizer.step()


def main() -> None:
    """Run the grid and print one row per (backbone, head, shot, U)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbones", default="conv4,resnet12")
    parser.add_argument(
        "--heads", default="protonet,ridge,svm", help="heads, or the methods matching, relation"
    )
    parser.add_argument("--shots", default="1,5")
    parser.add_argument("--resplits", default="1,2,5,10", help="the U values")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--query", type=int, default=15, help="queries per class")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive baseline")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    split = synthetic_split(20, 40, 84)
    device_name = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device_name = "cpu" if device_name == "auto" else device_name
    device = torch.device(device_name)
    card = (
        torch.cuda.get_device_name() if device.type == "cuda" else f"CPU x{torch.get_num_threads()}"
    )
    print(f"device: {card}; 5-way, {args.query} queries, 2 episodes per batch, 84x84, float32")
    print(
        f"{'backbone':9} {'head':8} {'shot':>4} {'U':>3} {'step s':>8} {'vs U=1':>7} {'naive':>7}"
    )
    for backbone in args.backbones.split(","):
        for head in args.heads.split(","):
            for shot in map(int, args.shots.split(",")):
                base = None
                for u in map(int, args.resplits.split(",")):
                    config = TrainSettings(
                        dataset="miniimagenet",  # a stand-in: the splits are given
                        amp="off",  # float32: bench_precision compares precisions
                        backbone=backbone,
                        # Matching and Relation Networks: a comparison module for a head.
                        **(
                            {"method": head} if head in ("matching", "relation") else {"head": head}
                        ),
                        way=5,
                        shot=shot,
                        query=args.query,
                        episodes_per_batch=2,
                        resplits=u,
                        lr=1e-3,  # steps repeat on the same weights: 0.1 diverges on random images
                        device=device_name,
                    )
                    trainer = Trainer(config, device, data=(split, split))
                    t = timed(trainer.train_step, args.repeats, device)
                    base = base or t
                    naive = ""
                    if not args.no_naive:
                        step = functools.partial(naive_step, trainer, u)
                        naive = f"{timed(step, args.repeats, device) / base:6.2f}x"
                    print(
                        f"{backbone:9} {head:8} {shot:4d} {u:3d} {t:8.3f} {t / base:6.2f}x "
                        f"{naive:>7}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
