"""`fewshot train --compile`: the training step eager and with each torch.compile mode.

One Trainer per mode from the same config and seed (the same weights and episodes), the data
read once: the first step's seconds (the compilation), its loss against the eager step's, then
--steps steps of each mode timed in alternation (off, default, reduce-overhead, off, ...), the
median of --repeats rounds, as ratios to eager. reduce-overhead replays CUDA graphs on a GPU and
is `default` on a CPU. Goal (issue 44): a mode that is faster and exact where it becomes the
default; the Conv-4 ProtoNet step of the zoo's Omniglot run near the hardware on a GPU.

    python -m benchmarks.bench_compile --device cuda
    OMP_NUM_THREADS=2 python -m benchmarks.bench_compile --steps 20 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace

from benchmarks.bench_ehg import sync
from benchmarks.bench_throughput import device_name
from fewshot.runtime.device import DEVICES, resolve_device
from fewshot.training.compiled import COMPILE_MODES
from fewshot.training.run_setup import read_data
from fewshot.training.settings import TrainSettings, make_config
from fewshot.training.trainer import Trainer


def timed_steps(trainer: Trainer, steps: int) -> tuple[float, float]:
    """The seconds `steps` training steps took, and the first one's loss."""
    sync(trainer.device)
    start = time.perf_counter()
    first = trainer.train_step()[0]
    for _ in range(steps - 1):
        trainer.train_step()
    sync(trainer.device)
    return time.perf_counter() - start, first


def main() -> None:
    """Print each mode's compile time, first-step loss difference and time per step."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="models/omniglot/protonet_conv4_trainval.json")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--modes", default=",".join(COMPILE_MODES), help="comma-separated")
    parser.add_argument("--steps", type=int, default=50, help="steps per timed pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (median)")
    parser.add_argument("--device", default="auto", choices=DEVICES)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (the test suite)")
    args = parser.parse_args()
    modes = args.modes.split(",")
    if modes[0] != "off" or not set(modes) <= set(COMPILE_MODES):
        parser.error(
            f"--modes: off first (the others are timed against it), then of {COMPILE_MODES}"
        )
    if args.smoke:
        args.steps, args.repeats = 2, 1
    device = resolve_device(args.device)
    with tempfile.TemporaryDirectory() as folder:
        flags = {"out": folder, "device": device.type}
        if args.data_root:
            flags["data_root"] = args.data_root
        if args.smoke:  # one 5-way 2-query episode per step
            flags |= {"way": 5, "query": 2, "episodes_per_batch": 1}
        base = make_config(args.config, flags, TrainSettings)
        data = read_data(base)
        print(f"device: {device_name(device)}, config {args.config}")
        print(
            f"{base.way}-way {base.shot}-shot {base.query}-query x {base.episodes_per_batch} "
            f"episodes per step, {base.backbone}, {args.steps} steps x {args.repeats} rounds"
        )
        trainers, first = {}, {}
        for mode in modes:  # printed as they come: a compilation may run past a time limit
            trainers[mode] = Trainer(replace(base, compile=mode), device, data=data)
            seconds, loss = first[mode] = timed_steps(trainers[mode], 1)
            difference = abs(loss - first[modes[0]][1]) if mode != "off" else 0.0
            print(f"{mode}: first step {seconds:.1f} s, |loss - eager loss| {difference:.2e}")
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        for _ in range(args.repeats):
            for mode in modes:
                times[mode].append(timed_steps(trainers[mode], args.steps)[0] / args.steps)
    print(f"precision {trainers['off'].precision}")
    eager = statistics.median(times["off"])
    for mode in modes:
        step = statistics.median(times[mode])
        faster = "  faster" if step < eager else ""
        print(f"{mode:16} {1000 * step:8.2f} ms/step  {step / eager:6.3f}x eager{faster}")


if __name__ == "__main__":
    main()
