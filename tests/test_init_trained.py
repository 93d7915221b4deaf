"""`fewshot train --init` with a meta-training checkpoint: the new run starts from every weight
of that model (then trains with its own settings); another method or architecture is refused
in one line before any data is read."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from trainers import make_trainer

from fewshot.cli.main import main
from fewshot.runtime.io import load_checkpoint
from fewshot.runtime.settings import build
from fewshot.training.settings import TrainSettings, read_config_file

REPO = Path(__file__).resolve().parents[1]
ZOO = REPO / "models" / "omniglot"


def zoo_settings(name: str, tmp_path: Path, **changes) -> TrainSettings:
    """The settings of a shipped Omniglot config, cut to a few steps on the CPU."""
    settings = build(TrainSettings, [("config file", read_config_file(str(ZOO / f"{name}.json")))])
    short = {"epochs": 1, "episodes_per_epoch": settings.episodes_per_batch, "val_episodes": 4}
    return dataclasses.replace(
        settings, device="cpu", out=str(tmp_path / "run"), **short, **changes
    )


@pytest.mark.parametrize(
    "name", ["relation_conv4_5way1shot", "maml_conv4_5way1shot_cpu", "matching_conv4_5way1shot"]
)
def test_the_run_starts_from_every_weight_of_the_trained_model(name, tmp_path):
    path = ZOO / f"{name}.pt"
    settings = zoo_settings(name, tmp_path, init=str(path), lr=1e-5)
    trainer = make_trainer(settings)
    saved = load_checkpoint(path)["model"]
    state = trainer.method.state_dict()
    assert state.keys() == saved.keys()
    for key, value in state.items():
        assert torch.equal(value, saved[key]), key
    # It trains on from there with its own settings, and says where it started.
    trainer.fit()
    last = load_checkpoint(tmp_path / "run" / "last.pt")
    assert last["config"]["init"] == str(path) and last["config"]["lr"] == 1e-5
    moved = [
        k
        for k, v in last["model"].items()
        if v.is_floating_point() and not torch.equal(v, saved[k])
    ]
    assert moved  # one step of lr 1e-5 changed weights: a trained run, not a copy


def refused(argv: list[str], capsys) -> str:
    """The one-line error of a command that must exit 2."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_another_method_or_architecture_is_refused_before_any_data(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--dataset", "omniglot"]
    argv += ["--out", str(out), "--device", "cpu"]
    relation = str(ZOO / "relation_conv4_5way1shot.pt")
    err = refused([*argv, "--init", relation], capsys)
    assert (
        f"--init {relation}: a --method relation model; this run trains --method embedding" in err
    )
    narrow = ["--method", "relation", "--backbone-options", '{"pooled_blocks": 2, "channels": 32}']
    err = refused([*argv, "--init", relation, *narrow], capsys)
    assert f"--init {relation}: its model does not fit this run's (" in err
    assert '"pooled_blocks": 2' in err and '"channels": 32' in err
    maml = str(ZOO / "maml_conv4_5way1shot_cpu.pt")
    twenty = [*argv, "--init", maml, "--method", "maml", "--way", "20"]
    err = refused([*twenty, "--backbone-options", '{"downsample": "stride"}'], capsys)
    assert "(network.classifier.weight: 5x" in err and "there, 20x" in err
    err = refused([*argv, "--init", str(tmp_path / "missing.pt")], capsys)
    assert f"--init: checkpoint not found: {tmp_path / 'missing.pt'}" in err
    assert not out.exists()  # refused before any folder was made
