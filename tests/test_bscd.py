"""BSCD-FSL's four target sets arranged as folder data sets from their downloads' layouts (small
stand-ins written here), and evaluated with the benchmark's protocol."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

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


def test_missing_images_and_an_existing_output_are_refused(tmp_path):
    source = isic_download(tmp_path / "isic", 2)
    (source / ISIC_IMAGES / "ISIC_01001.jpg").unlink()
    with pytest.raises(FewshotError, match=r"isic: 1 images listed but not found.*ISIC_01001"):
        arrange("isic", source, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    write_image(source / ISIC_IMAGES / "ISIC_01001.jpg", 1, "RGB")
    arrange("isic", source, tmp_path / "out")
    with pytest.raises(FewshotError, match="exists: arrange into a new folder"):
        arrange("isic", source, tmp_path / "out")


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
