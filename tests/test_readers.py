"""miniImageNet, tieredImageNet, CIFAR-FS and FC100 readers on small files in the real formats."""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch
from PIL import Image

from fewshot.datasets import REPO_DATA, load_split
from fewshot.datasets.array_split import hwc_to_split
from fewshot.datasets.safe_pickle import safe_load
from fewshot.runtime.errors import FewshotError

RNG = np.random.default_rng(0)


class _Py2Pickler(pickle._Pickler):
    """Writes str and bytes as Python 2 `str` opcodes, as MetaOptNet's Python 2 pickles hold."""

    dispatch: ClassVar[dict] = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj: str | bytes) -> None:
        raw = obj if isinstance(obj, bytes) else obj.encode("latin1")
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[str] = save_py2_str
    dispatch[bytes] = save_py2_str


def dump_py2(obj: object, path: Path) -> None:
    """Write `obj` as a protocol-2 pickle in Python 2's byte-string form."""
    buffer = io.BytesIO()
    _Py2Pickler(buffer, protocol=2).dump(obj)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())


def dump(obj: object, path: Path, protocol: int = pickle.HIGHEST_PROTOCOL) -> None:
    """Write `obj` as an ordinary Python 3 pickle."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(obj, protocol=protocol))


def random_images(n: int, size: int) -> np.ndarray:
    """n random uint8 HWC images."""
    return RNG.integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def reference_labels(raw: list) -> np.ndarray:
    """Class index of each raw label, classes numbered in sorted order (independent of the code)."""
    order = sorted(set(raw))
    return np.array([order.index(r) for r in raw])


def assert_split(split, images_hwc: np.ndarray, labels: np.ndarray) -> None:
    """The split holds exactly these images (as CHW) and labels."""
    assert split.images.dtype == torch.uint8
    assert torch.equal(split.images, torch.from_numpy(images_hwc).permute(0, 3, 1, 2))
    assert split.labels.dtype == torch.int64
    assert split.labels.tolist() == labels.tolist()


# ---------------------------------------------------------------- restricted unpickler


class _RunsCode:
    """An object whose unpickling calls os.system."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_safe_load_refuses_a_pickle_that_runs_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pickle"
    dump({"data": np.zeros(3), "x": _RunsCode(marker)}, path)
    with pytest.raises(FewshotError, match=r"evil\.pickle.*refused global (posix|os|nt)\.system"):
        safe_load(path)
    assert not marker.exists()


@pytest.mark.parametrize("target", [eval, Path, np.load])
def test_safe_load_refuses_other_globals(tmp_path: Path, target) -> None:
    path = tmp_path / "other.pkl"
    dump([1, target], path)
    with pytest.raises(FewshotError, match=r"other.pkl"):
        safe_load(path)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_safe_load_reads_containers_and_arrays(tmp_path: Path, protocol: int) -> None:
    obj = {
        "data": random_images(3, 5),
        "labels": [1, 2, 3],
        "names": ("a", b"b"),
        "scalar": np.int64(7),
        "floats": np.linspace(0, 1, 4),
        "set": {1, 2},
    }
    path = tmp_path / "ok.pkl"
    dump(obj, path, protocol)
    back = safe_load(path)
    assert back.keys() == obj.keys()
    assert np.array_equal(back["data"], obj["data"]) and back["data"].dtype == np.uint8
    assert np.array_equal(back["floats"], obj["floats"])
    assert (back["labels"], back["names"], back["scalar"], back["set"]) == (
        [1, 2, 3],
        ("a", b"b"),
        7,
        {1, 2},
    )


def test_safe_load_reads_python2_pickles_with_latin1(tmp_path: Path) -> None:
    images = random_images(4, 6)
    path = tmp_path / "py2.pickle"
    dump_py2({"data": images, "labels": [5, 9, 5, 9]}, path)
    with pytest.raises(UnicodeDecodeError):  # the default ASCII decoding cannot read it
        pickle.loads(path.read_bytes())
    back = safe_load(path)
    assert np.array_equal(back["data"], images) and back["labels"] == [5, 9, 5, 9]


