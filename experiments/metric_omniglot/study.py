"""Matching and Relation Networks on Omniglot: the zoo models, and EHG over 5 training seeds.

1. The zoo configs `models/omniglot/{matching,relation}_conv4_5way1shot.json` trained to the
   end and tested on the zoo's seeded episodes (2000 each, seed 0, 15 queries; 5/20-way,
   1/5-shot with the 5-way 1-shot model), beside the papers' numbers.
2. EHG: each config cut to --ehg-episodes training episodes, seeds 0-4, U = 1 and U = 5 from
   the same seed, tested on the same 2000 seeded 5-way 1-shot episodes: each arm's mean ± t
   interval and U5 − U1 paired across seeds (`fewshot compare-seeds`); and the seconds of
   training steps of each arm (metrics.jsonl), whose ratio is EHG's cost here.

Resumable like every study driver here (experiments/cli_runs.py). Writes results.md and
results.json into this folder (--out).

    python -m experiments.metric_omniglot.study    # from the repository root
    python -m experiments.metric_omniglot.study --smoke --out DIR    # the test suite's run
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from experiments.cli_runs import (
    OMNIGLOT_SETTINGS,
    SETTING_KEYS,
    compare_seeds,
    config_overrides,
    evaluate,
    markdown_header,
    markdown_row,
    percent,
    train,
    write_results,
)
from experiments.smoke import add_study_flags, apply_smoke
from fewshot.evaluation.stats import ci95, seeds_ci

HERE = Path(__file__).resolve().parent
METHODS = {"matching": "Matching Networks", "relation": "Relation Networks"}
PAPERS = {"matching": [98.1, 98.9, 93.8, 98.5], "relation": [99.6, 99.8, 97.6, 99.1]}
ZOO_EPOCHS = 2
# --smoke: one epoch of one step per run, two seeds (compare-seeds needs two), a few episodes.
SMOKE = {
    "episodes": 4, "seeds": 2, "ehg_episodes": 4, "epochs": 1, "zoo_episodes": 4,
    "val_episodes": 2,
}  # fmt: skip


def seconds(run: str) -> float:
    """The seconds a run spent in training steps (its metrics rows)."""
    rows = (Path(run) / "metrics.jsonl").read_text().splitlines()
    return sum(json.loads(row)["seconds"] for row in rows)


def main(argv: list[str] | None = None) -> None:
    """Train what is missing, evaluate, write the tables."""
    args = parse_args(argv)
    evals = Path(args.out) / "evals"
    evals.mkdir(parents=True, exist_ok=True)
    data = config_overrides(args.data_root)
    zoo_epochs = args.epochs or ZOO_EPOCHS
    zoo_flags = config_overrides(
        args.data_root,
        epochs=args.epochs,
        episodes_per_epoch=args.zoo_episodes,
        val_episodes=args.val_episodes,
    )
    ehg_flags = config_overrides(
        args.data_root,
        epochs=1,
        episodes_per_epoch=args.ehg_episodes,
        val_episodes=args.val_episodes,
    )
    results: dict = {"episodes": args.episodes, "ehg_episodes": args.ehg_episodes, "zoo": {}}
    results["ehg"] = {}
    for method in METHODS:
        config = f"models/omniglot/{method}_conv4_5way1shot.json"
        run = f"{args.runs}/omniglot_{method}_conv4_5way1shot"
        train("train", config, run, zoo_epochs, *zoo_flags)
        for way, shot in OMNIGLOT_SETTINGS:
            out = evals / f"{method}_{way}w{shot}s.json"
            acc = evaluate(f"{run}/last.pt", data, way, shot, args.episodes, out)
            cell = {"accuracy": 100 * float(acc.double().mean()), "ci95": 100 * ci95(acc)}
            results["zoo"].setdefault(method, {})[f"{way}-way {shot}-shot"] = cell
        arms = {
            u: [f"{args.runs}/omniglot_metric_ehg/{method}_u{u}_seed{s}" for s in range(args.seeds)]
            for u in (1, 5)
        }
        for u, runs in arms.items():
            for seed, folder in enumerate(runs):
                flags = [*ehg_flags, "--seed", str(seed), "--resplits", str(u)]
                train("train", config, folder, 1, *flags)
        record = compare_seeds(
            arms[1], arms[5], 5, 1, args.episodes, evals / f"{method}_ehg_5w1s.json", data
        )
        results["ehg"][method] = {
            "u1": [m["accuracy"] for m in record["a"]],
            "u5": [m["accuracy"] for m in record["b"]],
            "difference": record["difference"],
            "seconds_u1": [seconds(r) for r in arms[1]],
            "seconds_u5": [seconds(r) for r in arms[5]],
        }
    write_results(results, table(results), Path(args.out))


def table(results: dict) -> str:
    """The markdown tables of results.json."""
    keys = SETTING_KEYS
    seeds = len(next(iter(results["ehg"].values()))["u1"])
    lines = [
        f"Accuracy ± 95% CI (%) on {results['episodes']} seeded Omniglot test episodes (seed 0) "
        "of the 5-way 1-shot models; in brackets, the paper's.",
        "",
        *markdown_header("model", *keys),
    ]
    for method, cells in results["zoo"].items():
        values = [
            f"{cells[k]['accuracy']:.2f} ± {cells[k]['ci95']:.2f} ({paper})"
            for k, paper in zip(keys, PAPERS[method], strict=True)
        ]
        lines.append(markdown_row(METHODS[method], *values))
    lines += [
        "",
        f"EHG, {results['ehg_episodes']} training episodes, {seeds} seeds, 5-way 1-shot test: "
        "mean ± t interval (%), U = 5 − U = 1 paired across seeds, and the training steps' time.",
        "",
        *markdown_header("method", "U = 1", "U = 5", "U5 − U1", "seconds U = 5 / U = 1"),
    ]
    for method, ehg in results["ehg"].items():
        u1, u5 = (percent(*[v / 100 for v in seeds_ci(ehg[arm])]) for arm in ("u1", "u5"))
        d = ehg["difference"]
        ratio = sum(ehg["seconds_u5"]) / sum(ehg["seconds_u1"])
        diff = f"{percent(d['mean'], d['ci95'], True)} (p = {d['p_value']:.2g})"
        lines.append(markdown_row(METHODS[method], u1, u5, diff, f"{ratio:.2f}"))
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The study's settings (from the command line unless `argv` is given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000, help="test episodes per setting")
    parser.add_argument("--seeds", type=int, default=5, help="EHG training seeds per arm")
    parser.add_argument("--ehg-episodes", type=int, default=800, help="EHG training episodes")
    parser.add_argument("--epochs", type=int, help="of the zoo runs (default: the configs')")
    parser.add_argument("--zoo-episodes", type=int, help="per epoch of the zoo runs (configs')")
    parser.add_argument("--val-episodes", type=int, help="of every run (default: the configs')")
    add_study_flags(parser, HERE)
    args = parser.parse_args(argv)
    apply_smoke(args, SMOKE, ("runs",))
    return args


if __name__ == "__main__":
    main()
