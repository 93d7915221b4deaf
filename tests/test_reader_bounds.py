"""Readers that do not trust the file: a hostile LIBSVM, IDX or JSON file of a few bytes is one
FewshotError line naming it, raised before anything large is allocated."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from scipy.sparse import csr_matrix

from fewshot.datasets.idx import read_idx
from fewshot.datasets.libsvm import MAX_FEATURES, load_dataset, read_libsvm
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.settings import read_json_object


def one_line_error(call, *args, **kwargs) -> str:
    """The message of the FewshotError `call(*args, **kwargs)` raises, checked to be one line."""
    with pytest.raises(FewshotError) as caught:
        call(*args, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.fixture
def no_dense(monkeypatch):
    """Densifying a sparse matrix fails the test: the hostile files must be refused before."""

    def allocation(*args, **kwargs):
        raise AssertionError("a dense matrix was allocated")

    monkeypatch.setattr(csr_matrix, "toarray", allocation)


@pytest.mark.usefixtures("no_dense")
@pytest.mark.parametrize("index", ["1000000000", "20000000", "3000000", "1000000000000"])
def test_a_huge_feature_index_is_refused_with_its_line(tmp_path: Path, index) -> None:
    path = tmp_path / "huge.txt"
    path.write_text(f"+1 1:0.5\n# a comment line\n-1 2:1 {index}:1\n")
    message = one_line_error(read_libsvm, path)
    assert message.startswith(f"{path}:3: feature index {index} is outside 1..{MAX_FEATURES}")


@pytest.mark.usefixtures("no_dense")
def test_a_dense_matrix_past_the_memory_budget_is_refused(tmp_path: Path) -> None:
    # Every index is allowed, but 200 rows x 2^20 features would be 1.6 GiB dense.
    path = tmp_path / "wide.txt"
    path.write_text("".join(f"{(-1) ** i:+d} {MAX_FEATURES}:1\n" for i in range(200)))
    message = one_line_error(read_libsvm, path)
    assert message == (
        f"{path}: 200 rows x {MAX_FEATURES} features need 1.6 GiB as a dense matrix, "
        "over the 1 GiB limit"
    )


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("-1 1:nan 2:1", "'1:nan' has a value that is not a finite number"),
        ("-1 1:0.5 2:inf", "'2:inf' has a value that is not a finite number"),
        ("-1 1:-Infinity", "'1:-Infinity' has a value that is not a finite number"),
        ("nan 1:0.5", "label 'nan' is not a finite number"),
    ],
)
def test_non_finite_values_and_labels_are_refused(tmp_path: Path, line: str, reason: str) -> None:
    path = tmp_path / "odd.txt"
    path.write_text(f"+1 1:0.5 2:0\n{line}\n")
    assert one_line_error(read_libsvm, path).startswith(f"{path}:2: {reason}")


def write_libsvm(path: Path, rows: int) -> None:
    """`rows` lines of a two-class LIBSVM file at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{(-1) ** i:+d} 1:{i / 7:.3f} 2:{i % 3}\n" for i in range(rows)))


def test_a_split_left_without_test_or_observed_rows_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "libsvm" / "classification"
    write_libsvm(folder / "heart_scale", 100)  # heart observes 100 rows: none left to test on
    message = one_line_error(load_dataset, "heart", seed=0, data_root=tmp_path)
    assert message == f"{folder / 'heart_scale'}: no test rows (heart observes 100 of its rows)"
    write_libsvm(folder / "a1a", 10)
    write_libsvm(folder / "a1a.t", 0)
    message = one_line_error(load_dataset, "a1a", seed=0, data_root=tmp_path)
    assert message == f"{folder / 'a1a.t'}: no test rows"
    write_libsvm(folder / "a1a", 0)
    write_libsvm(folder / "a1a.t", 10)
    message = one_line_error(load_dataset, "a1a", seed=0, data_root=tmp_path)
    assert message == f"{folder / 'a1a'}: no observed rows"
    write_libsvm(folder / "heart_scale", 102)  # two test rows (one per class) are enough
    assert load_dataset("heart", seed=0, data_root=tmp_path).x_test.shape == (2, 2)


def test_an_idx_header_claiming_more_than_the_file_holds_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "huge-idx3-ubyte"
    path.write_bytes(b"\x00\x00\x08\x03" + struct.pack(">3I", 2**21, 2**21, 2**22) + bytes(16))
    message = one_line_error(read_idx, path)
    assert message == (
        f"corrupt IDX file {path}: file too short: header shape (2097152, 2097152, 4194304) "
        f"needs {2**64} data bytes, the file has 16"
    )


def test_a_deeply_nested_json_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"way": ' + "[" * 5000 + "]" * 5000 + "}")
    assert one_line_error(read_json_object, path) == f"config file {path} is nested too deeply"
    path.write_text('{"way": [[[]]], "lr": {"base": 0.1}}')  # an ordinary depth still reads
    assert read_json_object(path) == {"way": [[[]]], "lr": {"base": 0.1}}
