"""ResNet-12 rehearsal on the CPU: the miniImageNet ResNet-12 configs of the three heads, trained
through `fewshot train` on synthetic 84x84 images with learnable class structure.

The images are written as miniImageNet's learn2learn cache (64 / 16 / 20 classes, named after
the Ravi split lists' wnids) under --data; each config is trained with its own settings but a
short run (--epochs, --episodes-per-epoch, --val-episodes) on the CPU, one after another; the
peak memory of each `fewshot train` process is taken from the kernel (wait4). Resumable: a
config whose run record (`<runs>/<name>.run.json`) says it finished is not trained again.
Writes results.md and each run's metrics.jsonl into the study folder.

    nice -n 5 python -m experiments.resnet12_rehearsal.rehearsal     # from the repository root
    python -m experiments.resnet12_rehearsal.rehearsal --smoke --out DIR    # the test suite's run
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import pickle
import platform
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from experiments.cli_runs import config_overrides
from experiments.resnet12_rehearsal.synthetic import class_images
from experiments.smoke import add_smoke_flag, smoke_folder
from fewshot.datasets import REPO_DATA
from fewshot.datasets.miniimagenet import IMAGE_SIZE, LEARN2LEARN_FILES
from fewshot.evaluation.metrics import MetricsRow, read_metrics
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_write_bytes, atomic_write_text
from fewshot.training.settings import make_config

# One config per head; the MetaOptNet heads train 15-shot whatever the test shot, and their
# 5-shot configs select on 5-shot validation episodes.
CONFIGS = ("protonet_resnet12_1shot", "ridge_resnet12_5shot", "svm_resnet12_5shot")
# Images per class in every split (miniImageNet has 600; 60 keeps the cache at 127 MB).
PER_CLASS = 60
# Pattern contrast and pixel noise per split. The training augmentation's colour jitter (factors
# 0.6-1.4) leaves an untrained ResNet-12 at chance on faint patterns, so the training classes'
# are strong; the validation and test classes' are faint, so that their accuracy has room to
# rise: an untrained ResNet-12 ProtoNet scores 44.9 ± 1.1 % on their 5-way 1-shot episodes.
LEVELS = {
    "train": {"contrast": 60.0, "noise": 50.0},
    "val": {"contrast": 12.0, "noise": 70.0},
    "test": {"contrast": 12.0, "noise": 70.0},
}
SPLIT_SEEDS = {"train": 0, "val": 1, "test": 2}  # other seeds: other classes' patterns
# --smoke: one epoch of two steps of one small episode each, two validation episodes, as few
# images as the episodes need (a ResNet-12 step on 84x84 images takes seconds on a CPU).
SMOKE = {"epochs": 1, "episodes_per_epoch": "2", "val_episodes": 2}
SMOKE_SETTINGS = {"query": 2, "val_query": 2, "episodes_per_batch": 1}


@dataclass
class Run:
    """One finished `fewshot train` process: its command, run length, exit status, wall
    seconds, peak resident memory and the epochs it logged."""

    name: str
    command: list[str]
    episodes_per_epoch: int
    steps_per_epoch: int
    status: int
    seconds: float
    peak_bytes: int
    rows: list[MetricsRow]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The study's settings (from the command line unless `argv` is given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="runs/rehearsal/data", help="synthetic data root")
    parser.add_argument("--runs", default="runs/rehearsal", help="folder of the run folders")
    parser.add_argument("--out", default="experiments/resnet12_rehearsal", help="results folder")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="miniimagenet configs")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of every run")
    parser.add_argument(
        "--episodes-per-epoch",
        default="protonet_resnet12_1shot=20,ridge_resnet12_5shot=12,svm_resnet12_5shot=10",
        help="training episodes per epoch: one number, or NAME=N for each config",
    )
    parser.add_argument("--val-episodes", type=int, default=200, help="validation episodes")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    # Settings replacing the configs' beyond the run length.
    args.settings = {}
    if args.smoke:
        vars(args).update(SMOKE)
        out = smoke_folder(args.out)
        args.out, args.runs, args.data = str(out), str(out / "runs"), str(out / "data")
        args.settings = SMOKE_SETTINGS
    return args


def episodes_of(spec: str, names: list[str]) -> dict[str, int]:
    """--episodes-per-epoch as a count per config."""
    if "=" not in spec:
        return dict.fromkeys(names, int(spec))
    counts = {name: int(count) for name, count in (item.split("=") for item in spec.split(","))}
    missing = [name for name in names if name not in counts]
    if missing:
        raise SystemExit(f"--episodes-per-epoch names no count for {', '.join(missing)}")
    return counts


def ravi_classes(split: str) -> list[str]:
    """The wnids of a split in the Ravi list shipped in data/, in the order they appear."""
    with open(REPO_DATA / "miniimagenet" / f"{split}.csv", newline="") as f:
        return list(dict.fromkeys(row["label"] for row in csv.DictReader(f)))


def write_data(root: Path, per_class: int = PER_CLASS) -> None:
    """Write the three splits as learn2learn's miniImageNet cache under root/miniimagenet,
    `per_class` images per class."""
    folder = root / "miniimagenet"
    folder.mkdir(parents=True, exist_ok=True)
    for split, seed in SPLIT_SEEDS.items():
        names = ravi_classes(split)
        images, _ = class_images(len(names), per_class, 3, IMAGE_SIZE, seed, **LEVELS[split])
        cache = {
            "image_data": images.permute(0, 2, 3, 1).numpy(),  # learn2learn's [N, 84, 84, 3]
            "class_dict": {
                wnid: list(range(k * per_class, (k + 1) * per_class))
                for k, wnid in enumerate(names)
            },
        }
        atomic_write_bytes(pickle.dumps(cache), folder / LEARN2LEARN_FILES[split][0])


def images_needed(names: list[str], settings: dict) -> int:
    """The most images per class that an episode of these configs draws under `settings` (a
    smoke run writes no more)."""
    configs = [make_config(f"models/miniimagenet/{name}.json", settings) for name in names]
    return max(max(c.shot + c.query, c.val_shot + c.val_query) for c in configs)


def train(name: str, episodes: int, args: argparse.Namespace) -> Run:
    """Run `fewshot train` on a config with the rehearsal's run length (its output in a log
    beside the run folder) and read the epochs it logged."""
    config = f"models/miniimagenet/{name}.json"
    out = Path(args.runs) / name
    command = [
        sys.executable, "-m", "fewshot", "train",
        "--config", config,
        "--data-root", args.data,
        "--epochs", str(args.epochs),
        "--episodes-per-epoch", str(episodes),
        "--val-episodes", str(args.val_episodes),
        "--device", "cpu",
        "--out", str(out),
        "--overwrite", *config_overrides(None, **args.settings),
    ]  # fmt: skip
    start = time.perf_counter()
    with open(Path(args.runs) / f"{name}.log", "wb") as log:
        redirect = [(os.POSIX_SPAWN_DUP2, log.fileno(), 1), (os.POSIX_SPAWN_DUP2, log.fileno(), 2)]
        pid = os.posix_spawn(sys.executable, command, os.environ, file_actions=redirect)
        # wait4 gives this child's own peak (RUSAGE_CHILDREN would be the largest one so far).
        _, status, usage = os.wait4(pid, 0)
    seconds = time.perf_counter() - start
    try:
        rows = read_metrics(out)
    except FewshotError:  # the run stopped before its first epoch ended
        rows = []
    return Run(
        name,
        command,
        episodes,
        episodes // make_config(config, args.settings).episodes_per_batch,
        os.waitstatus_to_exitcode(status),
        seconds,
        usage.ru_maxrss * 1024,  # Linux reports KiB
        rows,
    )


def record_path(name: str, args: argparse.Namespace) -> Path:
    """Where a finished run's record is kept, beside its run folder."""
    return Path(args.runs) / f"{name}.run.json"


