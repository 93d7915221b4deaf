"""fewshot pretrain: batches of images of every train class on the trainer's run machinery
(equal to a hand-written loop, resumed bit-identically), its checkpoints evaluated as embedding
models, and `train --init` starting Meta-Baseline from them; checkpoints of the wrong stage are
refused in one line."""

from __future__ import annotations

import json
import signal

import pytest
import torch
import torch.nn.functional as F
from trainers import make_trainer

from fewshot.cli.main import main
from fewshot.datasets import load_split
from fewshot.datasets.sampler import EpisodeShape, ImageBatchSampler
from fewshot.evaluation.episodes import seeded_episodes
from fewshot.heads import protonet
from fewshot.methods.pretraining import build_pretrain_method
from fewshot.runtime.io import load_checkpoint
from fewshot.runtime.signals import Interrupted
from fewshot.training.checkpoint import load_trained
from fewshot.training.settings import PretrainSettings, TrainSettings
from fewshot.training.trainer import Trainer

ZOO_MAML = "models/omniglot/maml_conv4_5way1shot_cpu.pt"


@pytest.fixture(autouse=True)
def tiny_data(tiny_omniglot_root, monkeypatch):
    """Every run here reads Omniglot cut to 24 classes per split (480 train images)."""
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))


def pretrain_settings(tmp_path, **changes) -> PretrainSettings:
    """A seconds-long pretraining run: 15 batches of 32 images per epoch."""
    values = dict(
        batch_size=32,
        epochs=2,
        val_episodes=16,
        lr_schedule=[[1, 0.5]],
        out=str(tmp_path / "pre"),
        device="cpu",
    )
    values.update(changes)
    return PretrainSettings(**values)


def run_state(run_dir) -> dict:
    """Final weights and metrics rows (without timings) of a run folder."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("seconds")
    return {"model": load_checkpoint(run_dir / "last.pt")["model"], "rows": rows}


def assert_same(a: dict, b: dict) -> None:
    assert a["rows"] == b["rows"]
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key


def test_image_batches_pass_over_every_image_once_and_resume():
    sampler = ImageBatchSampler(10, 3, seed=0)
    assert sampler.batches_per_pass == 3
    first_pass = torch.cat([sampler.sample() for _ in range(3)])
    assert len(set(first_pass.tolist())) == 9  # one image of ten left out: drop_last
    state = sampler.state_dict()
    want = [sampler.sample() for _ in range(4)]  # across the next pass boundary
    again = ImageBatchSampler(10, 3, seed=5)
    again.load_state_dict(state)
    assert all(
        torch.equal(a, b) for a, b in zip(want, [again.sample() for _ in range(4)], strict=True)
    )
    with pytest.raises(ValueError, match="not a pass over 10"):
        ImageBatchSampler(10, 3, seed=0).load_state_dict({**state, "order": torch.arange(4)})


def test_pretraining_matches_a_hand_written_loop(tmp_path):
    settings = pretrain_settings(tmp_path, channels_last=False, amp="off")
    trainer = make_trainer(settings)
    got = [trainer.train_step()[0] for _ in range(3)]

    split = load_split("omniglot", "train")
    torch.manual_seed(settings.seed)
    config = {**settings.to_dict(), "in_channels": 1, "image_size": 28, "classes": 24}
    model = build_pretrain_method(config)
    opt = torch.optim.SGD(model.parameters(), 0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    order = torch.randperm(480, generator=torch.Generator().manual_seed(settings.seed))
    want = []
    for step in range(3):
        index = order[32 * step : 32 * (step + 1)]
        logits = model.classifier(model.backbone(split.images[index].float() / 255))
        loss = F.cross_entropy(logits, split.labels[index])
        opt.zero_grad()
        loss.backward()
        opt.step()
        want.append(loss.item())
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("classifier", ["linear", "cosine"])
def test_pretraining_resumes_bit_identically(tmp_path, monkeypatch, classifier):
    make_trainer(pretrain_settings(tmp_path / "a", classifier=classifier)).fit()
    settings = pretrain_settings(tmp_path / "b", classifier=classifier)
    real, calls = Trainer.train_step, {"n": 0}

    def signalled(self):
        calls["n"] += 1
        if calls["n"] == 20:  # in epoch 2
            self.stops.request(signal.SIGTERM)
        return real(self)

    monkeypatch.setattr(Trainer, "train_step", signalled)
    with pytest.raises(Interrupted, match="fewshot pretrain --resume"):
        make_trainer(settings).fit()
    monkeypatch.setattr(Trainer, "train_step", real)
    last = str(tmp_path / "b" / "pre" / "last.pt")
    assert load_checkpoint(last)["progress"]["step"] == 5
    make_trainer(settings, resume=last).fit()
    assert_same(run_state(tmp_path / "a" / "pre"), run_state(tmp_path / "b" / "pre"))
    rows = run_state(tmp_path / "a" / "pre")["rows"]
    assert rows[1]["train_loss"] < rows[0]["train_loss"]  # it learns


def test_the_cosine_classifier_keeps_a_fixed_scale(tmp_path):
    settings = pretrain_settings(tmp_path, classifier="cosine", scale=2.0, learn_scale=False)
    trainer = make_trainer(settings)
    for _ in range(3):
        trainer.train_step()
    head = trainer.method.classifier
    assert head.scale.item() == 2.0
    features = torch.randn(4, head.weight.shape[1])
    want = 2.0 * F.cosine_similarity(features[:, None], head.weight[None], dim=-1)
    assert torch.allclose(head(features), want, atol=1e-5)
    with pytest.raises(Exception, match="scale does not apply to --classifier linear"):
        pretrain_settings(tmp_path, scale=2.0)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, tiny_omniglot_root) -> str:
    """A finished tiny pretraining run's last checkpoint (through the command line)."""
    out = tmp_path_factory.mktemp("pretrained") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))
        argv = ["pretrain", "--batch-size", "32", "--epochs", "1", "--val-episodes", "16"]
        assert main([*argv, "--device", "cpu", "--out", str(out)]) == 0
    return str(out / "last.pt")


