"""EHG across training seeds: Omniglot (Vinyals split), Conv-4, ProtoNet / ridge / SVM, U = 1 vs 5.

Every cell (head, U) is trained with several training seeds on one budget (the same steps for
every cell); every model selected on 5-way 1-shot validation (best.pt) is tested on the same
seeded 5-way and 20-way 1-shot test episodes. Reported per head and test shape: the mean over
seeds ± t interval for each U and, for every pair of U values, the paired difference across
seeds (seed i of one arm with seed i of the other) and, for one seed, the paired difference over
the test episodes.

Resumable: a run whose last.pt holds the final epoch is skipped, an unfinished one is resumed,
and test accuracies are cached in the run folder, so the driver can be stopped and rerun.

    python -m experiments.ehg_seeds.study    # from the repository root
    python -m experiments.ehg_seeds.study --smoke --out DIR    # seconds: the test suite's run
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import time
from dataclasses import asdict
from pathlib import Path

import torch

from experiments.smoke import add_smoke_flag, apply_smoke
from fewshot.datasets import load_split
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import episode_accuracies
from fewshot.evaluation.metrics import read_metrics
from fewshot.evaluation.stats import paired_ci, paired_seeds_ci, seeds_ci
from fewshot.methods.feature_cache import FOLDER as FEATURES
from fewshot.runtime.device import resolve_device
from fewshot.runtime.io import atomic_write_json, atomic_write_text, load_checkpoint
from fewshot.runtime.run_folder import RunFolder
from fewshot.training.checkpoint import load_trained
from fewshot.training.settings import TrainSettings
from fewshot.training.trainer import Trainer

NUMBER_LIST = re.compile(r"\[([-+\d.e,\s]+)\]")
HEAD_NAMES = {"protonet": "ProtoNet", "ridge": "ridge", "svm": "SVM"}
# The SVM as recorded here: MetaOptNet's qpth, 15 QP iterations in training, 3 in testing
# (the qpth extra; the default solver converges instead, see experiments/svm_solver/).
HEAD_OPTIONS = {"svm": {"solver": "qpth"}}
EVAL_HEAD_OPTIONS = {"svm": {"solver": "qpth", "max_iter": 3}}
# --smoke: two seeds (the paired differences need two), one small step per epoch, a few episodes.
SMOKE = {
    "seeds": "0,1", "way": 5, "query": 2, "epochs": 2, "episodes_per_epoch": 2,
    "val_episodes": 2, "test_episodes": 4,
}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The study's settings (from the command line unless `argv` is given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", default="protonet,ridge,svm", help="comma-separated heads")
    parser.add_argument("--resplits", default="1,5", help="U values for every head (1 first)")
    parser.add_argument(
        "--extra", default="", help="more cells as HEAD:U, comma-separated (e.g. protonet:10)"
    )
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated training seeds")
    parser.add_argument("--way", type=int, default=20, help="training way")
    parser.add_argument("--query", type=int, default=5, help="training queries per class")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--episodes-per-epoch", type=int, default=100)
    parser.add_argument("--episodes-per-batch", type=int, default=2)
    parser.add_argument("--val-episodes", type=int, default=300)
    parser.add_argument("--test-ways", default="5,20", help="test ways (1-shot, 15 queries)")
    parser.add_argument("--test-episodes", type=int, default=2000)
    parser.add_argument("--test-seed", type=int, default=2024)
    parser.add_argument(
        "--paired-seed", type=int, default=0, help="training seed of the per-episode example"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (1: steady on a busy CPU)"
    )
    parser.add_argument(
        "--amp", default="off", help="--amp of every run (off: float32, as recorded here)"
    )
    parser.add_argument("--runs", default="runs/ehg_seeds", help="folder for the run folders")
    parser.add_argument("--out", default="experiments/ehg_seeds", help="folder for the results")
    parser.add_argument("--data-root", default=None, help="data root (default: as fewshot's)")
    parser.add_argument(
        "--report-only", action="store_true", help="no training: tabulate the finished runs"
    )
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    apply_smoke(args, SMOKE, ("runs",))
    return args


def cells(args: argparse.Namespace) -> list[tuple[str, int]]:
    """Every (head, U) cell: the grid heads x splits, then the extra cells."""
    grid = [(h, int(u)) for h in args.heads.split(",") for u in args.resplits.split(",")]
    for item in filter(None, args.extra.split(",")):
        head, u = item.split(":")
        grid.append((head, int(u)))
    return grid


def run_dir(args: argparse.Namespace, head: str, u: int, seed: int) -> Path:
    """The run folder of one model (float32 runs carry no precision in their name)."""
    suffix = "" if args.amp == "off" else f"_{args.amp}"
    return Path(args.runs) / f"{head}_U{u}_s{seed}{suffix}"


def train_config(args: argparse.Namespace, head: str, u: int, seed: int) -> TrainSettings:
    """The settings of experiments/omniglot_ehg (Adam 1e-3 halved at mid-run), one seed."""
    return TrainSettings(
        dataset="omniglot",
        backbone="conv4",
        head=head,
        head_options=HEAD_OPTIONS.get(head, {}),
        eval_head_options=EVAL_HEAD_OPTIONS.get(head, {}),
        way=args.way,
        shot=1,
        query=args.query,
        val_way=5,
        val_shot=1,
        val_query=15,
        val_episodes=args.val_episodes,
        epochs=args.epochs,
        episodes_per_epoch=args.episodes_per_epoch,
        episodes_per_batch=args.episodes_per_batch,
        resplits=u,
        amp=args.amp,
        optimizer="adam",
        lr=1e-3,
        weight_decay=0.0,
        lr_schedule=[[args.epochs // 2, 0.5]],
        seed=seed,
        device="cpu",
        data_root=args.data_root,
        out=str(run_dir(args, head, u, seed)),
    )


def train(config: TrainSettings) -> dict:
    """Train one model, or finish or skip it; its timing (also kept in the run folder)."""
    folder = Path(config.out)
    last, timing_file = folder / "last.pt", folder / "study_time.json"
    ckpt = load_checkpoint(last) if last.exists() else None
    done = ckpt is not None and ckpt["progress"]["epoch"] == config.epochs
    if not done:
        resumed = ckpt is not None
        device = resolve_device(config.device)
        start = time.perf_counter()
        if resumed:
            print(f"resuming {folder}", flush=True)
            Trainer(config, device, resume=(str(last), ckpt)).fit()
        else:
            # Nothing to resume (new, or killed before its first checkpoint): start afresh.
            with RunFolder(folder, fresh=True, overwrite=True) as run:
                Trainer(config, device).fit(run)
        wall = time.perf_counter() - start
        atomic_write_json({"wall_seconds": wall, "resumed": resumed}, timing_file)
    timing = json.loads(timing_file.read_text()) if timing_file.exists() else {}
    rows = read_metrics(folder)
    best = max(rows, key=lambda r: r.val_acc)  # best.pt: the first epoch with the best val
    return {
        # Training steps only (the trainer's own clock, kept across resumes).
        "train_seconds": sum(r.seconds for r in rows),
        # The whole fit: steps, validation every epoch, checkpoints (None when resumed).
        "wall_seconds": None if timing.get("resumed", True) else timing["wall_seconds"],
        "best_epoch": best.epoch,
        "val_acc": [r.val_acc for r in rows],
    }


def test(args: argparse.Namespace, folder: Path, splits: dict, way: int) -> dict:
    """Per-episode correct-query counts of best.pt on the shared test episodes (cached)."""
    cache = folder / f"study_test_{way}w1s_{args.test_episodes}ep_seed{args.test_seed}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    cpu = torch.device("cpu")
    model, _ = load_trained(str(folder / "best.pt"), cpu)
    # The test split embedded once per model: the test of its other way reads the features.
    model.use_feature_cache(folder / FEATURES)
    shape = EpisodeShape(way, 1, 15, 8)
    start = time.perf_counter()
    # The model tests with its eval_head_options (the SVM's 3 QP iterations).
    acc = episode_accuracies(
        model, splits["test"], shape, args.test_episodes, args.test_seed, cpu, cache=True
    )
    queries = way * 15
    correct = torch.round(acc.double() * queries).long()
    if not torch.allclose(correct.double() / queries, acc.double(), atol=1e-6):
        raise RuntimeError("per-episode accuracies are not counts of correct queries")
    record = {
        "accuracy": 100 * float(acc.double().mean()),
        "eval_seconds": time.perf_counter() - start,
        "queries": queries,
        "correct": correct.tolist(),
    }
    atomic_write_json(record, cache)
    return record


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


def main(argv: list[str] | None = None) -> None:
    """Train (or skip / resume) every model seed by seed, test it, and write the results."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    splits = {"test": load_split("omniglot", "test", args.data_root)}
    ways = [int(w) for w in args.test_ways.split(",")]
    models = []
    for seed in map(int, args.seeds.split(",")):
        for head, u in cells(args):
            config = train_config(args, head, u, seed)
            folder = Path(config.out)
            if args.report_only and not (folder / "study_time.json").exists():
                continue
            print(f"== {head} U={u} seed={seed}", flush=True)
            model = {"head": head, "U": u, "seed": seed, "run": str(folder), **train(config)}
            model["test"] = {f"{w}w1s": test(args, folder, splits, w) for w in ways}
            brief = {k: v for k, v in model.items() if k not in ("test", "val_acc")}
            accs = {k: round(v["accuracy"], 2) for k, v in model["test"].items()}
            print(json.dumps({**brief, **accs}), flush=True)
            models.append(model)
            write(args, models)
    print((Path(args.out) / "results.md").read_text())


if __name__ == "__main__":
    main()
