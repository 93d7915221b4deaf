"""Omniglot split as the Relation Networks authors' code splits it: its characters shuffled and
cut 1200 to train on, 423 to test, so that nearly every test character's alphabet is one
trained on (the Vinyals split keeps 12 of its 13 test alphabets out of training). Written as a
data root: the drawings linked from the source's, new lists in splits/vinyals/ (where the
reader takes them), each character with its four rotations as classes, as the Vinyals lists.

    python -m experiments.relation_character_split.split    # from the repository root
"""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

from fewshot.datasets import resolve_data_root
from fewshot.runtime.io import atomic_write_text

# The authors' sizes: 1200 of the 1623 characters to train on; here the last 172 of those
# (the Vinyals validation size) track progress, as the Vinyals val split does for the config.
TEST_SHARE, VAL_SHARE = 423 / 1623, 172 / 1200
ROTATIONS = ("rot000", "rot090", "rot180", "rot270")
FILES = ("omniglot_index.csv", "images_background.npz", "images_evaluation.npz")


def character_split(source: Path, target: Path, seed: int) -> None:
    """The data root `target`: Omniglot's drawings of the data root `source` linked, and the
    lists of a random character split (seeded: the authors' order depends on their file
    listing)."""
    with open(source / "omniglot" / FILES[0], newline="") as f:
        characters = sorted({(r["alphabet"], r["character"]) for r in csv.DictReader(f)})
    random.Random(seed).shuffle(characters)
    test_count = max(2, round(TEST_SHARE * len(characters)))
    trainval, test = characters[: len(characters) - test_count], characters[-test_count:]
    val_count = max(2, round(VAL_SHARE * len(trainval)))
    lists = {
        "train": trainval[: len(trainval) - val_count],
        "val": trainval[-val_count:],
        "trainval": trainval,
        "test": test,
    }
    folder = target / "omniglot"
    (folder / "splits" / "vinyals").mkdir(parents=True, exist_ok=True)
    for name in FILES:
        link = folder / name
        if not link.exists() and (source / "omniglot" / name).exists():
            link.symlink_to((source / "omniglot" / name).resolve())
    for split, chars in lists.items():
        names = [f"{a}/{c}/{rot}" for a, c in chars for rot in ROTATIONS]
        atomic_write_text("\n".join(names) + "\n", folder / "splits" / "vinyals" / f"{split}.txt")


def main(argv: list[str] | None = None) -> None:
    """Write the split's data root."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", help="Omniglot's source (default: fewshot's data root)")
    parser.add_argument("--out", default="runs/relation_character_split/data", help="data root")
    parser.add_argument("--seed", type=int, default=1, help="of the characters' shuffle")
    args = parser.parse_args(argv)
    character_split(resolve_data_root(args.data_root), Path(args.out), args.seed)
    print(f"Omniglot split at random by characters (seed {args.seed}): data root {args.out}")


if __name__ == "__main__":
    main()
