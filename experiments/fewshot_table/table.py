"""Reproduce the paper's few-shot table (Section 7): train, evaluate, write Markdown with 95% CIs.

Runs ProtoNet, MetaOptNet-RR and MetaOptNet-SVM, each plain and with EHG (U=5), on Conv-4 and
ResNet-12, 5-way 1-shot and 5-shot, miniImageNet and tieredImageNet: the 24 configs of
models/{miniimagenet,tieredimagenet}/ twice each (EHG is the `--resplits 5` flag), 48 runs.
Each run is `fewshot train --config ...` then `fewshot eval` of its best.pt on 2000 seeded
5-way test episodes. Re-running skips finished steps and resumes an interrupted training.
Checkpoints go to --runs-dir; the table to this study's folder (table.md) unless --table.

    python -m experiments.fewshot_table.table --data-root DATA --dry-run
    python -m experiments.fewshot_table.table --data-root DATA --only miniimagenet --only conv4
    python -m experiments.fewshot_table.table --data-root DATA --only protonet,ridge --only ehg
    python -m experiments.fewshot_table.table --smoke --table DIR/table.md    # seconds

--smoke trains and tests the miniImageNet Conv-4 ProtoNet 1-shot cell with EHG for one step on
synthetic images (../resnet12_rehearsal's), into the folder of --table.
"""

from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from experiments.resnet12_rehearsal.rehearsal import write_data
from experiments.smoke import add_smoke_flag, smoke_folder
from fewshot.cli.main import main as fewshot_main
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_write_text
from fewshot.training.settings import read_config_file

REPO = Path(__file__).resolve().parents[2]
STUDY = Path(__file__).resolve().parent
EHG_SPLITS = 5
DATASETS = {"miniimagenet": "miniImageNet", "tieredimagenet": "tieredImageNet"}
METHODS = {"protonet": "ProtoNet", "ridge": "MetaOptNet-RR", "svm": "MetaOptNet-SVM"}
BACKBONES = {"conv4": "4-layer conv (1600-d)", "resnet12": "ResNet-12 (16000-d)"}
SHOTS = (1, 5)
VARIANTS = ("plain", "ehg")

# The paper's table: (backbone, method, variant) -> accuracy ± CI for
# miniImageNet 1-shot, 5-shot, tieredImageNet 1-shot, 5-shot.
PAPER = {
    ("conv4", "protonet", "plain"): (
        "50.62 ± 0.67",
        "70.06 ± 0.54",
        "50.36 ± 0.70",
        "69.90 ± 0.57",
    ),
    ("conv4", "protonet", "ehg"): ("52.71 ± 0.69", "70.71 ± 0.52", "53.21 ± 0.72", "71.40 ± 0.58"),
    ("conv4", "ridge", "plain"): ("51.67 ± 0.66", "68.72 ± 0.54", "51.74 ± 0.70", "69.84 ± 0.58"),
    ("conv4", "ridge", "ehg"): ("52.91 ± 0.66", "69.61 ± 0.54", "54.84 ± 0.71", "70.95 ± 0.58"),
    ("conv4", "svm", "plain"): ("50.84 ± 0.65", "69.67 ± 0.52", "50.92 ± 0.69", "70.65 ± 0.58"),
    ("conv4", "svm", "ehg"): ("52.35 ± 0.67", "69.69 ± 0.53", "54.11 ± 0.74", "71.85 ± 0.58"),
    ("resnet12", "protonet", "plain"): (
        "57.38 ± 0.70",
        "73.80 ± 0.54",
        "57.99 ± 0.75",
        "78.24 ± 0.59",
    ),
    ("resnet12", "protonet", "ehg"): (
        "59.27 ± 0.70",
        "74.94 ± 0.53",
        "63.38 ± 0.78",
        "78.93 ± 0.58",
    ),
    ("resnet12", "ridge", "plain"): (
        "57.60 ± 0.66",
        "74.69 ± 0.50",
        "58.70 ± 0.75",
        "79.21 ± 0.57",
    ),
    ("resnet12", "ridge", "ehg"): ("59.27 ± 0.70", "74.94 ± 0.53", "63.38 ± 0.78", "78.93 ± 0.58"),
    ("resnet12", "svm", "plain"): ("58.00 ± 0.67", "75.35 ± 0.50", "58.63 ± 0.75", "79.11 ± 0.56"),
    ("resnet12", "svm", "ehg"): ("58.20 ± 0.68", "76.50 ± 0.49", "64.10 ± 0.77", "80.62 ± 0.55"),
}
COLUMNS = [(dataset, shot) for dataset in DATASETS for shot in SHOTS]
# --smoke: one cell, one training step, a few episodes, on 16 synthetic images per class (the
# 1-shot 15-query episodes).
SMOKE = {
    "only": ["miniimagenet", "conv4", "protonet", "1shot", "ehg"], "epochs": 1,
    "episodes_per_epoch": 2, "val_episodes": 2, "episodes": 4, "dry_run": False,
}  # fmt: skip
SMOKE_IMAGES = 16


