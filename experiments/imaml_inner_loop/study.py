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

import json
from pathlib import Path

from experiments.cli_runs import (
    evaluate,
    markdown_header,
    markdown_row,
    percent,
    train,
    write_results,
)
from experiments.imaml_inner_steps.study import CONFIG, parse_args, run_flags
from fewshot.evaluation.stats import ci95, paired_ci
from fewshot.runtime.io import load_checkpoint

HERE = Path(__file__).resolve().parent
ARMS = (("proximal", 5), ("pull_back", 16), ("pull_back", 5))  # (inner_loop, inner_steps)


def main(argv: list[str] | None = None) -> None:
    """Train what is missing, evaluate, write the table."""
    args = parse_args(argv, __doc__, HERE)  # the settings and sizes of ../imaml_inner_steps/
    evals = Path(args.out) / "evals"
    evals.mkdir(parents=True, exist_ok=True)
    options = json.loads(CONFIG.read_text())["method_options"]
    flags, test_flags = run_flags(args)
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


if __name__ == "__main__":
    main()