def test_a_pretrained_model_evaluates_by_nearest_centroid(pretrained, tmp_path):
    out = tmp_path / "eval.json"
    argv = ["eval", "--checkpoint", pretrained, "--episodes", "16", "--query", "5"]
    assert main([*argv, "--device", "cpu", "--amp", "off", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["stage"] == "pretrain" and record["classifier"] is None
    assert not record["transductive"]
    # By hand: the frozen features of the first episode, nearest class mean.
    method, _ = load_trained(pretrained, torch.device("cpu"))
    method.amp = "off"
    split = load_split("omniglot", "test")
    episodes = torch.cat(list(seeded_episodes(split, EpisodeShape(5, 1, 5, 8), 16, 0)))
    with torch.no_grad():
        features = method.embed(split.images[episodes.flatten()].float() / 255)
    features = features.view(16, 5, 6, -1)
    support, query = features[:, :, :1].flatten(1, 2), features[:, :, 1:].flatten(1, 2)
    logits = protonet(query, support, torch.arange(5).expand(16, 5), 5, 1)
    truth = torch.arange(5).repeat_interleave(5)
    accuracy = 100 * (logits.argmax(-1) == truth).float().mean()
    assert record["accuracy"] == pytest.approx(float(accuracy), abs=1e-4)


def test_meta_baseline_starts_from_the_pretrained_backbone(pretrained, tmp_path):
    settings = TrainSettings(
        init=pretrained, head="cosine", way=5, shot=1, query=2, episodes_per_epoch=4,
        epochs=1, val_episodes=8, out=str(tmp_path / "meta"), device="cpu",
    )  # fmt: skip
    trainer = make_trainer(settings)
    saved = load_checkpoint(pretrained)["model"]
    for name, value in trainer.method.backbone.state_dict().items():
        assert torch.equal(value, saved[f"backbone.{name}"]), name
    assert trainer.method.scale.item() == 10.0  # Meta-Baseline's initial temperature
    assert "classifier.weight" not in trainer.method.state_dict()
    trainer.fit()
    assert load_checkpoint(tmp_path / "meta" / "last.pt")["config"]["init"] == pretrained


def refused(argv: list[str], capsys) -> str:
    """The one-line error of a command that must exit 2."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_checkpoints_of_the_wrong_stage_are_refused(pretrained, tmp_path, capsys):
    meta = str(tmp_path / "meta")
    argv = ["train", "--episodes-per-epoch", "2", "--epochs", "1", "--device", "cpu"]
    err = refused([*argv, "--resume", pretrained, "--out", meta], capsys)
    assert "--resume" in err and "is a pretraining (fewshot pretrain) checkpoint" in err
    err = refused([*argv, "--init", ZOO_MAML, "--out", meta], capsys)
    assert "a --method maml model; this run trains --method embedding" in err
    err = refused([*argv, "--init", pretrained, "--backbone", "resnet12", "--out", meta], capsys)
    assert "a conv4 backbone" in err and "trains a resnet12" in err
    wider = [*argv, "--init", pretrained, "--backbone-options", '{"channels": 32}']
    err = refused([*wider, "--out", meta], capsys)
    assert "its backbone does not fit this run's (encoder.0.0.weight: 64x" in err
    assert 'this run has {"channels": 32}' in err
    err = refused(["pretrain", "--resume", ZOO_MAML, "--out", meta], capsys)
    assert "a pretraining (fewshot pretrain) one is needed" in err
    assert not (tmp_path / "meta").exists()  # refused before any folder was made


def test_a_classifier_needs_a_model_that_embeds(tmp_path, capsys):
    argv = ["eval", "--checkpoint", ZOO_MAML, "--classifier", "logistic", "--device", "cpu"]
    err = refused([*argv, "--out", str(tmp_path / "e.json")], capsys)
    assert "--classifier does not apply to --method maml" in err
    err = refused(["eval", "--checkpoint", ZOO_MAML, "--classifier-options", '{"C": 1}'], capsys)
    assert "--classifier-options needs --classifier" in err


def test_a_batch_larger_than_the_split_is_refused(tmp_path, capsys):
    argv = ["pretrain", "--batch-size", "100000", "--device", "cpu"]
    err = refused([*argv, "--out", str(tmp_path / "p")], capsys)
    assert "--batch-size 100000 needs 100000 images, 480" in err