def test_safe_load_reads_numpy2_module_names(tmp_path: Path) -> None:
    images = random_images(2, 4)
    # numpy 2 writes numpy._core where numpy 1 writes numpy.core (GLOBAL opcodes are plain text).
    blob = pickle.dumps({"data": images}, protocol=2)
    path = tmp_path / "numpy2.pkl"
    path.write_bytes(blob.replace(b"numpy.core.multiarray", b"numpy._core.multiarray"))
    assert b"numpy._core" in path.read_bytes()
    assert np.array_equal(safe_load(path)["data"], images)


def test_safe_load_names_missing_and_corrupt_files(tmp_path: Path) -> None:
    with pytest.raises(FewshotError, match=r"missing.*nothere.pkl"):
        safe_load(tmp_path / "nothere.pkl")
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(pickle.dumps({"a": 1})[:-3])
    with pytest.raises(FewshotError, match=r"bad.pkl"):
        safe_load(bad)


def test_hwc_to_split_does_not_copy_pixels() -> None:
    images = random_images(6, 84)
    split = hwc_to_split(
        images, [3, 1, 3, 1, 2, 2], source="x", files=["x"], image_size=84, mean=(0,), std=(1,)
    )
    assert split.images.data_ptr() == images.ctypes.data
    assert split.images.is_contiguous(memory_format=torch.channels_last)
    assert split.labels.tolist() == [2, 0, 2, 0, 1, 1]


# ---------------------------------------------------------------- miniImageNet


def make_gidaris(path: Path, n_classes: int, per_class: int, size: int, first_id: int) -> tuple:
    """A MetaOptNet/Gidaris pickle with shuffled, non-contiguous class ids; returns its content."""
    ids = [first_id + 3 * k for k in range(n_classes)]
    raw = [ids[k] for k in RNG.permutation(np.repeat(np.arange(n_classes), per_class))]
    images = random_images(len(raw), size)
    catname2label = {f"n{1000 + i:08d}": i for i in ids}
    dump_py2({"data": images, "labels": raw, "catname2label": catname2label}, path)
    return images, raw, catname2label


@pytest.mark.parametrize(
    ("split", "file"),
    [
        ("train", "miniImageNet_category_split_train_phase_train.pickle"),
        ("val", "miniImageNet_category_split_val.pickle"),
        ("test", "miniImageNet_category_split_test.pickle"),
    ],
)
def test_miniimagenet_metaoptnet_pickle(tmp_path: Path, split: str, file: str) -> None:
    images, raw, catname2label = make_gidaris(tmp_path / "miniimagenet" / file, 3, 4, 84, 64)
    out = load_split("miniimagenet", split, tmp_path)
    assert_split(out, images, reference_labels(raw))
    assert out.files == (str(tmp_path / "miniimagenet" / file),)
    names_by_id = {v: k for k, v in catname2label.items()}
    assert out.class_names == [names_by_id[i] for i in sorted(set(raw))]
    assert out.mean == pytest.approx([120.39586422 / 255, 115.59361427 / 255, 104.54012653 / 255])
    assert out.std == pytest.approx([70.68188272 / 255, 68.27635443 / 255, 72.54505529 / 255])


def test_miniimagenet_files_may_sit_directly_in_the_data_root(tmp_path: Path) -> None:
    file = "miniImageNet_category_split_val.pickle"
    images, raw, _ = make_gidaris(tmp_path / file, 2, 3, 84, 0)
    assert_split(load_split("miniimagenet", "val", tmp_path), images, reference_labels(raw))


