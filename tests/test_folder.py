"""Your own images as a few-shot data set (`--dataset folder`): both layouts, the Omniglot round
trip (its test split written as PNG files reads back exactly, with the zoo model's accuracy),
the conversion made once, every command on it, cross-domain evaluation and the one-line
refusals of bad layouts."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_errors import error_line
from PIL import Image
from test_distributed import torchrun
from trainers import make_trainer

import fewshot.datasets.folder as folder_module
from fewshot.cli.main import main
from fewshot.datasets import REPO_DATA, dataset_geometry, load_split
from fewshot.datasets.folder import CONVERSIONS
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import load_checkpoint
from fewshot.training.checkpoint import load_trained
from fewshot.training.settings import TrainSettings

ZOO = REPO_DATA.parent / "models" / "omniglot" / "protonet_conv4_trainval.pt"
SIDE = 16  # Conv-4's smallest input
TINY_TRAIN = [
    "--way", "3", "--shot", "1", "--query", "2", "--val-query", "2", "--epochs", "1",
    "--episodes-per-epoch", "2", "--episodes-per-batch", "1", "--val-episodes", "2",
    "--backbone-options", '{"channels": 8}', "--device", "cpu", "--amp", "off",
]  # fmt: skip
TINY_EPISODES = ["--way", "3", "--shot", "1", "--query", "2", "--episodes", "4", "--amp", "off"]


def write_class(folder: Path, images: np.ndarray, suffix: str = ".png") -> list[Path]:
    """Write uint8 [N, H, W(, C)] images into `folder` as 00.png, 01.png, ..."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{i:02d}{suffix}" for i in range(len(images))]
    for path, image in zip(paths, images, strict=True):
        Image.fromarray(image).save(path)
    return paths


def class_images(seed: int, count: int = 4, side: int = SIDE, channels: int = 3) -> np.ndarray:
    """`count` random images of one class (a shared colour plus noise)."""
    rng = np.random.default_rng(seed)
    shape = (count, side, side, channels) if channels == 3 else (count, side, side)
    base = rng.integers(0, 200, (1, 1, 1, channels) if channels == 3 else (1, 1, 1))
    return (base + rng.integers(0, 56, shape)).astype(np.uint8)


# Four classes per split, disjoint across splits.
CLASSES = {split: [f"{split}_{c}" for c in "abcd"] for split in ("train", "val", "test")}


def split_folders(root: Path, channels: int = 3, side: int = SIDE) -> Path:
    """A data set in the folder-per-split layout."""
    for k, (split, names) in enumerate(CLASSES.items()):
        for c, name in enumerate(names):
            write_class(root / split / name, class_images(10 * k + c, side=side, channels=channels))
    return root


@pytest.fixture
def rgb_root(tmp_path: Path) -> Path:
    """A small RGB data set of 16x16 images in the folder-per-split layout."""
    return split_folders(tmp_path / "rgb")


def one_line(call, *args, **kwargs) -> str:
    """The message of the FewshotError `call` raises, checked to be one line."""
    with pytest.raises(FewshotError) as caught:
        call(*args, **kwargs)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def refused(argv: list[str], capsys) -> str:
    """The one-line error of a command that must exit 2."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def conversions(root: Path) -> list[str]:
    """The conversion folders under a folder data set's root."""
    found = (root / CONVERSIONS).glob("*_*") if (root / CONVERSIONS).is_dir() else []
    return sorted(p.name for p in found if p.is_dir() and not p.name.endswith(".partial"))


# ---------------------------------------------------------------- the Omniglot round trip


@pytest.fixture(scope="module")
def omniglot_folder(tmp_path_factory, omniglot_test) -> Path:
    """Omniglot's Vinyals test split written as PNG files, one folder per class (named so that
    sorted order is the split list's order)."""
    root = tmp_path_factory.mktemp("omniglot_png")
    images, labels = omniglot_test.images.numpy(), omniglot_test.labels.numpy()
    for c, name in enumerate(omniglot_test.class_names):
        write_class(root / "test" / f"{c:04d}_{name.replace('/', '_')}", images[labels == c, 0])
    return root


def test_omniglot_written_as_png_files_reads_back_exactly(omniglot_folder, omniglot_test):
    assert dataset_geometry("folder", omniglot_folder, "test") == (1, 28)
    split = load_split("folder", "test", omniglot_folder)
    assert torch.equal(split.images, omniglot_test.images)
    assert torch.equal(split.labels, omniglot_test.labels)
    assert split.fingerprint() == omniglot_test.fingerprint()
    assert conversions(omniglot_folder) == ["test_1x28x28"]
    assert split.source == str(omniglot_folder / CONVERSIONS / "test_1x28x28")


