"""Throughput: cached vs per-episode evaluation, training step vs bare forward+backward, memory.

Everything is measured side by side in one process, on the same device:

(a) evaluation episodes/s with the embedding cache (`episode_accuracies(cache=True)`) and with
    per-episode embedding (cache=False), on N seeded 5-way 1-shot 15-query episodes of a
    synthetic 84x84 set of miniImageNet's test size (20 classes x 600 images), and on N 20-way
    1-shot 15-query episodes of the real Omniglot test classes (--query: another count). The
    speed-up's ceiling is the ratio of images embedded: N x way x (1 + query) per-episode
    against the split's size cached.
(b) the training step: a bare backbone forward+backward on the 160 images of 2 episodes of
    5-way 1-shot 15-query at 84x84, in PyTorch's default memory format and in channels_last,
    against the whole `Trainer.train_step` (sampling, gather, augmentation, one forward, head,
    loss, backward, SGD step), as ratios to the bare default-format figure.
(c) peak memory (CPU: the process's maxrss so far; CUDA: max_memory_allocated per section)
    and the device's name.

    python -m benchmarks.bench_throughput                     # the full set (slow on a CPU)
    python -m benchmarks.bench_throughput --episodes 50 --repeats 2 --no-omniglot
    python -m benchmarks.bench_throughput --backbones conv4,resnet12 --heads protonet,ridge,svm
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import platform
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from benchmarks.bench_ehg import sync, synthetic_split
from fewshot.backbones import build_backbone
from fewshot.datasets import load_split
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import episode_accuracies
from fewshot.methods import build_method
from fewshot.runtime.device import resolve_device
from fewshot.training.settings import TrainSettings
from fewshot.training.trainer import Trainer

WAY, SHOT, EPISODES_PER_STEP = 5, 1, 2
T = TypeVar("T")


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name with the thread count torch uses."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    models = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    cpu = models[0] if models else platform.processor() or platform.machine()
    return f"{cpu} CPU, {torch.get_num_threads()} threads"


def reset_peak(device: torch.device) -> None:
    """Start a new peak-memory section (CUDA only: the CPU's maxrss cannot be reset)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> str:
    """Peak memory of the section (CUDA) or of the process so far (CPU maxrss)."""
    if device.type == "cuda":
        return f"peak CUDA memory {torch.cuda.max_memory_allocated(device) / 2**20:.0f} MiB"
    # Linux reports ru_maxrss in KiB.
    return f"peak RSS so far {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB"


def once(fn: Callable[[], T], device: torch.device) -> tuple[float, T]:
    """Seconds of one call of `fn`, synchronised, and its result."""
    sync(device)
    start = time.perf_counter()
    result = fn()
    sync(device)
    return time.perf_counter() - start, result


def bench_eval(
    label: str, backbone: str, split: ImageSplit, way: int, args, device: torch.device
) -> None:
    """(a): cached vs per-episode evaluation of the same seeded episodes, one line."""
    settings = TrainSettings(backbone=backbone, head="protonet").to_dict()
    geometry = {"in_channels": split.channels, "image_size": split.image_size}
    model = build_method({**settings, **geometry}).to(device).eval()
    shape = EpisodeShape(way, SHOT, args.query, args.eval_batch)
    reset_peak(device)

    def run(cache: bool, episodes: int = args.episodes) -> torch.Tensor:
        return episode_accuracies(model, split, shape, episodes, 0, device, cache=cache)

    run(False, args.eval_batch)  # warm-up (CUDA context, allocator), not timed
    cached_s, cached = once(lambda: run(True), device)
    episode_s, per_episode = once(lambda: run(False), device)
    differ = int((cached != per_episode).sum())
    same = "identical" if differ == 0 else f"different in {differ} of {len(cached)} episodes"
    ceiling = args.episodes * way * (SHOT + args.query) / len(split.labels)
    print(
        f"{label:34} {backbone:9} {args.episodes / episode_s:9.2f} {args.episodes / cached_s:9.2f} "
        f"{episode_s / cached_s:7.2f}x {ceiling:7.2f}x  accuracies {same}; {peak_memory(device)}",
        flush=True,
    )


def bare_step(backbone: torch.nn.Module, images: torch.Tensor) -> Callable[[], None]:
    """A forward+backward of `backbone` on `images` (the gradient of the features' sum)."""

    def step() -> None:
        backbone.zero_grad(set_to_none=True)
        backbone(images).sum().backward()

    return step


def interleaved(
    fns: dict[str, Callable[[], object]], repeats: int, device: torch.device
) -> dict[str, float]:
    """Median seconds of each function, timed in turns (one warm-up each), so that a change in
    the machine's load falls on all of them alike."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(once(fn, device)[0])
    return {name: statistics.median(values) for name, values in times.items()}


def bench_train(backbone: str, heads: list[str], args, device: torch.device) -> None:
    """(b): bare forward+backward in both memory formats vs Trainer.train_step per head."""
    split = synthetic_split(20, 40, 84)
    n = EPISODES_PER_STEP * WAY * (SHOT + args.query)
    reset_peak(device)
    torch.manual_seed(0)
    net = build_backbone(backbone, 3, 84).to(device).train()
    images = torch.randn(n, 3, 84, 84, generator=torch.Generator().manual_seed(0)).to(device)
    net_last = copy.deepcopy(net).to(memory_format=torch.channels_last)
    fns = {
        "bare fwd+bwd": bare_step(net, images),
        "bare, channels_last": bare_step(
            net_last, images.contiguous(memory_format=torch.channels_last)
        ),
    }
    for head in heads:
        config = TrainSettings(
            dataset="miniimagenet",  # a stand-in: the splits are given
            amp="off",  # float32: bench_precision compares precisions
            backbone=backbone,
            head=head,
            way=WAY,
            shot=SHOT,
            query=args.query,
            episodes_per_batch=EPISODES_PER_STEP,
            augment=args.augment,
            lr=1e-3,  # steps repeat on the same weights: 0.1 diverges on random images
            device=device.type,
        )
        fns[f"train_step {head}"] = Trainer(config, device, data=(split, split)).train_step
    seconds = interleaved(fns, args.repeats, device)
    base = seconds["bare fwd+bwd"]
    for name, value in seconds.items():
        print(f"{backbone:9} {name:22} {value:8.3f} {value / base:7.2f}x", flush=True)
    print(f"{'':9} {peak_memory(device)}", flush=True)


def print_eval(backbones: list[str], args, device: torch.device) -> None:
    """Section (a): the synthetic set for each backbone, then Omniglot with Conv-4."""
    print(f"\n(a) evaluation, {args.episodes} seeded episodes, {args.eval_batch} per batch")
    print(
        f"{'episodes':34} {'backbone':9} {'ep/s':>9} {'cached':>9} {'speedup':>8} {'ceiling':>8}"
        "   (ep/s: per-episode embedding; cached: ep/s with the cache)"
    )
    if not args.no_synthetic:
        synthetic = synthetic_split(20, 600, 84)
        for backbone in backbones:
            label = f"synthetic 84x84 20x600, {WAY}-way {SHOT}-shot"
            bench_eval(label, backbone, synthetic, WAY, args, device)
        del synthetic
    if not args.no_omniglot:
        omniglot = first_classes(load_split("omniglot", "test", args.data_root), args.eval_classes)
        label = f"Omniglot test {omniglot.num_classes} cl., 20-way {SHOT}-shot"
        bench_eval(label, "conv4", omniglot, 20, args, device)


def first_classes(split: ImageSplit, count: int | None) -> ImageSplit:
    """The images of `split`'s classes 0..count-1 (labels unchanged); all of it for None."""
    if count is None:
        return split
    if count < 20:
        raise SystemExit(f"--eval-classes must be at least 20 (20-way episodes), got {count}")
    kept = split.labels < count
    return dataclasses.replace(
        split,
        images=split.images[kept],
        labels=split.labels[kept],
        class_names=split.class_names[:count],
    )


def main() -> None:
    """Parse the options and print the three sections."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000, help="evaluation episodes")
    parser.add_argument("--eval-batch", type=int, default=8, help="episodes per eval batch")
    parser.add_argument("--backbones", default="conv4", help="e.g. conv4,resnet12")
    parser.add_argument("--heads", default="protonet", help="train-step heads: protonet,ridge,svm")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds of (b) (median)")
    parser.add_argument("--no-eval", action="store_true", help="skip (a), the evaluation")
    parser.add_argument("--no-omniglot", action="store_true", help="skip the Omniglot episodes")
    parser.add_argument(
        "--eval-classes", type=int, help="(a) on the first N Omniglot test classes (default: all)"
    )
    parser.add_argument("--no-synthetic", action="store_true", help="skip the 84x84 episodes")
    parser.add_argument("--query", type=int, default=15, help="queries per class of (a) and (b)")
    parser.add_argument("--no-augment", dest="augment", action="store_false")
    parser.add_argument("--data-root", help="for Omniglot (default: $FEWSHOT_DATA or data/)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = parser.parse_args()
    device = resolve_device(args.device)
    backbones = args.backbones.split(",")
    print(f"device: {device_name(device)}; torch {torch.__version__}; float32")

    if not args.no_eval:
        print_eval(backbones, args, device)

    augmented = "with" if args.augment else "without"
    print(
        f"\n(b) training step: {EPISODES_PER_STEP} episodes of {WAY}-way {SHOT}-shot "
        f"{args.query}-query at 84x84 ({EPISODES_PER_STEP * WAY * (SHOT + args.query)} images), "
        f"train_step {augmented} augmentation; median of {args.repeats} rounds timed in turns"
    )
    print(f"{'backbone':9} {'what':22} {'seconds':>8} {'vs bare':>8}")
    for backbone in backbones:
        bench_train(backbone, args.heads.split(","), args, device)


if __name__ == "__main__":
    main()
