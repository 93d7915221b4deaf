"""The ResNet-12 rehearsal's data: synthetic 84x84 images with learnable class structure
(synthetic.py) written as miniImageNet's learn2learn cache (64 / 16 / 20 classes, named after
the Ravi split lists' wnids), which spec.yaml trains the miniImageNet configs on.

    python -m experiments.resnet12_rehearsal.rehearsal    # from the repository root
"""

from __future__ import annotations

import argparse
import csv
import pickle
from pathlib import Path

from experiments.resnet12_rehearsal.synthetic import class_images
from fewshot.datasets import REPO_DATA
from fewshot.datasets.miniimagenet import IMAGE_SIZE, LEARN2LEARN_FILES
from fewshot.runtime.io import atomic_write_bytes

# Images per class in every split (miniImageNet has 600; 60 keeps the cache at 127 MB).
PER_CLASS = 60
# Pattern contrast and pixel noise per split. The training augmentation's colour jitter (factors
# 0.6-1.4) leaves an untrained ResNet-12 at chance on faint patterns, so the training classes'
# are strong; the validation and test classes' are faint, so that their accuracy has room to
# rise: an untrained ResNet-12 ProtoNet scores 44.9 ± 1.1 % on their 5-way 1-shot episodes.
LEVELS = {
    "train": {"contrast": 60.0, "noise": 50.0},
    "val": {"contrast": 12.0, "noise": 70.0},
    "test": {"contrast": 12.0, "noise": 70.0},
}
SPLIT_SEEDS = {"train": 0, "val": 1, "test": 2}  # other seeds: other classes' patterns


def ravi_classes(split: str) -> list[str]:
    """The wnids of a split in the Ravi list shipped in data/, in the order they appear."""
    with open(REPO_DATA / "miniimagenet" / f"{split}.csv", newline="") as f:
        return list(dict.fromkeys(row["label"] for row in csv.DictReader(f)))


def write_data(root: Path, per_class: int = PER_CLASS) -> None:
    """Write the three splits as learn2learn's miniImageNet cache under root/miniimagenet,
    `per_class` images per class."""
    folder = root / "miniimagenet"
    folder.mkdir(parents=True, exist_ok=True)
    for split, seed in SPLIT_SEEDS.items():
        names = ravi_classes(split)
        images, _ = class_images(len(names), per_class, 3, IMAGE_SIZE, seed, **LEVELS[split])
        cache = {
            "image_data": images.permute(0, 2, 3, 1).numpy(),  # learn2learn's [N, 84, 84, 3]
            "class_dict": {
                wnid: list(range(k * per_class, (k + 1) * per_class))
                for k, wnid in enumerate(names)
            },
        }
        atomic_write_bytes(pickle.dumps(cache), folder / LEARN2LEARN_FILES[split][0])


def main(argv: list[str] | None = None) -> None:
    """Write the data root."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="runs/rehearsal/data", help="the data root to write")
    parser.add_argument("--per-class", type=int, default=PER_CLASS, help="images per class")
    args = parser.parse_args(argv)
    write_data(Path(args.data), args.per_class)
    print(f"synthetic miniImageNet ({args.per_class} images per class) in {args.data}")


if __name__ == "__main__":
    main()
