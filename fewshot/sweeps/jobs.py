"""A sweep's jobs: one training job per combination of the matrix, then each trained model's
evaluations; their folders, their command lines and their state.

A training job's folder is its run folder, OUT/runs/KEY=VALUE,KEY=VALUE (the matrix's values
in its order, safe characters only); an evaluation's is OUT/evals/RUN/WHAT. Each holds
command.txt, the job's `fewshot` command line, written before it first runs: a folder whose
command.txt is another's, or that holds files but none, belongs to no job of this sweep and is
refused before anything runs.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_write_text
from fewshot.runtime.run_folder import RUN_FILES
from fewshot.sweeps.executors import DONE, FAILED, Task, command_line
from fewshot.sweeps.spec import Spec, part, setting_flags
from fewshot.training.settings import STAGES

COMMAND = "command.txt"
LAST = "last.pt"
# A job's state, as --plan prints it.
DONE_STATE, FAILED_STATE, TO_RESUME, TO_RUN = "done", "failed", "to resume", "to run"


@dataclass(frozen=True)
class Job:
    """One `fewshot` command of a sweep, in its folder."""

    kind: str  # train or pretrain (a training job), eval or bench (an evaluation)
    run: str  # the training run it is or evaluates: its folder's name
    label: str  # what an evaluation tests: a shape (5w1s) or a suite; a training job's run
    folder: Path
    argv: tuple[str, ...]  # after `fewshot`, as command.txt holds it

    @property
    def training(self) -> bool:
        """Whether it is a training job."""
        return self.kind in STAGES

    @property
    def name(self) -> str:
        """How lines and reports name it: 'train RUN', or 'eval RUN 5w1s'."""
        return f"{self.kind} {self.run}" + ("" if self.training else f" {self.label}")

    @property
    def result(self) -> Path:
        """The JSON result of an eval job."""
        return result_path(self.folder)

    @property
    def state(self) -> str:
        """done, failed, to resume (a training run with a last.pt) or to run."""
        if (self.folder / DONE).is_file():
            return DONE_STATE
        if (self.folder / FAILED).is_file():
            return FAILED_STATE
        if self.training and (self.folder / LAST).is_file():
            return TO_RESUME
        return TO_RUN

    def check_owner(self) -> None:
        """Refuse a folder that holds another job's files."""
        held = self.folder / COMMAND
        if held.is_file():
            if held.read_text(encoding="utf-8").strip() != command_line(self.argv):
                raise FewshotError(
                    f"{self.folder} holds another job: its {COMMAND} is not this sweep's "
                    f"command ({command_line(self.argv)}); give the sweep another --out, or "
                    "remove the folder"
                )
        elif self.folder.is_dir() and any(self.folder.iterdir()):
            raise FewshotError(
                f"{self.folder} holds files of no job of this sweep (no {COMMAND}); give the "
                "sweep another --out, or remove them"
            )

    def prepare(self) -> Task:
        """Write command.txt, forget a failure being run again, and return what runs now: the
        command, or a training run resumed from its last.pt."""
        atomic_write_text(command_line(self.argv) + "\n", self.folder / COMMAND)
        (self.folder / FAILED).unlink(missing_ok=True)
        last = self.folder / LAST
        if self.training and last.is_file():
            return Task((self.kind, "--resume", str(last)), self.folder)
        if self.training and any((self.folder / name).exists() for name in RUN_FILES):
            # A start stopped before its first checkpoint left files a fresh run replaces.
            return Task((*self.argv, "--overwrite"), self.folder)
        return Task(self.argv, self.folder)


@dataclass(frozen=True)
class Sweep:
    """A spec's jobs, in their folder."""

    name: str
    folder: Path
    training: list[Job]
    evaluations: list[Job]

    @property
    def jobs(self) -> list[Job]:
        """Every job: the training jobs, then the evaluations."""
        return self.training + self.evaluations

    def trained(self) -> set[str]:
        """The runs whose training is done."""
        return {job.run for job in self.training if job.state == DONE_STATE}


def result_path(folder: Path) -> Path:
    """Where the eval job of `folder` writes its JSON result: beside its folder."""
    return folder.with_name(f"{folder.name}.json")


def expand(spec: Spec, folder: Path) -> Sweep:
    """The spec's jobs in `folder`: one training job per combination of the matrix, then each
    one's evaluations."""
    cls = spec.settings_class
    common = ["--config", spec.config, *setting_flags(cls, spec.overrides)]
    keys = list(spec.matrix)
    training: list[Job] = []
    for values in itertools.product(*spec.matrix.values()):
        combination = dict(zip(keys, values, strict=True))
        run = ",".join(part(key, value) for key, value in combination.items())
        run_folder = folder / "runs" / run
        argv = (spec.command, *common, *setting_flags(cls, combination), "--out", str(run_folder))
        training.append(Job(spec.command, run, run, run_folder, argv))
    evaluations = [job for train in training for job in evaluation_jobs(spec, folder, train)]
    return Sweep(spec.name, folder, training, evaluations)


def evaluation_jobs(spec: Spec, folder: Path, train: Job) -> list[Job]:
    """A trained model's evaluations: `fewshot bench` on the suite, `fewshot eval` per shape."""
    evaluate, jobs = spec.evaluate, []
    if evaluate is None:
        return jobs
    checkpoint, evals = str(train.folder / LAST), folder / "evals" / train.run
    if evaluate.suite is not None:
        limit = [] if evaluate.limit is None else ["--limit", str(evaluate.limit)]
        argv = ("bench", evaluate.suite, checkpoint, "--name", train.run)
        argv += ("--out", str(folder / "bench"), *limit, "--no-stored")
        jobs.append(Job("bench", train.run, evaluate.suite, evals / "bench", argv))
    for shape in evaluate.shapes:
        job_folder = evals / shape.label
        argv = ("eval", "--checkpoint", checkpoint, "--way", str(shape.way))
        argv += ("--shot", str(shape.shot), "--episodes", str(evaluate.episodes))
        argv += ("--seed", str(evaluate.seed), "--per-episode")
        argv += ("--out", str(result_path(job_folder)))
        jobs.append(Job("eval", train.run, shape.label, job_folder, argv))
    return jobs


def summary(sweep: Sweep) -> str:
    """'NAME in FOLDER: N training jobs (COUNT STATE, ...), M evaluations (...)'."""
    counts = []
    for what, jobs in (("training jobs", sweep.training), ("evaluations", sweep.evaluations)):
        states = Counter(job.state for job in jobs)
        shown = ", ".join(f"{count} {state}" for state, count in states.items())
        counts.append(f"{what}: {len(jobs)}" + (f" ({shown})" if jobs else ""))
    return f"{sweep.name} in {sweep.folder}: {', '.join(counts)}"


def plan_lines(sweep: Sweep) -> str:
    """Every job with its state, under a line that counts them."""
    return "\n".join(
        [f"sweep {summary(sweep)}", *(f"  {job.name}: {job.state}" for job in sweep.jobs)]
    )
