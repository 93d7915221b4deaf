"""A sweep's jobs: one training job per combination of the matrix, then each trained model's
evaluations; their folders, their command lines and their state.

A training job's folder is its run folder, RUNS/KEY=VALUE,KEY=VALUE (RUNS: the spec's runs, by
default OUT/runs; the matrix's values in its order, safe characters only); an evaluation's is
OUT/evals/RUN/WHAT, its result OUT/evals/RUN/WHAT.json. An evaluation whose result is there is
done, and a run whose evaluations are all done needs no training: a sweep whose run folders are
gone (or were never copied) reports from its evaluations alone. Each holds
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
from fewshot.sweeps.spec import Spec, job_config, setting_flags, without_config
from fewshot.training.settings import STAGES

COMMAND = "command.txt"
LAST = "last.pt"
# A job's state, as --plan prints it.
DONE_STATE, FAILED_STATE, TO_RESUME, TO_RUN = "done", "failed", "to resume", "to run"
EVALUATED = "evaluated"  # a training job not done whose evaluations all are: not needed


@dataclass(frozen=True)
class Job:
    """One `fewshot` command of a sweep, in its folder."""

    kind: str  # train or pretrain (a training job), eval or bench (an evaluation)
    run: str  # the training run it is or evaluates: its folder's name
    label: str  # what an evaluation tests: a shape (5w1s) or a suite; a training job's run
    folder: Path
    argv: tuple[str, ...]  # after `fewshot`, as command.txt holds it
    parts: tuple[tuple[str, str], ...] = ()  # its run's (matrix key, KEY=VALUE) pairs

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
        if (self.folder / DONE).is_file() or (self.kind == "eval" and self.result.is_file()):
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
        line, held = command_line(self.argv) + "\n", self.folder / COMMAND
        if not held.is_file():  # one there is this job's own: check_owner refuses another's
            atomic_write_text(line, held)
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

    def evaluated(self, states: dict[Job, str] | None = None) -> set[str]:
        """The runs whose evaluations are all done (none where the spec evaluates nothing),
        from the evaluations' `states` where given."""
        states = states or {job: job.state for job in self.evaluations}
        pending = {job.run for job in self.evaluations if states[job] != DONE_STATE}
        return {job.run for job in self.evaluations} - pending

    def states(self) -> dict[Job, str]:
        """Every job's state (each looked up once), a training job whose evaluations are all
        done `evaluated`."""
        found = {job: job.state for job in self.jobs}
        evaluated = self.evaluated(found)
        for job in self.training:
            if found[job] != DONE_STATE and job.run in evaluated:
                found[job] = EVALUATED
        return found


def result_path(folder: Path) -> Path:
    """Where the eval job of `folder` writes its JSON result: beside its folder."""
    return folder.with_name(f"{folder.name}.json")


def expand(spec: Spec, folder: Path, eval_flags: tuple[str, ...] = ()) -> Sweep:
    """The spec's jobs in `folder`: one training job per combination of the matrix (block by
    block), then each one's evaluations (`eval_flags`: the evaluation's options as flags of
    fewshot eval, which fewshot sweep checks)."""
    cls = spec.settings_class
    common = setting_flags(cls, spec.overrides)
    runs = Path(spec.runs) if spec.runs else folder / "runs"
    training: list[Job] = []
    for block in spec.blocks:
        for values in itertools.product(*block.values()):
            run = ",".join(value.part for value in values)
            settings = {key: v for value in values for key, v in value.settings.items()}
            config = ("--config", job_config(spec, settings))
            argv = (spec.command, *config, *common)
            argv += (*setting_flags(cls, without_config(settings)), "--out", str(runs / run))
            parts = tuple(zip(block, (value.part for value in values), strict=True))
            training.append(Job(spec.command, run, run, runs / run, argv, parts))
    twice = [run for run, count in Counter(job.run for job in training).items() if count > 1]
    if twice:
        raise FewshotError(f"the matrix gives the run {twice[0]} twice: give each once")
    evaluations = [
        job for train in training for job in evaluation_jobs(spec, folder, train, eval_flags)
    ]
    return Sweep(spec.name, folder, training, evaluations)


def evaluation_jobs(spec: Spec, folder: Path, train: Job, eval_flags: tuple[str, ...]) -> list[Job]:
    """A trained model's evaluations: `fewshot bench` on the suite, `fewshot eval` per shape."""
    evaluate, jobs = spec.evaluate, []
    if evaluate is None:
        return jobs
    checkpoint, evals = (
        str(train.folder / f"{evaluate.checkpoint}.pt"),
        folder / "evals" / train.run,
    )
    if evaluate.suite is not None:
        limit = [] if evaluate.limit is None else ["--limit", str(evaluate.limit)]
        argv = ("bench", evaluate.suite, checkpoint, "--name", train.run)
        argv += ("--out", str(folder / "bench"), *limit, "--no-stored")
        jobs.append(Job("bench", train.run, evaluate.suite, evals / "bench", argv, train.parts))
    for shape in evaluate.shapes:
        job_folder = evals / shape.label
        argv = ("eval", "--checkpoint", checkpoint, "--way", str(shape.way))
        argv += ("--shot", str(shape.shot), "--episodes", str(evaluate.episodes))
        argv += ("--seed", str(evaluate.seed), *eval_flags, "--per-episode")
        argv += ("--out", str(result_path(job_folder)))
        jobs.append(Job("eval", train.run, shape.label, job_folder, argv, train.parts))
    return jobs


def summary(sweep: Sweep, states: dict[Job, str] | None = None) -> str:
    """'NAME in FOLDER: N training jobs (COUNT STATE, ...), M evaluations (...)', from the
    jobs' `states` where given."""
    counts, found = [], states or sweep.states()
    for what, jobs in (("training jobs", sweep.training), ("evaluations", sweep.evaluations)):
        states = Counter(found[job] for job in jobs)
        shown = ", ".join(f"{count} {state}" for state, count in states.items())
        counts.append(f"{what}: {len(jobs)}" + (f" ({shown})" if jobs else ""))
    return f"{sweep.name} in {sweep.folder}: {', '.join(counts)}"


def plan_lines(sweep: Sweep) -> str:
    """Every job with its state, under a line that counts them."""
    found = sweep.states()
    return "\n".join(
        [f"sweep {summary(sweep, found)}", *(f"  {job.name}: {found[job]}" for job in sweep.jobs)]
    )
