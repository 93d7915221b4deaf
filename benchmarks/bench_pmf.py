"""P>M>F's test-time fine-tuning (`--classifier pmf`): a batch's episodes one at a time against
all at once (`batched`), side by side.

The zoo's Omniglot Conv-4 ProtoNet (models/omniglot/protonet_conv4_1shot.pt) fine-tunes its
backbone on each seeded test episode's support (default: 64 seeded 5-way 1-shot 15-query
Omniglot test episodes, seed 0, `--batch` 8 a call as `fewshot eval` batches them, 50 steps at
lr 1e-3; lr 1e-2 diverges on some of them), once one episode after another on the module and
once every episode of a batch at once on stacked copies of its weights (one vmapped forward;
grouped convolutions).

Printed: the wall time of each (after a warm-up batch), the mean query accuracy ± 95% CI, the
episodes whose accuracy differs between the two (0 expected: the same augmentation draws, the
weights equal to float rounding) and the ratio batched / one at a time, which decides the
default of `batched` (on where it is below 1: measured on a GPU, not on a CPU).

    OMP_NUM_THREADS=1 python -m benchmarks.bench_pmf
    python -m benchmarks.bench_pmf --device cuda --episodes 400
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.bench_ehg import sync
from benchmarks.bench_throughput import device_name
from fewshot.datasets import REPO_DATA, load_split
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import episode_accuracies
from fewshot.evaluation.stats import ci95
from fewshot.methods.pmf import PmfAdapter, PmfOptions
from fewshot.runtime.device import DEVICES, resolve_device
from fewshot.training.checkpoint import load_trained

CHECKPOINT = REPO_DATA.parent / "models" / "omniglot" / "protonet_conv4_1shot.pt"
SMOKE = {"episodes": 4, "batch": 2, "steps": 2, "query": 2}


def main() -> None:
    """Parse the options, fine-tune the seeded episodes both ways, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=64, help="seeded test episodes")
    parser.add_argument("--batch", type=int, default=8, help="episodes per call")
    parser.add_argument("--way", type=int, default=5)
    parser.add_argument("--shot", type=int, default=1)
    parser.add_argument("--query", type=int, default=15, help="queries per class")
    parser.add_argument("--steps", type=int, default=50, help="fine-tuning steps per episode")
    parser.add_argument("--lr", type=float, default=1e-3, help="fine-tuning learning rate")
    parser.add_argument("--seed", type=int, default=0, help="episode seed")
    parser.add_argument("--checkpoint", default=str(CHECKPOINT), help="ProtoNet model")
    parser.add_argument("--data-root", default=None, help="data root (default: as fewshot's)")
    parser.add_argument("--device", default="auto", choices=DEVICES)
    parser.add_argument("--smoke", action="store_true", help="4 episodes, 2 a call, 2 steps")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    device = resolve_device(args.device)
    split = load_split("omniglot", "test", args.data_root)
    model, _ = load_trained(args.checkpoint, device)
    shape = EpisodeShape(args.way, args.shot, args.query, args.batch)
    print(
        f"device: {device_name(device)}; torch {torch.__version__}\nmodel: "
        f"{Path(args.checkpoint).name}; {args.episodes} seeded {args.way}-way {args.shot}-shot "
        f"{args.query}-query Omniglot test episodes (seed {args.seed}), {args.batch} a call, "
        f"{args.steps} steps at lr {args.lr:g}",
        flush=True,
    )
    print(f"{'fine-tuning':16} {'seconds':>9} {'accuracy %':>15}")
    results = {}
    for name, batched in (("one at a time", False), (f"{args.batch} at once", True)):
        options = PmfOptions(steps=args.steps, lr=args.lr, batched=batched)
        model.use_adapter(PmfAdapter(model, options))
        episode_accuracies(model, split, shape, args.batch, args.seed + 1, device)  # warm-up
        sync(device)
        start = time.perf_counter()
        accuracies = episode_accuracies(model, split, shape, args.episodes, args.seed, device)
        sync(device)
        seconds = time.perf_counter() - start
        results[batched] = seconds, accuracies.cpu()
        mean, half = 100 * float(accuracies.mean()), 100 * ci95(accuracies.cpu())
        print(f"{name:16} {seconds:9.2f} {mean:8.2f} ± {half:4.2f}", flush=True)
    (alone, one), (together, at_once) = results[False], results[True]
    differ = int((one != at_once).sum())
    print(f"episodes whose accuracy differs: {differ}/{args.episodes}")
    print(f"batched / one at a time: {together / alone:.2f}x the time")


if __name__ == "__main__":
    main()
