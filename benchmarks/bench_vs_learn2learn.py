"""MAML, iMAML and ANIL training steps side by side with learn2learn's `l2l.algorithms.MAML`.

One process, the same network (the MAML paper's stride-2 Conv-4 on 28x28 images, a copy for
learn2learn), the same episodes and precision (float32). learn2learn adapts one episode at a
time (its documented usage: `clone()`, `adapt()` per task; for ANIL a cloned head on the
backbone's features; for iMAML, which learn2learn lacks, its clone for the inner steps and the
conjugate gradient on Hessian-vector products per episode, as the iMAML authors' code does);
fewshot adapts all episodes together by each `--batchings` path (`auto`: what it picks on this
device). Every round times every arm once, in turn, so all see the same machine load; a ratio
is the median over the rounds of an arm's time over learn2learn's in the same round. Before
timing, each arm's meta-gradient is compared with learn2learn's. The process keeps freed memory
as `fewshot train` does (`retain_freed_memory`, for both arms; `--glibc-defaults`: not).

    python -m benchmarks.bench_vs_learn2learn                 # needs learn2learn installed
    python -m benchmarks.bench_vs_learn2learn --batchings auto vmap loop threads --repeats 5
    python -m benchmarks.bench_vs_learn2learn --smoke         # seconds: the test suite's run
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import time
from dataclasses import asdict

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fewshot.methods import TRAINING_DEFAULTS, build_method
from fewshot.methods.batching import (
    BATCHING,
    chunk_count,
    concurrently,
    replica,
    resolve_batching,
)
from fewshot.runtime.allocator import retain_freed_memory
from fewshot.training.settings import TrainSettings

# (way, shot, inner steps) of the two settings of the MAML paper's Omniglot table that are timed.
SETTINGS = {"5-way 1-shot, 1 step": (5, 1, 1), "5-way 5-shot, 5 steps": (5, 5, 5)}
VARIANTS = ("maml", "imaml", "anil")
# iMAML's own defaults (fewshot's): a smaller inner step, the proximal weight, CG iterations.
IMAML = {"inner_lr": 0.1, "proximal": 1.0, "solver_steps": 5}
GOAL = 0.7  # fewshot's step at most this fraction of learn2learn's, every variant and setting
BACKBONE = "backbone"  # ANIL's extra arm: the backbone's forward and backward alone


def labels(way: int, count: int) -> torch.Tensor:
    """Class labels of `count` images per class, class by class."""
    return torch.arange(way).repeat_interleave(count)


def learn2learn_step(network, learner, variant: str, images, shot: int, steps: int) -> None:
    """learn2learn's MAML or ANIL meta-gradient of a batch of episodes, one episode at a time."""
    way, pool = images.shape[1:3]
    total = 0
    for episode in images:
        inputs = episode
        if variant == "anil":
            inputs = network.backbone(episode.flatten(0, 1)).view(way, pool, -1)
        clone = learner.clone()
        for _ in range(steps):
            loss = F.cross_entropy(clone(inputs[:, :shot].flatten(0, 1)), labels(way, shot))
            clone.adapt(loss)
        query = clone(inputs[:, shot:].flatten(0, 1))
        total = total + F.cross_entropy(query, labels(way, pool - shot))
    (total / len(images)).backward()


