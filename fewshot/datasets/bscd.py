"""The four target sets of BSCD-FSL (Guo et al. 2020: CropDisease, EuroSAT, ISIC 2018 and
ChestX-ray8) as folder data sets: each image given the class the benchmark's own loaders give
it, linked into `OUT/test/<class>/` so that `--dataset folder --data-root OUT` reads them.

The user brings the downloads (their licences forbid redistribution); nothing is copied. Every
name read from a download (a CSV's columns and image names) becomes a path only when it is one
plain name, so that nothing is linked or made outside OUT; the links are made in a temporary
folder beside OUT, renamed to OUT once all are made, so a failure leaves nothing behind."""

from __future__ import annotations

import csv
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from fewshot.datasets.folder import list_classes
from fewshot.runtime.errors import FewshotError, summary

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
ONE_HOT = {"0": False, "0.0": False, "1": True, "1.0": True}


def _rows(path: Path) -> list[dict[str, str]]:
    """A CSV file's rows by column name (a spreadsheet's byte-order mark is no part of the first
    name), or a clear error naming the file."""
    if not path.is_file():
        raise FewshotError(f"missing {path}: is the download unpacked in {path.parent}?")
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            return list(csv.DictReader(f))
    except (UnicodeDecodeError, csv.Error) as e:
        raise FewshotError(f"{path} is not a UTF-8 CSV file: {summary(e)}") from None


def _plain(name: str, what: str, where: str) -> str:
    """`name` where it is one plain file or folder name (a path made of it stays in its folder),
    else one line saying where it was read."""
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise FewshotError(
            f"{where}: {what} {name!r} is not a plain name (it would leave its folder)"
        )
    return name


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
        # A short row reads None, a long one a list under None: neither is one-hot.
        one_hot = image is not None and all(value in ONE_HOT for value in row.values())
        marked = [name for name, value in row.items() if one_hot and ONE_HOT[value]]
        if len(marked) != 1:
            raise FewshotError(f"{path} line {line}: expected an image and one class marked 1")
        label = _plain(marked[0], "class (column)", f"{path} line {line}")
        image = _plain(image, "image", f"{path} line {line}")
        classes.setdefault(label, []).append(source / ISIC_IMAGES / f"{image}.jpg")
    return classes


def chestx(source: Path) -> dict[str, list[Path]]:
    """ChestX-ray8 (NIH): the images with one finding among the benchmark's seven, found in
    images/ or the download's images_NNN/images/ folders."""
    path = source / CHESTX_CSV
    located = {p.name: p for p in source.glob("images*/**/*.png")}
    classes: dict[str, list[Path]] = {name: [] for name in CHESTX_CLASSES}
    for line, row in enumerate(_rows(path), start=2):
        if row.get("Image Index") is None or row.get("Finding Labels") is None:
            raise FewshotError(f"{path} line {line}: no 'Image Index' and 'Finding Labels'")
        if row["Finding Labels"] in classes:
            image = _plain(row["Image Index"], "image", f"{path} line {line}")
            classes[row["Finding Labels"]].append(located.get(image, source / "images" / image))
    return classes


SETS: dict[str, Callable[[Path], dict[str, list[Path]]]] = {
    "cropdisease": cropdisease,
    "eurosat": eurosat,
    "isic": isic,
    "chestx": chestx,
}


def _check_listing(name: str, source: Path, out: Path, classes: dict[str, list[Path]]) -> None:
    """Refuse, before anything is made, a listing of no images, a class without any, an image
    in two classes, two images for one link, and listed images that are missing."""
    empty = [label for label, paths in classes.items() if not paths]
    if not classes or empty:
        which = f" of {', '.join(empty)}" if empty else ""
        raise FewshotError(
            f"{name}: no images{which} listed in {source} (a class folder would be empty: is "
            "the download whole?); nothing was written"
        )
    linked: dict[Path, Path] = {}
    owner: dict[Path, str] = {}
    for label, paths in classes.items():
        for path in paths:
            link = out / "test" / label / path.name
            if link in linked:
                raise FewshotError(
                    f"{name}: {link} would be linked twice (to {linked[link]} and {path}: an "
                    "image listed twice?); nothing was written"
                )
            if owner.setdefault(path, label) != label:
                raise FewshotError(
                    f"{name}: {path} is listed in two classes, {owner[path]} and {label}; "
                    "nothing was written"
                )
            linked[link] = path
    missing = [p for paths in classes.values() for p in paths if not p.is_file()]
    if missing:
        raise FewshotError(
            f"{name}: {len(missing)} images listed but not found under {source}, the first "
            f"{missing[0]}"
        )


def _nearest_folder(path: Path) -> Path:
    """The nearest existing folder above `path` (where a folder beside it can be made now)."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def _link(classes: dict[str, list[Path]], out: Path) -> None:
    """OUT/test/<class>/ of links, made in a temporary folder beside OUT and renamed to OUT
    once whole (over an empty folder): a failure or interruption leaves nothing."""
    try:
        temporary = Path(tempfile.mkdtemp(dir=_nearest_folder(out), prefix=f".{out.name}."))
    except OSError as e:
        raise FewshotError(f"cannot make {out}: {e.strerror or e}") from None
    made = temporary / out.name  # made by mkdir, so with the mode the umask gives
    try:
        for label, paths in classes.items():
            at = out / "test" / label  # what a failure names: the path as the user will see it
            (made / "test" / label).mkdir(parents=True)
            for path in paths:
                at = out / "test" / label / path.name
                os.symlink(path.resolve(), made / "test" / label / path.name)
        at = out
        out.parent.mkdir(parents=True, exist_ok=True)
        os.rename(made, out)
    except OSError as e:
        raise FewshotError(f"cannot make {at}: {e.strerror or e}; nothing was written") from None
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def arrange(name: str, source: Path, out: Path) -> dict[str, int]:
    """Link the set's images into OUT/test/<class>/ (OUT new, or an empty folder: the
    settings checked it); the images per class."""
    classes = SETS[name](source)
    _check_listing(name, source, out, classes)
    _link(classes, out)
    return {label: len(paths) for label, paths in classes.items()}
