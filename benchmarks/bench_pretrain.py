"""A pretraining epoch of `fewshot pretrain` against a bare PyTorch loop on the same work.

Both sides train the same backbone and linear classifier from the same weights, on the same
data held as `load_split` gives it (the memory-mapped conversion where `fewshot convert` made
one, else the reader's arrays), batch size, precision (bf16 autocast where the settings' `--amp`
resolves to it) and memory format, with SGD Nesterov. The bare loop is what a user would write:
a shuffled permutation, index the uint8 images, normalise, forward under autocast,
cross-entropy, backward, step, `loss.item()`. The trainer's side is `Trainer.train_step`, which
adds the non-finite check, the progress sums and the batch source. Timed in alternation
(trainer, bare, trainer, ...) over --steps steps each, the median of --repeats rounds.

Goal: the trainer's epoch within 1.1x of the bare loop's.

    python -m benchmarks.bench_pretrain --steps 200 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

from benchmarks.bench_ehg import sync
from benchmarks.bench_throughput import device_name
from fewshot.datasets.augment import normalize
from fewshot.runtime.device import DEVICES, resolve_device
from fewshot.runtime.precision import autocast_dtype
from fewshot.training.settings import PretrainSettings, make_config
from fewshot.training.trainer import Trainer

GOAL = 1.1


def bare_loop(trainer: Trainer, steps: int, generator: torch.Generator) -> float:
    """`steps` optimizer steps of a hand-written loop on a copy of the trainer's model; the
    seconds they took."""
    s, data, device = trainer.settings, trainer.train_data, trainer.device
    model = trainer.batches.build(trainer.config).to(device)
    model.load_state_dict(trainer.method.state_dict())
    if s.channels_last:
        model.to(memory_format=torch.channels_last)
    model.train()
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(
        parameters, s.lr, momentum=s.momentum, nesterov=True, weight_decay=s.weight_decay
    )
    dtype = autocast_dtype(s.amp, device.type)
    order = torch.randperm(len(data.labels), generator=generator)
    sync(device)
    start = time.perf_counter()
    for step in range(steps):
        index = order[step * s.batch_size : (step + 1) * s.batch_size]
        images = normalize(data.images[index].to(device), data.mean, data.std)
        if s.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            features = model.backbone(images)
        loss = F.cross_entropy(model.classifier(features.float()), data.labels[index].to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()
    sync(device)
    return time.perf_counter() - start


def trainer_steps(trainer: Trainer, steps: int) -> float:
    """`steps` of the trainer's own step; the seconds they took."""
    trainer.method.train()
    sync(trainer.device)
    start = time.perf_counter()
    for _ in range(steps):
        trainer.train_step()
    sync(trainer.device)
    return time.perf_counter() - start


def main() -> None:
    """Print both sides' time per step and their ratio against the goal."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="models/omniglot/pretrain_conv4_trainval.json")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--steps", type=int, default=200, help="steps per timed pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (median)")
    parser.add_argument("--device", default="auto", choices=DEVICES)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (the test suite)")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.repeats = 2, 1
    device = resolve_device(args.device)
    with tempfile.TemporaryDirectory() as folder:
        flags = {"out": folder, "device": device.type}
        if args.data_root:
            flags["data_root"] = args.data_root
        settings = make_config(args.config, flags, PretrainSettings)
        trainer = Trainer(settings, device)
        generator = torch.Generator().manual_seed(0)
        trainer_steps(trainer, 2)  # warm-up of both sides
        bare_loop(trainer, 2, generator)
        ours, bare = [], []
        for _ in range(args.repeats):
            ours.append(trainer_steps(trainer, args.steps) / args.steps)
            bare.append(bare_loop(trainer, args.steps, generator) / args.steps)
    mine, theirs = statistics.median(ours), statistics.median(bare)
    print(f"device: {device_name(device)}, precision {trainer.precision}, config {args.config}")
    print(
        f"batch {settings.batch_size} of {settings.backbone}, {args.steps} steps x {args.repeats}"
    )
    print(f"fewshot pretrain step {1000 * mine:8.2f} ms")
    print(f"bare PyTorch loop     {1000 * theirs:8.2f} ms")
    ratio = mine / theirs
    print(f"ratio {ratio:.3f}x: goal <= {GOAL}x {'met' if ratio <= GOAL else 'MISSED'}")
    epoch = trainer.steps_per_epoch
    print(f"an epoch ({epoch} steps): {epoch * mine:.1f} s against {epoch * theirs:.1f} s")


if __name__ == "__main__":
    main()
