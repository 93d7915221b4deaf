"""`fewshot sweep --executor slurm` on a real one-node Slurm cluster (scripts/slurm_cluster.sh,
which .ci/run starts): a sweep of four training jobs submitted as a job array through
submitit, skipped once done, and a job preempted the way Slurm does it (USR2, then a requeue)
that resumes from its last.pt and ends on the very weights of an uninterrupted run. Without a
cluster these tests skip, naming the script that starts one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_sweeps import TINY, write_spec
from test_sweeps import folder as folder  # the tests' fixture: a folder of their own

from fewshot.cli.main import main
from fewshot.runtime.io import load_checkpoint


def cluster_up() -> bool:
    """Whether a Slurm controller answers here, and submitit is installed."""
    if shutil.which("scontrol") is None:
        return False
    try:
        import submitit  # noqa: F401
    except ImportError:
        return False
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    return ping.returncode == 0 and "UP" in ping.stdout


pytestmark = [
    pytest.mark.skipif(
        not cluster_up(),
        reason="no Slurm cluster here: start one with scripts/slurm_cluster.sh install && "
        "scripts/slurm_cluster.sh start (as root; .ci/run does)",
    ),
    pytest.mark.slow,
]


def test_a_sweep_runs_as_job_arrays_is_skipped_once_done_and_reports_as_on_local_workers(
    capsys,
):
    evaluate = {"shapes": [{"way": 5, "shot": 1}], "episodes": 4}
    write_spec(matrix={"seed": [0, 1], "resplits": [1, 2]}, evaluate=evaluate, compare="resplits")
    assert main(["sweep", "spec.yaml", "--executor", "slurm", "--time-min", "10"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("submitted 4 jobs (array ") == 2  # the trainings, then the evaluations
    runs = sorted(Path("sweep/runs").iterdir())
    assert len(runs) == 4
    for run in runs:
        assert (run / "done.json").is_file() and (run / "last.pt").is_file()
    assert len(list(Path("sweep/slurm").glob("*_log.out"))) == 8  # one Slurm log a job
    # Entered again (from any machine sharing the folder): nothing is submitted.
    assert main(["sweep", "spec.yaml", "--executor", "slurm"]) == 0
    assert "submitted" not in capsys.readouterr().out
    # The same sweep on local workers: the same tables, to the last digit.
    assert main(["sweep", "spec.yaml", "--out", "local", "--workers", "2"]) == 0
    local = Path("local/report.md").read_text().replace("local", "sweep")
    assert Path("sweep/report.md").read_text() == local
    assert "| all | 5w1s | resplits=1 | resplits=2 |" in local


def slurm_job(submissions: Path) -> str:
    """The Slurm id of the one job of the sweep's array that is running or pending."""
    for _ in range(200):
        ids = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True)
        submitted = {p.name.split("_")[0] for p in submissions.glob("*_submitted.pkl")}
        for job in ids.stdout.split():
            if job.split("_")[0] in submitted:
                return job
        time.sleep(0.1)
    raise AssertionError("the sweep's job is not in the queue")


def test_a_preempted_job_is_requeued_and_ends_as_an_uninterrupted_run(capsys):
    # Three epochs of 300 steps: seconds each, so that the signal, sent when the first epoch's
    # last.pt appears, finds the job in its second epoch.
    write_spec(overrides={**TINY, "epochs": 3, "episodes_per_epoch": 300}, matrix={"seed": [0]})
    # Uninterrupted, locally, one thread as the Slurm job's one CPU.
    workers = str(os.cpu_count() or 1)
    assert main(["sweep", "spec.yaml", "--out", "reference", "--workers", workers]) == 0
    argv = [sys.executable, "-m", "fewshot", "sweep", "spec.yaml", "--executor", "slurm"]
    sweep = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run = Path("sweep/runs/seed=0")
    while not (run / "last.pt").is_file() and sweep.poll() is None:
        time.sleep(0.05)
    job = slurm_job(Path("sweep/slurm"))
    # What Slurm sends a job it preempts or that nears its time limit: submitit stops the
    # training (it saves last.pt) and requeues the job.
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    _, err = sweep.communicate(timeout=600)
    assert sweep.returncode == 0, err
    log = (run / "log.txt").read_text()
    assert "stopped at epoch" in log  # the training saved where it was, not at an epoch's end
    attempts = [line for line in log.splitlines() if line.startswith("$ ")]
    assert len(attempts) == 2 and "--resume" in attempts[1]
    want = load_checkpoint(Path("reference/runs/seed=0/last.pt"))["model"]
    got = load_checkpoint(run / "last.pt")["model"]
    assert want.keys() == got.keys()
    for key, value in want.items():
        assert torch.equal(value, got[key]), key
