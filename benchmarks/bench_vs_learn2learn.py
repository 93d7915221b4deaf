"""MAML and ANIL training steps side by side with learn2learn's `l2l.algorithms.MAML`.

One process, the same network (the MAML paper's stride-2 Conv-4 on 28x28 images, a copy for
learn2learn), the same episodes and precision (float32); the steps alternate so both see the same
machine load. learn2learn adapts one episode at a time (its documented usage: `clone()`, `adapt()`
per task; for ANIL a cloned head on the backbone's features); fewshot adapts all episodes at once
with vmap. Before timing, the two meta-gradients are compared.

    python -m benchmarks.bench_vs_learn2learn                 # needs learn2learn installed
    python -m benchmarks.bench_vs_learn2learn --repeats 3 --batch 8
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from dataclasses import asdict

import torch
import torch.nn.functional as F

from fewshot.methods import build_method
from fewshot.training.settings import TrainSettings

# (way, shot, inner steps) of the two settings of the MAML paper's Omniglot table that are timed.
SETTINGS = {"5-way 1-shot, 1 step": (5, 1, 1), "5-way 5-shot, 5 steps": (5, 5, 5)}


def learn2learn_step(network, learner, variant: str, images, shot: int, steps: int) -> None:
    """learn2learn's meta-gradient of a batch of episodes, one episode at a time."""
    way, pool = images.shape[1:3]
    support_labels = torch.arange(way).repeat_interleave(shot)
    query_labels = torch.arange(way).repeat_interleave(pool - shot)
    total = 0
    for episode in images:
        inputs = episode
        if variant == "anil":
            inputs = network.backbone(episode.flatten(0, 1)).view(way, pool, -1)
        clone = learner.clone()
        for _ in range(steps):
            loss = F.cross_entropy(clone(inputs[:, :shot].flatten(0, 1)), support_labels)
            clone.adapt(loss)
        total = total + F.cross_entropy(clone(inputs[:, shot:].flatten(0, 1)), query_labels)
    (total / len(images)).backward()


def timed(step) -> float:
    """Seconds of one call."""
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def side_by_side(l2l, variant: str, way: int, shot: int, steps: int, args) -> tuple:
    """(fewshot seconds, learn2learn seconds, largest meta-gradient difference) of one setting."""
    settings = TrainSettings(
        method=variant, way=way, val_way=way, shot=shot, query=args.query, amp="off",
        backbone_options={"downsample": "stride"},
        method_options={"inner_steps": steps, "inner_lr": args.inner_lr},
    )  # fmt: skip
    ours = build_method({**asdict(settings), "in_channels": 1, "image_size": 28})
    network = copy.deepcopy(ours.network)
    adapted = network.classifier if variant == "anil" else network
    learner = l2l.algorithms.MAML(adapted, lr=args.inner_lr)
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(args.batch, way, shot + args.query, 1, 28, 28, generator=generator)

    def fewshot_step() -> None:
        ours.zero_grad(set_to_none=True)
        ours(images, None, shot)[0].backward()

    def l2l_step() -> None:
        network.zero_grad(set_to_none=True)
        learn2learn_step(network, learner, variant, images, shot, steps)

    fewshot_step()
    l2l_step()
    theirs = dict(network.named_parameters())
    gap = max(
        float((p.grad - theirs[k.removeprefix("network.")].grad).abs().max())
        for k, p in ours.named_parameters()
    )
    times: dict[str, list[float]] = {"fewshot": [], "l2l": []}
    for _ in range(args.repeats):
        times["fewshot"].append(timed(fewshot_step))
        times["l2l"].append(timed(l2l_step))
    return (*(statistics.median(t) for t in times.values()), gap)


def main() -> None:
    """Print seconds per meta-gradient of fewshot and learn2learn, their ratio, and the largest
    difference between their meta-gradients."""
    import learn2learn as l2l

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32, help="episodes per meta-batch")
    parser.add_argument("--query", type=int, default=15)
    parser.add_argument("--inner-lr", type=float, default=0.4)
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per side")
    args = parser.parse_args()
    print(f"CPU x{torch.get_num_threads()}, float32, meta-batch {args.batch}, {args.query} queries")
    print(
        f"{'method':6} {'setting':22} {'fewshot s':>10} {'l2l s':>8} {'ratio':>6} {'max |dg|':>9}"
    )
    for variant in ("maml", "anil"):
        for name, (way, shot, steps) in SETTINGS.items():
            a, b, gap = side_by_side(l2l, variant, way, shot, steps, args)
            print(f"{variant:6} {name:22} {a:10.3f} {b:8.3f} {a / b:6.2f} {gap:9.1e}")


if __name__ == "__main__":
    main()
