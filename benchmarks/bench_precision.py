"""float32 against bf16 autocast: training steps, evaluation and whole runs, side by side.

Everything is timed in one process on the same device, float32 and bf16 in turns:

(a) `Trainer.train_step` (sampling, gather, one forward, head, loss, backward, SGD step) per
    backbone and head, on Omniglot (2 episodes of 20-way 1-shot 15-query at 28x28, 640
    images) and on a synthetic 84x84 set (2 episodes of 5-way 1-shot 15-query, 160 images,
    MetaOptNet's augmentation), median of --repeats rounds; --query: another count of queries.
(b) cached evaluation (embed the split once, then the episodes) of N seeded episodes of the
    real Omniglot test classes with an untrained Conv-4: seconds, and in how many episodes
    the two precisions' accuracies differ.
(c) with --run CONFIG: the whole `fewshot train` run of that config in each precision (fresh
    folders under a temporary directory), then N seeded 5-way 1-shot test episodes of each
    model: wall seconds and accuracy ± 95% CI. The runs take turns, float32 first.
(d) with --allocator: the Omniglot trainval step (60-way 1-shot 5-query, models/omniglot/
    protonet_conv4_trainval.json) in fresh processes with glibc's default allocator and with
    freed memory retained (`fewshot.runtime.allocator`, what the `fewshot` command does), in turns:
    ms per step and page faults per step, each precision.

(a)-(c) run with freed memory retained, as the `fewshot` command runs.

    python -m benchmarks.bench_precision                                  # (a) and (b)
    python -m benchmarks.bench_precision --backbones conv4 --no-synthetic --repeats 3
    python -m benchmarks.bench_precision --no-steps --no-eval --run models/omniglot/quickstart.json
    python -m benchmarks.bench_precision --no-steps --no-eval --allocator
    python -m benchmarks.bench_precision --no-steps --eval-classes 40 --episodes 16  # seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import tempfile

import torch

from benchmarks.bench_ehg import synthetic_split
from benchmarks.bench_throughput import device_name, first_classes, interleaved, once
from fewshot.datasets import load_split
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import episode_accuracies
from fewshot.evaluation.stats import ci95
from fewshot.methods import build_method
from fewshot.runtime.allocator import retain_freed_memory
from fewshot.runtime.device import resolve_device
from fewshot.runtime.precision import cpu_has_native_bf16, precision_name
from fewshot.runtime.settings import build
from fewshot.training.checkpoint import load_trained
from fewshot.training.settings import TrainSettings, read_config_file
from fewshot.training.trainer import Trainer

PRECISIONS = ("off", "bf16")  # --amp values: float32, bf16 autocast


def step_row(
    label: str, backbone: str, head: str, split: ImageSplit, shape: EpisodeShape, args, device
) -> None:
    """(a): one backbone and head, float32 and bf16 train steps timed in turns, one line."""
    steps = {}
    for amp in PRECISIONS:
        config = TrainSettings(
            dataset="omniglot" if split.channels == 1 else "miniimagenet",  # splits are given
            backbone=backbone,
            head=head,
            way=shape.way,
            shot=shape.shot,
            query=shape.query,
            episodes_per_batch=shape.episodes_per_batch,
            augment=split.image_size == 84,
            amp=amp,
            lr=1e-3,  # steps repeat on the same weights: 0.1 diverges on random images
            device=device.type,
        )
        steps[amp] = Trainer(config, device, data=(split, split)).train_step
    seconds = interleaved(steps, args.repeats, device)
    off, bf16 = seconds["off"], seconds["bf16"]
    print(f"{label:22} {backbone:9} {head:9} {off:8.3f} {bf16:8.3f} {bf16 / off:7.2f}x", flush=True)


def print_steps(backbones: list[str], heads: list[str], args, device) -> None:
    """Section (a) for each data set, backbone and head."""
    print(f"\n(a) training step, median of {args.repeats} rounds timed in turns")
    print(f"{'data':22} {'backbone':9} {'head':9} {'float32':>8} {'bf16':>8} {'ratio':>8}")
    cases = []
    if not args.no_omniglot:
        omniglot = load_split("omniglot", "train", args.data_root)
        shape = EpisodeShape(20, 1, args.query, 2)
        cases.append((f"Omniglot 20w1s{args.query}q x2", omniglot, shape))
    if not args.no_synthetic:
        shape = EpisodeShape(5, 1, args.query, 2)
        cases.append((f"synthetic 84x84 5w1s{args.query}q x2", synthetic_split(20, 40, 84), shape))
    for label, split, shape in cases:
        for backbone in backbones:
            for head in heads:
                step_row(label[:22], backbone, head, split, shape, args, device)


def print_eval(args, device) -> None:
    """Section (b): cached evaluation of the Omniglot test classes in both precisions."""
    split = load_split("omniglot", "test", args.data_root)
    total = split.num_classes
    split = first_classes(split, args.eval_classes)
    classes = (
        f"the first {split.num_classes} of the {total}" if args.eval_classes else f"all {total}"
    )
    print(
        f"\n(b) cached evaluation of {classes} test classes, {args.episodes} seeded 20-way "
        "1-shot 15-query episodes"
    )
    torch.manual_seed(0)
    settings = TrainSettings(backbone="conv4", head="protonet").to_dict()
    model = build_method({**settings, "in_channels": 1, "image_size": 28}).to(device).eval()
    shape = EpisodeShape(20, 1, 15, 8)
    accuracies, seconds = {}, {}
    for amp in PRECISIONS:
        model.amp = amp
        seconds[amp], accuracies[amp] = once(
            lambda: episode_accuracies(model, split, shape, args.episodes, 0, device, True),
            device,
        )
    differ = int((accuracies["off"] != accuracies["bf16"]).sum())
    for amp in PRECISIONS:
        acc = accuracies[amp]
        print(
            f"{precision_name(amp, 'cpu'):8} {seconds[amp]:7.2f} s  accuracy "
            f"{100 * float(acc.double().mean()):.2f} ± {100 * ci95(acc):.2f} %"
        )
    print(f"ratio {seconds['bf16'] / seconds['off']:.2f}x; accuracies differ in {differ} episodes")


def print_runs(args, device) -> None:
    """Section (c): the whole run of --run in each precision, then its test accuracy."""
    values = read_config_file(args.run)
    test = load_split(values.get("dataset", "omniglot"), "test", args.data_root)
    shape = EpisodeShape(5, 1, 15, 8)
    print(f"\n(c) whole run of {args.run}, then {args.episodes} seeded 5-way 1-shot test episodes")
    with tempfile.TemporaryDirectory() as tmp:
        for amp in PRECISIONS:
            layers = [("config file", values), ("bench", {"amp": amp, "out": f"{tmp}/{amp}"})]
            config = dataclasses.replace(
                build(TrainSettings, layers), device=device.type, data_root=args.data_root
            )
            seconds, run_dir = once(lambda c=config: Trainer(c, device).fit(), device)
            model, _ = load_trained(str(run_dir / "best.pt"), device)
            model.amp = amp
            acc = episode_accuracies(model, test, shape, args.episodes, 0, device)
            print(
                f"{precision_name(amp, 'cpu'):8} run {seconds:7.1f} s  test accuracy "
                f"{100 * float(acc.double().mean()):.2f} ± {100 * ci95(acc):.2f} %",
                flush=True,
            )


TRAINVAL = "models/omniglot/protonet_conv4_trainval.json"
# A child of (d): time the trainval step with MODE (default / retained) and AMP, print a line.
CHILD = """
import resource, sys, time
from benchmarks.bench_precision import trainval_trainer
from fewshot.runtime.allocator import retain_freed_memory
mode, amp, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "retained":
    retain_freed_memory()
