"""torchrun with 2 CPU processes (gloo) trains exactly like one process averaging the halves."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from trainers import make_trainer

from fewshot.datasets.batches import images_to_device
from fewshot.methods.resplit import episode_loss
from fewshot.runtime.io import load_checkpoint
from fewshot.training.settings import PretrainSettings, TrainSettings

ARGS = dict(
    way=5,
    shot=1,
    query=2,
    epochs=1,
    episodes_per_epoch=8,
    episodes_per_batch=4,
    val_episodes=8,
    lr=0.05,
    amp="off",  # the reference embeds in float32; bf16 rounding would swamp the comparison
    channels_last=False,
    device="cpu",
)


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args: list[str], env: dict[str, str]) -> None:
    """Run `torchrun --nproc-per-node 2 args` on a port free right now (each launch its own:
    another test may take a port once it is released); a failure shows the ranks' output."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
        f"--master-port={free_port()}", *args,
    ]  # fmt: skip
    done = subprocess.run(command, env=env, timeout=600, capture_output=True, text=True)
    assert done.returncode == 0, f"exit status {done.returncode}:\n{done.stderr[-3000:]}"


def reference_weights(out) -> dict:
    """One process: each step averages the gradients of the two halves of the batch, each half
    embedded on its own (DDP normalises BatchNorm per rank)."""
    trainer = make_trainer(TrainSettings(**ARGS, out=str(out)))
    model, cfg = trainer.method, trainer.settings
    model.train()
    for _ in range(trainer.steps_per_epoch):
        index = trainer.batches.sampler.sample()
        trainer.optimizer.zero_grad()
        for half in index.chunk(2):
            images = images_to_device(trainer.train_data, half.flatten(), trainer.device)
            emb = model.embed(images).view(*half.shape, -1)
            loss, _ = episode_loss(emb, model.head, model.scale, cfg.shot)
            (loss / 2).backward()
        trainer.optimizer.step()
    # BatchNorm's running statistics are updated per half here and per rank there: compare weights
    return {name: p.detach() for name, p in model.named_parameters()}


def test_torchrun_two_processes_match_one(tmp_path, tiny_omniglot_root, monkeypatch):
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FEWSHOT_DATA": str(tiny_omniglot_root)}
    out = tmp_path / "ddp"
    flags = [
        f"--{k.replace('_', '-')}={v}"
        for k, v in ARGS.items()
        if k not in ("channels_last", "val_episodes")
    ]
    # channels_last and val_episodes are config-only: pass them through a config file
    config = tmp_path / "c.json"
    config.write_text('{"channels_last": false, "val_episodes": 8}')
    cmd = ["-m", "fewshot", "train", *flags, f"--out={out}", f"--config={config}"]
    torchrun(cmd, env)
    ddp = load_checkpoint(out / "last.pt")["model"]
    want = reference_weights(tmp_path / "ref")
    # Summation orders differ, and a conv bias before BatchNorm has a gradient of pure rounding
    # noise; a rank that skipped the all-reduce would be off by ~lr * gradient = 1e-2.
    for key, value in want.items():
        assert torch.allclose(ddp[key], value, rtol=1e-3, atol=2e-4), key
    # only rank 0 wrote: one line of metrics, one config
    assert (out / "metrics.jsonl").read_text().count("\n") == 1

    # Each rank's random streams are saved and each rank resumes its own: augmentation is off, so
    # rank r's augmentation generator must still be in its seeded state after a resumed epoch.
    def fresh(rank: int) -> torch.Tensor:
        seed = TrainSettings().seed + 2 + rank
        return torch.Generator().manual_seed(seed).get_state()

    for rank, rng in enumerate(load_checkpoint(out / "last.pt")["rank_rngs"]):
        assert torch.equal(rng["augment"], fresh(rank))
    resume = [arg for arg in cmd if not arg.startswith("--epochs=")]
    torchrun([*resume, "--epochs=2", f"--resume={out / 'last.pt'}"], env)
    resumed = load_checkpoint(out / "last.pt")
    assert resumed["progress"]["epoch"] == 2
    assert [torch.equal(r["augment"], fresh(1)) for r in resumed["rank_rngs"]] == [False, True]


def test_torchrun_pretraining_matches_one_process(tmp_path, tiny_omniglot_root, monkeypatch):
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FEWSHOT_DATA": str(tiny_omniglot_root)}
    values = dict(batch_size=32, epochs=1, val_episodes=8, lr=0.05, amp="off", device="cpu")
    values["channels_last"] = False
    config = tmp_path / "pretrain.json"
    config.write_text(json.dumps(values))
    out = tmp_path / "ddp"
    torchrun(["-m", "fewshot", "pretrain", f"--config={config}", f"--out={out}"], env)
    ddp = load_checkpoint(out / "last.pt")["model"]
    # One process: every step averages the losses of the batch's two halves (one per rank).
    trainer = make_trainer(PretrainSettings(**values, out=str(tmp_path / "ref")))
    model, labels = trainer.method, trainer.train_data.labels
    model.train()
    for _ in range(trainer.steps_per_epoch):
        index = trainer.batches.sampler.sample()
        trainer.optimizer.zero_grad()
        for half in index.chunk(2):
            images = images_to_device(trainer.train_data, half, trainer.device)
            (model(images, labels[half])[0] / 2).backward()
        trainer.optimizer.step()
    for key, value in model.named_parameters():
        assert torch.allclose(ddp[key], value.detach(), rtol=1e-3, atol=2e-4), key


@pytest.mark.slow
def test_two_process_runs_end_cleanly_every_time(tmp_path, tiny_omniglot_root):
    # A rank that finished first used to tear its connections down while rank 0 still wrote
    # checkpoints, and gloo could abort it (1 run in about 20): all ranks now meet at a barrier
    # before the process group goes. Each launch must exit 0: two here, and every other torchrun
    # launch of the suite (this file's, test_folder's, test_events') asserts the same.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FEWSHOT_DATA": str(tiny_omniglot_root)}
    config = tmp_path / "pretrain.json"
    config.write_text(json.dumps(dict(batch_size=64, epochs=1, val_episodes=2, device="cpu")))
    for attempt in range(2):
        out = tmp_path / f"run{attempt}"
        torchrun(["-m", "fewshot", "pretrain", f"--config={config}", f"--out={out}"], env)
        assert (out / "last.pt").is_file()


@pytest.mark.parametrize(("world", "status"), [("2", 3), ("1", 0)])
def test_a_finished_rank_ends_without_the_interpreters_finalisation(world, status):
    """Under torchrun (WORLD_SIZE > 1) `end_rank` exits with the command's status, its output
    flushed, and no finalisation (an atexit handler stands for it); alone it returns."""
    code = (
        "import atexit\n"
        "from fewshot.runtime.distributed import end_rank\n"
        "atexit.register(lambda: print('finalised'))\n"
        "print('done')\n"
        "end_rank(3)\n"
    )
    env = {**os.environ, "WORLD_SIZE": world}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == status, done.stderr
    assert done.stdout.split() == (["done"] if world == "2" else ["done", "finalised"])
