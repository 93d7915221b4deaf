"""What the study trains and tests (its methods and flags), and where each run and result is."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

# The U flag of `fewshot train`, in one place: the library may rename it.
EHG_FLAG = "--resplits"
# Every method a study can train: its name in tables, and the `fewshot train` flags picking it.
# The adaptation methods run the MAML paper's Omniglot setting: stride-2 Conv-4, one inner step
# of 0.4 in training, three at test time.
MAML_SETTING = [
    "--backbone-options", json.dumps({"downsample": "stride"}),
    "--method-options", json.dumps({"inner_steps": 1, "inner_lr": 0.4, "eval_inner_steps": 3}),
]  # fmt: skip
METHODS = {
    "protonet": ("ProtoNet", ["--head", "protonet"]),
    "ridge": ("ridge", ["--head", "ridge"]),
    "anil": ("ANIL", ["--method", "anil", *MAML_SETTING]),
    "maml": ("MAML", ["--method", "maml", *MAML_SETTING]),
}
# --smoke: two seeds (compare-seeds needs two), one small step per epoch, a few episodes, and
# the CLI processes at the test suite's priority.
SMOKE = {
    "seeds": "0,1", "method_seeds": "", "way": 5, "query": 2, "epochs": 2,
    "episodes_per_epoch": 2, "episodes_per_batch": 2, "val_episodes": 2, "test_episodes": 4,
    "nice": 0,
}  # fmt: skip


def data_flags(args: argparse.Namespace) -> list[str]:
    """--data-root for the CLI, when the study was given one."""
    return ["--data-root", str(args.data_root)] if args.data_root else []


def ints(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]."""
    return [int(x) for x in text.split(",") if x]


def method_seeds(args: argparse.Namespace) -> dict[str, list[int]]:
    """The training seeds of every method."""
    seeds = {method: ints(args.seeds) for method in args.methods.split(",")}
    for item in filter(None, args.method_seeds.split(";")):
        method, values = item.split("=")
        seeds[method] = ints(values)
    return seeds


def shown(path: Path) -> str:
    """A path as the results show it: relative to the working folder (no machine paths)."""
    return os.path.relpath(path)


def run_dir(args: argparse.Namespace, method: str, u: int, seed: int) -> Path:
    """The run folder of one model."""
    return args.runs / f"{method}_U{u}_s{seed}"


def metrics(folder: Path) -> list[dict]:
    """The finished epochs of a run (empty before its first)."""
    path = folder / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def finished(args: argparse.Namespace, folder: Path) -> bool:
    """Whether a run has logged its last epoch."""
    return any(row["epoch"] == args.epochs for row in metrics(folder))


def train_argv(args: argparse.Namespace, method: str, u: int, seed: int) -> list[str]:
    """`fewshot train` arguments: continue the run, or start it afresh."""
    folder = run_dir(args, method, u, seed)
    if (folder / "last.pt").exists():
        return ["train", "--resume", str(folder / "last.pt")]
    # Killed before its first checkpoint (or never started): nothing to keep.
    return [
        "train", "--overwrite", "--dataset", "omniglot", "--backbone", "conv4", *METHODS[method][1],
        "--way", str(args.way), "--shot", "1", "--query", str(args.query),
        "--val-way", "5", "--val-shot", "1", "--val-query", "15",
        "--val-episodes", str(args.val_episodes), "--epochs", str(args.epochs),
        "--episodes-per-epoch", str(args.episodes_per_epoch),
        "--episodes-per-batch", str(args.episodes_per_batch), EHG_FLAG, str(u),
        "--optimizer", "adam", "--lr", str(args.lr), "--weight-decay", "0",
        "--lr-schedule", json.dumps([[args.epochs // 2, 0.5]]), "--amp", args.amp,
        "--seed", str(seed), "--device", "cpu", "--out", str(folder), *data_flags(args),
    ]  # fmt: skip


def test_flags(args: argparse.Namespace, way: int) -> list[str]:
    """The shared test episodes of one way (1-shot, 15 queries)."""
    return [
        "--way", str(way), "--shot", "1", "--query", "15",
        "--episodes", str(args.test_episodes), "--seed", str(args.test_seed),
        "--device", "cpu", "--amp", args.amp, *data_flags(args),
    ]  # fmt: skip


def seeds_file(args: argparse.Namespace, method: str, u: int, way: int, seeds: list[int]) -> Path:
    """The cached `compare-seeds` JSON of U vs the baseline on one test way."""
    base = ints(args.resplits)[0]
    tag = "-".join(map(str, seeds))
    name = f"{method}_U{u}-U{base}_{way}w1s_{args.test_episodes}ep_seed{args.test_seed}_s{tag}"
    return args.runs / "tests" / f"compare_seeds_{name}.json"


def pair_file(args: argparse.Namespace, method: str, u: int, way: int) -> Path:
    """The cached `compare` JSON of U vs the baseline for the paired seed."""
    base = ints(args.resplits)[0]
    name = f"{method}_U{u}-U{base}_{way}w1s_{args.test_episodes}ep_seed{args.test_seed}"
    return args.runs / "tests" / f"compare_{name}_s{args.paired_seed}.json"
