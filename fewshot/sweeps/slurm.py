"""The Slurm executor: a sweep's tasks as a Slurm job array (several where the cluster's
MaxArraySize needs), through submitit.

Each task runs where Slurm puts it, as `python -m fewshot ARGV` under a small callable that
writes the task's log and status file there (so a sweep re-entered from any machine that shares
the folder sees what is done). When Slurm preempts a job or its time limit nears, submitit
signals it (USR2) and calls the callable's `checkpoint`: the training process is sent SIGTERM,
which it honours between steps by saving last.pt, and the job is requeued with the task resumed
from that checkpoint, so a requeued run ends exactly as an uninterrupted one.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fewshot.runtime.errors import FewshotError
from fewshot.sweeps.executors import Outcome, Task, open_log, record_end, say, shell_status

# Slurm's default MaxArraySize, taken where the cluster does not say: an array's indices (from
# 0) stay below it, so each array here has at most MaxArraySize - 1 jobs.
DEFAULT_MAX_ARRAY_SIZE = 1001
POLL_SECONDS = 0.5  # how often a running task is looked at: nothing next to a job's minutes
STOP_SECONDS = 600  # how long a stopped training process may take to save its last.pt


@dataclass(frozen=True)
class SlurmOptions:
    """What each job of the array asks Slurm for."""

    partition: str | None = None
    time_min: int = 60
    cpus: int = 1
    gpus: int = 0
    mem_gb: float | None = None
    parallelism: int = 64  # the array's jobs running at once


class SlurmTask:
    """One task where Slurm runs it: the `fewshot` command as a child process, its log and
    status file written there; `checkpoint` stops it (saving last.pt) for a requeue."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None

    def __call__(self, task: Task) -> int:
        """Run the task to its end; its exit status."""
        start = time.monotonic()
        with open_log(task) as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "fewshot", *task.argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=ignore_requeue_signal,
                # The job's CPUs, as the local executor gives each job its share of the cores.
                env={**os.environ, "OMP_NUM_THREADS": os.environ.get("SLURM_CPUS_PER_TASK", "1")},
            )
            # Polled, not waited for: submitit's signal handler (`checkpoint`) waits for it.
            while self.process.poll() is None:
                time.sleep(POLL_SECONDS)
        status = shell_status(self.process.returncode)
        record_end(task, status, time.monotonic() - start)
        return status

    def checkpoint(self, task: Task) -> Any:
        """The job is preempted or near its time limit: stop the command (a training run saves
        its last.pt on SIGTERM) and requeue the task, resumed from that checkpoint."""
        import submitit

        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=STOP_SECONDS)
        return submitit.helpers.DelayedSubmission(SlurmTask(), resumed(task))


def ignore_requeue_signal() -> None:
    """In the command's process: ignore the signal Slurm sends every process of a job that is
    to be requeued (submitit's USR2, whose default would kill it before it saves); the job's
    `checkpoint` stops it with SIGTERM, which it honours."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def resumed(task: Task) -> Task:
    """The task as it goes on after a requeue: a training run from its last.pt."""
    last = task.folder / "last.pt"
    if task.argv[0] in ("train", "pretrain") and last.is_file():
        return Task((task.argv[0], "--resume", str(last)), task.folder)
    return task


def submitit_module() -> Any:
    """submitit, with Slurm's sbatch on the PATH; one line naming what is missing otherwise."""
    try:
        import submitit
    except ImportError:
        raise FewshotError(
            "--executor slurm needs submitit: pip install 'fewshot[slurm]'"
        ) from None
    if shutil.which("sbatch") is None:
        raise FewshotError(
            "--executor slurm needs Slurm's sbatch on the PATH (a Slurm cluster's login node; "
            "scripts/slurm_cluster.sh starts a one-node cluster for tests)"
        )
    return submitit


@functools.cache
def max_array_size() -> int:
    """The cluster's MaxArraySize (`scontrol show config`), read once; Slurm's default where
    scontrol is missing or does not say."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return DEFAULT_MAX_ARRAY_SIZE
    try:
        shown = subprocess.run(
            [scontrol, "show", "config"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return DEFAULT_MAX_ARRAY_SIZE
    found = re.search(r"^MaxArraySize\s*=\s*(\d+)\s*$", shown, re.MULTILINE)
    return int(found.group(1)) if found else DEFAULT_MAX_ARRAY_SIZE


def array_chunks(tasks: Sequence[Task], size: int) -> list[list[Task]]:
    """The tasks in order, cut into arrays of at most `size` jobs (at least one each)."""
    size = max(1, size)
    return [list(tasks[start : start + size]) for start in range(0, len(tasks), size)]


class SlurmExecutor:
    """Runs the tasks as Slurm job arrays (submitit), each job one task, and waits for them: one
    array, or as many as the cluster's MaxArraySize needs; the jobs' submission files and Slurm
    logs in `folder`."""

    def __init__(self, folder: Path, options: SlurmOptions):
        self.folder, self.options = folder, options

    def run(self, tasks: Sequence[Task]) -> list[Outcome]:
        """Submit the tasks as arrays of under MaxArraySize jobs and wait for every job; Ctrl-C
        stops the waiting, not the jobs (they go on on the cluster; the sweep run again sees
        them end)."""
        if not tasks:
            return []
        submitit = submitit_module()
        executor = submitit.AutoExecutor(folder=self.folder, cluster="slurm")
        options = self.options
        parameters: dict[str, Any] = {
            "timeout_min": options.time_min,
            "cpus_per_task": options.cpus,
        }
        if options.partition:
            parameters["slurm_partition"] = options.partition
        if options.gpus:
            parameters["gpus_per_node"] = options.gpus
        if options.mem_gb:
            parameters["mem_gb"] = options.mem_gb
        arrays = array_chunks(tasks, max_array_size() - 1)
        # The arrays share --parallelism: together they run no more jobs at once.
        parameters["slurm_array_parallelism"] = max(1, options.parallelism // len(arrays))
        executor.update_parameters(**parameters)
        jobs = [job for array in arrays for job in executor.map_array(SlurmTask(), array)]
        ids = list(dict.fromkeys(job.job_id.split("_")[0] for job in jobs))  # in order
        if len(ids) == 1:
            print(f"submitted {len(jobs)} jobs (array {ids[0]})", flush=True)
        else:
            print(
                f"submitted {len(jobs)} jobs as {len(ids)} arrays (the cluster's MaxArraySize is "
                f"{max_array_size()}): {', '.join(ids)}",
                flush=True,
            )
        outcomes = []
        for task, job in zip(tasks, jobs, strict=True):
            try:
                status = job.result()
            except Exception as e:  # the job died outside the task (killed, node lost)
                status = 1
                record_end(task, status, 0.0)
                print(f"job {job.job_id}: {str(e).splitlines()[0]}", flush=True)
            outcomes.append(Outcome(task, status))
            say(outcomes[-1], len(outcomes), len(tasks))
        return outcomes