@pytest.mark.parametrize(
    ("split", "file"),
    [
        ("train", "mini-imagenet-cache-train.pkl"),
        ("val", "mini-imagenet-cache-validation.pkl"),
        ("val", "mini-imagenet-cache-val.pkl"),
        ("test", "mini-imagenet-cache-test.pkl"),
    ],
)
def test_miniimagenet_learn2learn_cache(tmp_path: Path, split: str, file: str) -> None:
    images = random_images(7, 84)
    # Insertion order, not sorted order, numbers the classes (as learn2learn does).
    class_dict = {"n0300": [4, 0, 6], "n0100": [1, 5], "n0200": [2, 3]}
    dump({"image_data": images, "class_dict": class_dict}, tmp_path / "miniimagenet" / file)
    out = load_split("miniimagenet", split, tmp_path)
    assert_split(out, images, np.array([0, 1, 2, 2, 0, 1, 0]))
    assert out.class_names == ["n0300", "n0100", "n0200"]
    assert out.files == (str(tmp_path / "miniimagenet" / file),)


@pytest.mark.parametrize(
    ("class_dict", "message"),
    [
        ({"a": [0, 1], "b": [2, 3]}, "outside 0..2"),
        ({"a": [0, 1], "b": [1, 2]}, "already in another class"),
        ({"a": [0], "b": [2]}, "1 images are in no class"),
    ],
)
def test_learn2learn_cache_bad_indices(tmp_path: Path, class_dict: dict, message: str) -> None:
    path = tmp_path / "miniimagenet" / "mini-imagenet-cache-test.pkl"
    dump({"image_data": random_images(3, 84), "class_dict": class_dict}, path)
    with pytest.raises(FewshotError, match=f"mini-imagenet-cache-test.pkl.*{message}"):
        load_split("miniimagenet", "test", tmp_path)


