"""BSCD-FSL's four target sets arranged as folder data sets from their downloads' layouts (small
stand-ins written here), and evaluated with the benchmark's protocol."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_folder import refused

from fewshot.cli.main import main
from fewshot.datasets import REPO_DATA, load_split
from fewshot.datasets.bscd import CHESTX_CLASSES, ISIC_CSV, ISIC_IMAGES, arrange
from fewshot.runtime.errors import FewshotError

ISIC_CLASSES = ("MEL", "NV", "BCC", "AKIEC", "BKL", "DF", "VASC")


def write_image(path: Path, value: int, mode: str = "L") -> None:
    """A small image of one grey level with a stripe, so that images differ."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.full((12, 12), value, np.uint8)
    pixels[value % 12] = 255 - value
    Image.fromarray(pixels).convert(mode).save(path)


def isic_download(root: Path, per_class: int) -> Path:
    """The ISIC 2018 task 3 layout: a one-hot ground-truth CSV and a folder of JPEGs."""
    rows = [f"image,{','.join(ISIC_CLASSES)}"]
    for c, _ in enumerate(ISIC_CLASSES):
        for i in range(per_class):
            name = f"ISIC_{c:02d}{i:03d}"
            rows.append(f"{name}," + ",".join("1.0" if k == c else "0.0" for k in range(7)))
            write_image(root / ISIC_IMAGES / f"{name}.jpg", 30 * c + i, "RGB")
    (root / ISIC_CSV).parent.mkdir(parents=True)
    (root / ISIC_CSV).write_text("\n".join(rows) + "\n")
    return root


def test_isic_images_go_to_the_class_of_their_one_hot_column(tmp_path):
    counts = arrange("isic", isic_download(tmp_path / "isic", 3), tmp_path / "out")
    assert counts == dict.fromkeys(ISIC_CLASSES, 3)
    split = load_split("folder", "test", tmp_path / "out")
    assert len(split.images) == 21 and split.images.shape[1] == 3
    # Classes in sorted order of their names: the AKIEC links point at the images of column 3.
    target = (tmp_path / "out" / "test" / "AKIEC" / "ISIC_03000.jpg").resolve()
    assert target == (tmp_path / "isic" / ISIC_IMAGES / "ISIC_03000.jpg").resolve()


def test_chestx_keeps_single_findings_among_the_seven(tmp_path):
    source = tmp_path / "chestx"
    rows = ["Image Index,Finding Labels,Follow-up #"]
    labels = [*CHESTX_CLASSES, "No Finding", "Pneumonia", "Mass|Nodule", "Hernia"]
    for i, label in enumerate(labels):
        # The Kaggle download spreads the PNGs over images_NNN/images/.
        write_image(source / f"images_{i % 2 + 1:03d}" / "images" / f"{i:08d}_000.png", 20 * i)
        rows.append(f"{i:08d}_000.png,{label},0")
    (source / "Data_Entry_2017.csv").write_text("\n".join(rows) + "\n")
    counts = arrange("chestx", source, tmp_path / "out")
    assert counts == dict.fromkeys(CHESTX_CLASSES, 1)
    assert sorted(p.name for p in (tmp_path / "out" / "test").iterdir()) == sorted(CHESTX_CLASSES)


@pytest.mark.parametrize(("name", "inner"), [("cropdisease", "dataset/train"), ("eurosat", "2750")])
def test_class_folder_sets_keep_their_folders(tmp_path, name, inner):
    for c in range(3):
        for i in range(2):
            write_image(tmp_path / name / inner / f"class{c}" / f"{i}.JPG", 40 * c + i, "RGB")
    counts = arrange(name, tmp_path / name, tmp_path / "out")
    assert counts == {"class0": 2, "class1": 2, "class2": 2}


def files(root: Path) -> list[str]:
    """Every path under `root` (links not followed), to see that nothing was made."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def rewrite_csv(source: Path, change) -> None:
    """The ISIC ground truth's lines (header first) through `change(lines)`."""
    lines = (source / ISIC_CSV).read_text().splitlines()
    (source / ISIC_CSV).write_text("\n".join(change(lines)) + "\n")