def finished_run(name: str, episodes: int, args: argparse.Namespace) -> Run | None:
    """The run of a config recorded by an earlier call with this run length, if it exited 0."""
    path = record_path(name, args)
    if not path.exists():
        return None
    fields = json.loads(path.read_text())
    if fields["status"] != 0 or fields["episodes_per_epoch"] != episodes:
        return None
    rows = read_metrics(Path(args.runs) / name)
    return Run(**fields, rows=rows) if len(rows) == args.epochs else None


def keep_record(run: Run, args: argparse.Namespace) -> None:
    """Write a run's record (all but its metrics rows, which stay in the run folder)."""
    fields = {k: v for k, v in dataclasses.asdict(run).items() if k != "rows"}
    atomic_write_text(json.dumps(fields, indent=1) + "\n", record_path(run.name, args))


def machine() -> str:
    """CPU model, core count and torch version, for the results' header."""
    with open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f if "model name" in line), "")
    return f"{model or platform.processor()}, {os.cpu_count()} cores, torch {torch.__version__}"


def summary_row(run: Run) -> str:
    """The results table's row of one run."""
    wall, memory = f"{run.seconds / 60:.1f}", f"{run.peak_bytes / 2**30:.2f}"
    if not run.rows:
        return f"| {run.name} | none (exit status {run.status}) | | | | | | {wall} | {memory} |"
    first, last = run.rows[0], run.rows[-1]
    steps = len(run.rows) * run.steps_per_epoch
    return (
        f"| {run.name} | {len(run.rows) * run.episodes_per_epoch} | {last.precision} | "
        f"{first.train_loss:.3f} → {last.train_loss:.3f} | "
        f"{first.train_acc:.1f} → {last.train_acc:.1f} | "
        f"{first.val_acc:.1f} → {last.val_acc:.1f} | "
        f"{sum(r.seconds for r in run.rows) / steps:.1f} | {wall} | {memory} |"
    )