def test_miniimagenet_image_folder_resizes_to_84(tmp_path: Path) -> None:
    folder = tmp_path / "miniimagenet"
    (folder / "images").mkdir(parents=True)
    rows, expected, wnids, files = [], [], [], [str(folder / "test.csv")]
    for i, wnid in enumerate(["n02", "n01", "n02", "n03", "n01"]):
        name = f"{wnid}{i:08d}.jpg" if i % 2 else f"{wnid}{i:08d}.png"
        pixels = RNG.integers(0, 256, (100 + i, 90, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / "images" / name)
        with Image.open(folder / "images" / name) as img:  # what was actually stored
            expected.append(np.asarray(img.convert("RGB").resize((84, 84), Image.LANCZOS)))
        rows.append(f"{name},{wnid}")
        wnids.append(wnid)
        files.append(str(folder / "images" / name))
    (folder / "test.csv").write_text("filename,label\n" + "\n".join(rows) + "\n")
    out = load_split("miniimagenet", "test", tmp_path)
    assert_split(out, np.stack(expected), reference_labels(wnids))
    assert out.class_names == ["n01", "n02", "n03"]
    assert out.files == tuple(files)  # the list and every image it names


def test_miniimagenet_image_folder_falls_back_to_the_shipped_ravi_list(tmp_path: Path) -> None:
    (tmp_path / "miniimagenet" / "images").mkdir(parents=True)
    with pytest.raises(FewshotError, match=r"val\.csv: 9600 of 9600 listed images are missing"):
        load_split("miniimagenet", "val", tmp_path)


def test_shipped_ravi_lists_have_the_published_sizes() -> None:
    for split, classes in (("train", 64), ("val", 16), ("test", 20)):
        lines = (REPO_DATA / "miniimagenet" / f"{split}.csv").read_text().split()
        assert lines[0] == "filename,label" and len(lines) - 1 == 600 * classes
        assert len({line.split(",")[1] for line in lines[1:]}) == classes


def test_missing_folder_lists_every_format(tmp_path: Path) -> None:
    with pytest.raises(FewshotError) as err:
        load_split("miniimagenet", "train", tmp_path)
    text = str(err.value)
    for expected in (
        str(tmp_path / "miniimagenet"),
        "miniImageNet_category_split_train_phase_train.pickle",
        "mini-imagenet-cache-train.pkl",
        "images",
        "data/README.md",
    ):
        assert expected in text


def test_missing_split_file_names_that_split(tmp_path: Path) -> None:
    make_gidaris(
        tmp_path / "miniimagenet" / "miniImageNet_category_split_train_phase_train.pickle",
        2,
        2,
        84,
        0,
    )
    with pytest.raises(FewshotError, match=r"'test'.*miniImageNet_category_split_test.pickle"):
        load_split("miniimagenet", "test", tmp_path)


def test_unknown_split_name(tmp_path: Path) -> None:
    with pytest.raises(FewshotError, match=r"train, val, test"):
        load_split("miniimagenet", "trainval", tmp_path)


def test_gidaris_pickle_with_wrong_content(tmp_path: Path) -> None:
    path = tmp_path / "miniimagenet" / "miniImageNet_category_split_val.pickle"
    dump_py2({"data": random_images(3, 84), "labels": [1, 2]}, path)
    with pytest.raises(FewshotError, match=r"split_val.pickle: 2 labels for 3 images"):
        load_split("miniimagenet", "val", tmp_path)
    dump_py2({"data": random_images(3, 32), "labels": [1, 2, 3]}, path)
    with pytest.raises(FewshotError, match=r"split_val.pickle: expected images \[N, 84, 84, 3\]"):
        load_split("miniimagenet", "val", tmp_path)
    dump_py2({"images": random_images(3, 84)}, path)
    with pytest.raises(FewshotError, match=r"split_val.pickle: expected a dict with keys 'data'"):
        load_split("miniimagenet", "val", tmp_path)


# ---------------------------------------------------------------- tieredImageNet


def make_tiered_labels(path: Path, labels: np.ndarray, key: str = "label_specific") -> list[str]:
    """A Ren et al. style labels pickle (Python 2 form); returns the class names."""
    names = [f"class_{k}" for k in range(int(labels.max()) + 1)]
    content = {
        key: labels.astype(np.int32),
        "label_general": (labels // 2).astype(np.int32),
        "label_specific_str": names,
        "label_general_str": [f"category_{k}" for k in range(int(labels.max()) // 2 + 1)],
    }
    dump_py2(content, path)
    return names


def encode_png_like_opencv(image_bgr: np.ndarray) -> np.ndarray:
    """What cv2.imencode('.png', a) stores for an OpenCV (BGR) array a: an RGB PNG, as uint8."""
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image_bgr[..., ::-1])).save(buffer, format="PNG")
    return np.frombuffer(buffer.getvalue(), dtype=np.uint8).reshape(-1, 1)


@pytest.mark.parametrize("split", ["train", "val", "test"])
@pytest.mark.parametrize("key", ["label_specific", "labels"])
def test_tieredimagenet_npz(tmp_path: Path, split: str, key: str) -> None:
    folder = tmp_path / "tieredimagenet"
    folder.mkdir()
    images = random_images(8, 84)
    labels = np.array([0, 0, 1, 3, 1, 3, 0, 3])
    np.savez(folder / f"{split}_images.npz", images=images)
    names = make_tiered_labels(folder / f"{split}_labels.pkl", labels, key)
    out = load_split("tieredimagenet", split, tmp_path)
    assert_split(out, images, reference_labels(labels.tolist()))
    assert out.class_names == [names[k] for k in (0, 1, 3)]
    assert out.files == (str(folder / f"{split}_images.npz"), str(folder / f"{split}_labels.pkl"))


def test_tieredimagenet_png_pickle_matches_the_npz(tmp_path: Path) -> None:
    images = random_images(6, 84)  # as stored in the npz: OpenCV's BGR order
    labels = np.array([2, 0, 1, 2, 0, 1])
    npz_root, png_root = tmp_path / "a", tmp_path / "b"
    for root in (npz_root, png_root):
        make_tiered_labels(root / "tieredimagenet" / "val_labels.pkl", labels)
    np.savez(npz_root / "tieredimagenet" / "val_images.npz", images=images)
    png = [encode_png_like_opencv(img) for img in images]
    png[1] = png[1].tobytes()  # encoded bytes come as arrays (cv2) or byte strings
    dump_py2(png, png_root / "tieredimagenet" / "val_images_png.pkl")
    from_npz = load_split("tieredimagenet", "val", npz_root)
    from_png = load_split("tieredimagenet", "val", png_root)
    assert_split(from_png, images, labels)
    assert torch.equal(from_npz.images, from_png.images)
    assert from_npz.class_names == from_png.class_names
    folder = png_root / "tieredimagenet"
    assert from_png.files == (str(folder / "val_images_png.pkl"), str(folder / "val_labels.pkl"))


def test_tieredimagenet_label_count_mismatch(tmp_path: Path) -> None:
    folder = tmp_path / "tieredimagenet"
    folder.mkdir()
    np.savez(folder / "train_images.npz", images=random_images(5, 84))
    make_tiered_labels(folder / "train_labels.pkl", np.array([0, 1, 0, 1]))
    with pytest.raises(
        FewshotError,
        match=r"train_labels.pkl: 4 labels for the 5 images of .*"
        r"train_images.npz",
    ):
        load_split("tieredimagenet", "train", tmp_path)


def test_tieredimagenet_out_of_range_labels(tmp_path: Path) -> None:
    folder = tmp_path / "tieredimagenet"
    folder.mkdir()
    np.savez(folder / "test_images.npz", images=random_images(3, 84))
    dump_py2(
        {"label_specific": np.array([0, 1, 2]), "label_specific_str": ["a", "b"]},
        folder / "test_labels.pkl",
    )
    with pytest.raises(
        FewshotError,
        match=r"test_labels.pkl: 'label_specific' has values 0..2, "
        r"outside 0..1",
    ):
        load_split("tieredimagenet", "test", tmp_path)
    dump_py2({"labels": np.array([0, -1, 2])}, folder / "test_labels.pkl")
    with pytest.raises(FewshotError, match=r"test_labels.pkl: 'labels' has values -1..2"):
        load_split("tieredimagenet", "test", tmp_path)


def test_tieredimagenet_npz_without_its_labels(tmp_path: Path) -> None:
    folder = tmp_path / "tieredimagenet"
    folder.mkdir()
    np.savez(folder / "val_images.npz", images=random_images(2, 84))
    with pytest.raises(FewshotError, match=r"val_images.npz \+ val_labels.pkl"):
        load_split("tieredimagenet", "val", tmp_path)


def test_tieredimagenet_npz_without_images_key(tmp_path: Path) -> None:
    folder = tmp_path / "tieredimagenet"
    folder.mkdir()
    np.savez(folder / "val_images.npz", data=random_images(2, 84))
    make_tiered_labels(folder / "val_labels.pkl", np.array([0, 1]))
    with pytest.raises(FewshotError, match=r"val_images.npz: no 'images' array"):
        load_split("tieredimagenet", "val", tmp_path)


def test_shipped_tiered_lists_have_the_published_sizes() -> None:
    for split, classes, categories in (("train", 351, 20), ("val", 97, 6), ("test", 160, 8)):
        rows = [
            r.split(",")
            for r in (REPO_DATA / "tieredimagenet" / f"{split}.csv").read_text().split()
        ]
        assert len({r[0] for r in rows}) == classes and len({r[1] for r in rows}) == categories


# ---------------------------------------------------------------- CIFAR-FS and FC100

CIFAR_MEAN = [129.37731888 / 255, 124.10583864 / 255, 112.47758569 / 255]
CIFAR_STD = [68.20947949 / 255, 65.43124043 / 255, 70.45866994 / 255]


@pytest.mark.parametrize(("dataset", "prefix"), [("cifar-fs", "CIFAR_FS"), ("fc100", "FC100")])
@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_cifar_metaoptnet_pickles(tmp_path: Path, dataset: str, prefix: str, split: str) -> None:
    path = tmp_path / dataset / f"{prefix}_{split}.pickle"
    images, raw, _ = make_gidaris(path, 3, 3, 32, 10)
    out = load_split(dataset, split, tmp_path)
    assert_split(out, images, reference_labels(raw))
    assert out.files == (str(path),)
    assert out.mean == pytest.approx(CIFAR_MEAN) and out.std == pytest.approx(CIFAR_STD)


def cifar_fs_pairs() -> list[list[str]]:
    """All 100 [superclass, class] pairs of CIFAR-100, from the shipped CIFAR-FS lists."""
    folder = REPO_DATA / "cifar_fs_fc100" / "cifar_fs"
    return [
        p for s in ("train", "val", "test") for p in json.loads((folder / f"{s}.json").read_text())
    ]


@pytest.fixture
def cifar100_python(tmp_path: Path) -> tuple[Path, dict]:
    """A small cifar-100-python folder: 2 train + 1 test image per class, Python 2 pickles."""
    pairs = cifar_fs_pairs()
    fine_names = sorted(p[1] for p in pairs)
    coarse_names = sorted({p[0] for p in pairs})
    coarse_of = {fine: coarse_names.index(coarse) for coarse, fine in pairs}
    base = tmp_path / "cifar-100-python"
    dump_py2({"fine_label_names": fine_names, "coarse_label_names": coarse_names}, base / "meta")
    parts = {}
    for part, per_class in (("train", 2), ("test", 1)):
        fine = RNG.permutation(np.repeat(np.arange(100), per_class))
        data = RNG.integers(0, 256, (len(fine), 3072), dtype=np.uint8)
        coarse = [coarse_of[fine_names[f]] for f in fine]
        dump_py2({"data": data, "fine_labels": fine.tolist(), "coarse_labels": coarse}, base / part)
        parts[part] = (data, fine)
    return tmp_path, {"fine_names": fine_names, "coarse_of": coarse_of, "parts": parts}


@pytest.mark.parametrize(
    ("dataset", "split", "classes"),
    [
        ("cifar-fs", "train", 64),
        ("cifar-fs", "val", 16),
        ("cifar-fs", "test", 20),
        ("fc100", "train", 60),
        ("fc100", "val", 20),
        ("fc100", "test", 20),
    ],
)
def test_cifar100_python_folder(cifar100_python, dataset: str, split: str, classes: int) -> None:
    root, ref = cifar100_python
    out = load_split(dataset, split, root)
    assert out.num_classes == classes and out.image_size == 32
    assert torch.bincount(out.labels).tolist() == [3] * classes  # train + test pooled
    class_list = REPO_DATA / "cifar_fs_fc100" / dataset.replace("-", "_") / f"{split}.json"
    parts = [root / "cifar-100-python" / name for name in ("train", "test", "meta")]
    assert out.files == tuple(map(str, [*parts, class_list]))
    wanted = json.loads(class_list.read_text())
    if dataset == "cifar-fs":
        assert set(out.class_names) == {fine for _, fine in wanted}
    else:
        coarse_names = sorted({p[0] for p in cifar_fs_pairs()})
        assert {coarse_names[ref["coarse_of"][c]] for c in out.class_names} == set(wanted)
    # Every image is the right CIFAR-100 row, converted from its CHW row layout.
    rows = {}
    for data, fine in ref["parts"].values():
        for row, f in zip(data, fine, strict=True):
            rows.setdefault(ref["fine_names"][f], []).append(row.reshape(3, 32, 32))
    for name, image_list in rows.items():
        if name in out.class_names:
            got = out.images[out.labels == out.class_names.index(name)]
            assert torch.equal(got, torch.from_numpy(np.stack(image_list)))


def test_cifar_fs_pickle_is_preferred_and_missing_split_is_named(tmp_path: Path) -> None:
    with pytest.raises(FewshotError, match=r"CIFAR_FS_val.pickle.*cifar-100-python/train"):
        load_split("cifar-fs", "val", tmp_path)