step = trainval_trainer(amp).train_step
for _ in range(3):
    step()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
start = time.perf_counter()
for _ in range(steps):
    step()
seconds = (time.perf_counter() - start) / steps
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps
print(seconds, faults)
"""


def trainval_trainer(amp: str) -> Trainer:
    """A Trainer of the Omniglot trainval config in `amp` (for timing steps; it writes nothing)."""
    layers = [("config file", read_config_file(TRAINVAL)), ("bench", {"amp": amp})]
    settings = dataclasses.replace(build(TrainSettings, layers), device="cpu")
    return Trainer(settings, torch.device("cpu"))


def print_allocator(args) -> None:
    """Section (d): glibc's default allocator against retained memory, fresh processes."""
    print(f"\n(d) allocator: {TRAINVAL} steps, fresh processes in turns, median of {args.repeats}")
    print(f"{'precision':9} {'allocator':14} {'ms/step':>8} {'faults/step':>12} {'ratio':>7}")
    for amp in PRECISIONS:
        times: dict[str, list[float]] = {"default": [], "retained": []}
        faults: dict[str, list[float]] = {"default": [], "retained": []}
        for _ in range(args.repeats):
            for mode in times:
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, mode, amp, "30"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()
                times[mode].append(1000 * float(out[0]))
                faults[mode].append(float(out[1]))
        base = statistics.median(times["default"])
        for mode in times:
            ms = statistics.median(times[mode])
            print(
                f"{precision_name(amp, 'cpu'):9} {mode:14} {ms:8.1f} "
                f"{statistics.median(faults[mode]):12.0f} {ms / base:6.2f}x",
                flush=True,
            )


def main() -> None:
    """Parse the options and print the sections asked for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbones", default="conv4,resnet12", help="e.g. conv4,resnet12")
    parser.add_argument("--heads", default="protonet,ridge,svm", help="train-step heads")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds of (a) (median)")
    parser.add_argument("--query", type=int, default=15, help="queries per class of (a)")
    parser.add_argument("--episodes", type=int, default=2000, help="episodes of (b) and (c)")
    parser.add_argument(
        "--run", help="a training config for (c), e.g. models/omniglot/quickstart.json"
    )
    parser.add_argument("--allocator", action="store_true", help="also (d), CPU only")
    parser.add_argument("--no-steps", action="store_true", help="skip (a)")
    parser.add_argument("--no-eval", action="store_true", help="skip (b)")
    parser.add_argument(
        "--eval-classes", type=int, help="(b) on the first N test classes (default: all)"
    )
    parser.add_argument("--no-omniglot", action="store_true", help="skip Omniglot in (a)")
    parser.add_argument("--no-synthetic", action="store_true", help="skip the 84x84 set in (a)")
    parser.add_argument("--data-root", help="default: $FEWSHOT_DATA or data/")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = parser.parse_args()
    device = resolve_device(args.device)
    retain_freed_memory()
    native = f"native bf16: {cpu_has_native_bf16()}" if device.type == "cpu" else ""
    print(f"device: {device_name(device)}; torch {torch.__version__}; {native}")
    if not args.no_steps:
        print_steps(args.backbones.split(","), args.heads.split(","), args, device)
    if not args.no_eval:
        print_eval(args, device)
    if args.run:
        print_runs(args, device)
    if args.allocator:
        print_allocator(args)


if __name__ == "__main__":
    main()