def run_section(run: Run) -> str:
    """The command and per-epoch table of one run."""
    lines = [
        f"## {run.name}",
        "",
        f"`{' '.join(['python', *run.command[1:]])}`: exit status {run.status}.",
        "",
        "| epoch | lr | loss | train acc (%) | val acc (%) | s in steps | s per step |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.epoch} | {r.lr:g} | {r.train_loss:.3f} | {r.train_acc:.1f} | "
        f"{r.val_acc:.1f} ± {r.val_ci95:.1f} | {r.seconds:.0f} | "
        f"{r.seconds / run.steps_per_epoch:.1f} |"
        for r in run.rows
    ]
    return "\n".join(lines)


def results(runs: list[Run], val_episodes: int) -> str:
    """results.md: a summary row per config, then each run's epochs."""
    lines = [
        "# ResNet-12 rehearsal: results",
        "",
        f"Machine: {machine()}; shared with other trainings, so times are upper bounds.",
        f"Validation: {val_episodes} seeded episodes of each config's validation shape.",
        "",
        "| config | episodes | precision | loss, first → last epoch | train acc (%) | "
        "val acc (%) | s per step | wall (min) | peak RSS (GiB) |",
        "|---|---|---|---|---|---|---|---|---|",
        *map(summary_row, runs),
    ]
    return "\n\n".join(["\n".join(lines), *map(run_section, runs)]) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Write the data, train each config, copy its metrics.jsonl and write results.md."""
    args = parse_args(argv)
    names = args.configs.split(",")
    counts = episodes_of(args.episodes_per_epoch, names)
    Path(args.runs).mkdir(parents=True, exist_ok=True)
    write_data(Path(args.data), images_needed(names, args.settings) if args.smoke else PER_CLASS)
    runs = []
    for name in names:
        done = finished_run(name, counts[name], args)
        if done is not None:
            print(f"{name}: finished before, kept", flush=True)
            runs.append(done)
            continue
        print(f"training {name}: {args.epochs} x {counts[name]} episodes", flush=True)
        runs.append(train(name, counts[name], args))
        keep_record(runs[-1], args)
        if runs[-1].rows:
            metrics = Path(args.runs) / name / "metrics.jsonl"
            shutil.copyfile(metrics, Path(args.out) / f"{name}.metrics.jsonl")
        print(f"  exit status {runs[-1].status}, {runs[-1].seconds / 60:.1f} min", flush=True)
    atomic_write_text(results(runs, args.val_episodes), Path(args.out) / "results.md")


if __name__ == "__main__":
    main()
