"""bf16 autocast against float32 on Omniglot: the same training runs in each precision.

1. ProtoNet, Conv-4, trained as Snell et al.'s final model (models/omniglot/
   protonet_conv4_trainval.json): the zoo's float32 model (models/omniglot/
   protonet_conv4_trainval.pt) against that config trained with --amp bf16, both tested on the
   zoo's 2000 seeded episodes (seed 0) of 5/20-way 1/5-shot. Paired over the episodes: the bf16
   run tested in bf16 against the float32 run tested in float32 (the whole pipeline), the bf16
   run against the float32 run both tested in float32 (training precision alone), and the
   float32 model tested in bf16 against float32 (evaluation precision alone).
2. Ridge and SVM heads, whose solves stay in float32: the U = 1 runs of ../ehg_seeds (seeds
   0-4, float32) against the same runs with --amp bf16, each run tested in its own precision on
   the same 2000 seeded 5-way and 20-way 1-shot episodes; paired by seed and per episode.

Resumable: finished runs are skipped and test accuracies cached (the runs of part 2 reuse
../ehg_seeds/study.py's training and test functions and its cache files).

    python -m experiments.bf16_omniglot.study                # from the repository root
    python -m experiments.bf16_omniglot.study --smoke --out DIR    # the test suite's run
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import torch

from experiments.ehg_seeds import report as seeds_report
from experiments.ehg_seeds import study as seeds
from experiments.smoke import add_smoke_flag, apply_smoke
from fewshot.datasets import load_split
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import episode_accuracies
from fewshot.evaluation.stats import Difference, ci95, paired_ci, paired_seeds_ci, seeds_ci
from fewshot.methods.feature_cache import FOLDER as FEATURES
from fewshot.runtime.allocator import retain_freed_memory
from fewshot.runtime.io import atomic_write_json, atomic_write_text
from fewshot.runtime.precision import precision_name
from fewshot.runtime.settings import build
from fewshot.training.checkpoint import load_trained
from fewshot.training.settings import TrainSettings, read_config_file

TRAINVAL_CONFIG = "models/omniglot/protonet_conv4_trainval.json"
TRAINVAL_FLOAT32 = "models/omniglot/protonet_conv4_trainval.pt"
ZOO_SHAPES = [(5, 1), (5, 5), (20, 1), (20, 5)]  # the zoo README's test shapes, 15 queries
# --smoke: part 1 trains one 5-way step; part 2 the smoke runs of ../ehg_seeds; a few episodes.
SMOKE = {"seeds": seeds.SMOKE["seeds"], "episodes": 4}
SMOKE_TRAINVAL = {"way": 5, "epochs": 1, "episodes_per_epoch": 1, "val_episodes": 2}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The study's settings (from the command line unless `argv` is given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="runs/bf16_omniglot", help="folder for new runs")
    parser.add_argument("--seed-runs", default="runs/ehg_seeds", help="../ehg_seeds' runs")
    parser.add_argument("--heads", default="ridge,svm", help="heads of part 2")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="training seeds of part 2")
    parser.add_argument("--episodes", type=int, default=2000, help="test episodes per shape")
    parser.add_argument("--skip-trainval", action="store_true", help="part 2 only, no report")
    parser.add_argument("--skip-heads", action="store_true", help="part 1 only, no report")
    parser.add_argument("--out", default="experiments/bf16_omniglot", help="results folder")
    parser.add_argument("--data-root", default=None, help="data root (default: as fewshot's)")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    apply_smoke(args, SMOKE, ("runs", "seed_runs"))
    return args


def in_percent(d: Difference) -> dict:
    """A paired difference of accuracy fractions, as a dict in percentage points."""
    return {**asdict(d), "mean": 100 * d.mean, "ci95": 100 * d.ci95}


def trainval_run(args: argparse.Namespace) -> tuple[Path, float]:
    """Train (or finish, or skip) the trainval config with --amp bf16: its run folder and the
    seconds of its training steps (the trainer's clock)."""
    folder = Path(args.runs) / "protonet_conv4_trainval_bf16"
    layers = [(f"config file {TRAINVAL_CONFIG}", read_config_file(TRAINVAL_CONFIG))]
    study = {"amp": "bf16", "out": str(folder), "device": "cpu", "data_root": args.data_root}
    layers.append(("study", {**study, **(SMOKE_TRAINVAL if args.smoke else {})}))
    return folder, seeds.train(build(TrainSettings, layers))["train_seconds"]


def test_trainval(
    args: argparse.Namespace, split: ImageSplit, checkpoint: str, amp: str, cache: Path
) -> dict:
    """Per-episode accuracies of a checkpoint tested in `amp` on the zoo's shapes (cached)."""
    if cache.exists():
        return json.loads(cache.read_text())
    cpu = torch.device("cpu")
    model, _ = load_trained(checkpoint, cpu)
    model.amp = amp
    # The test split embedded once per checkpoint and precision, not once per shape.
    model.use_feature_cache(cache.parent / FEATURES)
    record = {}
    for way, shot in ZOO_SHAPES:
        shape = EpisodeShape(way, shot, 15, 8)
        acc = episode_accuracies(model, split, shape, args.episodes, 0, cpu, cache=True)
        record[f"{way}w{shot}s"] = acc.tolist()
    atomic_write_json(record, cache)
    return record


def part_trainval(args: argparse.Namespace) -> dict:
    """Part 1: the four tests and their paired differences, per shape."""
    folder, train_seconds = trainval_run(args)
    checkpoints = {"float32": TRAINVAL_FLOAT32, "bf16": str(folder / "last.pt")}
    split = load_split("omniglot", "test", args.data_root)
    acc = {}
    for run, checkpoint in checkpoints.items():
        for amp in ("off", "bf16"):
            cache = Path(args.runs) / f"test_{run}_run_{precision_name(amp, 'cpu')}_test.json"
            name = f"{run} run, {precision_name(amp, 'cpu')} test"
            acc[name] = test_trainval(args, split, checkpoint, amp, cache)
    pairs = {
        "whole pipeline": ("float32 run, float32 test", "bf16 run, bf16 test"),
        "training precision": ("float32 run, float32 test", "bf16 run, float32 test"),
        "evaluation precision": ("float32 run, float32 test", "float32 run, bf16 test"),
    }
    result: dict = {"bf16 train seconds": train_seconds, "shapes": {}}
    for way, shot in ZOO_SHAPES:
        shape = f"{way}w{shot}s"
        per = {name: torch.tensor(values[shape]) for name, values in acc.items()}
        entry = {name: [100 * float(a.double().mean()), 100 * ci95(a)] for name, a in per.items()}
        for label, (a, b) in pairs.items():
            entry[label] = in_percent(paired_ci(per[a], per[b]))
        result["shapes"][shape] = entry
    return result


def part_heads(args: argparse.Namespace) -> dict:
    """Part 2: ridge and SVM runs of ../ehg_seeds in float32 and bf16, paired by seed."""
    torch.set_num_threads(1)  # as the float32 runs of ../ehg_seeds
    splits = {"test": load_split("omniglot", "test", args.data_root)}
    common = ["--heads", args.heads, "--resplits", "1", "--seeds", args.seeds]
    if args.data_root:
        common += ["--data-root", args.data_root]
    arms = {
        amp: seeds.parse_args([*common, "--amp", amp, "--runs", runs])
        for amp, runs in (("off", args.seed_runs), ("bf16", args.runs))
    }
    if args.smoke:  # the runs of ../ehg_seeds' smoke mode, here
        for arm in arms.values():
            vars(arm).update(seeds.SMOKE)
    models: dict = {}
    for seed in map(int, args.seeds.split(",")):
        for head in args.heads.split(","):
            for amp, arm in arms.items():
                config = seeds.train_config(arm, head, 1, seed)
                print(f"== {head} seed={seed} {precision_name(amp, 'cpu')}", flush=True)
                model = {"head": head, "seed": seed, **seeds.train(config)}
                model["test"] = {
                    f"{w}w1s": seeds.test(arm, Path(config.out), splits, w) for w in (5, 20)
                }
                models[head, amp, seed] = model
    summary: dict = {}
    for head in args.heads.split(","):
        for way in (5, 20):
            key, shared = f"{way}w1s", [int(s) for s in args.seeds.split(",")]
            by_amp = {
                amp: [models[head, amp, s]["test"][key]["accuracy"] for s in shared] for amp in arms
            }
            d = paired_seeds_ci(by_amp["off"], by_amp["bf16"])
            episodes = [
                paired_ci(
                    seeds_report.episode_acc(models[head, "off", s], way),
                    seeds_report.episode_acc(models[head, "bf16", s], way),
                )
                for s in shared
            ]
            summary.setdefault(head, {})[key] = {
                **{precision_name(amp, "cpu"): [*seeds_ci(v), v] for amp, v in by_amp.items()},
                "bf16 - float32 across seeds": asdict(d),
                "bf16 - float32 per episode, each seed": [in_percent(e) for e in episodes],
            }
    return summary


def signed(d: dict) -> str:
    """'+0.12 ± 0.31 (p = 0.4)'."""
    return f"{d['mean']:+.2f} ± {d['ci95']:.2f} (p = {d['p_value']:.2g})"


def tables(trainval: dict, heads: dict, args: argparse.Namespace) -> str:
    """results.md: one table per part."""
    lines = [
        f"# bf16 against float32 on Omniglot ({args.episodes} seeded test episodes per shape)",
        "",
        "## 1. ProtoNet Conv-4, Snell et al.'s final-model training (12000 episodes)",
        "",
        f"bf16 run: {trainval['bf16 train seconds'] / 60:.1f} min of training steps "
        "(the trainer's clock). Accuracy % ± 95% CI; differences in points, paired over the "
        "same episodes (mean ± 1.96 s/√n, paired t-test).",
        "",
        "| shape | float32 run, float32 test | bf16 run, bf16 test | whole pipeline | "
        "training precision | evaluation precision |",
        "|---|---|---|---|---|---|",
    ]
    for shape, e in trainval["shapes"].items():
        a, b = e["float32 run, float32 test"], e["bf16 run, bf16 test"]
        lines.append(
            f"| {shape} | {a[0]:.2f} ± {a[1]:.2f} | {b[0]:.2f} ± {b[1]:.2f} | "
            f"{signed(e['whole pipeline'])} | {signed(e['training precision'])} | "
            f"{signed(e['evaluation precision'])} |"
        )
    lines += [
        "",
        "## 2. Ridge and SVM heads (../ehg_seeds' U = 1 runs), each run tested in its precision",
        "",
        "Mean over seeds ± t interval; bf16 − float32 paired by seed (t interval, paired t-test) "
        "and, per seed, over the same test episodes (how many of the seeds' per-episode "
        "intervals exclude zero).",
        "",
        "| head | test | float32 | bf16 | bf16 − float32 across seeds | seeds whose per-episode "
        "interval excludes 0 |",
        "|---|---|---|---|---|---|",
    ]
    for head, per_way in heads.items():
        for key, e in per_way.items():
            per_seed = e["bf16 - float32 per episode, each seed"]
            clear = sum(abs(x["mean"]) > x["ci95"] for x in per_seed)
            lines.append(
                f"| {seeds_report.HEAD_NAMES[head]} | {key} | {e['float32'][0]:.2f} ± "
                f"{e['float32'][1]:.2f} | {e['bf16'][0]:.2f} ± {e['bf16'][1]:.2f} | "
                f"{signed(e['bf16 - float32 across seeds'])} | {clear}/{len(e['float32'][2])} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Train and test what is missing; with both parts, write results.json and results.md."""
    args = parse_args(argv)
    retain_freed_memory()  # as the fewshot command
    trainval = None if args.skip_trainval else part_trainval(args)
    heads = None if args.skip_heads else part_heads(args)
    if trainval is None or heads is None:
        return
    out = Path(args.out)
    record = {"settings": vars(args), "trainval": trainval, "heads": heads}
    atomic_write_json(record, out / "results.json")
    atomic_write_text(tables(trainval, heads, args), out / "results.md")
    print((out / "results.md").read_text())


if __name__ == "__main__":
    main()
