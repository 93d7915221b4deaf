"""iMAML's inner steps measured side by side: its `_cpu` config trained with 5 inner steps (the
shipped model's) and with 16 (the iMAML paper's GD version and its authors' code; the
full-schedule configs' since experiments/maml_test_steps/), at equal meta-iterations.

Both arms train `models/omniglot/imaml_conv4_5way1shot_cpu.json` from the same seed (the same
episodes) for --epochs of its epochs, only `inner_steps` changed, and each model is tested with
5 and with 16 steps on the same seeded Omniglot 5-way 1-shot test episodes (seed 0, float32):
accuracy ± CI, its validation curve, and the 16-step model against the 5-step one paired over
the episodes, each with its own steps.

Resumable like every study driver here (experiments/cli_runs.py). Writes results.md and
results.json into this folder (--out).

    python -m experiments.imaml_inner_steps.study    # from the repository root
    python -m experiments.imaml_inner_steps.study --smoke --out DIR    # the test suite's run
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
from fewshot.evaluation.stats import ci95, paired_ci
from fewshot.runtime.io import load_checkpoint

HERE = Path(__file__).resolve().parent
CONFIG = Path("models/omniglot/imaml_conv4_5way1shot_cpu.json")
STEPS = (5, 16)  # inner steps in training, and at test time
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
    flags, test_flags = run_flags(args)
    results: dict = {"episodes": args.episodes, "epochs": args.epochs, "arms": []}
    accuracies = {}
    for trained_steps in STEPS:
        run = f"{args.runs}/imaml_inner_steps/steps{trained_steps}"
        arm_options = json.dumps({**options, "inner_steps": trained_steps})
        train("train", str(CONFIG), run, args.epochs, *flags, "--method-options", arm_options)
        history = load_checkpoint(Path(run) / "last.pt")["progress"]["history"]
        arm = {
            "inner_steps": trained_steps,
            "val_acc": [row["val_acc"] for row in history],
            "seconds": sum(row["seconds"] for row in history),
            "test": {},
        }
        for test_steps in STEPS:
            out = evals / f"trained{trained_steps}.tested{test_steps}.5w1s.json"
            steps = [*test_flags, "--inner-steps", str(test_steps)]
            acc = evaluate(f"{run}/last.pt", steps, 5, 1, args.episodes, out)
            accuracies[trained_steps, test_steps] = acc
            arm["test"][str(test_steps)] = [float(acc.double().mean()), ci95(acc)]
        results["arms"].append(arm)
    diff = paired_ci(accuracies[5, 5], accuracies[16, 16])
    results["sixteen_minus_five"] = {"mean": diff.mean, "ci95": diff.ci95, "p": diff.p_value}
    write_results(results, table(results), Path(args.out))


def table(results: dict) -> str:
    """The markdown table of results.json."""
    lines = [
        f"iMAML, Omniglot 5-way 1-shot, {results['epochs']} epochs of "
        f"`{CONFIG.name}` per arm (same seed), tested on {results['episodes']} seeded episodes: "
        "accuracy ± 95% CI (%) with 5 and 16 test-time steps, validation accuracy per epoch.",
        "",
        *markdown_header(
            "trained with", "tested with 5 steps", "tested with 16 steps", "validation", "time"
        ),
    ]
    for arm in results["arms"]:
        tested = [percent(*arm["test"][str(s)]) for s in STEPS]
        curve = " / ".join(f"{v:.1f}" for v in arm["val_acc"])
        minutes = f"{arm['seconds'] / 60:.0f} min"
        lines.append(markdown_row(f"{arm['inner_steps']} steps", *tested, curve, minutes))
    d = results["sixteen_minus_five"]
    p = f"p = {d['p']:.2g}" if d["p"] >= 1e-15 else "p < 1e-15"  # a t of 60 underflows to 0
    lines += [
        "",
        "Trained and tested with 16 steps minus trained and tested with 5, paired over the "
        f"episodes: {percent(d['mean'], d['ci95'], True)} points ({p}).",
    ]
    return "\n".join(lines) + "\n"


def run_flags(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The flags of every arm's training (the study's sizes over the config's) and of every
    evaluation (float32)."""
    sizes = ("episodes_per_epoch", "episodes_per_batch", "val_episodes")
    flags = config_overrides(args.data_root, **{k: getattr(args, k) for k in sizes})
    flags += ["--epochs", str(args.epochs)]
    return flags, [*config_overrides(args.data_root), "--amp", "off"]


def parse_args(
    argv: list[str] | None = None, description: str = __doc__, out: Path = HERE
) -> argparse.Namespace:
    """The study's settings (from the command line unless `argv` is given); `description` and
    `out` (the results folder) for a study of the same runs (`../imaml_inner_loop/`)."""
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000, help="test episodes per model")
    parser.add_argument("--epochs", type=int, default=4, help="of the config's, per arm")
    parser.add_argument("--episodes-per-epoch", type=int, help="default: the config's")
    parser.add_argument("--episodes-per-batch", type=int, help="default: the config's")
    parser.add_argument("--val-episodes", type=int, help="of every run (default: the config's)")
    add_study_flags(parser, out)
    args = parser.parse_args(argv)
    apply_smoke(args, SMOKE, ("runs",))
    return args


if __name__ == "__main__":
    main()
