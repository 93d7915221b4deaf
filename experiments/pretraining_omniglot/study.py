"""Pretraining and transfer baselines on Omniglot against the meta-trained zoo ProtoNet.

Every model is tested with `fewshot eval --per-episode` on the zoo's seeded test episodes (seed
0, 2000 episodes, 5/20-way 1/5-shot, 15 queries), so every difference is paired per episode:

- the zoo's `protonet_conv4_trainval` (meta-trained, its own head): the reference;
- `pretrain_conv4_trainval` (linear classifier over the 4800 train+val classes) with the
  test-time classifiers centroid, centroid with CL2N, logistic regression (RFS), and the
  transductive BD-CSPN and PT-MAP (they also use each episode's unlabelled queries);
- `pretrain_cosine_conv4_trainval` (Baseline++) with its fine-tuned cosine classifier;
- Meta-Baseline (`metabaseline_conv4_5way1shot`, from the linear pretraining) with U = 1 and
  U = 5 (EHG) over 5 training seeds: each arm's mean ± t interval and the paired difference
  across seeds (`fewshot compare-seeds`).

Resumable: a pretraining or training run that finished is skipped, an unfinished one resumed,
and an evaluation whose JSON exists is read back. Writes results.md and results.json here (--out).

    python -m experiments.pretraining_omniglot.study    # from the repository root
    python -m experiments.pretraining_omniglot.study --smoke --out DIR    # the test suite's run
"""

from __future__ import annotations

import argparse
import re
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
from fewshot.evaluation.stats import paired_ci, seeds_ci

HERE = Path(__file__).resolve().parent
ZOO = "models/omniglot/protonet_conv4_trainval.pt"
# The pretraining runs: (config, epochs), their folders named after the configs below --runs.
LINEAR = ("models/omniglot/pretrain_conv4_trainval.json", 40)
COSINE = ("models/omniglot/pretrain_cosine_conv4_trainval.json", 20)
META = "models/omniglot/metabaseline_conv4_5way1shot.json"
META_EPOCHS = 2
# --smoke: one epoch of at most a few steps per run, two seeds (compare-seeds needs two), a few
# episodes.
SMOKE = {"episodes": 4, "seeds": 2, "epochs": 1, "meta_episodes": 4, "val_episodes": 2}
# Rows tested at 5-way only: PT-MAP's Sinkhorn iterations took 78 s per 200 episodes at 20-way
# on this CPU (over 25 minutes for the two 20-way settings).
FIVE_WAY_ONLY = {"pretrain + PT-MAP (transductive)"}
# Row label -> (model: the zoo's, or the linear or cosine pretraining, classifier flags)
BASELINES = {
    "ProtoNet, meta-trained (zoo)": ("zoo", []),
    "pretrain + centroid": ("linear", []),
    "pretrain + centroid, CL2N": (
        "linear",
        ["--classifier", "centroid", "--classifier-options", '{"cl2n": true}'],
    ),
    "pretrain + logistic (RFS)": ("linear", ["--classifier", "logistic"]),
    "pretrain + BD-CSPN (transductive)": ("linear", ["--classifier", "bd-cspn"]),
    "pretrain + PT-MAP (transductive)": ("linear", ["--classifier", "pt-map"]),
    "Baseline++ + fine-tuned cosine": (
        "cosine",
        ["--classifier", "finetune", "--classifier-options", '{"classifier": "cosine"}'],
    ),
}


def eval_name(label: str, way: int, shot: int) -> str:
    """The cached evaluation's file name: the row's label in lower-case words."""
    return "_".join(re.findall(r"[a-z0-9+]+", label.lower())) + f"_{way}w{shot}s.json"


def pretrain(args: argparse.Namespace, config: str, epochs: int) -> str:
    """Pretrain (or finish, or skip) one config; its last checkpoint."""
    run = f"{args.runs}/omniglot_{Path(config).stem}"
    flags = config_overrides(args.data_root, epochs=args.epochs, val_episodes=args.val_episodes)
    train("pretrain", config, run, args.epochs or epochs, *flags)
    return f"{run}/last.pt"