@dataclass(frozen=True)
class Run:
    """One cell of the table: a zoo config, trained plain or with EHG."""

    dataset: str
    method: str
    backbone: str
    shot: int
    variant: str

    @property
    def config(self) -> Path:
        """The zoo config this run trains."""
        return (
            REPO / "models" / self.dataset / f"{self.method}_{self.backbone}_{self.shot}shot.json"
        )

    @property
    def name(self) -> str:
        """Run folder name below --runs-dir, e.g. miniimagenet/svm_conv4_1shot_ehg5."""
        suffix = f"_ehg{EHG_SPLITS}" if self.variant == "ehg" else ""
        return f"{self.dataset}/{self.method}_{self.backbone}_{self.shot}shot{suffix}"

    def fields(self) -> dict[str, str]:
        """The values --only filters match: dataset, method, backbone, shot, variant."""
        return {
            "dataset": self.dataset,
            "method": self.method,
            "backbone": self.backbone,
            "shot": f"{self.shot}shot",
            "variant": self.variant,
        }


def all_runs() -> list[Run]:
    """Every run of the table, in table order."""
    return [
        Run(dataset, method, backbone, shot, variant)
        for backbone in BACKBONES
        for method in METHODS
        for variant in VARIANTS
        for dataset in DATASETS
        for shot in SHOTS
    ]


def select(runs: list[Run], only: list[str]) -> list[Run]:
    """Keep the runs that match every --only (each a comma-separated list of alternatives)."""
    choices = {
        "dataset": set(DATASETS),
        "method": set(METHODS),
        "backbone": set(BACKBONES),
        "shot": {f"{s}shot" for s in SHOTS},
        "variant": set(VARIANTS),
    }
    for group in only:
        wanted = {token.strip() for token in group.split(",") if token.strip()}
        unknown = sorted(wanted - set().union(*choices.values()))
        if unknown:
            options = ", ".join(sorted(set().union(*choices.values())))
            raise FewshotError(f"--only {group}: unknown {', '.join(unknown)}; use {options}")
        runs = [r for r in runs if wanted & set(r.fields().values())]
    return runs


def epochs_done(run_dir: Path) -> int:
    """Completed epochs of a run (one line of metrics.jsonl each)."""
    metrics = run_dir / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.is_file() else 0


