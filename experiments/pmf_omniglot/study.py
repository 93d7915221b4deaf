"""P>M>F on Omniglot with EHG in its meta stage, paired on the same varied test episodes.

The three stages of P>M>F (Hu et al., CVPR 2022), with a ResNet-12 pretrained here standing in
for DINO (no weights can be downloaded on this machine):

- P: `fewshot pretrain` of a narrow ResNet-12 on the Omniglot train classes;
- M: ProtoNet meta-trained from it on Meta-Dataset-style varied episodes, with U = 1 and
  U = 5 re-splits (EHG), the same seed, init and episodes;
- F: each model tested on the same seeded varied test episodes with its own ProtoNet head and
  with P>M>F's test-time fine-tuning of the backbone on each support (`--classifier pmf`, its
  lr chosen on validation episodes of the unseen validation classes); and stage P's backbone
  alone, frozen, as `fewshot eval --backbone` takes any pretrained backbone (P>M>F's "P" and
  "P>F" rows: no meta stage).

Float32 throughout (the configs' "amp": "off", the evaluations' --amp off): the table does not
depend on whether a CPU has native bf16.

Every test is `fewshot eval --per-episode` on the same episodes, so every difference is paired
per episode (fewshot.evaluation.stats.paired_ci). Resumable: a finished run is skipped, an
unfinished one resumed, an evaluation whose JSON exists read back. Writes results.md and
results.json (--out).

    python -m experiments.pmf_omniglot.study --runs RUNS    # from the repository root
    python -m experiments.pmf_omniglot.study --smoke --out DIR    # the test suite's run
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
from fewshot.methods.pmf import PmfOptions
from fewshot.runtime.errors import FewshotError

HERE = Path(__file__).resolve().parent
PRETRAIN = HERE / "pretrain_resnet12.json"
META = HERE / "meta_resnet12.json"
TIMM = HERE / "timm_resnet10t.json"
TIMM_ROW = "timm:resnet10t from scratch (no stage P), U = 1"
# The test episodes: as the meta stage's, on the test classes (way 5-20, shot 1-10, 5 queries).
TEST = {"way": 5, "max_way": 20, "shot": 10, "max_support": 100, "query": 5}
# The meta stage's arms: none (P>M>F's "P" and "P>F" rows: stage P's backbone frozen, tested as
# any pretrained backbone is, `fewshot eval --backbone`), and ProtoNet with U = 1 and U = 5.
P_ONLY = "none (stage P frozen)"
ARMS = {P_ONLY: None, "U = 1": 1, "U = 5": 5}
CLASSIFIERS = {"ProtoNet head": [], "P>M>F fine-tuning": ["--classifier", "pmf"]}
# --smoke: one epoch of a few steps per run, a few test episodes, fine-tuning of two steps.
SMOKE = {
    "episodes": 3,
    "epochs": 1,
    "meta_episodes": 4,
    "val_episodes": 2,
    "pmf_steps": 2,
    "pmf_val_episodes": 2,
    "pmf_lrs": [0.0, 1e-3],  # two candidates: the choice still runs, at half the paper's cost
}


def varied_flags(shape: dict) -> list[str]:
    """The evaluation flags of varied episodes of `shape` (way and shot given apart)."""
    flags = ["--varied"]
    for key in ("max_way", "max_support", "query"):
        flags += [f"--{key.replace('_', '-')}", str(shape[key])]
    return flags


def main(argv: list[str] | None = None) -> None:
    """Train what is missing, evaluate every arm on the same episodes, write the tables."""
    args = parse_args(argv)
    sizes = {"epochs": args.epochs, "val_episodes": args.val_episodes}
    pretrained = f"{args.runs}/omniglot_pmf_pretrain_resnet12"
    train("pretrain", str(PRETRAIN), pretrained, args.epochs or config_epochs(PRETRAIN),
          *config_overrides(args.data_root, **sizes))  # fmt: skip
    meta_flags = config_overrides(args.data_root, episodes_per_epoch=args.meta_episodes, **sizes)
    runs = {}
    for arm, u in ARMS.items():
        if u is None:
            runs[arm] = pretrained
            continue
        runs[arm] = f"{args.runs}/omniglot_pmf_meta_resnet12_u{u}"
        flags = [*meta_flags, "--init", f"{pretrained}/last.pt", "--resplits", str(u)]
        train("train", str(META), runs[arm], args.epochs or config_epochs(META), *flags)
    runs[TIMM_ROW] = f"{args.runs}/omniglot_pmf_timm_resnet10t"
    evals = Path(args.out) / "evals"
    evals.mkdir(parents=True, exist_ok=True)
    pmf = json.dumps(pmf_options(args))
    accuracies = {}
    test = [*config_overrides(args.data_root), *varied_flags(TEST), "--amp", "off"]
    for arm, run in runs.items():
        if arm == TIMM_ROW:  # the smoke-sized row trains last, after the study's own arms
            train("train", str(TIMM), run, args.epochs or config_epochs(TIMM), *meta_flags)
        for name, flags in CLASSIFIERS.items():
            if arm == TIMM_ROW and flags:
                continue  # a smoke-sized row: its own head only
            flags = [*flags, "--classifier-options", pmf] if flags else []
            out = evals / f"{eval_stem(arm)}_{'pmf' if flags else 'protonet'}.json"
            accuracies[arm, name] = evaluate(
                f"{run}/last.pt",
                [*test, *flags],
                TEST["way"],
                TEST["shot"],
                args.episodes,
                out,
                per_batch=1,
                frozen=frozen_p() if arm == P_ONLY else None,
            )
    lrs = {arm: json.loads((evals / f"{eval_stem(arm)}_pmf.json").read_text())["pmf_lr"]
           for arm in ARMS}  # fmt: skip
    results = summary(accuracies, lrs, args)
    write_results(results, table(results), Path(args.out))


def frozen_p() -> list[str]:
    """The flags naming stage P's backbone, frozen, for `fewshot eval --backbone`."""
    config = json.loads(PRETRAIN.read_text())
    options = json.dumps(config["backbone_options"])
    return ["--dataset", config["dataset"], "--backbone", config["backbone"],
            "--backbone-options", options]  # fmt: skip