def learn2learn_imaml_step(network, learner, images, shot: int, steps: int) -> None:
    """iMAML per episode: `steps` first-order adapt() steps of a clone on the support loss plus
    proximal/2 |theta - init|^2, then conjugate gradient on (H + proximal I) v = the query
    gradient (stopping at non-positive curvature, as fewshot's does); the meta-gradient
    proximal * v, averaged over the episodes into the initialisation's .grad."""
    way, pool = images.shape[1:3]
    names, init = zip(*network.named_parameters(), strict=True)
    lam, tiny = IMAML["proximal"], torch.finfo(images.dtype).tiny
    meta = [torch.zeros_like(p) for p in init]

    def loss(theta, x, count: int) -> torch.Tensor:
        logits = functional_call(network, dict(zip(names, theta, strict=True)), (x,))
        return F.cross_entropy(logits, labels(way, count))

    def dot(a, b) -> torch.Tensor:
        return sum((x * y).sum() for x, y in zip(a, b, strict=True))

    for episode in images:
        support, query = episode[:, :shot].flatten(0, 1), episode[:, shot:].flatten(0, 1)
        clone = learner.clone()
        for _ in range(steps):
            prox = sum(
                ((p - q.detach()) ** 2).sum() for p, q in zip(clone.parameters(), init, strict=True)
            )
            loss_k = F.cross_entropy(clone(support), labels(way, shot)) + lam / 2 * prox
            clone.adapt(loss_k, first_order=True)
        theta = [p.detach().requires_grad_() for p in clone.parameters()]
        b = torch.autograd.grad(loss(theta, query, pool - shot), theta)
        inner = loss(theta, support, shot) + lam / 2 * sum(
            ((t - p.detach()) ** 2).sum() for t, p in zip(theta, init, strict=True)
        )
        grad = torch.autograd.grad(inner, theta, create_graph=True)
        v = [torch.zeros_like(t) for t in theta]
        residual, direction = list(b), list(b)
        rr = dot(residual, residual)
        for _ in range(IMAML["solver_steps"]):
            if rr <= tiny:
                break
            h_dir = torch.autograd.grad(grad, theta, direction, retain_graph=True)
            curvature = dot(direction, h_dir)
            if curvature <= 0:
                break
            alpha = rr / curvature
            v = [x + alpha * d for x, d in zip(v, direction, strict=True)]
            residual = [r - alpha * h for r, h in zip(residual, h_dir, strict=True)]
            rr_next = dot(residual, residual)
            direction = [r + rr_next / rr * d for r, d in zip(residual, direction, strict=True)]
            rr = rr_next
        meta = [m + lam * x / len(images) for m, x in zip(meta, v, strict=True)]
    for p, g in zip(init, meta, strict=True):
        p.grad = g


def backbone_alone(backbone, images):
    """ANIL's floor: a step of the backbone's forward and backward alone on the episodes (a
    loss on the features, no head, no inner loop), each episode in its own call, its chunks of
    episodes in threads as fewshot's automatic batching runs them on this CPU."""
    chunks = images.tensor_split(chunk_count(resolve_batching("auto", "cpu"), len(images)))
    replicas = [replica(backbone) for _ in chunks]

    def work(i: int) -> None:
        features = [replicas[i](episode) for episode in chunks[i].flatten(1, 2)]
        torch.stack(features).square().mean().backward()

    def step() -> None:
        backbone.zero_grad(set_to_none=True)
        concurrently(work, len(chunks))

    return step


def timed(step) -> float:
    """Seconds of one call."""
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def fewshot_method(variant: str, batching: str, way: int, shot: int, steps: int, args):
    """fewshot's method of a variant on the benchmark's network, from its training defaults
    (the MAML family's contiguous tensors among them), in float32."""
    options = {"inner_steps": steps, "inner_lr": args.inner_lr, "batching": batching}
    if variant == "imaml":
        options |= IMAML
    settings = TrainSettings(
        **TRAINING_DEFAULTS[variant],
        method=variant, way=way, val_way=way, shot=shot, query=args.query, amp="off",
        backbone_options={"downsample": "stride"}, method_options=options,
    )  # fmt: skip
    return build_method({**asdict(settings), "in_channels": 1, "image_size": 28})


