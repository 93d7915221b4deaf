"""The command line: train then eval end to end, and one-line errors for bad input."""

from __future__ import annotations

import json

import pytest
import torch

from fewshot.cli import main


@pytest.fixture(autouse=True)
def tiny_data(tiny_omniglot_root, monkeypatch):
    """Read Omniglot cut to 24 classes per split."""
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_omniglot_root):
    """A checkpoint from a few-step `fewshot train` run."""
    out = tmp_path_factory.mktemp("run")
    args = [
        "train",
        "--way",
        "5",
        "--shot",
        "1",
        "--query",
        "2",
        "--epochs",
        "1",
        "--episodes-per-epoch",
        "4",
        "--episodes-per-batch",
        "2",
        "--device",
        "cpu",
        "--out",
        str(out),
        "--data-root",
        str(tiny_omniglot_root),
    ]
    assert main(args) == 0
    return out


def test_train_then_eval(trained, capsys, tmp_path):
    assert (trained / "metrics.jsonl").read_text().count("\n") == 1
    out = tmp_path / "result.json"
    code = main(
        [
            "eval",
            "--checkpoint",
            str(trained / "best.pt"),
            "--way",
            "5",
            "--shot",
            "1",
            "--query",
            "3",
            "--episodes",
            "20",
            "--seed",
            "3",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(out.read_text())
    assert line == f"accuracy: {result['accuracy']:.2f} ± {result['ci95']:.2f} %"
    assert result["episodes"] == 20 and result["seed"] == 3


def error_of(capsys, args) -> str:
    """Run the CLI, expect exit status 2, return stderr (which must be one line)."""
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_user_errors_are_one_line(capsys, tmp_path, trained):
    assert "unknown backbone 'vgg'" in error_of(
        capsys, ["train", "--backbone", "vgg", "--out", str(tmp_path)]
    )
    assert "unknown head 'knn'" in error_of(
        capsys, ["train", "--head", "knn", "--out", str(tmp_path)]
    )
    assert "unknown dataset 'mnist'" in error_of(capsys, ["train", "--dataset", "mnist"])
    assert "30-way episodes need 30 classes" in error_of(
        capsys, ["train", "--way", "30", "--out", str(tmp_path)]
    )
    assert "--ehg-splits 2 exceeds the 1 distinct splits" in error_of(
        capsys, ["train", "--way", "5", "--shot", "20", "--query", "0", "--ehg-splits", "2"]
    )
    assert "checkpoint not found" in error_of(
        capsys, ["eval", "--checkpoint", str(tmp_path / "x.pt")]
    )
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"garbage")
    assert "cannot read checkpoint" in error_of(capsys, ["eval", "--checkpoint", str(bad)])
    config = tmp_path / "c.json"
    config.write_text('{"wayy": 5}')
    assert "unknown keys wayy" in error_of(capsys, ["train", "--config", str(config)])


def test_checkpoint_of_another_backbone_is_refused(capsys, tmp_path, trained):
    ckpt = torch.load(trained / "best.pt", weights_only=True)
    ckpt["config"]["backbone"] = "resnet12"
    torch.save(ckpt, tmp_path / "other.pt")
    err = error_of(capsys, ["eval", "--checkpoint", str(tmp_path / "other.pt")])
    assert "does not fit a resnet12 backbone" in err
