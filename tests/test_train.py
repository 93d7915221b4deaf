"""Trainer: equals an independent hand-written loop, resumes bit-identically, survives Ctrl-C."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
import torch.nn.functional as F
from trainers import make_trainer

import fewshot.methods.embedding
from fewshot.cli.train import TrainRun, run_train
from fewshot.datasets import load_split
from fewshot.datasets.sampler import EpisodeSampler, EpisodeShape
from fewshot.heads import get_head
from fewshot.methods import build_method
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import load_checkpoint
from fewshot.runtime.run_folder import RunFolder
from fewshot.runtime.signals import Interrupted
from fewshot.training.settings import TrainSettings
from fewshot.training.trainer import Trainer


@pytest.fixture(autouse=True)
def tiny_data(tiny_omniglot_root, monkeypatch):
    """Every run here reads Omniglot cut to 24 classes per split."""
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))


def tiny_config(tmp_path, **changes) -> TrainSettings:
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
    return TrainSettings(**values)


def test_trainer_matches_a_hand_written_loop(tmp_path):
    config = tiny_config(tmp_path, channels_last=False, amp="off")  # the loop is float32
    trainer = make_trainer(config)
    got = [trainer.train_step()[0] for _ in range(3)]

    split = load_split("omniglot", "train")
    torch.manual_seed(config.seed)
    model = build_method({**config.to_dict(), "in_channels": 1, "image_size": 28})
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


@pytest.mark.parametrize("resplits", [1, 3])
def test_resume_is_bit_identical(tmp_path, resplits):
    straight = tiny_config(tmp_path / "a", resplits=resplits)
    make_trainer(straight).fit()
    first = tiny_config(tmp_path / "b", resplits=resplits, epochs=1)
    make_trainer(first).fit()
    resumed = tiny_config(tmp_path / "b", resplits=resplits)
    make_trainer(resumed, resume=str(tmp_path / "b" / "run" / "last.pt")).fit()
    assert_same_run(final_state(tmp_path / "a" / "run"), final_state(tmp_path / "b" / "run"))
    assert (tmp_path / "b" / "run" / "best.pt").is_file()


def interrupted_then_resumed(
    tmp_path, monkeypatch, method: str, call: int, **changes
) -> tuple[tuple[int, int], dict]:
    """Run with a SIGTERM request arriving during the `call`-th call of Trainer.`method`, then
    resume from last.pt to the end; return the (epoch, step) saved at the stop and the final
    state."""
    config = tiny_config(tmp_path, **changes)
    real = getattr(Trainer, method)
    calls = {"n": 0}

    def signalled(self, *args):
        calls["n"] += 1
        if calls["n"] == call:
            self.stops.request(signal.SIGTERM)  # what the handler does when the signal comes
        return real(self, *args)

    monkeypatch.setattr(Trainer, method, signalled)
    with pytest.raises(Interrupted, match="saved") as stopped:
        make_trainer(config).fit()
    assert stopped.value.signum == signal.SIGTERM
    ckpt = load_checkpoint(tmp_path / "run" / "last.pt")
    monkeypatch.setattr(Trainer, method, real)
    make_trainer(config, resume=str(tmp_path / "run" / "last.pt")).fit()
    assert not list((tmp_path / "run").glob(".*.tmp"))
    return (ckpt["progress"]["epoch"], ckpt["progress"]["step"]), final_state(tmp_path / "run")


@pytest.mark.parametrize(
    ("method", "call", "where"),
    [
        ("train_step", 5, (1, 2)),  # inside the second step of epoch 2: that step completes
        ("train_step", 3, (0, 3)),  # the last step of epoch 1, before its validation
        ("validate", 1, (0, 3)),  # in the first validation: epoch 1 is validated on resume
        ("validate", 2, (1, 3)),
    ],
)
def test_interruption_resumes_exactly(tmp_path, monkeypatch, method, call, where):
    make_trainer(tiny_config(tmp_path / "a")).fit()
    straight = final_state(tmp_path / "a" / "run")
    stopped_at, resumed = interrupted_then_resumed(tmp_path / "b", monkeypatch, method, call)
    assert stopped_at == where
    assert_same_run(straight, resumed)  # weights, and every epoch's row (all its steps)
    assert [row["epoch"] for row in resumed["metrics"]] == [1, 2]


def test_a_second_signal_during_a_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    config = tiny_config(tmp_path, epochs=2)
    make_trainer(tiny_config(tmp_path, epochs=1)).fit()
    before = load_checkpoint(tmp_path / "run" / "last.pt")

    def interrupted_save(obj, path):
        with open(path.parent / f".{path.name}.partial.tmp", "wb") as f:
            f.write(b"half")  # what a killed write leaves; the atomic write removes its own
        raise Interrupted(signal.SIGINT, "second signal: stopped at once")

    monkeypatch.setattr("fewshot.training.trainer.atomic_torch_save", interrupted_save)
    with pytest.raises(Interrupted):
        make_trainer(config, resume=str(tmp_path / "run" / "last.pt")).fit()
    after = load_checkpoint(tmp_path / "run" / "last.pt")
    counters = [(c["progress"]["epoch"], c["progress"]["step"]) for c in (after, before)]
    assert counters == [(1, 0), (1, 0)]
    monkeypatch.undo()
    make_trainer(config, resume=str(tmp_path / "run" / "last.pt")).fit()  # stale .tmp cleaned up
    assert not list((tmp_path / "run").glob(".*.tmp"))


def test_a_non_finite_loss_never_reaches_the_weights(tmp_path, monkeypatch):
    make_trainer(tiny_config(tmp_path, epochs=1)).fit()
    finite = load_checkpoint(tmp_path / "run" / "last.pt")
    config = tiny_config(tmp_path, epochs=2)
    trainer = make_trainer(config, resume=str(tmp_path / "run" / "last.pt"))
    real_loss = fewshot.methods.embedding.episode_loss
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        loss, acc = real_loss(*args, **kwargs)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] == 2 else loss), acc

    monkeypatch.setattr("fewshot.methods.embedding.episode_loss", poisoned)
    trainer.train_step()
    weights = {k: v.clone() for k, v in trainer.method.state_dict().items()}
    momentum = [s["momentum_buffer"].clone() for s in trainer.optimizer.state.values()]
    with pytest.raises(FewshotError, match="non-finite"):
        trainer.train_step()
    for key, value in trainer.method.state_dict().items():
        if "running" not in key and "num_batches" not in key:  # BatchNorm saw the batch
            assert torch.equal(value, weights[key]), key
    for before, state in zip(momentum, trainer.optimizer.state.values(), strict=True):
        assert torch.equal(before, state["momentum_buffer"])
    # Through fit: the run stops and the checkpoint on disk keeps its finite weights.
    calls["n"] = 0
    with pytest.raises(FewshotError, match="non-finite"):
        make_trainer(config, resume=str(tmp_path / "run" / "last.pt")).fit()
    kept = load_checkpoint(tmp_path / "run" / "last.pt")
    for key, value in finite["model"].items():
        assert torch.equal(value, kept["model"][key]), key


def test_a_fresh_run_never_replaces_another(tmp_path):
    make_trainer(tiny_config(tmp_path, epochs=1)).fit()
    weights = load_checkpoint(tmp_path / "run" / "best.pt")["model"]
    with pytest.raises(FewshotError, match="already holds a run"):
        make_trainer(tiny_config(tmp_path, epochs=1, seed=5)).fit()
    assert torch.equal(
        load_checkpoint(tmp_path / "run" / "best.pt")["model"]["scale"], weights["scale"]
    )
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 1
    with RunFolder(tmp_path / "run", fresh=True, overwrite=True) as folder:
        make_trainer(tiny_config(tmp_path, epochs=1, seed=5)).fit(folder)
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 1


def test_a_busy_run_folder_is_refused_with_its_holder(tmp_path):
    with (
        RunFolder(tmp_path / "run", fresh=True),
        pytest.raises(FewshotError, match=f"pid {os.getpid()}"),
    ):
        make_trainer(tiny_config(tmp_path, epochs=1)).fit()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_ehg_leaves_the_episode_stream_unchanged(tmp_path):
    plain = make_trainer(tiny_config(tmp_path / "a"))
    ehg = make_trainer(tiny_config(tmp_path / "b", resplits=4))
    loss_plain = [plain.train_step()[0] for _ in range(2)]
    loss_ehg = [ehg.train_step()[0] for _ in range(2)]
    assert torch.equal(
        plain.batches.sampler.generator.get_state(), ehg.batches.sampler.generator.get_state()
    )
    assert loss_plain[0] != loss_ehg[0]


def test_resume_refuses_a_different_run(tmp_path):
    make_trainer(tiny_config(tmp_path, epochs=1)).fit()
    with pytest.raises(FewshotError, match="differ in shot"):
        run_train(TrainRun(resume=str(tmp_path / "run" / "last.pt")), tiny_config(tmp_path, shot=2))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda c: c.pop("optimizer"), "it has no optimizer"),
        (lambda c: c["progress"].update(epoch="x"), "damaged .*epoch and step must be counts"),
        (lambda c: c["progress"].update(step=99), "damaged .*step 99 is past the 3 of an epoch"),
        (lambda c: c["sampler"].update(generator=torch.zeros(3, dtype=torch.uint8)), "damaged"),
        (lambda c: c["model"].pop("scale"), "damaged .*Missing key"),
    ],
)
def test_a_damaged_checkpoint_is_refused_on_resume(tmp_path, damage, message):
    make_trainer(tiny_config(tmp_path, epochs=1)).fit()
    ckpt = load_checkpoint(tmp_path / "run" / "last.pt")
    damage(ckpt)
    torch.save(ckpt, tmp_path / "damaged.pt")
    with pytest.raises(FewshotError, match=message):
        make_trainer(tiny_config(tmp_path, epochs=2), resume=str(tmp_path / "damaged.pt"))