def out_inside(source: Path, tmp: Path) -> Path:
    """OUT a folder of the download."""
    return source / "arranged"


def out_inside_spelled_otherwise(source: Path, tmp: Path) -> Path:
    """OUT in the download, spelled through another folder and `..`."""
    (tmp / "elsewhere").mkdir()
    return tmp / "elsewhere" / ".." / "isic" / "arranged"


def out_not_empty(source: Path, tmp: Path) -> Path:
    """OUT a folder that holds a file of the user's."""
    (tmp / "out").mkdir()
    (tmp / "out" / "notes.txt").write_text("mine")
    return tmp / "out"


def out_a_file(source: Path, tmp: Path) -> Path:
    """OUT a file."""
    (tmp / "out").write_text("mine")
    return tmp / "out"


def out_a_link(source: Path, tmp: Path) -> Path:
    """OUT a link to an empty folder (renaming onto it would replace the link)."""
    (tmp / "empty").mkdir()
    (tmp / "out").symlink_to(tmp / "empty")
    return tmp / "out"


def column_leaves(source: Path, tmp: Path) -> Path:
    """The last class's column named to climb out of OUT/test (its images into tmp/x)."""
    rewrite_csv(source, lambda lines: [lines[0].replace("VASC", "../../x"), *lines[1:]])
    return tmp / "out"


def image_leaves(source: Path, tmp: Path) -> Path:
    """A row whose image name climbs out of the download's image folder."""
    rewrite_csv(source, lambda lines: [*lines, "../../x,1.0,0,0,0,0,0,0"])
    return tmp / "out"


def not_one_hot(source: Path, tmp: Path) -> Path:
    """A row with a class marked 2.0."""
    rewrite_csv(source, lambda lines: [*lines[:3], lines[3].replace("1.0", "2.0"), *lines[4:]])
    return tmp / "out"


def listed_twice(source: Path, tmp: Path) -> Path:
    """The first image listed twice, under its one class."""
    rewrite_csv(source, lambda lines: [*lines, lines[1]])
    return tmp / "out"


def in_two_classes(source: Path, tmp: Path) -> Path:
    """The first image listed again under another class."""
    rewrite_csv(source, lambda lines: [*lines, "ISIC_00000,0,1.0,0,0,0,0,0"])
    return tmp / "out"


def not_utf8(source: Path, tmp: Path) -> Path:
    """A line that is not UTF-8."""
    (source / ISIC_CSV).write_bytes((source / ISIC_CSV).read_bytes() + b"ISIC_\xff,1,0,0,0,0,0,0\n")
    return tmp / "out"


def image_missing(source: Path, tmp: Path) -> Path:
    """A listed image deleted."""
    (source / ISIC_IMAGES / "ISIC_01001.jpg").unlink()
    return tmp / "out"


# One broken check each, on an ISIC download that arranges; the line after "error: ".
ARRANGE_CASES = [
    (out_inside, "--out {out} is inside the download {source}: name a folder outside it"),
    (out_inside_spelled_otherwise, "--out {out} is inside the download {source}"),
    (out_not_empty, "--out {out} exists and is not an empty folder: arrange into a new folder"),
    (out_a_file, "--out {out} exists and is not an empty folder"),
    (out_a_link, "--out {out} exists and is not an empty folder"),
    (column_leaves, "{csv} line 14: class (column) '../../x' is not a plain name"),
    (image_leaves, "{csv} line 16: image '../../x' is not a plain name"),
    (not_one_hot, "{csv} line 4: expected an image and one class marked 1"),
    (listed_twice, "isic: {out}/test/MEL/ISIC_00000.jpg would be linked twice"),
    (in_two_classes, "isic: {source}/{images}/ISIC_00000.jpg is listed in two classes, MEL and NV"),
    (not_utf8, "{csv} is not a UTF-8 CSV file"),
    (image_missing, "isic: 1 images listed but not found under {source}, the first"),
]