def test_the_zoo_model_scores_the_same_on_the_png_copy(omniglot_folder, tmp_path):
    args = ["eval", "--checkpoint", str(ZOO), "--episodes", "40", "--seed", "3", "--no-cache"]
    args += ["--amp", "off", "--device", "cpu", "--per-episode"]
    reference = ["--data-root", str(REPO_DATA), "--out", str(tmp_path / "builtin.json")]
    assert main([*args, *reference]) == 0
    own = ["--dataset", "folder", "--data-root", str(omniglot_folder)]
    assert main([*args, *own, "--out", str(tmp_path / "folder.json")]) == 0
    builtin, copy = (
        json.loads((tmp_path / f"{n}.json").read_text()) for n in ("builtin", "folder")
    )
    assert copy["accuracies"] == builtin["accuracies"]
    assert (copy["accuracy"], copy["ci95"]) == (builtin["accuracy"], builtin["ci95"])
    assert copy["dataset_fingerprint"] == builtin["dataset_fingerprint"]
    assert (copy["dataset"], builtin["dataset"]) == ("folder", "omniglot")
    assert copy["data_root"] == str(omniglot_folder.resolve())


def test_drawings_of_the_other_polarity_are_refused_for_an_omniglot_model(
    omniglot_test, tmp_path, capsys
):
    """Omniglot drawn as its own files are (dark ink on white: the negatives of the library's
    images) would give an Omniglot model's accuracy as noise: refused in one line."""
    for c in range(5):
        folder = tmp_path / "test" / f"c{c}"
        folder.mkdir(parents=True)
        for j in range(3):
            Image.fromarray(255 - omniglot_test.images[20 * c + j, 0].numpy()).save(
                folder / f"{j}.png"
            )
    args = ["eval", "--checkpoint", str(ZOO), "--dataset", "folder", "--data-root", str(tmp_path)]
    assert main([*args, *TINY_EPISODES, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    light = re.search(rf"^fewshot eval: error: {tmp_path} test: its images are mostly light", err)
    assert light and re.search(r"\(mean 0\.[89]\d of 1\)", err)  # Omniglot's ink: about a tenth
    assert "evaluate the images' negatives (255 - value)" in err
    assert len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- layouts and geometry


def test_split_files_name_the_classes_of_one_folder(rgb_root, tmp_path):
    by_folder = load_split("folder", "train", rgb_root, converted=False)
    rows = "".join(f"x{i}.png,{name}\n" for i in range(3) for name in CLASSES["train"])
    for suffix, text in [
        (".txt", "# the train classes\ntrain_c\ntrain_a\n\ntrain_d\ntrain_b\n"),
        (".csv", "filename,label\n" + rows),
    ]:
        root = tmp_path / suffix[1:]
        for name in CLASSES["train"]:
            (root / "images").mkdir(parents=True, exist_ok=True)
            (root / "images" / name).symlink_to(rgb_root / "train" / name)
        (root / f"train{suffix}").write_text(text)
        split = load_split("folder", "train", root, converted=False)
        assert split.class_names == CLASSES["train"]  # sorted, whatever the file's order
        assert torch.equal(split.images, by_folder.images)
        assert torch.equal(split.labels, by_folder.labels)
        assert split.files[0] == str(root / f"train{suffix}")


def test_classes_and_images_in_sorted_order_other_files_left_out(tmp_path):
    root = tmp_path / "sorted"
    write_class(root / "test" / "b", class_images(1, 2))
    write_class(root / "test" / "a", class_images(2, 3), suffix=".JPG")
    (root / "test" / "a" / "notes.txt").write_text("not an image")
    (root / "test" / "a" / ".hidden.png").write_bytes(b"")
    (root / "test" / ".cache").mkdir()
    split = load_split("folder", "test", root, converted=False)
    assert split.class_names == ["a", "b"] and split.labels.tolist() == [0, 0, 0, 1, 1]
    assert [Path(f).name for f in split.files] == ["00.JPG", "01.JPG", "02.JPG", "00.png", "01.png"]


def test_the_geometry_is_the_first_images_or_the_one_given(tmp_path):
    root = split_folders(tmp_path / "gray", channels=1, side=20)
    assert dataset_geometry("folder", root, "test") == (1, 20)
    assert dataset_geometry("folder", root, "test", resize=8) == (1, 8)
    assert dataset_geometry("folder", None, "test", resize=8, channels=3) == (3, 8)  # no I/O
    gray = load_split("folder", "test", root, converted=False)
    rgb = load_split("folder", "test", root, resize=8, channels=3, converted=False)
    assert (gray.channels, gray.image_size, rgb.channels, rgb.image_size) == (1, 20, 3, 8)
    first = Image.open(root / "test" / "test_a" / "00.png").convert("RGB")
    want = np.array(first.resize((8, 8), Image.LANCZOS))
    assert torch.equal(rgb.images[0].permute(1, 2, 0), torch.from_numpy(want))
    # Normalised by the split's own pixels.
    pixels = gray.images.double() / 255
    assert gray.mean[0] == pytest.approx(pixels.mean().item())
    assert gray.std[0] == pytest.approx(pixels.std(unbiased=False).item())


# ---------------------------------------------------------------- the conversion


def test_converted_once_then_mapped_and_converted_again_when_files_change(rgb_root, monkeypatch):
    decoded = []
    decode = folder_module.decode_listing
    monkeypatch.setattr(folder_module, "decode_listing", lambda *a: decoded.append(1) or decode(*a))
    first = load_split("folder", "val", rgb_root)
    again = load_split("folder", "val", rgb_root)
    assert len(decoded) == 1 and torch.equal(first.images, again.images)
    assert again.source.endswith(f"{CONVERSIONS}/val_3x16x16")
    # Another geometry is another conversion; the first stays.
    load_split("folder", "val", rgb_root, resize=SIDE + 4)
    assert conversions(rgb_root) == ["val_3x16x16", "val_3x20x20"] and len(decoded) == 2
    # An image added, or one rewritten: converted again.
    write_class(rgb_root / "val" / "val_a", class_images(99, 5))
    assert len(load_split("folder", "val", rgb_root).labels) == 17 and len(decoded) == 3
    write_class(rgb_root / "val" / "val_b", class_images(98, 4))
    changed = load_split("folder", "val", rgb_root)
    assert len(decoded) == 4 and not torch.equal(changed.images, first.images)


def test_processes_asking_at_once_convert_once(rgb_root, monkeypatch):
    decoded = []
    decode = folder_module.decode_listing
    monkeypatch.setattr(folder_module, "decode_listing", lambda *a: decoded.append(1) or decode(*a))
    splits = []
    threads = [
        threading.Thread(target=lambda: splits.append(load_split("folder", "test", rgb_root)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(decoded) == 1 and len(splits) == 3
    assert all(torch.equal(s.images, splits[0].images) for s in splits)


def test_torchrun_ranks_convert_once_and_share_the_conversion(rgb_root, tmp_path):
    argv = ["-m", "fewshot", "train", *TINY_TRAIN, "--episodes-per-batch", "2"]
    argv += ["--dataset", "folder", f"--data-root={rgb_root}", f"--out={tmp_path / 'run'}"]
    torchrun(argv, {**os.environ, "OMP_NUM_THREADS": "1"})
    assert conversions(rgb_root) == ["train_3x16x16", "val_3x16x16"]
    assert not list((rgb_root / CONVERSIONS).glob("*.partial"))
    assert (tmp_path / "run" / "last.pt").is_file()


def test_fewshot_convert_converts_a_folder(rgb_root, capsys):
    argv = ["convert", "--dataset", "folder", "--data-root", str(rgb_root), "--resize", "8"]
    assert main(argv) == 0
    assert conversions(rgb_root) == [f"{s}_3x8x8" for s in ("test", "train", "val")]
    assert "16 images 8x8x3" in capsys.readouterr().out


# ---------------------------------------------------------------- the commands


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory) -> tuple[Path, Path]:
    """(data root, run folder) of a tiny training run on an RGB folder data set."""
    base = tmp_path_factory.mktemp("folder_run")
    root, out = split_folders(base / "data"), base / "run"
    argv = ["train", *TINY_TRAIN, "--dataset", "folder", "--data-root", str(root)]
    assert main([*argv, "--out", str(out)]) == 0
    return root, out


def test_train_records_the_geometry_and_normalisation_of_its_images(folder_run):
    root, out = folder_run
    config = load_checkpoint(out / "last.pt")["config"]
    train = load_split("folder", "train", root)
    assert (config["in_channels"], config["image_size"]) == (3, SIDE)
    assert (config["mean"], config["std"]) == (list(train.mean), list(train.std))
    assert config["resize"] is None and config["channels"] is None  # as given


def test_the_python_api_trains_on_a_folder(rgb_root, tmp_path):
    settings = TrainSettings(
        dataset="folder", data_root=str(rgb_root), resize=20, way=3, shot=1, query=2,
        val_query=2, epochs=1, episodes_per_epoch=2, episodes_per_batch=1, val_episodes=2,
        backbone_options={"channels": 8}, device="cpu", out=str(tmp_path),
    )  # fmt: skip
    assert settings.geometry == (3, 20)
    trainer = make_trainer(settings)
    train = load_split("folder", "train", rgb_root, resize=20)
    assert torch.equal(trainer.train_data.images, train.images)
    # Validated as it will be evaluated: with the training split's normalisation.
    assert (trainer.val_data.mean, trainer.val_data.std) == (train.mean, train.std)
    trainer.fit()


def test_eval_and_compare_default_to_the_models_own_folder(folder_run, tmp_path, capsys):
    root, out = folder_run
    result = tmp_path / "eval.json"
    argv = ["eval", "--checkpoint", str(out), *TINY_EPISODES, "--device", "cpu"]
    assert main([*argv, "--out", str(result)]) == 0
    record = json.loads(result.read_text())
    test = load_split("folder", "test", root)
    assert record["dataset"] == "folder" and record["data_root"] == str(root.resolve())
    assert record["dataset_fingerprint"] == test.fingerprint()
    # The default result name says which folder.
    assert main(argv) == 0
    assert len(list(out.glob("eval_folder-data_test_3w1s*q_*ep_seed0_*.json"))) == 1
    compare = ["compare", str(out / "best.pt"), str(out / "last.pt"), *TINY_EPISODES]
    assert main([*compare, "--device", "cpu"]) == 0
    assert "B - A" in capsys.readouterr().out


def test_a_folder_models_settings_load_without_its_images(folder_run, tmp_path):
    _, out = folder_run
    checkpoint = load_checkpoint(out / "last.pt")
    checkpoint["config"]["data_root"] = str(tmp_path / "gone")
    torch.save(checkpoint, tmp_path / "moved.pt")
    _, config = load_trained(tmp_path / "moved.pt", torch.device("cpu"))
    assert (config["resize"], config["channels"]) == (SIDE, 3)  # the geometry it read


def test_a_model_whose_folder_moved_is_refused_naming_data_root(folder_run, tmp_path, capsys):
    root, out = folder_run
    checkpoint = load_checkpoint(out / "last.pt")
    checkpoint["config"]["data_root"] = str(tmp_path / "gone")
    torch.save(checkpoint, tmp_path / "moved.pt")
    argv = ["eval", "--checkpoint", str(tmp_path / "moved.pt"), *TINY_EPISODES, "--device", "cpu"]
    line = error_line(capsys, argv)
    assert "the folder data set the model was trained on, is not there" in line
    assert line.endswith("give --data-root where it is now")
    assert main([*argv, "--data-root", str(root), "--out", str(tmp_path / "e.json")]) == 0


def test_pretrain_and_resume_on_a_folder(rgb_root, tmp_path):
    out = tmp_path / "pretrain"
    argv = ["pretrain", "--dataset", "folder", "--data-root", str(rgb_root), "--epochs", "1"]
    argv += ["--batch-size", "8", "--val-episodes", "2", "--val-way", "3", "--val-query", "2"]
    argv += ["--backbone-options", '{"channels": 8}', "--device", "cpu", "--amp", "off"]
    assert main([*argv, "--out", str(out)]) == 0
    assert load_checkpoint(out / "last.pt")["config"]["classes"] == 4
    assert main(["pretrain", "--resume", str(out / "last.pt"), "--epochs", "2"]) == 0


def test_cross_domain_evaluation_reads_the_images_at_the_models_geometry(
    folder_run, tmp_path, capsys
):
    _, out = folder_run
    other = split_folders(tmp_path / "other", channels=1, side=24)
    result = tmp_path / "cross.json"
    argv = ["eval", "--checkpoint", str(out / "last.pt"), *TINY_EPISODES, "--device", "cpu"]
    argv += ["--dataset", "folder", "--data-root", str(other), "--out", str(result)]
    assert main(argv) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "read as" in line]
    assert said == [
        f"{other} test: its 1x24x24 images (the first's geometry) are read as 3x16x16, the "
        f"geometry of {out / 'last.pt'}"
    ]
    record = json.loads(result.read_text())
    assert record["data_root"] == str(other.resolve())
    assert (
        record["dataset_fingerprint"]
        == load_split("folder", "test", other, resize=SIDE, channels=3).fingerprint()
    )
    # The Omniglot zoo model on the RGB folder: converted to its 1x28x28.
    argv = ["eval", "--checkpoint", str(ZOO), *TINY_EPISODES, "--device", "cpu"]
    argv += ["--dataset", "folder", "--data-root", str(other), "--out", str(tmp_path / "z.json")]
    assert main(argv) == 0
    assert "are read as 1x28x28" in capsys.readouterr().out


# ---------------------------------------------------------------- refusals, one line each


def test_a_missing_split_folder_is_refused_before_any_work(rgb_root, tmp_path, capsys):
    (rgb_root / "val").rename(rgb_root / "validation")
    out = tmp_path / "run"
    argv = ["train", *TINY_TRAIN, "--dataset", "folder", "--data-root", str(rgb_root)]
    err = refused([*argv, "--out", str(out)], capsys)
    assert f"no val split in {rgb_root}: expected a folder {rgb_root / 'val'}" in err
    assert conversions(rgb_root) == [] and not (out / "config.json").exists()


def test_a_class_too_small_for_the_episodes_is_named_with_its_count(rgb_root, capsys):
    for path in sorted((rgb_root / "test" / "test_c").iterdir())[2:]:
        path.unlink()
    argv = ["eval", "--checkpoint", str(ZOO), "--dataset", "folder", "--data-root", str(rgb_root)]
    need = f"class 'test_c' of {rgb_root / 'test'} has 2 images; the episodes need 16 per class"
    err = refused([*argv, "--device", "cpu"], capsys)
    assert err.endswith(f"{need} (support + query)")
    # Varied episodes: one support image at least, then the queries (not --shot + --query).
    err = refused([*argv, "--device", "cpu", "--varied", "--shot", "5", "--query", "15"], capsys)
    assert err.endswith(f"{need} (support + query)")
    assert conversions(rgb_root) == []


@pytest.mark.parametrize("damage", ["truncated", "truncated jpeg", "not an image", "unreadable"])
def test_a_damaged_image_file_is_named(rgb_root, damage):
    path = rgb_root / "train" / "train_b" / "02.png"
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    elif damage == "truncated jpeg":  # its header whole: only decoding every pixel finds the end
        path.unlink()
        path = write_class(path.parent, class_images(7, 3), ".jpg")[2]
        path.write_bytes(path.read_bytes()[:-20])
        with Image.open(path) as img:
            assert img.size == (SIDE, SIDE)  # opened (lazily) without a word
    elif damage == "not an image":
        path.write_text("hello")
    else:
        path.chmod(0)
        if _readable(path):  # running as root: nothing is unreadable
            pytest.skip("files are readable whatever their mode")
    message = one_line(load_split, "folder", "train", rgb_root)
    assert message.startswith(f"cannot decode image {path}: ")
    assert conversions(rgb_root) == []


def _readable(path: Path) -> bool:
    """Whether `path` can be opened for reading."""
    try:
        path.open("rb").close()
    except OSError:
        return False
    return True


def test_mixed_channels_and_sizes_are_refused_unless_converted(rgb_root):
    gray = rgb_root / "train" / "train_c" / "01.png"
    write_class(gray.parent, class_images(5, 2, channels=1))
    first = rgb_root / "train" / "train_a" / "00.png"
    assert one_line(load_split, "folder", "train", rgb_root) == (
        f"mixed channels: {gray.parent / '00.png'} has 1, {first} has 3; give --channels 1 or "
        "3 to convert every image"
    )
    assert load_split("folder", "train", rgb_root, channels=3).channels == 3
    write_class(gray.parent, class_images(5, 2, side=SIDE + 1))
    assert one_line(load_split, "folder", "train", rgb_root, channels=3).startswith(
        f"mixed sizes: {gray.parent / '00.png'} is 17x17, {first} is 16x16; give --resize N"
    )
    Image.fromarray(np.zeros((10, 14, 3), np.uint8)).save(first)
    assert one_line(load_split, "folder", "train", rgb_root) == (
        f"{first} is 14x10 (not square): give --resize N (at most 1024) to resize every image "
        "to N x N"
    )
    assert load_split("folder", "train", rgb_root, resize=12).image_size == 12


def test_split_file_problems_are_refused(rgb_root, tmp_path):
    root = tmp_path / "listed"
    (root / "images").mkdir(parents=True)
    for name in ["train_a", "train_b", "test_a"]:
        (root / "images" / name).symlink_to(rgb_root / name.split("_")[0] / name)
    (root / "train.txt").write_text("train_a\ntrain_b\ntrain_x\n")
    assert one_line(load_split, "folder", "train", root) == (
        f"{root / 'train.txt'}: class 'train_x' has no folder {root / 'images' / 'train_x'}"
    )
    (root / "train.txt").write_text("train_a\ntrain_b\ntest_a\n")
    (root / "test.csv").write_text("filename,label\n1.png,test_a\n")
    assert one_line(load_split, "folder", "train", root) == (
        f"{root}: class 'test_a' is in both the train and the test split (1 shared); few-shot "
        "splits must not share a class"
    )
    (root / "test.csv").write_text("file,class\n1.png,test_a\n")
    assert "expected a CSV whose header has a 'label' column" in one_line(
        load_split, "folder", "test", root
    )
    (root / "train.txt").write_text("../../etc\n")
    assert "class '../../etc' is not the name of a folder" in one_line(
        load_split, "folder", "train", root
    )
    (root / "train").mkdir()
    assert "the train split is given 2 times (train, train.txt)" in one_line(
        load_split, "folder", "train", root
    )


def test_split_folders_sharing_a_class_are_refused(rgb_root):
    (rgb_root / "test" / "train_a").symlink_to(rgb_root / "train" / "train_a")
    assert one_line(load_split, "folder", "train", rgb_root) == (
        f"{rgb_root}: class 'train_a' is in both the train and the test split (1 shared); "
        "few-shot splits must not share a class"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--resize", "32"], "--resize does not apply to --dataset omniglot"),
        (["eval", "--checkpoint", "x.pt", "--dataset", "omniglot", "--channels", "3"],
         "--channels does not apply to --dataset omniglot"),
        (["train", "--dataset", "folder"], "--data-root must be given with --dataset folder"),
        (["convert", "--dataset", "folder", "--data-root", ".", "--channels", "2"],
         "--channels must be 1 (grayscale) or 3 (RGB), got 2"),
        (["eval", "--checkpoint", str(ZOO), "--resize", "32"],
         "--resize and --channels apply to --dataset folder, not omniglot (its images are 1x28"),
    ],
)  # fmt: skip
def test_options_that_do_not_apply_are_refused(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert message in refused(argv, capsys)
    assert not list(tmp_path.iterdir())


def test_sixteen_bit_grayscale_keeps_its_contrast(tmp_path):
    """16-bit PNGs are scaled to 8 bits over their full range (Pillow's conversion clips them
    at 255: a set of them trained on blank images)."""
    rng = np.random.default_rng(0)
    eight = rng.integers(0, 256, size=(3, 2, SIDE, SIDE), dtype=np.uint8)
    for c in range(3):
        for i in range(2):
            folder = tmp_path / "test" / f"class{c}"
            folder.mkdir(parents=True, exist_ok=True)
            wide = eight[c, i].astype(np.uint16) * 257  # the same picture on 0..65535
            Image.fromarray(wide).save(folder / f"{i}.png")
            assert Image.open(folder / f"{i}.png").mode.startswith("I;16")
    split = load_split("folder", "test", tmp_path, converted=False)
    assert torch.equal(split.images[:, 0], torch.from_numpy(eight.reshape(6, SIDE, SIDE)))


def test_a_relative_data_root_is_recorded_whole(tmp_path, monkeypatch, omniglot_test):
    """A run trained with a relative --data-root records where the data is, so that eval
    from another folder reads the same data set."""
    images = omniglot_test.images[: 20 * 10, 0].numpy().reshape(10, 20, 28, 28)
    for split, classes in (("train", range(0, 5)), ("val", range(5, 10))):
        for c in classes:
            write_class(tmp_path / "mine" / split / f"class{c}", images[c, :6])
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--dataset", "folder", "--data-root", "mine", "--way", "3", "--shot", "1"]
    argv += ["--query", "2", "--epochs", "1", "--episodes-per-epoch", "2", "--val-episodes", "2"]
    assert main([*argv, "--out", "run", "--device", "cpu"]) == 0
    config = torch.load(tmp_path / "run" / "last.pt", weights_only=True)["config"]
    assert config["data_root"] == str(tmp_path / "mine")
