"""Image readers (real files and small files written here), classifiers, image regularization."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest
import torch
from datafiles import jpeg, write_digits, write_idx, write_mnist, write_tar

from fewshot.cli.main import main
from fewshot.datasets.idx import read_idx
from fewshot.hpo.tasks.classifiers import classifier_logits, classifier_scores, init_classifier
from fewshot.hpo.tasks.image_data import flat_pixels, load_image_dataset
from fewshot.hpo.tasks.image_regularization import Settings as RegularizationSettings
from fewshot.hpo.tasks.image_regularization import (
    draw_observed_data,
    regularization_problem,
    run,
)
from fewshot.runtime.errors import FewshotError

# Canonical MNIST class counts (LeCun et al.), train and t10k.
MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_real_mnist_matches_canonical_facts(real_data):
    train = load_image_dataset("mnist", "train", real_data("mnist"))
    test = load_image_dataset("mnist", "test", real_data("mnist"))
    assert tuple(train.images.shape) == (60000, 1, 28, 28)
    assert tuple(test.images.shape) == (10000, 1, 28, 28)
    assert train.labels[:5].tolist() == [5, 0, 4, 1, 9]
    assert test.labels[:5].tolist() == [7, 2, 1, 0, 4]
    assert train.labels.bincount().tolist() == MNIST_TRAIN_COUNTS
    assert test.labels.bincount().tolist() == MNIST_TEST_COUNTS
    assert train.mean[0] == pytest.approx(0.1307, abs=1e-4)


def test_real_fashion_mnist_counts(real_data):
    fashion = load_image_dataset("fashion-mnist", "test", real_data("fashion-mnist"))
    assert tuple(fashion.images.shape) == (10000, 1, 28, 28)
    assert fashion.labels.bincount().tolist() == [1000] * 10


def test_real_cifar10_counts(real_data):
    cifar = load_image_dataset("cifar10", "test", real_data("cifar10"))
    assert tuple(cifar.images.shape) == (10000, 3, 32, 32)
    assert cifar.labels.bincount().tolist() == [1000] * 10
    assert cifar.class_names[0] == "airplane" and cifar.class_names[9] == "truck"


@pytest.mark.parametrize("compress", [True, False])
def test_small_idx_files_round_trip(tmp_path, compress):
    images, labels = write_mnist(tmp_path / "mnist", 7, compress)
    split = load_image_dataset("mnist", "train", tmp_path)
    assert torch.equal(split.images[:, 0], torch.from_numpy(images))
    assert split.labels.tolist() == labels.tolist()
    suffix = ".gz" if compress else ""
    assert split.files == tuple(
        str(tmp_path / "mnist" / f"train-{kind}-ubyte{suffix}")
        for kind in ("images-idx3", "labels-idx1")
    )
    assert split.mean[0] == pytest.approx(images.mean() / 255)
    pixels = flat_pixels(split, torch.tensor([2]))
    assert pixels.shape == (1, 784)
    assert torch.allclose(pixels[0], torch.from_numpy(images[2].reshape(-1)).float() / 255)


def test_torchvision_raw_layout_is_found(tmp_path):
    images, _ = write_mnist(tmp_path / "FashionMNIST" / "raw", 3, compress=False)
    split = load_image_dataset("fashion-mnist", "test", tmp_path)
    assert torch.equal(split.images[:, 0], torch.from_numpy(images))


def test_missing_idx_file_is_named(tmp_path):
    write_mnist(tmp_path / "mnist", 4, compress=True)
    (tmp_path / "mnist" / "train-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FewshotError, match=r"missing IDX file .*train-labels-idx1-ubyte"):
        load_image_dataset("mnist", "train", tmp_path)


def test_corrupt_idx_files_are_rejected(tmp_path):
    images = np.zeros((2, 28, 28), dtype=np.uint8)
    path = tmp_path / "x-idx3-ubyte"
    write_idx(path, images, compress=False)
    path.write_bytes(path.read_bytes()[:-5])  # truncated data
    with pytest.raises(FewshotError, match=r"corrupt IDX file .*needs 1568 data bytes"):
        read_idx(path)
    path.write_bytes(b"\x12\x34\x08\x03" + bytes(100))  # bad magic
    with pytest.raises(FewshotError, match="bad magic"):
        read_idx(path)
    path.write_bytes(gzip.compress(b"\x00\x00\x08\x03" + bytes(50))[:-8])  # cut gzip stream
    with pytest.raises(FewshotError, match="corrupt IDX file"):
        read_idx(path)


def test_label_count_mismatch_is_rejected(tmp_path):
    write_mnist(tmp_path / "mnist", 5, compress=False)
    write_idx(tmp_path / "mnist" / "train-labels-idx1-ubyte", np.zeros(4, np.uint8), False)
    with pytest.raises(FewshotError, match="expected 5 labels"):
        load_image_dataset("mnist", "train", tmp_path)


def test_small_cifar_tar_is_read_in_class_order(tmp_path):
    red, blue = (200, 30, 30), (20, 40, 220)
    write_tar(
        tmp_path / "cifar10_jpeg" / "test.tar.gz",
        {
            "cifar10_jpeg/test/truck/0001.jpg": jpeg(blue),
            "cifar10_jpeg/test/airplane/0000.jpg": jpeg(red),
            "cifar10_jpeg/test/truck/0000.jpg": jpeg(blue),
        },
    )
    split = load_image_dataset("cifar10", "test", tmp_path)
    assert split.labels.tolist() == [0, 9, 9]
    assert split.files == (str(tmp_path / "cifar10_jpeg" / "test.tar.gz"),)
    center = split.images[:, :, 16, 16].int()
    assert (center[0] - torch.tensor(red)).abs().max() <= 6
    assert (center[1] - torch.tensor(blue)).abs().max() <= 6


def test_cifar_errors_name_the_archive(tmp_path):
    with pytest.raises(FewshotError, match=r"missing .*train\.tar\.gz"):
        load_image_dataset("cifar10", "train", tmp_path)
    write_tar(tmp_path / "cifar10_jpeg" / "test.tar.gz", {"x/test/unicorn/0.jpg": jpeg((0, 0, 0))})
    with pytest.raises(FewshotError, match="unexpected member x/test/unicorn"):
        load_image_dataset("cifar10", "test", tmp_path)
    (tmp_path / "cifar10_jpeg" / "test.tar.gz").write_bytes(b"not a tar at all")
    with pytest.raises(FewshotError, match="corrupt CIFAR-10 archive"):
        load_image_dataset("cifar10", "test", tmp_path)


def test_unknown_dataset_and_split(tmp_path):
    with pytest.raises(FewshotError, match="unknown image dataset"):
        load_image_dataset("svhn", "train", tmp_path)
    with pytest.raises(FewshotError, match="unknown split"):
        load_image_dataset("mnist", "val", tmp_path)


def test_classifiers_shapes_and_parameter_counts():
    x = torch.rand(5, 784)
    sr = init_classifier("sr", 784, 10, seed=0)
    mlp = init_classifier("mlp", 784, 10, seed=0)
    assert classifier_logits(sr, x).shape == (5, 10)
    assert classifier_logits(mlp, x).shape == (5, 10)
    assert sum(p.numel() for p in sr.values()) == 784 * 10 + 10
    assert sum(p.numel() for p in mlp.values()) == 784 * 300 + 300 + 300 * 10 + 10
    # The MLP is relu(x W1 + b1) W2 + b2, checked against torch.nn layers holding the same weights.
    reference = torch.nn.Sequential(
        torch.nn.Linear(784, 300), torch.nn.ReLU(), torch.nn.Linear(300, 10)
    )
    with torch.no_grad():
        reference[0].weight.copy_(mlp["w1"].T)
        reference[0].bias.copy_(mlp["b1"])
        reference[2].weight.copy_(mlp["w2"].T)
        reference[2].bias.copy_(mlp["b2"])
    assert torch.allclose(classifier_logits(mlp, x), reference(x), atol=1e-5)
    with pytest.raises(FewshotError, match="unknown model"):
        init_classifier("cnn", 784, 10, seed=0)


def test_classifier_scores_count_argmax_hits():
    theta = {"w": torch.eye(3), "b": torch.zeros(3)}
    x = torch.tensor([[1.0, 0, 0], [0, 2.0, 0], [0, 0, 3.0], [5.0, 0, 0]])
    accuracy, loss = classifier_scores(theta, x, torch.tensor([0, 1, 0, 0]))
    assert accuracy == 75.0
    log_probs = x - x.logsumexp(1, keepdim=True)
    assert loss == pytest.approx(float(-log_probs[torch.arange(4), [0, 1, 0, 0]].mean()))


def test_regularization_losses_match_hand_computation():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(6, 4, generator=gen), torch.tensor([0, 1, 2, 0, 1, 2])
    theta = {"w": torch.randn(4, 3, generator=gen), "b": torch.randn(3, generator=gen)}
    rho = {"w": torch.randn(4, 3, generator=gen), "b": torch.randn(3, generator=gen)}
    problem = regularization_problem(0.1)
    inner = problem.inner_loss(theta, rho, (x, y))
    assert torch.equal(inner, problem.inner_loss(theta, rho, (x, y)))  # pure: same batch, same
    logits = x @ theta["w"] + theta["b"]
    log_probs = logits - logits.logsumexp(1, keepdim=True)
    ce = -log_probs[torch.arange(6), y].mean()
    penalty = (rho["w"].exp() * theta["w"] ** 2).sum() + (rho["b"].exp() * theta["b"] ** 2).sum()
    assert torch.allclose(inner, ce + penalty)
    assert torch.allclose(problem.outer_loss(theta, rho, (x, y)), ce)


@pytest.mark.parametrize("method", ["oehg", "rhg", "trhg", "aid-cg"])
def test_short_image_regularization_run_learns(digits_root, method):
    data = draw_observed_data("mnist", 0, digits_root, n_observed=1000, n_test=500)
    settings = RegularizationSettings(
        dataset="mnist",
        model="sr",
        method=method,
        out="unused",
        device="cpu",
        outer_steps=30 if method == "oehg" else 3,
        **({} if method == "oehg" else {"inner_steps": 16}),
        **({"truncate": 4} if method == "trhg" else {}),
    )
    result = run(settings, data)
    assert result.outer_losses[-1] < 0.8 * math.log(10)  # well below chance-level cross-entropy
    assert result.test_accuracy > 60
    assert set(result.mean_log_lam) == {"w", "b"}
    assert run(settings, data).outer_losses == result.outer_losses


def test_image_regularization_cli(tmp_path, capsys):
    # The task observes 10000 training images and tests on 10000: the paper's sizes.
    root = write_digits(tmp_path / "data", n_train=10000, n_test=10000)
    args = ["hpo", "image-regularization", "--dataset", "mnist", "--model", "sr"]
    args += ["--method", "oehg", "--resplits", "2", "--outer-steps", "2", "--seed", "4"]
    args += ["--out", str(tmp_path), "--data-root", str(root), "--device", "cpu"]
    assert main(args) == 0
    saved = json.loads((tmp_path / "imgreg_mnist_sr_oehg_seed4.json").read_text())
    out = capsys.readouterr().out
    assert f"test accuracy: {saved['test_accuracy']:.2f} %" in out
    assert f"test loss: {saved['test_loss']:.4f}" in out
    args[args.index("--resplits") + 1] = "0"
    assert main(args) == 2
    assert "--resplits must be >= 1, got 0" in capsys.readouterr().err


def _one_line_error(capsys, args: list[str]) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_corrupt_idx_and_jpeg_files_are_one_line_naming_the_file(tmp_path, capsys):
    args = ["hpo", "image-regularization", "--model", "sr", "--method", "oehg"]
    args += ["--out", str(tmp_path / "out"), "--data-root", str(tmp_path), "--device", "cpu"]
    write_mnist(tmp_path / "mnist", 4, compress=True)
    images = tmp_path / "mnist" / "train-images-idx3-ubyte.gz"
    images.write_bytes(images.read_bytes()[:-20])  # truncated gzip stream
    err = _one_line_error(capsys, [*args, "--dataset", "mnist"])
    assert f"corrupt IDX file {images}" in err
    write_tar(
        tmp_path / "cifar10_jpeg" / "train.tar.gz",
        {
            "c/train/cat/0000.jpg": jpeg((10, 20, 30)),
            "c/train/cat/0001.jpg": jpeg((10, 20, 30))[:200],  # cut short
        },
    )
    err = _one_line_error(capsys, [*args, "--dataset", "cifar10"])
    assert "train.tar.gz: cannot decode c/train/cat/0001.jpg" in err
    write_tar(tmp_path / "cifar10_jpeg" / "train.tar.gz", {"c/train/cat/0.jpg": b"not a jpeg"})
    assert "cannot decode c/train/cat/0.jpg" in _one_line_error(
        capsys, [*args, "--dataset", "cifar10"]
    )


def test_a_label_outside_the_classes_is_named_with_its_row(tmp_path):
    write_mnist(tmp_path / "mnist", 5, compress=False)
    labels = np.array([1, 2, 3, 12, 4], np.uint8)
    write_idx(tmp_path / "mnist" / "train-labels-idx1-ubyte", labels, False)
    with pytest.raises(FewshotError, match=r"label 12 at row 3 outside 0..9"):
        load_image_dataset("mnist", "train", tmp_path)