def eval_stem(arm: str) -> str:
    """The start of an arm's evaluation files' names."""
    if arm == TIMM_ROW:
        return "timm"
    return f"u{ARMS[arm]}" if ARMS[arm] else "p_only"


def config_epochs(config: Path) -> int:
    """The epochs a config trains."""
    return json.loads(config.read_text())["epochs"]


def summary(accuracies: dict, lrs: dict, args: argparse.Namespace) -> dict:
    """Every arm's accuracy ± CI, its fine-tuning's chosen lr (`lrs`) and the paired
    differences, in percent."""

    def cell(acc) -> dict:
        return {"accuracy": 100 * float(acc.double().mean()), "ci95": 100 * ci95(acc)}

    def diff(a, b) -> dict:
        d = paired_ci(a, b)
        return {"mean": 100 * d.mean, "ci95": 100 * d.ci95}

    results = {"episodes": args.episodes, "test": TEST, "pmf_steps": args.pmf_steps, "rows": {}}
    for arm in ARMS:
        plain, tuned = (accuracies[arm, name] for name in CLASSIFIERS)
        results["rows"][arm] = {
            **{name: cell(accuracies[arm, name]) for name in CLASSIFIERS},
            "fine-tuning − head": diff(plain, tuned),
            "lr chosen": lrs[arm],
        }
    for later, earlier in (("U = 1", P_ONLY), ("U = 5", "U = 1")):
        results["rows"][f"{later} − {earlier}"] = {
            name: diff(accuracies[earlier, name], accuracies[later, name]) for name in CLASSIFIERS
        }
    head = next(iter(CLASSIFIERS))
    results["rows"][TIMM_ROW] = {head: cell(accuracies[TIMM_ROW, head])}
    return results


def table(results: dict) -> str:
    """The markdown table of results.json."""
    test = results["test"]
    columns = [*CLASSIFIERS, "fine-tuning − head", "lr chosen"]
    lines = [
        f"Accuracy ± 95% CI (%) on {results['episodes']} seeded varied Omniglot test episodes "
        f"({test['way']}-{test['max_way']} ways, 1-{test['shot']} shots within "
        f"{test['max_support']} support images, {test['query']} queries; seed 0); differences "
        f"paired per episode. Fine-tuning: {results['pmf_steps']} steps, lr chosen on "
        "validation episodes.",
        "",
        *markdown_header("meta stage", *columns),
    ]
    for arm, cells in results["rows"].items():
        values = []
        for column in columns:
            if column not in cells:
                values.append("")
                continue
            c = cells[column]  # an accuracy, a paired difference (signed) or an lr
            if not isinstance(c, dict):
                values.append(f"{c:g}")
                continue
            mean, half = c.get("accuracy", c.get("mean")), c["ci95"]
            values.append(percent(mean / 100, half / 100, "accuracy" not in c))
        lines.append(markdown_row(arm, *values))
    return "\n".join(lines) + "\n"


def pmf_options(args: argparse.Namespace) -> dict:
    """The fine-tuning's --classifier-options: the study's steps, validation episodes and (where
    given) candidate lrs."""
    options = {"steps": args.pmf_steps, "val_episodes": args.pmf_val_episodes}
    return {**options, "lrs": args.pmf_lrs} if args.pmf_lrs else options


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The study's settings (from the command line unless `argv` is given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100, help="varied test episodes")
    parser.add_argument("--epochs", type=int, help="of every run (default: the configs')")
    parser.add_argument("--meta-episodes", type=int, help="per meta epoch (config's)")
    parser.add_argument("--val-episodes", type=int, help="of every run (default: the configs')")
    # P>M>F fine-tunes 50 steps; 20 here, and 5 episodes per lr, for the 2-core CPU's budget.
    parser.add_argument("--pmf-steps", type=int, default=20, help="fine-tuning steps")
    parser.add_argument("--pmf-val-episodes", type=int, default=5, help="episodes choosing each lr")
    parser.add_argument(
        "--pmf-lrs", type=float, nargs="+", help="the lrs to choose among (default: the paper's)"
    )
    add_study_flags(parser, HERE)
    args = parser.parse_args(argv)
    apply_smoke(args, SMOKE, ("runs",))
    try:  # refused now, not after hours of training
        PmfOptions(**pmf_options(args))
    except FewshotError as e:
        parser.error(str(e))
    return args


if __name__ == "__main__":
    main()
