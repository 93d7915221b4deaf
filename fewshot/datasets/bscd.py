"""The four target sets of BSCD-FSL (Guo et al. 2020: CropDisease, EuroSAT, ISIC 2018 and
ChestX-ray8) as folder data sets: each image given the class the benchmark's own loaders give
it, linked into `OUT/test/<class>/` so that `--dataset folder --data-root OUT` reads them.

The user brings the downloads (their licences forbid redistribution); nothing is copied."""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from pathlib import Path

from fewshot.datasets.folder import list_classes
from fewshot.runtime.errors import FewshotError

ISIC_CSV = "ISIC2018_Task3_Training_GroundTruth/ISIC2018_Task3_Training_GroundTruth.csv"
ISIC_IMAGES = "ISIC2018_Task3_Training_Input"
CHESTX_CSV = "Data_Entry_2017.csv"
# The benchmark keeps the images with exactly one finding among these seven.
CHESTX_CLASSES = (
    "Atelectasis",
    "Cardiomegaly",
    "Effusion",
    "Infiltration",
    "Mass",
    "Nodule",
    "Pneumothorax",
)


def _rows(path: Path) -> list[dict[str, str]]:
    """A CSV file's rows by column name, or a clear error naming the file."""
    if not path.is_file():
        raise FewshotError(f"missing {path}: is the download unpacked in {path.parent}?")
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def cropdisease(source: Path) -> dict[str, list[Path]]:
    """CropDisease (the Kaggle 'plant-disease' download): its 38 classes in dataset/train."""
    return list_classes(source / "dataset" / "train").classes


def eurosat(source: Path) -> dict[str, list[Path]]:
    """EuroSAT (RGB): its 10 classes in 2750/."""
    return list_classes(source / "2750").classes


def isic(source: Path) -> dict[str, list[Path]]:
    """ISIC 2018 task 3 training set: each image's class the column of its one-hot label."""
    path = source / ISIC_CSV
    classes: dict[str, list[Path]] = {}
    for line, row in enumerate(_rows(path), start=2):
        image = row.pop("image", None)
        marked = [name for name, value in row.items() if value not in ("0", "0.0")]
        if image is None or len(marked) != 1:
            raise FewshotError(f"{path} line {line}: expected an image and one class marked 1")
        classes.setdefault(marked[0], []).append(source / ISIC_IMAGES / f"{image}.jpg")
    return classes


def chestx(source: Path) -> dict[str, list[Path]]:
    """ChestX-ray8 (NIH): the images with one finding among the benchmark's seven, found in
    images/ or the download's images_NNN/images/ folders."""
    path = source / CHESTX_CSV
    located = {p.name: p for p in source.glob("images*/**/*.png")}
    classes: dict[str, list[Path]] = {name: [] for name in CHESTX_CLASSES}
    for line, row in enumerate(_rows(path), start=2):
        if "Image Index" not in row or "Finding Labels" not in row:
            raise FewshotError(f"{path} line {line}: no 'Image Index' and 'Finding Labels'")
        if row["Finding Labels"] in classes:
            image = row["Image Index"]
            classes[row["Finding Labels"]].append(located.get(image, source / "images" / image))
    return classes


SETS: dict[str, Callable[[Path], dict[str, list[Path]]]] = {
    "cropdisease": cropdisease,
    "eurosat": eurosat,
    "isic": isic,
    "chestx": chestx,
}


def arrange(name: str, source: Path, out: Path) -> dict[str, int]:
    """Link the set's images into OUT/test/<class>/ (made anew; an existing one is refused);
    the images per class."""
    classes = SETS[name](source)
    missing = [p for paths in classes.values() for p in paths if not p.is_file()]
    if missing:
        raise FewshotError(
            f"{name}: {len(missing)} images listed but not found under {source}, the first "
            f"{missing[0]}"
        )
    test = out / "test"
    if test.exists():
        raise FewshotError(f"{test} exists: arrange into a new folder (nothing was changed)")
    for label, paths in classes.items():
        folder = test / label
        folder.mkdir(parents=True)
        for path in paths:
            os.symlink(path.resolve(), folder / path.name)
    return {label: len(paths) for label, paths in classes.items()}
