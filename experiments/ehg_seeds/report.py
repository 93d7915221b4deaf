"""The study's results: each U over seeds, paired differences, results.json and results.md."""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
from dataclasses import asdict
from pathlib import Path

import torch

from fewshot.evaluation.stats import paired_ci, paired_seeds_ci, seeds_ci
from fewshot.runtime.io import atomic_write_text

NUMBER_LIST = re.compile(r"\[([-+\d.e,\s]+)\]")
HEAD_NAMES = {"protonet": "ProtoNet", "ridge": "ridge", "svm": "SVM"}


def episode_acc(model: dict, way: int) -> torch.Tensor:
    """A model's per-episode accuracies (fractions) from the stored counts."""
    test = model["test"][f"{way}w1s"]
    return torch.tensor(test["correct"], dtype=torch.float64) / test["queries"]


def summarise(args: argparse.Namespace, models: list[dict]) -> dict:
    """Per head and test way: each U over seeds; every pair U_b - U_a (a < b) paired across
    seeds and, for the paired seed, per test episode."""
    summary: dict = {}
    ways = [int(w) for w in args.test_ways.split(",")]
    by_cell: dict = {}
    for m in models:
        by_cell.setdefault((m["head"], m["U"]), {})[m["seed"]] = m
    for head in dict.fromkeys(h for h, _ in by_cell):
        us = sorted(u for h, u in by_cell if h == head)
        for way in ways:
            key = f"{way}w1s"
            entry = summary.setdefault(head, {}).setdefault(key, {})
            for u in us:
                runs = by_cell[head, u]
                accs = [runs[s]["test"][key]["accuracy"] for s in sorted(runs)]
                cell = {"n": len(accs), "seeds": sorted(runs), "accuracies": accs}
                if len(accs) >= 2:
                    cell["mean"], cell["ci95"] = seeds_ci(accs)
                entry[f"U{u}"] = cell
            for ua, ub in itertools.combinations(us, 2):
                arm_a, arm_b = by_cell[head, ua], by_cell[head, ub]
                shared = sorted(set(arm_a) & set(arm_b))
                if len(shared) < 2:
                    continue
                a = [arm_a[s]["test"][key]["accuracy"] for s in shared]
                b = [arm_b[s]["test"][key]["accuracy"] for s in shared]
                wins = sum(y > x for x, y in zip(a, b, strict=True))
                label = f"U{ub}-U{ua}"
                d = paired_seeds_ci(a, b)
                entry[f"{label} seeds"] = {**asdict(d), "seeds": shared, "b_higher": wins}
                if args.paired_seed in shared:
                    s = args.paired_seed
                    d = paired_ci(episode_acc(arm_a[s], way), episode_acc(arm_b[s], way))
                    # paired_ci works on fractions: in percent like everything else here.
                    entry[f"{label} episodes"] = {
                        **asdict(d),
                        "mean": 100 * d.mean,
                        "ci95": 100 * d.ci95,
                        "seed": s,
                    }
    return summary


def minutes(seconds: list[float]) -> str:
    """'2.1 (1.4-3.2)': mean and range in minutes."""
    if not seconds:
        return "-"
    m = [x / 60 for x in seconds]
    return f"{sum(m) / len(m):.1f} ({min(m):.1f}-{max(m):.1f})"


def fmt(mean: float, half: float) -> str:
    """'95.74 ± 0.21'."""
    return f"{mean:.2f} ± {half:.2f}"


def signed(d: dict) -> str:
    """'+0.92 ± 0.31 (p = 0.002)'."""
    p = f"p = {d['p_value']:.2g}" if d["p_value"] > 0 else "p < 1e-300"
    return f"{d['mean']:+.2f} ± {d['ci95']:.2f} ({p})"


