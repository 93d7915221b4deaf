"""Trainer: equals an independent hand-written loop, resumes bit-identically, survives Ctrl-C."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from fewshot.config import TrainConfig
from fewshot.datasets import load_split
from fewshot.datasets.sampler import EpisodeSampler, EpisodeShape
from fewshot.errors import FewshotError
from fewshot.heads import get_head
from fewshot.io import load_checkpoint
from fewshot.model import build_model
from fewshot.train import Trainer, model_config


@pytest.fixture(autouse=True)
def tiny_data(tiny_omniglot_root, monkeypatch):
    """Every run here reads Omniglot cut to 24 classes per split."""
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))


def tiny_config(tmp_path, **changes) -> TrainConfig:
    """A seconds-long run on 24 Omniglot classes."""
    values = dict(
        dataset="omniglot",
        train_split="train",
        val_split="val",
        way=5,
        shot=1,
        query=2,
        episodes_per_epoch=6,
        episodes_per_batch=2,
        epochs=2,
        val_episodes=16,
        lr=0.05,
        lr_schedule=[[1, 0.5]],
        out=str(tmp_path / "run"),
        device="cpu",
    )
    values.update(changes)
    return TrainConfig(**values)


def test_trainer_matches_a_hand_written_loop(tmp_path):
    config = tiny_config(tmp_path, channels_last=False)
    trainer = Trainer(config)
    got = [trainer.train_step()[0] for _ in range(3)]

    split = load_split("omniglot", "train")
    torch.manual_seed(config.seed)
    model = build_model(model_config(config, split))
    opt = torch.optim.SGD(model.parameters(), 0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    sampler = EpisodeSampler(split.labels, EpisodeShape(5, 1, 2, 2), config.seed)
    protonet = get_head("protonet")
    want = []
    for _ in range(3):
        index = sampler.sample()
        x = split.images[index.flatten()].float() / 255
        emb = model.backbone(x).view(2, 5, 3, -1)
        support, query = emb[:, :, :1].reshape(2, 5, -1), emb[:, :, 1:].reshape(2, 10, -1)
        labels = torch.arange(5).expand(2, 5)
        logits = model.scale * protonet(query, support, labels, 5, 1)
        loss = F.cross_entropy(logits.flatten(0, 1), torch.arange(5).repeat_interleave(2).repeat(2))
        opt.zero_grad()
        loss.backward()
        opt.step()
        want.append(loss.item())
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


def final_state(run_dir) -> dict:
    """Model weights and logged metrics (without timings) at the end of a run."""
    ckpt = load_checkpoint(run_dir / "last.pt")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for m in metrics:
        m.pop("seconds")
    return {"model": ckpt["model"], "metrics": metrics}


def assert_same_run(a: dict, b: dict) -> None:
    assert a["metrics"] == b["metrics"]
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key


@pytest.mark.parametrize("ehg_splits", [1, 3])
def test_resume_is_bit_identical(tmp_path, ehg_splits):
    straight = tiny_config(tmp_path / "a", ehg_splits=ehg_splits)
    Trainer(straight).fit()
    first = tiny_config(tmp_path / "b", ehg_splits=ehg_splits, epochs=1)
    Trainer(first).fit()
    resumed = tiny_config(tmp_path / "b", ehg_splits=ehg_splits)
    Trainer(resumed, resume=str(tmp_path / "b" / "run" / "last.pt")).fit()
    assert_same_run(final_state(tmp_path / "a" / "run"), final_state(tmp_path / "b" / "run"))
    assert (tmp_path / "b" / "run" / "best.pt").is_file()


def test_ctrl_c_saves_a_checkpoint_that_resumes_exactly(tmp_path, monkeypatch):
    Trainer(tiny_config(tmp_path / "a")).fit()

    calls = {"n": 0}
    real_step = Trainer.train_step

    def interrupting_step(self):
        calls["n"] += 1
        if calls["n"] == 5:  # the second step of epoch 2
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(Trainer, "train_step", interrupting_step)
    config = tiny_config(tmp_path / "b")
    with pytest.raises(FewshotError, match="interrupted at epoch 2 step 1"):
        Trainer(config).fit()
    ckpt = load_checkpoint(tmp_path / "b" / "run" / "last.pt")
    assert (ckpt["epoch"], ckpt["step"]) == (1, 1)
    monkeypatch.setattr(Trainer, "train_step", real_step)
    Trainer(config, resume=str(tmp_path / "b" / "run" / "last.pt")).fit()
    state_a, state_b = final_state(tmp_path / "a" / "run"), final_state(tmp_path / "b" / "run")
    # the interrupted epoch logs its loss over the resumed steps only; weights must agree
    for key, value in state_a["model"].items():
        assert torch.equal(value, state_b["model"][key]), key
    assert state_a["metrics"][-1]["val_acc"] == state_b["metrics"][-1]["val_acc"]


def test_ehg_leaves_the_episode_stream_unchanged(tmp_path):
    plain = Trainer(tiny_config(tmp_path / "a"))
    ehg = Trainer(tiny_config(tmp_path / "b", ehg_splits=4))
    loss_plain = [plain.train_step()[0] for _ in range(2)]
    loss_ehg = [ehg.train_step()[0] for _ in range(2)]
    assert torch.equal(plain.sampler.generator.get_state(), ehg.sampler.generator.get_state())
    assert loss_plain[0] != loss_ehg[0]


def test_resume_refuses_a_different_run(tmp_path):
    Trainer(tiny_config(tmp_path, epochs=1)).fit()
    with pytest.raises(FewshotError, match="differ in shot"):
        Trainer(tiny_config(tmp_path, shot=2), resume=str(tmp_path / "run" / "last.pt"))
