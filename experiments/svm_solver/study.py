"""The SVM head trained with the native interior-point solver and with qpth, from the same seeds.

Both arms go through `fewshot train` with the settings of `experiments/ehg_seeds` (Omniglot,
Conv-4, 400 episodes of 20-way 1-shot 5-query, Adam, float32, U = 1), so for each seed they
start from the same weights and see the same episodes; they differ in how each episode's SVM is
solved: the native solver to its tolerance (training and testing), or MetaOptNet's qpth
truncated at 15 iterations in training and 3 in testing (the `qpth` extra). Each seed's pair
is tested with `fewshot compare` on the same 2000 seeded 5-way and 20-way 1-shot episodes, and
the seeds together with `fewshot compare-seeds`. Resumable: a finished step is skipped.

    python -m experiments.svm_solver.study    # from the repository root
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from experiments.ehg_convergence.study import metrics
from fewshot.cli.main import main as fewshot

ARMS = {
    "native": [],
    "qpth": [
        "--head-options", '{"solver": "qpth"}',
        "--eval-head-options", '{"solver": "qpth", "max_iter": 3}',
    ],
}  # fmt: skip
# experiments/ehg_seeds' runs: 4 epochs of 100 episodes, 2 per step, Adam 1e-3 halved at epoch 2.
TRAIN = [
    "--dataset", "omniglot", "--backbone", "conv4", "--head", "svm", "--way", "20",
    "--shot", "1", "--query", "5", "--val-way", "5", "--val-shot", "1", "--val-query", "15",
    "--val-episodes", "300", "--epochs", "4", "--episodes-per-epoch", "100",
    "--episodes-per-batch", "2", "--optimizer", "adam", "--lr", "0.001", "--weight-decay", "0",
    "--lr-schedule", "[[2, 0.5]]", "--amp", "off", "--device", "cpu",
]  # fmt: skip


def parse_args() -> argparse.Namespace:
    """The study's settings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds")
    parser.add_argument("--test-episodes", type=int, default=2000)
    parser.add_argument("--test-seed", type=int, default=2024)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steady)")
    parser.add_argument("--runs", type=Path, default=Path("runs/svm_solver"))
    parser.add_argument("--out", type=Path, default=Path("experiments/svm_solver"))
    return parser.parse_args()


def run(argv: list[str]) -> None:
    """One fewshot command; a failure stops the study."""
    if fewshot(argv) != 0:
        raise SystemExit(f"failed: fewshot {' '.join(argv)}")


def train(folder: Path, arm: str, seed: int) -> None:
    """Train (or finish) one arm's run of one seed."""
    if any(row["epoch"] == 4 for row in metrics(folder)):
        return
    if (folder / "last.pt").exists():
        run(["train", "--resume", str(folder / "last.pt")])
    else:
        run(["train", *TRAIN, *ARMS[arm], "--seed", str(seed), "--overwrite", "--out", str(folder)])


def main() -> None:
    """Train both arms for every seed, compare each pair and the seeds, write summary.json."""
    args = parse_args()
    torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",")]
    folders = {(arm, s): args.runs / f"{arm}_seed{s}" for arm in ARMS for s in seeds}
    for (arm, seed), folder in folders.items():
        train(folder, arm, seed)
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"seeds": seeds, "train_seconds": {}}
    for (arm, seed), folder in folders.items():
        rows = metrics(folder)
        summary["train_seconds"][f"{arm}_seed{seed}"] = sum(r["seconds"] for r in rows)
    test = ["--shot", "1", "--query", "15", "--amp", "off", "--device", "cpu"]
    test += ["--episodes", str(args.test_episodes), "--seed", str(args.test_seed)]
    for way in (5, 20):
        shape = [*test, "--way", str(way)]
        for seed in seeds:
            out = args.out / f"compare_{way}way_seed{seed}.json"
            if not out.exists():
                pair = [str(folders["qpth", seed]), str(folders["native", seed])]
                run(["compare", *pair, *shape, "--out", str(out)])
        out = args.out / f"compare_seeds_{way}way.json"
        if not out.exists():
            arms = {a: [str(folders[a, s]) for s in seeds] for a in ARMS}
            run(["compare-seeds", "--a", *arms["qpth"], "--b", *arms["native"], *shape,
                 "--out", str(out)])  # fmt: skip
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
