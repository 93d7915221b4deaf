"""The batched logistic classifier against RFS's per-episode scikit-learn loop, on real features.

Features: the zoo's Omniglot Conv-4 ProtoNet (models/omniglot/protonet_conv4_trainval.pt,
64-d) embeds every image of the seeded test episodes once, outside both timings. Then on the
same episodes (default: 2000 seeded 5-way 1-shot 15-query Omniglot test episodes, seed 0):

- batched: `fewshot.heads.logistic` (Newton-CG in float64, default tol 1e-6), --batch
  episodes per call; the median of --repeats timed passes over all the episodes, after one
  warm-up call;
- per episode: scikit-learn's `LogisticRegression(C=C, max_iter=1000)` (RFS's classifier: lbfgs,
  multinomial, its default tol 1e-4) fitted and asked to predict episode by episode, once; and
  the same loop solved to convergence (tol 1e-10, max_iter 10000), the accuracy reference:
  scikit-learn's default tolerance stops lbfgs early enough to change a few predictions.

Both fit L2-normalised support features with the same C (normalising is inside every timing).
Printed: wall time of each, the ratios, the mean query accuracy ± 95% CI of each, and against
each scikit-learn loop the paired difference, the episodes whose accuracy differs and the
largest per-episode difference. Goal: batched at least 20x faster than RFS's loop (default
tol) at equal accuracy: the paired 95% CI of the difference from the converged loop contains 0.

    python -m benchmarks.bench_logistic                      # 2000 episodes, 250 per call
    OMP_NUM_THREADS=1 python -m benchmarks.bench_logistic --batch 500
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import sklearn
import torch
from sklearn.linear_model import LogisticRegression

from benchmarks.bench_ehg import sync
from benchmarks.bench_throughput import device_name
from fewshot.datasets import load_split
from fewshot.datasets.batches import images_to_device
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import seeded_episodes
from fewshot.evaluation.stats import ci95, paired_ci
from fewshot.heads import logistic
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.methods.resplit import resplit_episodes
from fewshot.runtime.device import DEVICES, resolve_device
from fewshot.training.checkpoint import load_trained

REPO = Path(__file__).resolve().parents[1]
CHECKPOINT = REPO / "models" / "omniglot" / "protonet_conv4_trainval.pt"
SPEED_GOAL = 20.0
SMOKE = {"episodes": 16, "batch": 8, "repeats": 1}
# The per-episode loops: (tol, max_iter) of RFS's (scikit-learn's default tol) and converged.
SKLEARN = {
    "scikit-learn lbfgs tol 1e-4 (RFS)": (1e-4, 1000),
    "scikit-learn lbfgs tol 1e-10": (1e-10, 10000),
}

Episode = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def embedded_features(
    args, device: torch.device
) -> tuple[EmbeddingMethod, torch.Tensor, list[torch.Tensor], int, float]:
    """The model, the features [N, d] on the device of the split's images that the seeded
    episodes use (embedded once; zeros elsewhere), the episodes' index batches [b, way, pool],
    the images embedded and the seconds it took."""
    split = load_split("omniglot", "test", args.data_root)
    method, _ = load_trained(args.checkpoint, device)
    shape = EpisodeShape(args.way, args.shot, args.query, args.batch)
    indices = list(seeded_episodes(split, shape, args.episodes, args.seed))
    used = torch.unique(torch.cat([index.flatten() for index in indices]))
    start = time.perf_counter()
    with torch.no_grad():
        chunks = [
            method.embed(images_to_device(split, chunk, device)) for chunk in used.split(1024)
        ]
    sync(device)
    seconds = time.perf_counter() - start
    features = torch.zeros(len(split.labels), chunks[0].shape[1], device=device)
    features[used.to(device)] = torch.cat(chunks)
    return method, features, indices, len(used), seconds


def embedded_episodes(args, device: torch.device) -> tuple[list[Episode], int, float]:
    """The seeded episodes as (query, support, support labels, query labels) batches on the
    device, from features embedded once; the images embedded and the seconds it took."""
    _, features, indices, images, seconds = embedded_features(args, device)
    batches = [resplit_episodes(features[index.to(device)], None, args.shot) for index in indices]
    return batches, images, seconds


def batched_accuracies(batches: list[Episode], way: int, shot: int, C: float) -> torch.Tensor:
    """Per-episode query accuracy of the batched solver, one call per batch of episodes."""
    accuracies = []
    for query, support, labels, query_labels in batches:
        logits = logistic(query, support, labels, way, shot, C=C)
        accuracies.append((logits.argmax(-1) == query_labels).double().mean(-1))
    return torch.cat(accuracies).cpu()


def sklearn_accuracies(
    episodes: list[tuple[np.ndarray, ...]], C: float, tol: float, max_iter: int
) -> torch.Tensor:
    """Per-episode query accuracy of scikit-learn fitted on each episode in turn (RFS's loop)."""
    accuracies = []
    for query, support, labels, query_labels in episodes:
        support = support / np.linalg.norm(support, axis=1, keepdims=True)
        query = query / np.linalg.norm(query, axis=1, keepdims=True)
        model = LogisticRegression(C=C, tol=tol, max_iter=max_iter).fit(support, labels)
        accuracies.append((model.predict(query) == query_labels).mean())
    return torch.tensor(accuracies, dtype=torch.float64)


def main() -> None:
    """Parse the options, embed the episodes once, time both solvers, print figures and goal."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000, help="seeded test episodes")
    parser.add_argument("--batch", type=int, default=250, help="episodes per batched call")
    parser.add_argument("--way", type=int, default=5)
    parser.add_argument("--shot", type=int, default=1)
    parser.add_argument("--query", type=int, default=15, help="queries per class")
    parser.add_argument("--C", type=float, default=1.0, help="inverse L2 penalty (RFS: 1)")
    parser.add_argument("--seed", type=int, default=0, help="episode seed")
    parser.add_argument("--repeats", type=int, default=3, help="timed batched passes (median)")
    parser.add_argument("--checkpoint", default=str(CHECKPOINT), help="embedding model")
    parser.add_argument("--data-root", default=None, help="data root (default: as fewshot's)")
    parser.add_argument("--device", default="auto", choices=DEVICES, help="the batched solver's")
    parser.add_argument("--smoke", action="store_true", help="16 episodes, 8 per call, 1 repeat")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    device = resolve_device(args.device)
    batches, images, embed_seconds = embedded_episodes(args, device)
    on_cpu = [
        (q.cpu().double().numpy(), s.cpu().double().numpy(), y.cpu().numpy(), t.cpu().numpy())
        for batch in batches
        for q, s, y, t in zip(*batch, strict=True)
    ]
    print(
        f"device: {device_name(device)}; torch {torch.__version__}; scikit-learn "
        f"{sklearn.__version__} (CPU, {torch.get_num_threads()} torch threads)\nfeatures: "
        f"{Path(args.checkpoint).name} on Omniglot test, {batches[0][1].shape[2]}-d, {images} "
        f"images embedded once in {embed_seconds:.1f} s (outside both timings)\nepisodes: "
        f"{args.episodes} seeded {args.way}-way {args.shot}-shot {args.query}-query (seed "
        f"{args.seed}); C = {args.C:g} on L2-normalised features",
        flush=True,
    )
    batched_accuracies(batches[:1], args.way, args.shot, args.C)  # warm-up
    times = []
    for _ in range(args.repeats):
        sync(device)
        start = time.perf_counter()
        batched = batched_accuracies(batches, args.way, args.shot, args.C)
        times.append(time.perf_counter() - start)
    batched_seconds = statistics.median(times)
    rows = {f"batched logistic ({args.batch}/call, {device.type})": (batched_seconds, batched)}
    for name, (tol, max_iter) in SKLEARN.items():
        start = time.perf_counter()
        accuracies = sklearn_accuracies(on_cpu, args.C, tol, max_iter)
        rows[name] = (time.perf_counter() - start, accuracies)

    print(f"{'solver':36} {'seconds':>9} {'ms/episode':>11} {'vs batched':>10} {'accuracy %':>15}")
    for name, (seconds, accuracies) in rows.items():
        mean, half = 100 * float(accuracies.mean()), 100 * ci95(accuracies)
        per_episode = 1000 * seconds / args.episodes
        ratio = seconds / batched_seconds
        print(
            f"{name:36} {seconds:9.3f} {per_episode:11.3f} {ratio:9.1f}x {mean:8.2f} ± {half:4.2f}"
        )
    equal = {}
    for name in SKLEARN:
        reference = rows[name][1]
        difference = paired_ci(reference, batched)
        differing = int((batched != reference).sum())
        largest = 100 * float((batched - reference).abs().max())
        equal[name] = abs(difference.mean) <= difference.ci95
        print(
            f"batched - {name}: {100 * difference.mean:+.3f} ± {100 * difference.ci95:.3f} "
            f"points (paired 95% CI); {differing}/{args.episodes} episodes differ, largest "
            f"per-episode difference {largest:.2f} points"
        )
    rfs, converged = SKLEARN
    speed = rows[rfs][0] / batched_seconds
    met = speed >= SPEED_GOAL and equal[converged]
    print(
        f"goal: batched >= {SPEED_GOAL:g}x faster than {rfs}, at equal accuracy (the paired 95% "
        f"CI of the difference from {converged} contains 0): {'met' if met else 'NOT met'} "
        f"({speed:.1f}x, {'equal' if equal[converged] else 'different'} accuracy)"
    )


if __name__ == "__main__":
    main()
