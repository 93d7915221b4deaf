"""The shipped Omniglot: Vinyals split sizes, rotations as classes, clear errors."""

from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pytest
import torch

from fewshot.datasets import REPO_DATA, load_split
from fewshot.runtime.cache import save_checked
from fewshot.runtime.errors import FewshotError


def test_test_split_matches_vinyals(omniglot_test):
    assert omniglot_test.num_classes == 1692  # 423 characters x 4 rotations
    assert omniglot_test.images.shape == (1692 * 20, 1, 28, 28)
    assert omniglot_test.images.dtype == torch.uint8
    assert torch.equal(torch.bincount(omniglot_test.labels), torch.full((1692,), 20))


def test_rotated_classes_are_rotations(omniglot_test):
    names = omniglot_test.class_names
    base = names.index(names[0].rsplit("/", 1)[0] + "/rot000")
    for k, rot in enumerate(("rot000", "rot090", "rot180", "rot270")):
        c = names.index(names[base].rsplit("/", 1)[0] + "/" + rot)
        got = omniglot_test.images[omniglot_test.labels == c]
        want = torch.rot90(omniglot_test.images[omniglot_test.labels == base], k, dims=(-2, -1))
        assert torch.equal(got, want)


def test_pixels_come_from_the_npz(omniglot_test):
    # The first test class is row 0 of the evaluation file's first test alphabet: check that
    # our 28x28 image is the 105x105 drawing averaged over 15x15 cells (up to the area
    # resampling of 105 -> 28, which is not an integer factor) by comparing ink mass.
    name = omniglot_test.class_names[0]
    alphabet, character, _ = name.split("/")
    rows = [
        r.split(",") for r in (REPO_DATA / "omniglot" / "omniglot_index.csv").read_text().split()
    ]
    row = next(r for r in rows if r[4] == alphabet and r[5] == character)
    with np.load(REPO_DATA / "omniglot" / row[2]) as d:
        drawing = ~d["images"][int(row[3]), 0]
    ours = omniglot_test.images[omniglot_test.labels == 0][0, 0].float() / 255
    assert float(ours.sum()) == pytest.approx(drawing.sum() * (28 / 105) ** 2, rel=0.02)


def test_the_split_names_every_file_it_was_read_from(omniglot_test, omniglot_val):
    folder = REPO_DATA / "omniglot"
    common = [folder / "omniglot_index.csv"]
    # The test classes are drawings of the evaluation alphabets, the validation ones of the
    # background alphabets: each split names the list, the index and the images it read.
    assert omniglot_test.files == tuple(
        map(str, [folder / "splits/vinyals/test.txt", *common, folder / "images_evaluation.npz"])
    )
    assert omniglot_val.files == tuple(
        map(str, [folder / "splits/vinyals/val.txt", *common, folder / "images_background.npz"])
    )


def test_train_and_val_sizes():
    train = load_split("omniglot", "train", REPO_DATA)
    assert train.num_classes == 4112
    assert not set(train.class_names) & set(load_split("omniglot", "test", REPO_DATA).class_names)


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(FewshotError, match="missing split list"):
        load_split("omniglot", "test", tmp_path)
    shutil.copytree(REPO_DATA / "omniglot" / "splits", tmp_path / "omniglot" / "splits")
    shutil.copy(REPO_DATA / "omniglot" / "omniglot_index.csv", tmp_path / "omniglot")
    with pytest.raises(FewshotError, match=r"images_evaluation\.npz"):
        load_split("omniglot", "test", tmp_path)
    (tmp_path / "omniglot" / "images_evaluation.npz").write_bytes(b"not a zip file")
    with pytest.raises(FewshotError, match="corrupt Omniglot file"):
        load_split("omniglot", "test", tmp_path)
    with pytest.raises(FewshotError, match="splits train, val, trainval, test"):
        load_split("omniglot", "holdout", tmp_path)
    with pytest.raises(FewshotError, match="unknown dataset 'imagenet'"):
        load_split("imagenet", "test", tmp_path)


