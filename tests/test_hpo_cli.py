"""`fewshot hpo ...` sub-commands end to end on shipped data."""

from __future__ import annotations

import argparse
import json

import pytest

from fewshot.errors import FewshotError
from fewshot.hpo.cli import add_parser


def _run(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["hpo", *argv])
    args.func(args)


def test_regularization_prints_and_writes_the_same_numbers(tmp_path, capsys):
    _run(
        [
            "regularization",
            "--dataset",
            "heart",
            "--model",
            "svm",
            "--method",
            "oehg",
            "--seed",
            "1",
            "--out",
            str(tmp_path),
            "--outer-steps",
            "40",
            "--splits",
            "3",
        ]
    )
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "heart_svm_oehg_seed1.json").read_text())
    assert f"test loss: {saved['test_loss']:.4f}" in out
    assert f"test accuracy: {saved['test_accuracy']:.2f} %" in out
    assert saved["settings"]["splits"] == 3 and len(saved["curve"]) == 40
    assert (tmp_path / "heart_svm_oehg_seed1.png").stat().st_size > 0


def test_regression_prints_no_accuracy(tmp_path, capsys):
    _run(
        [
            "regularization",
            "--dataset",
            "pyrim",
            "--model",
            "lasso",
            "--method",
            "aid-cg",
            "--per-parameter",
            "--out",
            str(tmp_path),
            "--outer-steps",
            "3",
            "--inner-steps",
            "8",
        ]
    )
    out = capsys.readouterr().out
    assert "test loss:" in out and "accuracy" not in out
    saved = json.loads((tmp_path / "pyrim_lasso_aid-cg_pp_seed0.json").read_text())
    assert len(saved["lam"]) == 27


def test_bias_variance_prints_table_and_saves_plot(tmp_path, capsys):
    _run(["bias-variance", "--splits", "1,4", "--repeats", "30", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "var x U" in out and "bias^2" in out
    rows = json.loads((tmp_path / "bias_variance.json").read_text())["rows"]
    assert {r["splits"] for r in rows} == {1, 4}
    assert (tmp_path / "bias_variance.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bias-variance", "--splits", "1,x"], "comma-separated integers"),
        (["bias-variance", "--splits", "0,2"], "at least 1"),
        (
            [
                "regularization",
                "--dataset",
                "heart",
                "--model",
                "svm",
                "--method",
                "rhg",
                "--out",
                "unused",
                "--outer-steps",
                "0",
            ],
            "--outer-steps must be positive",
        ),
    ],
)
def test_bad_flags_raise_clear_errors(argv, message):
    with pytest.raises(FewshotError, match=message):
        _run(argv)
