"""EHG cost of the MAML family: time per meta-gradient for U = 1 and U = 5, side by side.

One process, the MAML paper's Omniglot setting (5-way 1-shot, 15 queries, meta-batch 32, the
stride-2 Conv-4, one inner step; iMAML five steps and five CG steps), synthetic 28x28 images.
U = 1 and U = 5 of a method alternate, so both see the same machine load; the ratio is the
figure that matters.

    python -m benchmarks.bench_adaptation
    python -m benchmarks.bench_adaptation --methods anil maml --batch 8 --repeats 3
    python -m benchmarks.bench_adaptation --smoke    # seconds: the test suite's run
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict

import torch

from fewshot.methods import TRAINING_DEFAULTS, build_method
from fewshot.methods.resplit import draw_resplits
from fewshot.runtime.device import DEVICES, resolve_device
from fewshot.training.settings import TrainSettings

OPTIONS = {
    "maml": {"inner_steps": 1, "inner_lr": 0.4},
    "fomaml": {"inner_steps": 1, "inner_lr": 0.4},
    "anil": {"inner_steps": 1, "inner_lr": 0.4},
    "imaml": {"inner_steps": 5, "inner_lr": 0.1, "solver_steps": 5},
}
SMOKE = {"batch": 2, "query": 2, "repeats": 1}


def step_seconds(method, images, resplits, shot: int) -> float:
    """Seconds of one meta-gradient (forward and backward), the device synchronised."""
    start = time.perf_counter()
    method.zero_grad(set_to_none=True)
    loss, _ = method(images, resplits, shot)
    loss.backward()
    if images.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    """Print seconds per step for U = 1 and U = 5 of every method, and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=list(OPTIONS), choices=list(OPTIONS))
    parser.add_argument("--batch", type=int, default=32, help="episodes per meta-batch")
    parser.add_argument("--way", type=int, default=5)
    parser.add_argument("--shot", type=int, default=1)
    parser.add_argument("--query", type=int, default=15)
    parser.add_argument("--resplits", type=int, default=5, help="U of the EHG arm")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per arm")
    parser.add_argument("--device", default="auto", choices=DEVICES)
    parser.add_argument("--smoke", action="store_true", help="2 episodes of 2 queries, 1 repeat")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    device = resolve_device(args.device)
    generator = torch.Generator().manual_seed(0)
    pool = args.shot + args.query
    images = torch.randn(args.batch, args.way, pool, 1, 28, 28, generator=generator).to(device)
    shape = f"{args.way}-way {args.shot}-shot"
    print(f"{device} ({torch.get_num_threads()} threads), {args.batch} episodes of {shape}")
    print(f"{'method':8} {'U=1 s':>8} {f'U={args.resplits} s':>8} {'ratio':>6}")
    for name in args.methods:
        # From the method's own training defaults (contiguous tensors: the MAML family refuses
        # channels_last), as fewshot train starts from them.
        settings = TrainSettings(
            **TRAINING_DEFAULTS[name],
            method=name, way=args.way, val_way=args.way, shot=args.shot, query=args.query,
            amp="off", backbone_options={"downsample": "stride"}, method_options=OPTIONS[name],
        )  # fmt: skip
        method = build_method({**asdict(settings), "in_channels": 1, "image_size": 28}).to(device)
        times: dict[int, list[float]] = {1: [], args.resplits: []}
        for repeat in range(args.repeats + 1):  # the first round warms up
            for u in times:
                resplits = None
                if u > 1:
                    resplits = draw_resplits(
                        args.batch, args.way, args.shot, args.query, u, generator
                    )
                seconds = step_seconds(method, images, resplits, args.shot)
                if repeat:
                    times[u].append(seconds)
        one, many = (statistics.median(t) for t in times.values())
        print(f"{name:8} {one:8.3f} {many:8.3f} {many / one:6.2f}")


if __name__ == "__main__":
    main()
