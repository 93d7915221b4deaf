"""Executors: where the jobs of a sweep, or of a bench with --executor, run.

An executor takes tasks (each a `fewshot` command line and its folder) and runs them, a failed
one never stopping the others. Wherever a task runs, its output goes to FOLDER/log.txt and its
end to a status file written there atomically: FOLDER/done.json, or FOLDER/failed.json with its
exit status and the log's last lines. The status files are the sweep's record: a sweep run again,
from any machine that shares the folder, sees what is done whichever executor ran it.

`LocalExecutor` runs up to `workers` tasks at once as processes of this machine. Another
executor (a cluster's) is a class with the same `run` method, whose jobs call `open_log` and
`record_end` where they run.
"""

from __future__ import annotations

import io
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from fewshot.runtime.io import atomic_write_json

LOG = "log.txt"
DONE = "done.json"
FAILED = "failed.json"
LOG_TAIL = 20  # the log lines a failed task's status file keeps
TAIL_BYTES = 1 << 16  # where those lines are looked for: a training log grows long
POLL_SECONDS = 0.1  # how often running tasks are looked at: nothing next to a job's seconds


@dataclass(frozen=True)
class Task:
    """One job as an executor runs it: `fewshot ARGV`, its output into FOLDER/log.txt, its end
    into FOLDER/done.json or FOLDER/failed.json."""

    argv: tuple[str, ...]
    folder: Path


@dataclass(frozen=True)
class Outcome:
    """How a task ended: its exit status (0: done; 128 + N: stopped by signal N)."""

    task: Task
    status: int


class Executor(Protocol):
    """Where a sweep's tasks run."""

    def run(self, tasks: Sequence[Task]) -> list[Outcome]:
        """Run every task, a failed one not stopping the others, and return how each ended.
        An interruption of the sweep (Ctrl-C, SIGTERM) stops the running tasks so that they
        can be resumed, and is raised."""


def command_line(argv: Sequence[str]) -> str:
    """`fewshot ARGV`, shell-quoted: what a person types to run it by hand."""
    return shlex.join(["fewshot", *argv])


def open_log(task: Task) -> IO[str]:
    """The task's log, opened to append, with a line saying what starts now (a resumed job's
    log keeps every attempt)."""
    task.folder.mkdir(parents=True, exist_ok=True)
    path = task.folder / LOG
    # An attempt stopped mid-line (a progress bar) leaves no newline: the next starts its own.
    log = open(path, "a+b")  # noqa: SIM115 (the caller closes it)
    if log.tell():
        log.seek(log.tell() - 1)
        if log.read(1) != b"\n":
            log.write(b"\n")
    log = io.TextIOWrapper(log, encoding="utf-8")
    log.write(f"$ {command_line(task.argv)}  # {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    log.flush()
    return log


def record_end(task: Task, status: int, seconds: float) -> Outcome:
    """Write the task's status file: done.json, or failed.json with the log's last lines."""
    record = {"status": status, "command": command_line(task.argv), "seconds": round(seconds, 1)}
    if status == 0:
        atomic_write_json(record, task.folder / DONE)
        (task.folder / FAILED).unlink(missing_ok=True)
    else:
        record.update(log=str(task.folder / LOG), last_lines=log_tail(task.folder / LOG))
        atomic_write_json(record, task.folder / FAILED)
    return Outcome(task, status)


def log_tail(path: Path) -> list[str]:
    """The last lines of a log, each as a terminal shows it (a progress bar's last state); none
    where the task died before it wrote one (a Slurm job lost before it started)."""
    if not path.is_file():
        return []
    with open(path, "rb") as log:
        log.seek(max(0, log.seek(0, os.SEEK_END) - TAIL_BYTES))
        text = log.read().decode("utf-8", errors="replace")
    lines = [line.rpartition("\r")[2].rstrip() for line in text.split("\n")]
    return [line for line in lines if line][-LOG_TAIL:]


def shell_status(returncode: int) -> int:
    """A process's exit status as a shell gives it: 128 + N for a process ended by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class LocalExecutor:
    """Runs up to `workers` tasks at once as processes of this machine (`python -m fewshot`),
    the machine's cores divided among them (OMP_NUM_THREADS)."""

    def __init__(self, workers: int = 1):
        self.workers = workers
        self.threads = max(1, (os.cpu_count() or 1) // workers)

    def run(self, tasks: Sequence[Task]) -> list[Outcome]:
        """Run the tasks, up to `workers` at once; on an interruption, send SIGTERM to the
        running ones (a training run saves last.pt and stops), wait for them, and raise."""
        waiting, outcomes = list(tasks), []
        running: dict[Task, tuple[subprocess.Popen, float]] = {}
        try:
            while waiting or running:
                while waiting and len(running) < self.workers:
                    task = waiting.pop(0)
                    running[task] = (self._start(task), time.monotonic())
                for task, (process, start) in list(running.items()):
                    if process.poll() is not None:
                        del running[task]
                        outcome = record_end(
                            task, shell_status(process.returncode), time.monotonic() - start
                        )
                        outcomes.append(outcome)
                        say(outcome, len(outcomes), len(tasks))
                time.sleep(POLL_SECONDS)
        except BaseException:
            for process, _ in running.values():
                process.terminate()
            for task, (process, start) in running.items():
                if process.wait() == 0:  # it ended before the signal reached it
                    record_end(task, 0, time.monotonic() - start)
            raise
        return outcomes

    def _start(self, task: Task) -> subprocess.Popen:
        """Start one task, its output into its log."""
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads)}
        with open_log(task) as log:
            # A session of its own: Ctrl-C at the terminal reaches the sweep alone, which
            # sends each job one SIGTERM (a second signal would stop a training run at once).
            return subprocess.Popen(
                [sys.executable, "-m", "fewshot", *task.argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )


def say(outcome: Outcome, ended: int, total: int) -> None:
    """A line for a task that ended: done, or failed with where its log is."""
    folder = outcome.task.folder
    if outcome.status == 0:
        print(f"[{ended}/{total}] done: {folder}", flush=True)
    else:
        print(f"[{ended}/{total}] failed (exit {outcome.status}): {folder / LOG}", flush=True)
