"""The iterative test-time classifiers on precomputed features: all episodes in one call
against a call per batch, side by side.

Features: the zoo's Omniglot Conv-4 ProtoNet (models/omniglot/protonet_conv4_trainval.pt,
64-d) embeds every image of the seeded test episodes once, outside the timings, as
`fewshot eval` does with its cache. Then, for each classifier (`--classifiers`: PT-MAP, TIM,
fine-tuning, logistic regression by default, with their default options) on the same
episodes (default: 2000 seeded 5-way 1-shot 15-query Omniglot test episodes, seed 0):

- one call with every episode (the batch over all episodes that the goal is about);
- one call per `--batch` episodes (`fewshot eval --episodes-per-batch`),

each as the cached evaluation calls it: the episodes index the features, and fine-tuning
draws each episode's initial weights from the episode's seed.

Printed per classifier: the wall time of each (after a warm-up call on one batch), the mean
query accuracy ± 95% CI, the episodes whose accuracy differs between the two batchings (0: the
result does not depend on the batching), and the goal: every classifier's one call under
`--goal` seconds (60 s for 2000 five-way episodes on the CPU; on a GPU, PT-MAP on 2000
twenty-way episodes in 10 s: `--device cuda --way 20 --classifiers pt-map --goal 10`).

    OMP_NUM_THREADS=1 python -m benchmarks.bench_classifiers
    python -m benchmarks.bench_classifiers --device cuda --way 20 --classifiers pt-map --goal 10
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.bench_ehg import sync
from benchmarks.bench_logistic import CHECKPOINT, embedded_features
from benchmarks.bench_throughput import device_name
from fewshot.evaluation.stats import ci95
from fewshot.heads import CLASSIFIERS
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.methods.resplit import episode_loss
from fewshot.runtime.device import DEVICES, resolve_device

ITERATIVE = ("pt-map", "tim", "finetune", "logistic")
SMOKE = {"episodes": 16, "batch": 8}


def accuracies(
    method: EmbeddingMethod, features: torch.Tensor, indices: list[torch.Tensor], shot: int
) -> torch.Tensor:
    """Per-episode query accuracy of the method's classifier, one call per index batch
    [b, way, pool]: the cached evaluation's work (`EmbeddingMethod.solver`), each episode
    with its seed (`episode_head`)."""
    device = features.device
    result = [
        episode_loss(features[index.to(device)], method.episode_head(index), method.scale, shot)[1]
        for index in indices
    ]
    return torch.cat(result).cpu()


def timed(
    method: EmbeddingMethod, features: torch.Tensor, indices: list[torch.Tensor], shot: int
) -> tuple[float, torch.Tensor]:
    """Wall seconds and per-episode accuracies of `accuracies` over these batches."""
    sync(features.device)
    start = time.perf_counter()
    result = accuracies(method, features, indices, shot)
    sync(features.device)
    return time.perf_counter() - start, result


def main() -> None:
    """Parse the options, embed the episodes once, time each classifier both ways, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classifiers", nargs="+", default=list(ITERATIVE), choices=CLASSIFIERS)
    parser.add_argument("--episodes", type=int, default=2000, help="seeded test episodes")
    parser.add_argument("--batch", type=int, default=200, help="episodes per call, the other way")
    parser.add_argument("--way", type=int, default=5)
    parser.add_argument("--shot", type=int, default=1)
    parser.add_argument("--query", type=int, default=15, help="queries per class")
    parser.add_argument("--seed", type=int, default=0, help="episode seed")
    parser.add_argument("--goal", type=float, default=60.0, help="seconds for one call, each")
    parser.add_argument("--checkpoint", default=str(CHECKPOINT), help="embedding model")
    parser.add_argument("--data-root", default=None, help="data root (default: as fewshot's)")
    parser.add_argument("--device", default="auto", choices=DEVICES)
    parser.add_argument("--smoke", action="store_true", help="16 episodes, 8 per call")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    device = resolve_device(args.device)
    method, features, indices, images, embed_seconds = embedded_features(args, device)
    together = [torch.cat(indices)]
    print(
        f"device: {device_name(device)}; torch {torch.__version__}\nfeatures: "
        f"{Path(args.checkpoint).name} on Omniglot test, {features.shape[1]}-d, {images} "
        f"images embedded once in {embed_seconds:.1f} s (outside the timings)\nepisodes: "
        f"{args.episodes} seeded {args.way}-way {args.shot}-shot {args.query}-query (seed "
        f"{args.seed}), each classifier with its default options",
        flush=True,
    )
    one, per = f"{args.episodes} in one call", f"{args.batch} per call"
    print(f"{'classifier':10} {one + ' (s)':>22} {per + ' (s)':>18} {'accuracy %':>15}  differ")
    missed = []
    for name in args.classifiers:
        method.use_classifier(name, {})
        accuracies(method, features, indices[:1], args.shot)  # warm-up
        all_seconds, all_accuracies = timed(method, features, together, args.shot)
        batch_seconds, batch_accuracies = timed(method, features, indices, args.shot)
        mean, half = 100 * float(all_accuracies.mean()), 100 * ci95(all_accuracies)
        differ = int((all_accuracies != batch_accuracies).sum())
        print(
            f"{name:10} {all_seconds:22.2f} {batch_seconds:18.2f} {mean:8.2f} ± {half:4.2f}"
            f"  {differ}/{args.episodes}",
            flush=True,
        )
        if all_seconds >= args.goal:
            missed.append(name)
    verdict = f"MISSED by {', '.join(missed)}" if missed else "met"
    print(f"goal: {args.episodes} episodes in one call under {args.goal:g} s each: {verdict}")


if __name__ == "__main__":
    main()