def commands(run: Run, args: argparse.Namespace) -> list[list[str]]:
    """The `fewshot train` and `fewshot eval` commands of one run, less the finished ones."""
    run_dir = Path(args.runs_dir) / run.name
    settings = read_config_file(run.config)
    epochs = args.epochs or settings["epochs"]
    common = ["--device", args.device]
    if args.data_root:
        common += ["--data-root", args.data_root]
    out = []
    if args.dry_run or epochs_done(run_dir) < epochs:
        train = ["fewshot", "train", "--config", str(run.config), "--out", str(run_dir), *common]
        if run.variant == "ehg":
            train += ["--resplits", str(EHG_SPLITS)]
        if args.epochs:
            train += ["--epochs", str(args.epochs)]
        if args.episodes_per_epoch:
            train += ["--episodes-per-epoch", str(args.episodes_per_epoch)]
        if args.val_episodes:
            train += ["--val-episodes", str(args.val_episodes)]
        if not args.dry_run and (run_dir / "last.pt").is_file():
            train += ["--resume", str(run_dir / "last.pt")]
        elif not args.dry_run:
            train += ["--overwrite"]  # a run killed before its first checkpoint left nothing
        out.append(train)
    evaluation = [
        "fewshot", "eval", "--checkpoint", str(run_dir / "best.pt"), "--split", "test",
        "--way", "5", "--shot", str(run.shot), "--query", "15",
        "--episodes", str(args.episodes), "--seed", str(args.seed),
        "--out", str(run_dir / "test.json"), *common,
    ]  # fmt: skip
    if args.dry_run or not (run_dir / "test.json").is_file():
        out.append(evaluation)
    return out


def cell(run_dir: Path) -> str:
    """Our 'accuracy ± CI' of a finished run, or a dash."""
    result = run_dir / "test.json"
    if not result.is_file():
        return "—"
    values = json.loads(result.read_text())
    return f"{values['accuracy']:.2f} ± {values['ci95']:.2f}"


def table(runs_dir: Path, episodes: int) -> str:
    """The Markdown table: our accuracy ± 95% CI with the paper's beside it."""
    head = " | ".join(f"{DATASETS[d]} {s}-shot" for d, s in COLUMNS)
    lines = [
        f"5-way accuracy (%) ± 95% CI on {episodes} seeded test episodes; paper in brackets.",
        "",
        f"| model | {head} |",
        "|---" * (len(COLUMNS) + 1) + "|",
    ]
    for backbone, title in BACKBONES.items():
        lines.append(f"| **{title}** |" + " |" * len(COLUMNS))
        for method, method_title in METHODS.items():
            for variant in VARIANTS:
                paper = PAPER[(backbone, method, variant)]
                cells = [
                    f"{cell(runs_dir / Run(d, method, backbone, s, variant).name)} ({p})"
                    for (d, s), p in zip(COLUMNS, paper, strict=True)
                ]
                label = method_title + ("(+EHG)" if variant == "ehg" else "")
                lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Print or run the selected runs, then write the table of whatever has finished."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data-root", help="folder with the datasets' folders (default: $FEWSHOT_DATA or data/)"
    )
    parser.add_argument("--runs-dir", default="runs/paper_table")
    parser.add_argument("--only", action="append", default=[], help="e.g. conv4 or ridge,svm")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--episodes", type=int, default=2000, help="test episodes per run")
    parser.add_argument("--seed", type=int, default=0, help="seed of the test episodes")
    parser.add_argument("--epochs", type=int, help="override the configs' 100 (for a trial)")
    parser.add_argument("--episodes-per-epoch", type=int, help="override the configs' 1000")
    parser.add_argument("--val-episodes", type=int, help="override the configs' 2000")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument(
        "--table", help=f"Markdown output (default: {STUDY.relative_to(REPO)}/table.md)"
    )
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
        folder = smoke_folder(Path(args.table).parent if args.table else STUDY)
        args.table, args.runs_dir = str(folder / "table.md"), str(folder / "runs")
        if not args.data_root:
            args.data_root = str(folder / "data")
            write_data(Path(args.data_root), SMOKE_IMAGES)
    try:
        runs = select(all_runs(), args.only)
    except FewshotError as e:
        parser.error(str(e))
    for run in runs:
        for command in commands(run, args):
            if args.dry_run:
                print(shlex.join(command), flush=True)
            else:
                print("$", shlex.join(command), flush=True)
                if fewshot_main(command[1:]) != 0:
                    raise SystemExit(f"failed: {shlex.join(command)}")
    if not args.dry_run:
        out = Path(args.table) if args.table else STUDY / "table.md"
        text = table(Path(args.runs_dir), args.episodes)
        atomic_write_text(text, out)
        print(f"table written to {out}")


if __name__ == "__main__":
    main()
