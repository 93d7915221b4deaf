"""experiments/omniglot_zoo/gpu_runs.sh trains the zoo's long runs in time slices: stopped on
time with a checkpoint, resumed by the next slice, each run's files in one archive."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
NAME = "anil_conv4_5way1shot_cpu"  # a shipped config with steps of a fraction of a second


def one_slice(seconds: int, out: Path, runs: Path, *names: str) -> tuple[int, str]:
    """Run the script once on the CPU; its exit status and summary."""
    env = {"PYTHON": sys.executable, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    script = "experiments/omniglot_zoo/gpu_runs.sh"
    result = subprocess.run(
        ["bash", script, str(seconds), str(out), str(runs), *names],
        cwd=REPO,
        env={**env, "DEVICE": "cpu"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    summary = (out / "summary.txt").read_text() if (out / "summary.txt").exists() else ""
    return result.returncode, summary + result.stderr


def stopped_step(summary: str) -> int:
    """The step the run stopped at on time, from the summary's line of the run."""
    line = re.search(rf"^{NAME}: exit 130 after \d+ s, 0 epochs logged; (.*)$", summary, re.M)
    assert line, summary
    step = re.search(r"stopped at epoch 1 step (\d+); saved .*last\.pt", line[1])
    assert step, summary
    return int(step[1])


@pytest.mark.slow
def test_a_run_stops_on_time_and_the_next_slice_continues_it(tmp_path):
    runs = tmp_path / "runs"
    rc, summary = one_slice(15, tmp_path / "out1", runs, NAME)
    assert rc == 0, summary
    first = stopped_step(summary)
    rc, summary = one_slice(15, tmp_path / "out2", runs, NAME)
    assert rc == 0, summary
    second = stopped_step(summary)
    assert second > first >= 1
    progress = torch.load(runs / NAME / "last.pt", weights_only=True)["progress"]
    assert (progress["epoch"], progress["step"]) == (0, second)  # epoch 0: the first, 0-based
    with tarfile.open(tmp_path / "out2" / f"{NAME}.tar") as archive:
        files = sorted(archive.getnames())
        log = archive.extractfile(f"{NAME}/slices.log").read().decode()
    assert files == sorted(
        f"{NAME}/{f}" for f in ("config.json", "last.pt", "metrics.jsonl", "slices.log")
    )
    # Both slices' output, the second one resumed from the first's checkpoint.
    assert log.count("fewshot train: interrupted: stopped at epoch 1 step") == 2
    assert sorted((tmp_path / "out2").iterdir()) == [
        tmp_path / "out2" / f"{NAME}.tar",
        tmp_path / "out2" / "summary.txt",
    ]


def test_an_unknown_config_is_refused_before_any_run(tmp_path):
    rc, summary = one_slice(5, tmp_path / "out", tmp_path / "runs", "no_such_model")
    assert rc == 2
    assert "no config models/omniglot/no_such_model.json" in summary
    assert not (tmp_path / "runs").exists()
