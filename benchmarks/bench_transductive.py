"""The transductive test-time classifiers against nearest centroid at 5 and 20 ways, side by side.

What `fewshot eval --classifier NAME` does with its evaluation cache, timed in one process: the
zoo's Omniglot Conv-4 ProtoNet (models/omniglot/protonet_conv4_trainval.pt, 64-d) embeds every
image of the test split once (the cache's work, timed once: with --smoke only the episodes'
images), then each classifier solves the seeded episodes (default: 400 1-shot 15-query
episodes, seed 0) one call per --batch of them (200, as the cached evaluation), for each
--ways. The classifiers (`centroid` and --classifiers: BD-CSPN, TIM, PT-MAP by default, their
default options) take turns in every one of --repeats rounds; each has one warm-up call on one
episode first.

Printed per way and classifier: the median seconds of its calls over all the episodes, the
evaluation's seconds (the cache's embedding plus those), that as a ratio to centroid's, and the
mean query accuracy ± 95% CI. Goal (issue 66): PT-MAP's evaluation at most 3x centroid's at
20 ways.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_transductive
    python -m benchmarks.bench_transductive --ways 20 --classifiers pt-map --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.bench_classifiers import accuracies, timed
from benchmarks.bench_ehg import sync
from benchmarks.bench_logistic import CHECKPOINT
from benchmarks.bench_throughput import device_name
from fewshot.datasets import load_split
from fewshot.datasets.batches import images_to_device
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import seeded_episodes
from fewshot.evaluation.stats import ci95
from fewshot.heads import TRANSDUCTIVE
from fewshot.runtime.device import DEVICES, resolve_device
from fewshot.training.checkpoint import load_trained

GOAL = 3.0  # PT-MAP's evaluation against centroid's at 20 ways
SMOKE = {"episodes": 2, "batch": 2, "repeats": 1}


def main() -> None:
    """Parse the options, embed the split once, time every classifier at each way, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--classifiers", nargs="+", default=sorted(TRANSDUCTIVE), choices=sorted(TRANSDUCTIVE)
    )
    parser.add_argument("--ways", type=int, nargs="+", default=[5, 20])
    parser.add_argument("--episodes", type=int, default=400, help="seeded test episodes")
    parser.add_argument("--batch", type=int, default=200, help="episodes per classifier call")
    parser.add_argument("--shot", type=int, default=1)
    parser.add_argument("--query", type=int, default=15, help="queries per class")
    parser.add_argument("--seed", type=int, default=0, help="episode seed")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of every classifier")
    parser.add_argument("--checkpoint", default=str(CHECKPOINT), help="embedding model")
    parser.add_argument("--data-root", default=None, help="data root (default: as fewshot's)")
    parser.add_argument("--device", default="auto", choices=DEVICES)
    parser.add_argument("--smoke", action="store_true", help="2 episodes in one call, 1 round")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    device = resolve_device(args.device)
    split = load_split("omniglot", "test", args.data_root)
    method, _ = load_trained(args.checkpoint, device)
    indices = {
        way: list(
            seeded_episodes(
                split,
                EpisodeShape(way, args.shot, args.query, args.batch),
                args.episodes,
                args.seed,
            )
        )
        for way in args.ways
    }
    # The cache embeds the whole split; --smoke only the images its few episodes use.
    used = torch.arange(len(split.labels))
    if args.smoke:
        used = torch.unique(
            torch.cat([i.flatten() for batches in indices.values() for i in batches])
        )
    sync(device)
    start = time.perf_counter()
    with torch.no_grad():
        chunks = [
            method.embed(images_to_device(split, chunk, device)) for chunk in used.split(1024)
        ]
    sync(device)
    embed_seconds = time.perf_counter() - start
    features = torch.zeros(len(split.labels), chunks[0].shape[1], device=device)
    features[used.to(device)] = torch.cat(chunks)
    print(
        f"device: {device_name(device)}; torch {torch.__version__}\nfeatures: "
        f"{Path(args.checkpoint).name} on Omniglot test, {features.shape[1]}-d, {len(used)} "
        f"images embedded once in {embed_seconds:.1f} s (the evaluation cache's work)\n"
        f"episodes: {args.episodes} seeded {args.shot}-shot {args.query}-query (seed "
        f"{args.seed}), {args.batch} a call; rounds: {args.repeats} (the median)",
        flush=True,
    )
    names = ["centroid", *args.classifiers]
    print(
        f"{'way':>3} {'classifier':10} {'classifier (s)':>15} {'evaluation (s)':>15} "
        f"{'x centroid':>11} {'accuracy %':>15}"
    )
    ratios = {}
    for way, batches in indices.items():
        seconds = {name: [] for name in names}
        results = {}
        for name in names:
            method.use_classifier(name, {})
            accuracies(method, features, [batches[0][:1]], args.shot)  # warm-up
        for round_ in range(args.repeats):
            # Each round in another order: no classifier always runs after the same one.
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                method.use_classifier(name, {})
                elapsed, results[name] = timed(method, features, batches, args.shot)
                seconds[name].append(elapsed)
        medians = {name: statistics.median(times) for name, times in seconds.items()}
        for name in names:
            evaluation = embed_seconds + medians[name]
            ratios[way, name] = evaluation / (embed_seconds + medians["centroid"])
            mean, half = 100 * float(results[name].mean()), 100 * ci95(results[name])
            print(
                f"{way:3} {name:10} {medians[name]:15.2f} {evaluation:15.2f} "
                f"{ratios[way, name]:10.2f}x {mean:8.2f} ± {half:4.2f}",
                flush=True,
            )
    if (20, "pt-map") in ratios:
        verdict = "met" if ratios[20, "pt-map"] <= GOAL else "MISSED"
        print(f"goal: pt-map's evaluation at most {GOAL:g}x centroid's at 20 ways: {verdict}")


if __name__ == "__main__":
    main()
