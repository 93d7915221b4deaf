"""Fault injection: real SIGINT, SIGTERM and SIGKILL at random moments of `fewshot train`, and
SIGINT (Ctrl-C) of `fewshot pretrain`, which runs on the same trainer, signal handling and
checkpoint writer.

Whatever the moment (data loading, a step, validation, a checkpoint write), resuming until the
run ends must give weights identical to an uninterrupted run, one metrics row per epoch with
the same numbers, no temporary files, and never a traceback.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fewshot.runtime.io import load_checkpoint

TRAIN = [sys.executable, "-m", "fewshot", "train", "--way", "5", "--shot", "1"]
TRAIN += ["--query", "3", "--epochs", "3", "--episodes-per-epoch", "24", "--val-episodes", "40"]
TRAIN += ["--optimizer", "adam", "--lr", "0.001", "--device", "cpu"]
# The same guarantees for pretraining, on the same trainer: 15 batches of 32 images an epoch.
PRETRAIN = [sys.executable, "-m", "fewshot", "pretrain", "--batch-size", "32", "--epochs", "3"]
PRETRAIN += ["--val-episodes", "40", "--device", "cpu"]
COMMANDS = {"train": TRAIN, "pretrain": PRETRAIN}


def start(args: list[str], root: Path) -> subprocess.Popen:
    """`fewshot train ...` as its own process, reading the small Omniglot root."""
    env = {**os.environ, "FEWSHOT_DATA": str(root)}
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for_lock(process: subprocess.Popen, out: Path) -> None:
    """Until the process has locked the run folder: past the interpreter's imports (a Ctrl-C
    there is Python's own), before data loading."""
    mine = f"pid {process.pid} "
    while process.poll() is None:
        lock = out / ".lock"
        if lock.exists() and lock.read_text().startswith(mine):
            return
        time.sleep(0.01)


def finished_run(out: Path) -> dict:
    """Final weights and metrics rows (without timings) of a finished run."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("seconds")
    return {"model": load_checkpoint(out / "last.pt")["model"], "rows": rows}


@pytest.fixture(scope="module")
def reference(request, tmp_path_factory, tiny_omniglot_root) -> tuple[list[str], dict, float]:
    """A command, its uninterrupted run and how long that took after taking its lock."""
    command = COMMANDS[request.param]
    out = tmp_path_factory.mktemp("reference") / "run"
    process = start([*command, "--out", str(out)], tiny_omniglot_root)
    wait_for_lock(process, out)
    begun = time.monotonic()
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err.decode()
    return command, finished_run(out), time.monotonic() - begun


@pytest.mark.slow
@pytest.mark.parametrize(
    ("reference", "signum"),
    [
        ("train", signal.SIGINT),
        ("train", signal.SIGTERM),
        ("train", signal.SIGKILL),
        ("pretrain", signal.SIGINT),
    ],
    indirect=["reference"],
)
def test_a_run_survives_signals_at_random_moments(reference, tiny_omniglot_root, tmp_path, signum):
    command, want, duration = reference
    rng = random.Random(int(signum))
    out = tmp_path / "run"
    args = [*command, "--out", str(out)]
    # Two interruptions (the second of a resumed run, or of a fresh one where the first came
    # before any checkpoint), then run to the end. One run, not one per count of interruptions:
    # each start costs seconds of imports, and this file was a tenth of the suite's time.
    for _ in range(2):
        process = start(args, tiny_omniglot_root)
        wait_for_lock(process, out)
        time.sleep(rng.uniform(0.0, duration))
        process.send_signal(signum)
        _, err = process.communicate(timeout=300)
        stderr = err.decode()
        assert "Traceback" not in stderr, stderr
        # -signum: the signal came as the process was exiting, after its work was done.
        if process.returncode not in (0, -signum):
            assert process.returncode == 128 + signum, stderr
            assert "interrupted" in stderr.splitlines()[-1], stderr
        # Continue from the last checkpoint; if none was written, start again.
        last = out / "last.pt"
        fresh = [*command, "--out", str(out), "--overwrite"]
        args = [*command, "--resume", str(last)] if last.exists() else fresh
    process = start(args, tiny_omniglot_root)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err.decode()
    got = finished_run(out)
    assert got["rows"] == want["rows"]
    for key, value in want["model"].items():
        assert torch.equal(value, got["model"][key]), key
    assert not list(out.glob(".*.tmp"))
