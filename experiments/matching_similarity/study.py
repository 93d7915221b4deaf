"""Matching Networks' similarity measured side by side: cosine (the paper's), cosine with a
learned temperature, negative squared Euclidean distance, and the Euclidean one with full
context embeddings, at equal training episodes.

Each arm trains `models/omniglot/matching_conv4_5way1shot.json` with its `--method-options`
for --train-episodes episodes (one epoch, at the config's first learning rate) from seeds
0 .. --seeds - 1 (the same episodes in every arm for a seed), and is tested on the same 2000
seeded Omniglot 5-way 1-shot test episodes (seed 0): per arm the mean over seeds ± t interval
and each seed's accuracy, and each arm against the paper's cosine paired across seeds.

Resumable like every study driver here (experiments/cli_runs.py). Writes results.md and
results.json into this folder (--out).

    python -m experiments.matching_similarity.study    # from the repository root
    python -m experiments.matching_similarity.study --smoke --out DIR    # the test suite's run
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from experiments.cli_runs import (
    config_overrides,
    evaluate,
    markdown_header,
    markdown_row,
    percent,
    train,
    write_results,
)
from experiments.smoke import add_study_flags, apply_smoke
from fewshot.evaluation.stats import paired_seeds_ci, seeds_ci

HERE = Path(__file__).resolve().parent
CONFIG = "models/omniglot/matching_conv4_5way1shot.json"
ARMS = {
    "cosine": {"similarity": "cosine"},
    "scaled_cosine": {"similarity": "scaled_cosine"},
    "euclidean": {"similarity": "euclidean"},
    "euclidean_fce": {"similarity": "euclidean", "fce": True},
}
SMOKE = {"episodes": 4, "seeds": 2, "train_episodes": 4, "val_episodes": 2}


def main(argv: list[str] | None = None) -> None:
    """Train what is missing, evaluate, write the table."""
    args = parse_args(argv)
    evals = Path(args.out) / "evals"
    evals.mkdir(parents=True, exist_ok=True)
    data = config_overrides(args.data_root)
    flags = config_overrides(
        args.data_root, episodes_per_epoch=args.train_episodes, val_episodes=args.val_episodes
    )
    results: dict = {"episodes": args.episodes, "train_episodes": args.train_episodes, "arms": {}}
    for arm, options in ARMS.items():
        accuracies = []
        for seed in range(args.seeds):
            run = f"{args.runs}/matching_similarity/{arm}_seed{seed}"
            extra = ["--seed", str(seed), "--method-options", json.dumps(options)]
            train("train", CONFIG, run, 1, *flags, "--epochs", "1", *extra)
            out = evals / f"{arm}_seed{seed}.json"
            acc = evaluate(f"{run}/last.pt", data, 5, 1, args.episodes, out)
            accuracies.append(float(acc.double().mean()))
        results["arms"][arm] = {"options": options, "accuracy": accuracies}
    write_results(results, table(results), Path(args.out))


def table(results: dict) -> str:
    """The markdown table of results.json."""
    arms = results["arms"]
    lines = [
        f"Omniglot 5-way 1-shot, {results['train_episodes']} training episodes per run, tested "
        f"on {results['episodes']} seeded episodes: mean over seeds ± t interval (%), each "
        "seed, and the arm minus the paper's cosine paired across seeds.",
        "",
        *markdown_header("similarity", "method options", "accuracy", "seeds", "− cosine"),
    ]
    for arm, record in arms.items():
        accs = record["accuracy"]
        seeds = ", ".join(f"{100 * a:.2f}" for a in accs)
        diff = paired_seeds_ci(arms["cosine"]["accuracy"], accs)
        versus = "" if arm == "cosine" else percent(diff.mean, diff.ci95, True)
        lines.append(
            markdown_row(
                arm, f"`{json.dumps(record['options'])}`", percent(*seeds_ci(accs)), seeds, versus
            )
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The study's settings (from the command line unless `argv` is given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000, help="test episodes per run")
    parser.add_argument("--seeds", type=int, default=3, help="training seeds per arm")
    parser.add_argument("--train-episodes", type=int, default=2000, help="per training run")
    parser.add_argument("--val-episodes", type=int, help="of every run (default: the config's)")
    add_study_flags(parser, HERE)
    args = parser.parse_args(argv)
    apply_smoke(args, SMOKE, ("runs",))
    return args


if __name__ == "__main__":
    main()
