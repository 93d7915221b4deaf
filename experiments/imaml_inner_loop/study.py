"""iMAML's inner loop measured side by side: the paper's (every step on the support loss plus
the proximal term) against its authors' code's (steps on the support loss alone, one step back
towards the initialisation, tested without it), at equal meta-iterations.

Every arm trains `models/omniglot/imaml_conv4_5way1shot_cpu.json` from the same seed (the same
episodes) for --epochs of its epochs, only `inner_loop` and `inner_steps` changed: the config's
5 proximal steps, the authors' 16 steps pulled back, and 5 steps pulled back (the loop alone
changed). Each model is tested with its own loop and steps on the same seeded Omniglot 5-way
1-shot test episodes (seed 0, float32): accuracy ± CI, its validation curve, and each arm
against the proximal one paired over the episodes.

Resumable like every study driver here (experiments/cli_runs.py). Writes results.md and
results.json into this folder (--out).

    python -m experiments.imaml_inner_loop.study    # from the repository root
    python -m experiments.imaml_inner_loop.study --smoke --out DIR    # the test suite's run
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
from experiments.smoke import add_smoke_flag, apply_smoke
from fewshot.evaluation.stats import ci95, paired_ci
from fewshot.runtime.io import load_checkpoint

HERE = Path(__file__).resolve().parent
CONFIG = Path("models/omniglot/imaml_conv4_5way1shot_cpu.json")
ARMS = (("proximal", 5), ("pull_back", 16), ("pull_back", 5))  # (inner_loop, inner_steps)
SMOKE = {
    "episodes": 4,
    "epochs": 1,
    "episodes_per_epoch": 4,
    "episodes_per_batch": 2,
    "val_episodes": 2,
}


def main(argv: list[str] | None = None) -> None:
    """Train what is missing, evaluate, write the table."""
    args = parse_args(argv)
    evals = Path(args.out) / "evals"
    evals.mkdir(parents=True, exist_ok=True)
    options = json.loads(CONFIG.read_text())["method_options"]
    sizes = ("episodes_per_epoch", "episodes_per_batch", "val_episodes")
    flags = config_overrides(args.data_root, **{k: getattr(args, k) for k in sizes})
    flags += ["--epochs", str(args.epochs)]
    test_flags = [*config_overrides(args.data_root), "--amp", "off"]
    results: dict = {"episodes": args.episodes, "epochs": args.epochs, "arms": []}
    accuracies = []
    for loop, steps in ARMS:
        name = f"{loop}{steps}"
        run = f"{args.runs}/imaml_inner_loop/{name}"
        arm_options = json.dumps({**options, "inner_loop": loop, "inner_steps": steps})
        train("train", str(CONFIG), run, args.epochs, *flags, "--method-options", arm_options)
        history = load_checkpoint(Path(run) / "last.pt")["progress"]["history"]
        acc = evaluate(
            f"{run}/last.pt", test_flags, 5, 1, args.episodes, evals / f"{name}.5w1s.json"
        )
        accuracies.append(acc)
        arm = {
            "inner_loop": loop,
            "inner_steps": steps,
            "val_acc": [row["val_acc"] for row in history],
            "seconds": sum(row["seconds"] for row in history),
            "test": [float(acc.double().mean()), ci95(acc)],
        }
        if len(accuracies) > 1:  # against the first arm, the paper's loop
            diff = paired_ci(accuracies[0], acc)
            arm["minus_proximal"] = {"mean": diff.mean, "ci95": diff.ci95, "p": diff.p_value}
        results["arms"].append(arm)
    write_results(results, table(results), Path(args.out))


def table(results: dict) -> str:
    """The markdown table of results.json."""
    lines = [
        f"iMAML, Omniglot 5-way 1-shot, {results['epochs']} epochs of `{CONFIG.name}` per arm "
        f"(same seed), tested on {results['episodes']} seeded episodes with its own loop and "
        "steps: accuracy ± 95% CI (%), the difference from the proximal arm paired over the "
        "episodes (points), validation accuracy per epoch.",
        "",
        *markdown_header("inner loop", "steps", "test", "minus proximal", "validation", "time"),
    ]
    for arm in results["arms"]:
        d = arm.get("minus_proximal")
        diff = percent(d["mean"], d["ci95"], True) if d else "—"
        curve = " / ".join(f"{v:.1f}" for v in arm["val_acc"])
        minutes = f"{arm['seconds'] / 60:.0f} min"
        cells = (arm["inner_loop"], str(arm["inner_steps"]), percent(*arm["test"]), diff)
        lines.append(markdown_row(*cells, curve, minutes))
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The study's settings (from the command line unless `argv` is given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000, help="test episodes per model")
    parser.add_argument("--epochs", type=int, default=4, help="of the config's, per arm")
    parser.add_argument("--episodes-per-epoch", type=int, help="default: the config's")
    parser.add_argument("--episodes-per-batch", type=int, help="default: the config's")
    parser.add_argument("--val-episodes", type=int, help="of every run (default: the config's)")
    parser.add_argument("--runs", default="runs", help="folder of the run folders")
    parser.add_argument("--out", default=str(HERE), help="results folder")
    parser.add_argument("--data-root", default=None, help="data root (default: as fewshot's)")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    apply_smoke(args, SMOKE, ("runs",))
    return args


if __name__ == "__main__":
    main()
