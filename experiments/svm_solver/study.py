"""The SVM head trained with the native interior-point solver and with qpth, from the same seeds.

Both arms go through `fewshot train` with the settings of `experiments/ehg_seeds` (Omniglot,
Conv-4, 400 episodes of 20-way 1-shot 5-query, Adam, float32, U = 1), so for each seed they
start from the same weights and see the same episodes; they differ in how each episode's SVM is
solved: the native solver to its tolerance (training and testing), or MetaOptNet's qpth
truncated at 15 iterations in training and 3 in testing (the `qpth` extra). Each seed's pair
is tested with `fewshot compare` on the same 2000 seeded 5-way and 20-way 1-shot episodes, and
the seeds together with `fewshot compare-seeds`. Resumable: a finished step is skipped.

    python -m experiments.svm_solver.study    # from the repository root
    python -m experiments.svm_solver.study --smoke --out DIR    # seconds: the test suite's run
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from experiments.cli_runs import fewshot
from experiments.ehg_convergence.layout import metrics
from experiments.smoke import add_smoke_flag, omniglot_root, smoke_folder

ARMS = {
    "native": [],
    "qpth": [
        "--head-options", '{"solver": "qpth"}',
        "--eval-head-options", '{"solver": "qpth", "max_iter": 3}',
    ],
}  # fmt: skip
# experiments/ehg_seeds' runs: 4 epochs of 100 episodes, 2 per step, Adam 1e-3 halved at epoch 2.
EPOCHS = 4
TRAIN = [
    "--dataset", "omniglot", "--backbone", "conv4", "--head", "svm", "--way", "20",
    "--shot", "1", "--query", "5", "--val-way", "5", "--val-shot", "1", "--val-query", "15",
    "--val-episodes", "300", "--epochs", str(EPOCHS), "--episodes-per-epoch", "100",
    "--episodes-per-batch", "2", "--optimizer", "adam", "--lr", "0.001", "--weight-decay", "0",
    "--lr-schedule", "[[2, 0.5]]", "--amp", "off", "--device", "cpu",
]  # fmt: skip
# --smoke: two seeds (compare-seeds needs two), 2 epochs of one small step, a few episodes.
SMOKE_EPOCHS = 2
SMOKE_TRAIN = [
    "--way", "5", "--query", "2", "--val-episodes", "2", "--epochs", str(SMOKE_EPOCHS),
    "--episodes-per-epoch", "2", "--lr-schedule", "[[1, 0.5]]",
]  # fmt: skip
SMOKE = {"seeds": "0,1", "test_episodes": 4}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The study's settings (from the command line unless `argv` is given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds")
    parser.add_argument("--test-episodes", type=int, default=2000)
    parser.add_argument("--test-seed", type=int, default=2024)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steady)")
    parser.add_argument("--runs", type=Path, default=Path("runs/svm_solver"))
    parser.add_argument("--out", type=Path, default=Path("experiments/svm_solver"))
    parser.add_argument("--data-root", default=None, help="data root (default: as fewshot's)")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    # The flags of every training run and test, and the epochs that finish a run.
    args.train, args.epochs, args.data_flags = TRAIN, EPOCHS, []
    if args.smoke:
        vars(args).update(SMOKE)
        args.out = smoke_folder(args.out)
        args.runs = args.out / "runs"
        args.data_root = args.data_root or str(omniglot_root(args.out / "data"))
        args.train, args.epochs = [*TRAIN, *SMOKE_TRAIN], SMOKE_EPOCHS
    if args.data_root:
        args.data_flags = ["--data-root", args.data_root]
    return args


def train(args: argparse.Namespace, folder: Path, arm: str, seed: int) -> None:
    """Train (or finish) one arm's run of one seed."""
    if any(row["epoch"] == args.epochs for row in metrics(folder)):
        return
    if (folder / "last.pt").exists():
        fewshot("train", "--resume", str(folder / "last.pt"))
    else:
        flags = [*args.train, *args.data_flags, *ARMS[arm], "--seed", str(seed)]
        fewshot("train", *flags, "--overwrite", "--out", str(folder))


def main(argv: list[str] | None = None) -> None:
    """Train both arms for every seed, compare each pair and the seeds, write summary.json."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",")]
    folders = {(arm, s): args.runs / f"{arm}_seed{s}" for arm in ARMS for s in seeds}
    for (arm, seed), folder in folders.items():
        train(args, folder, arm, seed)
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"seeds": seeds, "train_seconds": {}}
    for (arm, seed), folder in folders.items():
        rows = metrics(folder)
        summary["train_seconds"][f"{arm}_seed{seed}"] = sum(r["seconds"] for r in rows)
    test = ["--shot", "1", "--query", "15", "--amp", "off", "--device", "cpu"]
    test += ["--episodes", str(args.test_episodes), "--seed", str(args.test_seed), *args.data_flags]
    for way in (5, 20):
        shape = [*test, "--way", str(way)]
        for seed in seeds:
            out = args.out / f"compare_{way}way_seed{seed}.json"
            if not out.exists():
                pair = [str(folders["qpth", seed]), str(folders["native", seed])]
                fewshot("compare", *pair, *shape, "--out", str(out))
        out = args.out / f"compare_seeds_{way}way.json"
        if not out.exists():
            arms = {a: [str(folders[a, s]) for s in seeds] for a in ARMS}
            fewshot("compare-seeds", "--a", *arms["qpth"], "--b", *arms["native"], *shape,
                    "--out", str(out))  # fmt: skip
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