@pytest.mark.parametrize(
    ("make", "message"), ARRANGE_CASES, ids=[c[0].__name__ for c in ARRANGE_CASES]
)
def test_an_arrangement_that_would_go_wrong_is_one_line_and_writes_nothing(
    make, message, tmp_path, capsys
):
    source = isic_download(tmp_path / "isic", 2)
    out = make(source, tmp_path)
    before = files(tmp_path)
    err = refused(["data", "arrange", "isic", str(source), "--out", str(out)], capsys)
    names = {"out": out, "source": source, "csv": source / ISIC_CSV, "images": ISIC_IMAGES}
    assert message.format(**names) in err
    assert files(tmp_path) == before  # nothing made, inside OUT or outside it


def test_an_empty_folder_and_a_spreadsheets_byte_order_mark_are_taken(tmp_path, capsys):
    source = isic_download(tmp_path / "isic", 2)
    (source / ISIC_CSV).write_bytes(b"\xef\xbb\xbf" + (source / ISIC_CSV).read_bytes())
    (tmp_path / "out").mkdir()
    argv = ["data", "arrange", "isic", str(source), "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    assert "7 classes, 14 images" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "out" / "test").iterdir()) == sorted(ISIC_CLASSES)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["isic", "out"]  # no temporary left


@pytest.mark.parametrize(
    "failure", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()]
)
def test_a_failure_while_linking_leaves_nothing_and_names_the_link(failure, tmp_path, monkeypatch):
    source = isic_download(tmp_path / "isic", 2)
    out = tmp_path / "new" / "isic_fs"  # its folder made only once every link is
    symlink, made = os.symlink, []

    def failing(target, link):
        if len(made) == 5:
            raise failure
        made.append(link)
        symlink(target, link)

    monkeypatch.setattr(os, "symlink", failing)
    with pytest.raises(
        FewshotError if isinstance(failure, OSError) else KeyboardInterrupt
    ) as caught:
        arrange("isic", source, out)
    if isinstance(failure, OSError):  # the link named, not the image it would point at
        assert str(caught.value) == (
            f"cannot make {out}/test/BCC/ISIC_02001.jpg: No space left on device; nothing was "
            "written"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["isic"]
    monkeypatch.undo()  # the next run is not blocked by anything left
    assert arrange("isic", source, out) == dict.fromkeys(ISIC_CLASSES, 2)


def test_chestx_without_some_findings_is_refused_rather_than_empty_folders(tmp_path, capsys):
    source = tmp_path / "chestx"
    rows = ["Image Index,Finding Labels"]
    for i, label in enumerate(CHESTX_CLASSES[:5]):  # no Nodule, no Pneumothorax
        write_image(source / "images" / f"{i:08d}_000.png", 20 * i)
        rows.append(f"{i:08d}_000.png,{label}")
    (source / "Data_Entry_2017.csv").write_text("\n".join(rows) + "\n")
    argv = ["data", "arrange", "chestx", str(source), "--out", str(tmp_path / "out")]
    err = refused(argv, capsys)
    assert f"chestx: no images of Nodule, Pneumothorax listed in {source}" in err
    assert not (tmp_path / "out").exists()


def test_the_benchmarks_protocol_through_the_folder_data_set(tmp_path, capsys):
    """`fewshot data arrange`, then 600 5-way 5-shot episodes of 16 queries per class."""
    source = isic_download(tmp_path / "isic", 21)
    assert main(["data", "arrange", "isic", str(source), "--out", str(tmp_path / "isic_fs")]) == 0
    assert "7 classes, 147 images" in capsys.readouterr().out
    model = REPO_DATA.parent / "models" / "omniglot" / "protonet_conv4_trainval.pt"
    argv = ["eval", "--checkpoint", str(model), "--dataset", "folder"]
    argv += ["--data-root", str(tmp_path / "isic_fs"), "--split", "test", "--way", "5"]
    argv += ["--shot", "5", "--query", "16", "--episodes", "600", "--device", "cpu"]
    assert main([*argv, "--out", str(tmp_path / "isic.json")]) == 0
    result = json.loads((tmp_path / "isic.json").read_text())
    assert (result["episodes"], result["shot"], result["query"]) == (600, 5, 16)
    assert 20 < result["accuracy"] <= 100
