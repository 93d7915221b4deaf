"""`fewshot sweep SPEC`: a spec's training jobs and each trained model's evaluations, run by an
executor, resumed where they stopped, and reported.

The spec is checked whole before any job runs (its keys and types, its config file, every
override and matrix value against the command's settings, its suite, the jobs' folders). The
training jobs run first: a done one is skipped, an interrupted one resumed from its last.pt, a
failed one run again only with --rerun-failed. Then the evaluations of the trained models, then
the report (OUT/report.md and OUT/report.json). A failed job does not stop the others; the sweep
ends with one line naming the failed jobs and their logs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fewshot.benchmark.leaderboard import build_leaderboard, write_leaderboard
from fewshot.benchmark.results import read_results
from fewshot.benchmark.suites import Suite, load_suite
from fewshot.cli.eval import EvalSettings
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.settings import (
    Command,
    SettingError,
    build,
    check_fields,
    setting,
    settings_keys,
)
from fewshot.runtime.signals import Interrupted
from fewshot.sweeps.executors import LOG, Executor
from fewshot.sweeps.jobs import FAILED_STATE, TO_RESUME, TO_RUN, Job, Sweep, expand, plan_lines
from fewshot.sweeps.report import SuiteScores, write_report
from fewshot.sweeps.settings import ExecutorSettings, executor_setting
from fewshot.sweeps.spec import EVAL_GIVEN, Shape, Spec, read_spec, setting_flags


@dataclass(frozen=True, kw_only=True)
class SweepSettings(ExecutorSettings):
    """`fewshot sweep`: which spec, where its jobs run, what runs again."""

    spec: str = setting(help="the sweep's spec: a YAML file", positional=True)
    plan: bool = setting(
        False, help="print every job with its state (done, to resume, to run, failed); run none"
    )
    executor: str = executor_setting("local")
    rerun_failed: bool = setting(
        False, help="run the failed jobs again (a training run resumes from its last.pt)"
    )
    out: str | None = setting(
        None, help="the sweep's folder (default: the spec's out, else runs/sweeps/NAME)"
    )

    def __post_init__(self) -> None:
        check_fields(self)
        self.check_executor()


def run_sweep(settings: SweepSettings) -> Sweep:
    """Check the spec, then print the plan, or run the jobs not done and write the report."""
    spec = read_spec(Path(settings.spec))
    suite = spec_suite(spec, settings.spec)
    flags = eval_flags(spec, f"spec file {settings.spec}")
    sweep = expand(spec, Path(settings.out) if settings.out else spec.folder, flags)
    for job in sweep.jobs:
        job.check_owner()
    if settings.plan:
        print(plan_lines(sweep))
        return sweep
    executor = settings.make_executor(sweep.folder)
    try:
        evaluated = sweep.evaluated()  # a run whose evaluations are all done needs no training
        training = [job for job in sweep.training if job.run not in evaluated]
        run_jobs(executor, training, settings.rerun_failed)
        trained = sweep.trained()
        evaluations = [job for job in sweep.evaluations if job.run in trained]
        run_jobs(executor, evaluations, settings.rerun_failed)
    except Interrupted as e:
        raise Interrupted(e.signum, "its jobs stopped; run it again to resume them") from None
    scores = None
    if suite is not None:
        scores = suite_scores(suite, spec.evaluate.limit, sweep.folder / "bench")
    print(write_report(spec, sweep, scores), end="")
    report = sweep.folder / "report.md"
    failed = [job for job in sweep.jobs if job.state == FAILED_STATE]
    if failed:
        named = "; ".join(f"{job.name} (log {job.folder / LOG})" for job in failed)
        raise FewshotError(
            f"{len(failed)} of {len(sweep.jobs)} jobs failed: {named}; the others are reported "
            f"in {report}"
        )
    print(f"report in {report} and {report.with_suffix('.json')}")
    return sweep


def eval_flags(spec: Spec, label: str) -> tuple[str, ...]:
    """The evaluation's options as flags of fewshot eval: settings of it that the spec does not
    give itself, with values it takes (named before any job runs)."""
    if spec.evaluate is None or not spec.evaluate.options:
        return ()
    evaluate, options = spec.evaluate, spec.evaluate.options
    label = f"{label} evaluate options"
    for key in options:
        if key in EVAL_GIVEN:
            raise FewshotError(f'{label}: "{key}" is given by the spec itself: leave it out')
        if key not in settings_keys(EvalSettings):
            raise FewshotError(f'{label}: "{key}" is not a setting of fewshot eval')
    shape = evaluate.shapes[0] if evaluate.shapes else Shape(way=5, shot=1)
    given = {"checkpoint": "last.pt", "way": shape.way, "shot": shape.shot}
    build(EvalSettings, [(label, {**options, **given})])
    try:
        return tuple(setting_flags(EvalSettings, options))
    except SettingError as e:
        raise FewshotError(f'{label}: "{e.key}" {e.problem}') from None


def spec_suite(spec: Spec, path: str) -> Suite | None:
    """The suite the spec benches each model on, if any."""
    if spec.evaluate is None or spec.evaluate.suite is None:
        return None
    try:
        return load_suite(spec.evaluate.suite)
    except FewshotError as e:
        raise FewshotError(f'spec file {path} evaluate: "suite" {e}') from None


def run_jobs(executor: Executor, jobs: list[Job], rerun_failed: bool) -> None:
    """Run the jobs not done: to run, to resume, and the failed ones with --rerun-failed
    (otherwise reported as failed again)."""
    again = {TO_RUN, TO_RESUME} | ({FAILED_STATE} if rerun_failed else set())
    wanted = [job for job in jobs if job.state in again]
    if wanted:
        print(f"running {len(wanted)} of {len(jobs)} jobs", flush=True)
        executor.run([job.prepare() for job in wanted])


def suite_scores(suite: Suite, limit: int | None, folder: Path) -> SuiteScores | None:
    """The leaderboard of the runs benched into `folder`, written again now that every bench
    job has ended (jobs that ran at once each wrote it with the results it saw), for the
    report; None where no run was benched."""
    board_folder = folder if limit is None else folder / f"first-{limit}"
    results = read_results(board_folder / "results", suite.id, False)
    if not results:
        return None
    board = build_leaderboard(suite, results, limit)
    paths = write_leaderboard(board, board_folder)
    accuracy = {
        (standing.name, f"{suite.id}/{ranking.cell}"): standing.accuracy
        for ranking in board.cells
        for standing in ranking.standings
    }
    return SuiteScores(board.markdown("##"), paths[0], accuracy)


COMMANDS = [
    Command(
        ("sweep",),
        "a spec's matrix of training runs and their evaluations, run on workers, resumable, "
        "with a report comparing arms across seeds",
        (SweepSettings,),
        run_sweep,
    )
]