def side_by_side(l2l, variant: str, way: int, shot: int, steps: int, args) -> dict:
    """Per arm (each batching, then 'learn2learn'): (median seconds, median ratio to
    learn2learn's time in the same round, largest meta-gradient difference) of one setting."""
    torch.manual_seed(0)
    methods = {b: fewshot_method(variant, b, way, shot, steps, args) for b in args.batchings}
    for method in methods.values():  # one initialisation for every arm
        method.load_state_dict(next(iter(methods.values())).state_dict())
    network = copy.deepcopy(next(iter(methods.values())).network)
    adapted = network.classifier if variant == "anil" else network
    lr = IMAML["inner_lr"] if variant == "imaml" else args.inner_lr
    learner = l2l.algorithms.MAML(adapted, lr=lr)
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(args.batch, way, shot + args.query, 1, 28, 28, generator=generator)

    def ours(method):
        def step() -> None:
            method.zero_grad(set_to_none=True)
            method(images, None, shot)[0].backward()

        return step

    def theirs() -> None:
        network.zero_grad(set_to_none=True)
        if variant == "imaml":
            learn2learn_imaml_step(network, learner, images, shot, steps)
        else:
            learn2learn_step(network, learner, variant, images, shot, steps)

    arms = {b: ours(m) for b, m in methods.items()} | {"learn2learn": theirs}
    if variant == "anil":
        arms[BACKBONE] = backbone_alone(copy.deepcopy(network.backbone), images)
    for step in arms.values():  # warm-up, and the meta-gradients to compare
        step()
    reference = dict(network.named_parameters())
    gaps = {
        b: max(
            float((p.grad - reference[k.removeprefix("network.")].grad).abs().max())
            for k, p in m.named_parameters()
        )
        for b, m in methods.items()
    }
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.repeats):
        for name, step in arms.items():
            times[name].append(timed(step))
    ratios = {
        name: statistics.median(a / b for a, b in zip(t, times["learn2learn"], strict=True))
        for name, t in times.items()
    }
    return {name: (statistics.median(t), ratios[name], gaps.get(name)) for name, t in times.items()}


def machine() -> str:
    """The CPU's model name and whether it has native bf16 (Linux), threads, load average."""
    model, flags = platform.processor() or "unknown CPU", ""
    if os.path.exists("/proc/cpuinfo"):
        info: dict[str, str] = {}
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
        model = info.get("model name", model)
        flags = " (avx512_bf16)" if "avx512_bf16" in info.get("flags", "").split() else ""
    load = " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return f"{model}{flags}, {torch.get_num_threads()} threads, load average {load}"


def main() -> None:
    """Print seconds per meta-gradient of fewshot (each batching) and learn2learn, their
    ratio against the goal, and the largest difference between their meta-gradients."""
    import learn2learn as l2l

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32, help="episodes per meta-batch")
    parser.add_argument("--query", type=int, default=15)
    parser.add_argument("--inner-lr", type=float, default=0.4, help="MAML's and ANIL's")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument(
        "--batchings", nargs="+", default=["auto"], choices=BATCHING, help="fewshot's paths"
    )
    parser.add_argument("--smoke", action="store_true", help="2 episodes, 2 queries, 1 round")
    parser.add_argument(
        "--glibc-defaults",
        action="store_true",
        help="glibc's malloc as it comes (default: freed memory kept, as `fewshot train` does)",
    )
    args = parser.parse_args()
    retained = not args.glibc_defaults and retain_freed_memory()
    settings = SETTINGS
    if args.smoke:
        args.batch, args.query, args.repeats = 2, 2, 1
        settings = {"5-way 1-shot, 1 step": (5, 1, 1)}
    auto = resolve_batching("auto", "cpu")
    print(f"cpu: {machine()}; torch {torch.__version__}, learn2learn {l2l.__version__}")
    allocator = "freed memory kept" if retained else "the C library's default allocator"
    print(f"float32, meta-batch {args.batch}, {args.query} queries, auto = {auto}, {allocator}")
    print(f"{'method':6} {'setting':22} {'arm':11} {'s/step':>8} {'ratio':>6} {'max |dg|':>9}")
    for variant in args.variants:
        for name, (way, shot, steps) in settings.items():
            rows = side_by_side(l2l, variant, way, shot, steps, args)
            for arm, (seconds, ratio, gap) in rows.items():
                verdict = ""
                if arm == BACKBONE:
                    verdict = "          the backbone alone: ANIL's floor"
                elif arm != "learn2learn":
                    verdict = f"{gap:9.1e}  goal <= {GOAL}x {'met' if ratio <= GOAL else 'MISSED'}"
                print(
                    f"{variant:6} {name:22} {arm:11} {seconds:8.3f} {ratio:6.2f} {verdict}".rstrip()
                )


if __name__ == "__main__":
    main()