def tables(args: argparse.Namespace, models: list[dict], summary: dict) -> str:
    """The Markdown tables of results.md."""
    ways = [f"{w}w1s" for w in args.test_ways.split(",")]
    titles = [f"{w}-way 1-shot" for w in args.test_ways.split(",")]
    steps = args.epochs * args.episodes_per_epoch // args.episodes_per_batch
    lines = [
        f"Omniglot (Vinyals split), Conv-4, trained {args.way}-way 1-shot {args.query}-query, "
        f"{args.epochs * args.episodes_per_epoch} episodes ({steps} steps of "
        f"{args.episodes_per_batch}), Adam 1e-3 halved after epoch {args.epochs // 2}, best of "
        f"{args.epochs} epochs on {args.val_episodes} 5-way 1-shot validation episodes; every "
        f"model tested on the same {args.test_episodes} seeded test episodes (seed "
        f"{args.test_seed}, 15 queries). Accuracies in %, ± the 95% interval.",
        "",
        "## Accuracy over training seeds (mean ± t interval across seeds)",
        "",
        "| head | U | seeds | "
        + " | ".join(titles)
        + " | training steps, min per run | × U = 1 | whole fit, min | testing, min |",
        "|---|---|---|" + "---|" * len(ways) + "---|---|---|---|",
    ]
    for head, per_way in summary.items():
        u_keys = [k for k in per_way[ways[0]] if "-" not in k]
        for u_key in sorted(u_keys, key=lambda k: int(k[1:])):
            u = int(u_key[1:])
            cells_ = [per_way[w][u_key] for w in ways]
            accs = [fmt(c["mean"], c["ci95"]) if "mean" in c else "-" for c in cells_]
            runs = {m["seed"]: m for m in models if m["head"] == head and m["U"] == u}
            base = {m["seed"]: m for m in models if m["head"] == head and m["U"] == 1}
            # Median over seeds of the step-time ratio to the same seed's U = 1 run.
            ratios = [
                runs[s]["train_seconds"] / base[s]["train_seconds"] for s in runs if s in base
            ]
            walls = [m["wall_seconds"] for m in runs.values() if m["wall_seconds"] is not None]
            tests = [sum(t["eval_seconds"] for t in m["test"].values()) for m in runs.values()]
            lines.append(
                f"| {HEAD_NAMES[head]} | {u} | {cells_[0]['n']} | "
                + " | ".join(accs)
                + f" | {minutes([m['train_seconds'] for m in runs.values()])} | "
                + (f"{statistics.median(ratios):.2f} | " if ratios else "- | ")
                + f"{minutes(walls)} | {minutes(tests)} |"
            )
    lines += [
        "",
        "## Paired differences (percentage points)",
        "",
        "Across seeds: seed i of one U paired with seed i of the other, mean ± t interval, "
        f"paired t-test. Per episode: training seed {args.paired_seed} only, the two models on the "
        f"same {args.test_episodes} episodes, mean ± 1.96 s/√n, paired t-test; it measures "
        "the test-episode noise of one pair of models, not the spread across training seeds.",
        "",
        "| head | difference | test | across seeds | higher in | per episode (one seed) |",
        "|---|---|---|---|---|---|",
    ]
    for head, per_way in summary.items():
        keys = [k for k in per_way[ways[0]] if k.endswith(" seeds")]
        for k in keys:
            label = k.removesuffix(" seeds")
            for w, title in zip(ways, titles, strict=True):
                seeds_d = per_way[w][k]
                ep = per_way[w].get(f"{label} episodes")
                lines.append(
                    f"| {HEAD_NAMES[head]} | {label.replace('-', ' − ')} ({seeds_d['n']} seeds) | "
                    f"{title} | {signed(seeds_d)} | {seeds_d['b_higher']}/{seeds_d['n']} seeds | "
                    f"{signed(ep) if ep else '-'} |"
                )
    lines += [
        "",
        "## Every model (test accuracy %, best epoch, training minutes)",
        "",
        "| head | U | seed | " + " | ".join(titles) + " | best epoch | train min | wall min |",
        "|---|---|---|" + "---|" * len(ways) + "---|---|---|",
    ]
    for m in sorted(models, key=lambda m: (list(HEAD_NAMES).index(m["head"]), m["U"], m["seed"])):
        accs = " | ".join(f"{m['test'][w]['accuracy']:.2f}" for w in ways)
        wall = f"{m['wall_seconds'] / 60:.1f}" if m["wall_seconds"] is not None else "-"
        lines.append(
            f"| {HEAD_NAMES[m['head']]} | {m['U']} | {m['seed']} | {accs} | {m['best_epoch']} | "
            f"{m['train_seconds'] / 60:.1f} | {wall} |"
        )
    return "\n".join(lines) + "\n"


def write(args: argparse.Namespace, models: list[dict]) -> None:
    """results.json (every model, per-episode counts) and results.md (the tables)."""
    out = Path(args.out)
    summary = summarise(args, models)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "report_only")}
    record = {
        "settings": settings,
        "machine": "a 2-core CPU shared with other jobs",
        "notes": {
            "accuracy": "percent, mean over the test episodes",
            "correct": "per test episode: correct queries out of `queries`",
            "train_seconds": "training steps only (the trainer's clock)",
            "wall_seconds": "the whole fit incl. validation and checkpoints; null if resumed",
        },
        "summary": summary,
        "models": models,
    }
    # Indented, but arrays of numbers on one line (2000 counts per model and test shape).
    text = json.dumps(record, indent=1)
    text = NUMBER_LIST.sub(
        lambda m: "[" + ", ".join(m.group(1).replace(",", " ").split()) + "]", text
    )
    atomic_write_text(text + "\n", out / "results.json")
    atomic_write_text(tables(args, models, summary), out / "results.md")
