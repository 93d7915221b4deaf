"""Shared by the image-task table drivers (experiments.hpo_cleaning.table and
experiments.hpo_image_regularization.table): cell-selection flags, missing-cell runs, the smoke
mode, output."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from experiments.smoke import add_smoke_flag, smoke_folder
from fewshot.cli.main import main as fewshot_main
from fewshot.runtime.io import atomic_write_json, atomic_write_text

Cell = tuple[str, str, str, int]  # dataset, model, method, seed
# --smoke: every model and method on MNIST, one seed, run into a folder of its own...
SMOKE = {"run": True, "datasets": "mnist", "seeds": "0"}
# ...each method at its smallest K, T-RHG window or U.
SMOKE_METHOD_FLAGS = {
    "rhg": ["--inner-steps", "2"],
    "trhg": ["--inner-steps", "2", "--truncate", "1"],
    "oehg": ["--resplits", "2"],
}


def csv(text: str) -> list[str]:
    """The non-empty parts of a comma list."""
    return [part for part in text.split(",") if part]


def add_cell_arguments(parser: argparse.ArgumentParser, out: str, datasets: str) -> None:
    """--out (default: the study folder), --run, --data-root and the comma lists of cells."""
    parser.add_argument("--out", default=out)
    parser.add_argument("--run", action="store_true", help="run missing cells first")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--datasets", default=datasets)
    parser.add_argument("--models", default="sr,mlp")
    parser.add_argument("--methods", default="rhg,trhg,oehg")
    parser.add_argument("--seeds", default="0,1,2", help="the committed tables' seeds")
    add_smoke_flag(parser)


def apply_smoke(args: argparse.Namespace) -> None:
    """Under --smoke: the smoke selection, into a folder of its own (not the recorded tables)."""
    if args.smoke:
        vars(args).update(SMOKE)
        args.out = str(smoke_folder(args.out))


def selection(args: argparse.Namespace) -> tuple[list[str], list[str], list[str], list[int]]:
    """The selected datasets, models, methods and seeds."""
    seeds = [int(seed) for seed in csv(args.seeds)]
    return csv(args.datasets), csv(args.models), csv(args.methods), seeds


def cells(args: argparse.Namespace) -> list[Cell]:
    """Every (dataset, model, method, seed) the flags select."""
    datasets, models, methods, seeds = selection(args)
    return [(d, mo, me, s) for d in datasets for mo in models for me in methods for s in seeds]


def run_missing(
    command: str,
    args: argparse.Namespace,
    result: Callable[[Cell], Path],
    extra: Callable[[Cell], list[str]],
) -> None:
    """Run `fewshot hpo COMMAND` for every selected cell whose result file is missing, with the
    cell's `extra` flags."""
    for cell in cells(args):
        if result(cell).is_file():
            continue
        dataset, model, method, seed = cell
        argv = ["hpo", command, "--dataset", dataset, "--model", model, "--method", method]
        argv += ["--seed", str(seed), "--out", args.out, *extra(cell)]
        if args.data_root:
            argv += ["--data-root", args.data_root]
        print("fewshot " + " ".join(argv), flush=True)
        if fewshot_main(argv):
            raise SystemExit(f"run failed: {' '.join(argv)}")


def write_table(out: Path, name: str, lines: list[str], table: dict) -> None:
    """Write OUT/NAME.md and OUT/NAME.json atomically and print the Markdown."""
    text = "\n".join(lines)
    atomic_write_text(text + "\n", out / f"{name}.md")
    atomic_write_json(table, out / f"{name}.json")
    print(text)
