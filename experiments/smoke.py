"""The drivers' --smoke mode: a driver's own code path end to end at the smallest sizes, on a
cut of the repository's Omniglot, writing only into a folder of its own (the test suite runs
every driver this way, so that none can rot)."""

from __future__ import annotations

import argparse
import csv
import os
from pathlib import Path

import numpy as np

from fewshot.datasets import REPO_DATA

EXPERIMENTS = Path(__file__).resolve().parent
# Classes kept per Vinyals split: the studies test up to 20-way; a smoke run trains and
# validates 5-way. Every class has 20 images (5-shot 15-query).
OMNIGLOT_CLASSES = {"train": 5, "val": 5, "trainval": 5, "test": 20}
SMOKE_HELP = "the smallest sizes on small data, into --out (never the recorded results)"


def add_smoke_flag(parser: argparse.ArgumentParser) -> None:
    """The --smoke flag, worded the same in every driver."""
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)


def smoke_folder(out: str | os.PathLike) -> Path:
    """Where a smoke run writes: the folder `out`, unless it lies among the recorded results in
    experiments/ (every driver's default), then runs/smoke/NAME (NAME: the folder's name)."""
    path = Path(out)
    if path.resolve().is_relative_to(EXPERIMENTS):
        path = Path("runs") / "smoke" / path.name
    path.mkdir(parents=True, exist_ok=True)
    print(f"smoke run: writing into {path}", flush=True)
    return path


def omniglot_root(folder: Path) -> Path:
    """A data root under `folder` holding the repository's Omniglot cut to the first classes
    of every Vinyals split list (OMNIGLOT_CLASSES): the drawings of those characters alone, so
    that a split reads in milliseconds. Returns `folder`."""
    source, target = REPO_DATA / "omniglot", folder / "omniglot"
    (target / "splits" / "vinyals").mkdir(parents=True, exist_ok=True)
    wanted = set()
    for split_file in (source / "splits" / "vinyals").glob("*.txt"):
        names = split_file.read_text().split()[: OMNIGLOT_CLASSES[split_file.stem]]
        (target / "splits" / "vinyals" / split_file.name).write_text("\n".join(names) + "\n")
        wanted.update(tuple(name.split("/")[:2]) for name in names)
    with open(source / "omniglot_index.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = [row for row in reader if (row["alphabet"], row["character"]) in wanted]
        columns = reader.fieldnames or []
    for file in {row["npz_file"] for row in rows}:
        kept = [row for row in rows if row["npz_file"] == file]
        with np.load(source / file) as drawings:
            images = drawings["images"][[int(row["npz_row"]) for row in kept]]
        np.savez(target / file, images=images)
        for new_row, row in enumerate(kept):
            row["npz_row"] = str(new_row)
    with open(target / "omniglot_index.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)
    return folder
