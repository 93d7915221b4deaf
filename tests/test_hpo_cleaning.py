"""Data hyper-cleaning: label corruption, cleaner scores, OEHG splits, short runs and the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from fewshot.cli.main import main
from fewshot.hpo.tasks.classifiers import init_classifier
from fewshot.hpo.tasks.cleaning import Settings, load, run
from fewshot.hpo.tasks.cleaning_data import (
    CleanValidationSplits,
    cleaner_scores,
    corrupt_labels,
    draw_cleaning_data,
)
from fewshot.hpo.tasks.image_data import load_image_dataset
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.settings import SettingError

SMALL = {"n_train": 600, "n_val": 300, "n_test": 500}


def settings(**changes) -> Settings:
    """MNIST softmax-regression settings on the small sets, CPU, with `changes`."""
    values = {"dataset": "mnist", "model": "sr", "method": "oehg", "out": "unused"}
    return Settings(**{**values, **SMALL, "device": "cpu", **changes})


def draw_small(root) -> object:
    """600 training examples of the small digits (half of the labels corrupted), 300
    validation, 500 test."""
    train, test = (load_image_dataset("mnist", split, root) for split in ("train", "test"))
    return draw_cleaning_data(train, test, **SMALL, noise=0.5, seed=3)


@pytest.fixture(scope="module")
def small_data(digits_root):
    """The small draw of seed 3."""
    return draw_small(digits_root)


def test_corruption_flips_to_a_different_label_at_the_rate():
    n, rate = 40000, 0.3
    labels = torch.randint(0, 10, (n,), generator=torch.Generator().manual_seed(0))
    noisy, flipped = corrupt_labels(labels, rate, 10, torch.Generator().manual_seed(1))
    assert torch.equal(noisy != labels, flipped)  # flipped exactly where it says, never to itself
    # Flip count is Binomial(n, rate): within 4 standard deviations.
    assert abs(int(flipped.sum()) - n * rate) < 4 * (n * rate * (1 - rate)) ** 0.5
    # The wrong label is uniform over the 9 others: each offset within 4 sd of its expected count.
    offsets = ((noisy - labels) % 10)[flipped]
    counts = offsets.bincount(minlength=10)[1:].double()
    expected = len(offsets) / 9
    assert (counts - expected).abs().max() < 4 * (expected * 8 / 9) ** 0.5
    same, none = corrupt_labels(labels, 0.0, 10, torch.Generator().manual_seed(1))
    assert torch.equal(same, labels) and not none.any()


@pytest.mark.parametrize("rate", [1.0, -0.1, 1.5])
def test_corruption_rate_outside_range_is_rejected(rate):
    with pytest.raises(ValueError, match="corruption rate"):
        corrupt_labels(torch.zeros(3, dtype=torch.long), rate, 10, torch.Generator())


def test_cleaner_scores_against_hand_computed_values():
    # hits 2, flagged 3, corrupted 3: P = R = F1 = 2/3.
    s = cleaner_scores(torch.tensor([1, 1, 0, 0, 1, 0]), torch.tensor([1, 0, 1, 0, 1, 0]))
    assert s == pytest.approx({"precision": 200 / 3, "recall": 200 / 3, "f1": 200 / 3})
    # hits 1, flagged 4, corrupted 2: P = 1/4, R = 1/2, F1 = 2 * 1/8 / (3/4) = 1/3.
    s = cleaner_scores(torch.tensor([1, 1, 1, 1, 0]), torch.tensor([1, 0, 0, 0, 1]))
    assert s == pytest.approx({"precision": 25.0, "recall": 50.0, "f1": 100 / 3})
    s = cleaner_scores(torch.zeros(4), torch.tensor([1, 0, 0, 1]))
    assert s == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_bad_settings_and_missing_files_are_named(tmp_path):
    with pytest.raises(SettingError, match=r"noise must be >= 0 and < 1, got 1\.0"):
        settings(noise=1.0)
    with pytest.raises(SettingError, match="dataset must be one of"):
        settings(dataset="cifar10")
    with pytest.raises(FewshotError, match="missing IDX file"):
        load(settings(method="rhg", data_root=str(tmp_path)))


def test_sizes_larger_than_the_data_are_rejected(digits_root, tmp_path, capsys):
    root = str(digits_root)  # 2000 training and 600 test images
    with pytest.raises(SettingError, match="exceed the 2000 training images"):
        load(settings(n_train=1900, n_val=200, data_root=root))
    with pytest.raises(SettingError, match="n_test 601 exceeds"):
        load(settings(method="rhg", n_test=601, data_root=root))
    train, test = (load_image_dataset("mnist", split, root) for split in ("train", "test"))
    with pytest.raises(ValueError, match="exceed the 2000 training and 600 test images"):
        draw_cleaning_data(train, test, n_test=601)
    args = ["hpo", "cleaning", "--dataset", "mnist", "--model", "sr", "--method", "oehg"]
    args += ["--n-train", "1600", "--n-val", "400", "--n-test", "601"]
    args += ["--out", str(tmp_path), "--data-root", root]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--n-test 601 exceeds the 600 test images" in err


def test_drawn_sets_are_disjoint_and_seeded(small_data, digits_root):
    again = draw_small(digits_root)
    assert torch.equal(again.x_train, small_data.x_train)
    assert torch.equal(again.corrupted, small_data.corrupted)
    train_rows = {tuple(r) for r in small_data.x_train[:, ::7].tolist()}
    val_rows = {tuple(r) for r in small_data.x_val[:, ::7].tolist()}
    assert not train_rows & val_rows
    assert 0.4 < float(small_data.corrupted.float().mean()) < 0.6


def test_oehg_splits_move_disjoint_confident_examples(small_data):
    splits = CleanValidationSplits(
        small_data, 4, 50, confidence=0.9, every=10, batch=600, val_batch=350, seed=0
    )
    # A model that believes every given label with probability ~1: one-hot logits by hand.
    theta = init_classifier("sr", 784, 10, seed=0)
    confident = {"w": torch.zeros(784, 10), "b": torch.zeros(10)}
    assert len(splits(0, theta)) == 4 and splits.moved_counts == [0, 0, 0, 0]  # none is sure yet
    # Make the model certain of label 3 only: examples labelled 3 form the clean pool.
    confident["b"][3] = 20.0
    pool = int((small_data.y_train == 3).sum())
    data = splits(10, confident)
    share = min(50, pool // 3)
    assert splits.moved_counts == [0, share, share, share]
    assert data[0][0].rows == 600 and data[0][1].rows == 300  # split 0 is the original
    moved = [set(range(600)) - set(train.tensors[2].tolist()) for train, _ in data[1:]]
    assert all(not a & b for i, a in enumerate(moved) for b in moved[i + 1 :])
    assert all(int(small_data.y_train[i]) == 3 for m in moved for i in m)
    assert splits(11, theta) is data  # kept until the next re-draw


def test_oehg_down_weights_corrupted_examples(small_data):
    changes = {"outer_steps": 40, "extra_val": 40, "resplit_every": 10, "retrain_steps": 50}
    result = run(settings(**changes), small_data)
    assert result.corrupted_mean_weight < 0.3 < 0.7 < result.clean_mean_weight
    assert result.f1 > 85
    assert result.test_accuracy > 70
    assert result.weight_tr_accuracy > result.dirty_tr_accuracy


def test_rhg_and_trhg_down_weight_corrupted_examples(small_data):
    for method, window in (("rhg", {}), ("trhg", {"truncate": 2})):
        changes = {"outer_steps": 6, "inner_steps": 8, "retrain_steps": 10, **window}
        result = run(settings(method=method, **changes), small_data)
        assert result.corrupted_mean_weight + 0.15 < result.clean_mean_weight, method
        assert result.f1 > 70, method


def test_settings_are_checked():
    with pytest.raises(SettingError, match="resplits does not apply to --method rhg"):
        settings(method="rhg", resplits=3)
    with pytest.raises(SettingError, match=r"more than n_train \(600\)"):
        settings(resplits=3, extra_val=400)
    with pytest.raises(SettingError, match="truncate must be <= inner_steps"):
        settings(method="trhg", truncate=100, inner_steps=64)
    settings(method="rhg", inner_steps=2)  # below the default window, which rhg does not read
    with pytest.raises(SettingError, match="truncate does not apply to --method rhg"):
        settings(method="rhg", truncate=2)


def test_cli_prints_scores_and_writes_json(tmp_path, capsys, digits_root):
    args = ["hpo", "cleaning", "--dataset", "mnist", "--model", "sr", "--method", "oehg"]
    args += ["--resplits", "2", "--n-train", "200", "--n-val", "100", "--n-test", "100"]
    args += ["--outer-steps", "3", "--extra-val", "20", "--retrain-steps", "3", "--seed", "1"]
    args += ["--out", str(tmp_path), "--data-root", str(digits_root), "--device", "cpu"]
    assert main(args) == 0
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "cleaning_mnist_sr_oehg_seed1.json").read_text())
    assert f"test accuracy: {saved['test_accuracy']:.2f} %" in out
    assert f"F1: {saved['f1']:.2f} %" in out
    assert "precision:" in out and "recall:" in out
    assert saved["settings"]["resplits"] == 2


def test_cli_rejects_bad_noise(tmp_path, capsys):
    args = ["hpo", "cleaning", "--dataset", "mnist", "--model", "sr", "--method", "oehg"]
    args += ["--noise", "1.0", "--out", str(tmp_path), "--data-root", str(tmp_path)]
    assert main(args) == 2
    assert "--noise must be >= 0 and < 1, got 1.0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("model", "method", "steps"),
    [("sr", "oehg", 1000), ("sr", "rhg", 94), ("mlp", "oehg", 3000), ("mlp", "trhg", 282)],
)
def test_default_budgets_give_every_method_oehgs_inner_steps(model, method, steps):
    # OEHG takes U = 5 split steps and one deployed-model step per outer step: 6 T inner steps;
    # RHG / T-RHG take K = 64 per outer step: ceil(6 * 1000 / 64) = 94, ceil(6 * 3000 / 64) = 282.
    budget = Settings(dataset="mnist", model=model, method=method, out="unused").budget()
    assert budget.outer_steps == steps