def test_damaged_npz_and_index_rows_name_the_file(tmp_path):
    folder = tmp_path / "omniglot"
    shutil.copytree(REPO_DATA / "omniglot" / "splits", folder / "splits")
    shutil.copy(REPO_DATA / "omniglot" / "images_evaluation.npz", folder)
    index = (REPO_DATA / "omniglot" / "omniglot_index.csv").read_text().splitlines()
    data = bytearray((REPO_DATA / "omniglot" / "images_evaluation.npz").read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(
        64
    )  # flipped bytes inside the deflate stream
    (folder / "images_evaluation.npz").write_bytes(bytes(data))
    (folder / "omniglot_index.csv").write_text("\n".join(index) + "\n")
    with pytest.raises(FewshotError, match=r"corrupt Omniglot file .*images_evaluation\.npz"):
        load_split("omniglot", "test", tmp_path)
    shutil.copy(REPO_DATA / "omniglot" / "images_evaluation.npz", folder)
    # Line 1202 is Gurmukhi/character42, the first class of the test split.
    for row, message in [("x", "line 1202: expected"), ("99999", "row 99999 is past the 659")]:
        fields = index[1201].split(",")
        fields[3] = row
        lines = [*index[:1201], ",".join(fields), *index[1202:]]
        (folder / "omniglot_index.csv").write_text("\n".join(lines) + "\n")
        with pytest.raises(FewshotError, match=message):
            load_split("omniglot", "test", tmp_path)


def test_decoded_drawings_are_cached_across_processes(tmp_path, monkeypatch):
    """The first load decodes and resizes each npz file into the cache folder; a later load
    reads the same images from there (the file names digest the npz's bytes)."""
    monkeypatch.setenv("FEWSHOT_CACHE", "")  # off: decoded now
    decoded = load_split("omniglot", "test", REPO_DATA)
    monkeypatch.setenv("FEWSHOT_CACHE", str(tmp_path / "cache"))
    first = load_split("omniglot", "test", REPO_DATA)
    digest = hashlib.sha256((REPO_DATA / "omniglot/images_evaluation.npz").read_bytes())
    entry = tmp_path / "cache" / f"omniglot-{digest.hexdigest()[:32]}-28.npy"
    # The entry and its checksum beside it.
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [
        entry.name,
        f"{entry.name}.sha256",
    ]
    stored = np.load(entry)
    assert stored.shape == (659, 20, 28, 28)  # every character of the file
    assert torch.equal(first.images, decoded.images)
    stored[:] = 7  # a stand-in entry with its checksum: the next load reads the cache, not the npz
    save_checked(stored, entry)
    assert torch.equal(load_split("omniglot", "test", REPO_DATA).images.unique(), torch.tensor([7]))


@pytest.mark.parametrize("damage", ["garbage", "shape", "dtype"])
def test_a_damaged_cache_entry_is_decoded_again_and_replaced(tmp_path, monkeypatch, damage):
    monkeypatch.setenv("FEWSHOT_CACHE", str(tmp_path))
    want = load_split("omniglot", "test", REPO_DATA).images
    (entry,) = tmp_path.glob("*.npy")
    if damage == "garbage":
        entry.write_bytes(b"\x93NUMPY not an array")
    else:
        np.save(
            entry,
            np.zeros((659, 20, 28), np.uint8)
            if damage == "shape"
            else np.load(entry).astype(np.int64),
        )
    assert torch.equal(load_split("omniglot", "test", REPO_DATA).images, want)
    assert np.load(entry).dtype == np.uint8 and np.load(entry).shape == (659, 20, 28, 28)


def test_an_unwritable_cache_folder_only_costs_the_decoding(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("FEWSHOT_CACHE", str(tmp_path / "file" / "cache"))  # cannot be made
    monkeypatch.setattr("fewshot.runtime.cache._NOTED", set())
    assert load_split("omniglot", "val", REPO_DATA).num_classes == 688
    (note,) = capsys.readouterr().err.splitlines()
    assert note.startswith(f"note: cannot write {tmp_path / 'file'}") and "in memory" in note
