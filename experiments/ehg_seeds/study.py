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
import json
import time
from pathlib import Path

import torch

from experiments.ehg_seeds.report import write
from experiments.smoke import add_smoke_flag, apply_smoke
from fewshot.datasets import load_split
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import episode_accuracies
from fewshot.evaluation.metrics import read_metrics
from fewshot.methods.feature_cache import FOLDER as FEATURES
from fewshot.runtime.device import resolve_device
from fewshot.runtime.io import atomic_write_json, load_checkpoint
from fewshot.runtime.run_folder import RunFolder
from fewshot.training.checkpoint import load_trained
from fewshot.training.settings import TrainSettings
from fewshot.training.trainer import Trainer

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
