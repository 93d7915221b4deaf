"""Pretraining and transfer baselines on Omniglot against the meta-trained zoo ProtoNet.

Every model is tested with `fewshot eval --per-episode` on the zoo's seeded test episodes (seed
0, 2000 episodes, 5/20-way 1/5-shot, 15 queries), so every difference is paired per episode:

- the zoo's `protonet_conv4_trainval` (meta-trained, its own head): the reference;
- `pretrain_conv4_trainval` (linear classifier over the 4800 train+val classes) with the
  test-time classifiers centroid, centroid with CL2N, and logistic regression (RFS);
- `pretrain_cosine_conv4_trainval` (Baseline++) with its fine-tuned cosine classifier;
- Meta-Baseline (`metabaseline_conv4_5way1shot`, from the linear pretraining) with U = 1 and
  U = 5 (EHG) over 5 training seeds: each arm's mean ± t interval and the paired difference
  across seeds (`fewshot compare-seeds`).

Resumable: a pretraining or training run that finished is skipped, an unfinished one resumed,
and an evaluation whose JSON exists is read back. Writes results.md and results.json here.

    python -m experiments.pretraining_omniglot.study    # from the repository root
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from fewshot.evaluation.stats import paired_ci
from fewshot.runtime.io import atomic_write_json, atomic_write_text, load_checkpoint

HERE = Path(__file__).resolve().parent
SETTINGS = [(5, 1), (5, 5), (20, 1), (20, 5)]
ZOO = "models/omniglot/protonet_conv4_trainval.pt"
LINEAR = "runs/omniglot_pretrain_conv4_trainval"
COSINE = "runs/omniglot_pretrain_cosine_conv4_trainval"
META = "models/omniglot/metabaseline_conv4_5way1shot.json"
# Row label -> (checkpoint, classifier flags)
BASELINES = {
    "ProtoNet, meta-trained (zoo)": (ZOO, []),
    "pretrain + centroid": (f"{LINEAR}/last.pt", []),
    "pretrain + centroid, CL2N": (
        f"{LINEAR}/last.pt",
        ["--classifier", "centroid", "--classifier-options", '{"cl2n": true}'],
    ),
    "pretrain + logistic (RFS)": (f"{LINEAR}/last.pt", ["--classifier", "logistic"]),
    "Baseline++ + fine-tuned cosine": (
        f"{COSINE}/last.pt",
        ["--classifier", "finetune", "--classifier-options", '{"classifier": "cosine"}'],
    ),
}


def fewshot(*args: str) -> None:
    """Run a fewshot command, stopping the study if it fails."""
    command = [sys.executable, "-m", "fewshot", *args]
    print("$", " ".join(command[2:]), flush=True)
    subprocess.run(command, check=True)


def finished(run: str, epochs: int) -> bool:
    """Whether the run folder's last.pt holds its final epoch."""
    last = Path(run) / "last.pt"
    return last.is_file() and load_checkpoint(last)["progress"]["epoch"] >= epochs


def train(command: str, config: str, run: str, epochs: int, *flags: str) -> None:
    """Start, resume or skip one run."""
    if finished(run, epochs):
        return
    last = Path(run) / "last.pt"
    if last.is_file():
        fewshot(command, "--resume", str(last))
    else:
        fewshot(command, "--config", config, "--out", run, *flags)


def evaluate(checkpoint: str, flags: list[str], way: int, shot: int, out: Path) -> torch.Tensor:
    """Per-episode accuracies of one model on the study's episodes (cached in `out`)."""
    if not out.is_file():
        fewshot(
            "eval", "--checkpoint", checkpoint, *flags, "--way", str(way), "--shot", str(shot),
            "--episodes", str(ARGS.episodes), "--seed", "0", "--per-episode", "--out", str(out),
        )  # fmt: skip
    return torch.tensor(json.loads(out.read_text())["accuracies"])


def percent(mean: float, half: float, signed: bool = False) -> str:
    """'98.75 ± 0.12' (or '+0.31 ± 0.08')."""
    return f"{100 * mean:{'+' if signed else ''}.2f} ± {100 * half:.2f}"