def main(argv: list[str] | None = None) -> None:
    """Train what is missing, evaluate every model, write the table."""
    args = parse_args(argv)
    linear = pretrain(args, *LINEAR)
    seeds = range(args.seeds)
    meta_runs = {
        u: [f"{args.runs}/omniglot_metabaseline/u{u}_seed{s}" for s in seeds] for u in (1, 5)
    }
    meta_flags = config_overrides(
        args.data_root,
        epochs=args.epochs,
        episodes_per_epoch=args.meta_episodes,
        val_episodes=args.val_episodes,
    )
    for u, runs in meta_runs.items():
        for seed, run in zip(seeds, runs, strict=True):
            flags = [*meta_flags, "--init", linear, "--seed", str(seed), "--resplits", str(u)]
            train("train", META, run, args.epochs or META_EPOCHS, *flags)
    checkpoints = {"zoo": ZOO, "linear": linear, "cosine": pretrain(args, *COSINE)}
    evals = Path(args.out) / "evals"
    evals.mkdir(parents=True, exist_ok=True)
    data = config_overrides(args.data_root)
    rows = {
        **{label: (checkpoints[model], flags) for label, (model, flags) in BASELINES.items()},
        "Meta-Baseline, seed 0": (f"{meta_runs[1][0]}/last.pt", []),
    }
    results: dict = {"episodes": args.episodes, "rows": {}, "ehg": {}}
    for way, shot in OMNIGLOT_SETTINGS:
        key = f"{way}-way {shot}-shot"
        accuracies = {
            label: evaluate(
                ckpt,
                [*data, *flags],
                way,
                shot,
                args.episodes,
                evals / eval_name(label, way, shot),
                200,
            )
            for label, (ckpt, flags) in rows.items()
            if way == 5 or label not in FIVE_WAY_ONLY
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
        record = compare_seeds(meta_runs[1], meta_runs[5], way, shot, args.episodes, out, data)
        results["ehg"][key] = {
            "u1": [m["accuracy"] for m in record["a"]],
            "u5": [m["accuracy"] for m in record["b"]],
            "difference": record["difference"],
        }
    write_results(results, table(results), Path(args.out))


def table(results: dict) -> str:
    """The markdown tables of results.json."""
    keys = SETTING_KEYS
    seeds = len(results["ehg"][keys[0]]["u1"])
    lines = [
        f"Accuracy ± 95% CI (%) on {results['episodes']} seeded Omniglot test episodes (seed 0); "
        "below each, the paired difference to the meta-trained ProtoNet on the same episodes.",
        "",
        *markdown_header("model", *keys),
    ]
    for label, cells in results["rows"].items():
        values = [
            percent(cells[k]["accuracy"] / 100, cells[k]["ci95"] / 100) if k in cells else "—"
            for k in keys
        ]
        lines.append(markdown_row(label, *values))
        if label != "ProtoNet, meta-trained (zoo)":
            diffs = [
                percent(
                    cells[k]["minus_protonet"] / 100, cells[k]["minus_protonet_ci95"] / 100, True
                )
                if k in cells
                else "—"
                for k in keys
            ]
            lines.append(markdown_row("&nbsp;&nbsp;− ProtoNet", *diffs))
    lines += [
        "",
        f"Meta-Baseline with EHG: mean over {seeds} training seeds ± t interval (%), and U = 5 − "
        "U = 1 paired across seeds.",
        "",
        *markdown_header("", *keys),
    ]
    for arm in ("u1", "u5"):
        cells = [percent(*[v / 100 for v in seeds_ci(results["ehg"][k][arm])]) for k in keys]
        lines.append(markdown_row(f"U = {arm[1]}", *cells))
    diffs = [results["ehg"][k]["difference"] for k in keys]
    cells = [f"{percent(d['mean'], d['ci95'], True)} (p = {d['p_value']:.2g})" for d in diffs]
    lines.append(markdown_row("U = 5 − U = 1", *cells))
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The study's settings (from the command line unless `argv` is given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000, help="test episodes per setting")
    parser.add_argument("--seeds", type=int, default=5, help="Meta-Baseline training seeds")
    parser.add_argument("--epochs", type=int, help="of every run (default: the configs')")
    parser.add_argument("--meta-episodes", type=int, help="per Meta-Baseline epoch (config's)")
    parser.add_argument("--val-episodes", type=int, help="of every run (default: the configs')")
    add_study_flags(parser, HERE)
    args = parser.parse_args(argv)
    apply_smoke(args, SMOKE, ("runs",))
    return args


if __name__ == "__main__":
    main()
