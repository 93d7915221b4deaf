"""The LIBSVM reader: shipped sets, the paper's observed/test sizes, and line-level errors."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from fewshot.datasets.libsvm import DATASETS, find_file, load_dataset, read_libsvm
from fewshot.runtime.errors import FewshotError


@pytest.mark.parametrize(
    ("name", "observed", "test", "features"),
    [
        ("heart", 100, 170, 13),
        ("ionosphere", 200, 151, 34),
        ("diabetes", 300, 468, 8),
        ("a1a", 1605, 30956, 123),
        ("abalone", 835, 3342, 8),
        ("pyrim", 14, 60, 27),
        ("triazines", 37, 149, 60),
    ],
)
def test_shipped_sets_have_the_papers_sizes(name, observed, test, features):
    data = load_dataset(name, seed=0)
    assert data.x_observed.shape == (observed, features)
    assert data.x_test.shape == (test, features)
    if DATASETS[name].task == "classification":
        assert set(np.unique(data.y_observed)) == {-1.0, 1.0}


def test_observed_set_is_the_file_head_or_a_seeded_subset():
    x, _ = read_libsvm(find_file("classification", "heart_scale", None))
    head = load_dataset("heart", seed=5)
    assert np.array_equal(head.x_observed, x[:100]) and np.array_equal(head.x_test, x[100:])
    a, b = load_dataset("heart", 1, shuffle=True), load_dataset("heart", 1, shuffle=True)
    assert np.array_equal(a.x_observed, b.x_observed)
    c = load_dataset("heart", seed=2, shuffle=True)
    assert not np.array_equal(a.x_observed, c.x_observed)


def test_regression_sets_default_to_a_seeded_random_observed_set():
    x, _ = read_libsvm(find_file("regression", "abalone_scale", None))
    default = load_dataset("abalone", seed=3)
    assert np.array_equal(default.x_observed, load_dataset("abalone", 3, shuffle=True).x_observed)
    assert not np.array_equal(default.x_observed, x[:835])
    assert np.array_equal(load_dataset("abalone", 3, shuffle=False).x_observed, x[:835])
    rows = {tuple(r) for r in default.x_observed}
    assert not rows & {tuple(r) for r in default.x_test}


def test_heart_first_row_matches_the_text_file():
    """heart_scale's first line: +1 1:0.708333 2:1 3:1 4:-0.320755 5:-0.105023 6:-1 7:1 ..."""
    x, y = read_libsvm(find_file("classification", "heart_scale", None))
    assert x.shape == (270, 13) and y[0] == 1.0
    assert np.allclose(x[0, :5], [0.708333, 1, 1, -0.320755, -0.105023])


def test_bad_line_is_reported_with_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("+1 1:0.5 2:1\n-1 1:0.25\n+1 1:zero 2:3\n")
    with pytest.raises(FewshotError, match=r"bad.txt:3: .*'1:zero'"):
        read_libsvm(path)


def test_bad_label_in_gzip_file_is_reported(tmp_path):
    path = tmp_path / "bad.gz"
    with gzip.open(path, "wt") as f:
        f.write("+1 1:0.5\nyes 1:1\n")
    with pytest.raises(FewshotError, match=r"bad.gz:2: label 'yes'"):
        read_libsvm(path)


def test_missing_file_and_unknown_dataset_errors(tmp_path):
    # a9a is not shipped, and tmp_path holds no libsvm/ folder either.
    with pytest.raises(FewshotError, match=r"libsvm/classification/a9a not found.*--data-root"):
        load_dataset("a9a", seed=0, data_root=tmp_path)
    with pytest.raises(FewshotError, match="unknown --dataset 'nope'"):
        load_dataset("nope", seed=0)


def test_truncated_gzip_file_is_named(tmp_path):
    path = tmp_path / "cut.gz"
    lines = "".join(f"{(-1) ** i:+d} 1:{i / 3:.5f} 2:{i % 7}\n" for i in range(300))
    packed = gzip.compress(lines.encode())
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(FewshotError, match=r"cut.gz: truncated file"):
        read_libsvm(path)
    path.write_bytes(b"plain text, not gzip")
    with pytest.raises(FewshotError, match=r"cannot read LIBSVM file .*cut.gz"):
        read_libsvm(path)