def main() -> None:
    """Train what is missing, evaluate every model, write the table."""
    train("pretrain", "models/omniglot/pretrain_conv4_trainval.json", LINEAR, 40)
    train("pretrain", "models/omniglot/pretrain_cosine_conv4_trainval.json", COSINE, 40)
    seeds = range(ARGS.seeds)
    meta_runs = {u: [f"runs/omniglot_metabaseline/u{u}_seed{s}" for s in seeds] for u in (1, 5)}
    for u, runs in meta_runs.items():
        for seed, run in zip(seeds, runs, strict=True):
            train("train", META, run, 2, "--seed", str(seed), "--resplits", str(u))
    evals = HERE / "evals"
    evals.mkdir(exist_ok=True)
    rows = {**BASELINES, "Meta-Baseline, seed 0": (f"{meta_runs[1][0]}/last.pt", [])}
    results: dict = {"episodes": ARGS.episodes, "rows": {}, "ehg": {}}
    for way, shot in SETTINGS:
        key = f"{way}-way {shot}-shot"
        accuracies = {
            label: evaluate(ckpt, flags, way, shot, evals / f"{i}_{way}w{shot}s.json")
            for i, (label, (ckpt, flags)) in enumerate(rows.items())
        }
        reference = accuracies["ProtoNet, meta-trained (zoo)"]
        for label, acc in accuracies.items():
            d = paired_ci(reference, acc)
            results["rows"].setdefault(label, {})[key] = {
                "accuracy": 100 * float(acc.double().mean()),
                "ci95": 100 * float(1.96 * acc.double().std() / len(acc) ** 0.5),
                "minus_protonet": 100 * d.mean,
                "minus_protonet_ci95": 100 * d.ci95,
            }
        out = evals / f"ehg_{way}w{shot}s.json"
        if not out.is_file():
            fewshot(
                "compare-seeds", "--a", *[f"{r}/last.pt" for r in meta_runs[1]],
                "--b", *[f"{r}/last.pt" for r in meta_runs[5]], "--way", str(way), "--shot",
                str(shot), "--episodes", str(ARGS.episodes), "--seed", "0", "--out", str(out),
            )  # fmt: skip
        record = json.loads(out.read_text())
        results["ehg"][key] = {
            "u1": [m["accuracy"] for m in record["a"]],
            "u5": [m["accuracy"] for m in record["b"]],
            "difference": record["difference"],
        }
    atomic_write_json(results, HERE / "results.json")
    atomic_write_text(table(results), HERE / "results.md")
    print(table(results))


def table(results: dict) -> str:
    """The markdown tables of results.json."""
    keys = [f"{w}-way {s}-shot" for w, s in SETTINGS]
    lines = [
        f"Accuracy ± 95% CI (%) on {results['episodes']} seeded Omniglot test episodes (seed 0); "
        "below each, the paired difference to the meta-trained ProtoNet on the same episodes.",
        "",
        "| model | " + " | ".join(keys) + " |",
        "|---" * (len(keys) + 1) + "|",
    ]
    for label, cells in results["rows"].items():
        values = [percent(cells[k]["accuracy"] / 100, cells[k]["ci95"] / 100) for k in keys]
        lines.append(f"| {label} | " + " | ".join(values) + " |")
        if label != "ProtoNet, meta-trained (zoo)":
            diffs = [
                percent(
                    cells[k]["minus_protonet"] / 100, cells[k]["minus_protonet_ci95"] / 100, True
                )
                for k in keys
            ]
            lines.append("| &nbsp;&nbsp;− ProtoNet | " + " | ".join(diffs) + " |")
    lines += [
        "",
        "Meta-Baseline with EHG: mean over 5 training seeds ± t interval (%), and U = 5 − U = 1 "
        "paired across seeds.",
        "",
        "| | " + " | ".join(keys) + " |",
        "|---" * (len(keys) + 1) + "|",
    ]
    from fewshot.evaluation.stats import seeds_ci

    for arm in ("u1", "u5"):
        cells = [percent(*[v / 100 for v in seeds_ci(results["ehg"][k][arm])]) for k in keys]
        lines.append(f"| U = {arm[1]} | " + " | ".join(cells) + " |")
    diffs = [results["ehg"][k]["difference"] for k in keys]
    lines.append(
        "| U = 5 − U = 1 | "
        + " | ".join(
            f"{percent(d['mean'], d['ci95'], True)} (p = {d['p_value']:.2g})" for d in diffs
        )
        + " |"
    )
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    """The study's settings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000, help="test episodes per setting")
    parser.add_argument("--seeds", type=int, default=5, help="Meta-Baseline training seeds")
    return parser.parse_args()


if __name__ == "__main__":
    ARGS = parse_args()
    main()
