"""`fewshot bench SUITE MODEL...`: models on a suite's cells, ranked among the zoo's stored
results.

Each (model, cell) is one evaluation on the cell's manifest of episodes (written once into the
output folder, checked against the suite's pinned SHA-256), with one result file of its
per-episode results, written atomically and skipped when it holds this very result: a bench
stopped by Ctrl-C or SIGTERM goes on where it stopped. An embedding method embeds each split
once for all its cells. The leaderboard ranks every result of the folder with the zoo's stored
ones (models/bench/SUITE in a checkout) and is written as Markdown, CSV, JSON and a figure.

With --executor (local workers, or a Slurm cluster), each (model, cell) without its result is a
job of its own: `fewshot bench` of that model on that cell, in OUT/jobs/MODEL/CELL with its log
and status file as a sweep's jobs have them; the leaderboard is then made of the results there.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

from tqdm import tqdm

from fewshot.benchmark.leaderboard import Leaderboard, build_leaderboard, write_leaderboard
from fewshot.benchmark.results import (
    STORED,
    CellResult,
    correct_counts,
    read_results,
    slug,
)
from fewshot.benchmark.suites import Cell, Suite, load_suite, shipped_suites
from fewshot.cli.compare import names_backbone
from fewshot.cli.eval import EvalSettings, evaluate_to_file
from fewshot.cli.model_settings import ModelSettings
from fewshot.datasets import load_split, resolve_data_root
from fewshot.evaluation.manifests import draw_manifest, read_manifest, write_manifest
from fewshot.methods.feature_cache import FeatureMemory
from fewshot.runtime.device import device_setting
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_write_json
from fewshot.runtime.settings import (
    Command,
    SettingError,
    build,
    check_fields,
    setting,
    settings_keys,
)
from fewshot.runtime.signals import Interrupted
from fewshot.sweeps.executors import DONE, FAILED, LOG, Task
from fewshot.sweeps.settings import ExecutorSettings
from fewshot.sweeps.spec import setting_flags

# The settings of a model's evaluation that a stored result records, to evaluate it again.
RERUN_KEYS = ("classifier", "classifier_options", "batch_norm", "inner_steps")
RERUN_KEYS += ("backbone_options", "normalization")
REPO = STORED.parents[1]  # the checkout whose models/ the stored results name


@dataclass(frozen=True)
class BenchListing:
    """`fewshot bench --list`: the shipped suites and their cells."""

    list: bool = setting(False, help="list the shipped suites with their cells, and stop")

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class BenchSettings(ModelSettings, ExecutorSettings):
    """`fewshot bench`: which suite, which models, where the results go, where the jobs run."""

    suite: str | None = setting(
        None,
        help="a shipped suite (NAME-vVERSION: fewshot bench --list) or a suite's .yaml file",
        positional=True,
    )
    models: list[str] = setting(
        help="checkpoints (.pt files or run folders) or frozen backbones' names (conv4, "
        "resnet12, timm:NAME, torchvision:NAME, a plug-in's), each evaluated with --classifier",
        default_factory=list,
        positional=True,
    )
    name: list[str] | None = setting(
        None, help="the models' names in the leaderboard, one per model (default: file stems)"
    )
    cells: list[str] | None = setting(None, help="evaluate only these cells (default: all)")
    out: str | None = setting(
        None, help="the folder of manifests, results and leaderboard (default: bench/SUITE)"
    )
    data_root: str | None = setting(
        None, help="data folder (default: $FEWSHOT_DATA or the repository's data/)"
    )
    device: str = device_setting()
    limit: int | None = setting(
        None, help="a quick look: the first N episodes of each cell (results kept apart)", low=2
    )
    plan: bool = setting(False, help="print the jobs and what is done, and run nothing")
    stored: bool = setting(True, help="rank with the zoo's stored results (--no-stored: not)")
    rerun_stored: list[str] | None = setting(
        None, help="evaluate these stored models again (their names, or all) instead of reading"
    )
    overwrite: bool = setting(False, help="replace a result of another model of the same name")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_executor()
        if self.name is not None and len(self.name) != len(self.models):
            raise SettingError(
                "name", f"gives {len(self.name)} names for {len(self.models)} models"
            )
        names = self.names
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise SettingError("name", f"two models are named {twice[0]!r}: name them with --name")

    @property
    def backbones(self) -> list[str]:
        """The models that name frozen backbones."""
        return [model for model in self.models if names_backbone(model)]

    @property
    def names(self) -> list[str]:
        """The models' display names: --name, else the file's stem (a run folder's name) or
        the backbone's name, with the classifier where one is given."""
        if self.name is not None:
            return list(self.name)
        stems = [model if names_backbone(model) else _stem(model) for model in self.models]
        suffix = f" + {self.classifier}" if self.classifier else ""
        return [stem + suffix for stem in stems]


def _stem(model: str) -> str:
    """A checkpoint's name: its file's stem, or its run folder's name."""
    path = Path(model)
    return path.name if path.is_dir() else path.stem


@dataclass(frozen=True)
class Job:
    """One evaluation: a model (its display name, its evaluation's settings as flags) on a
    cell."""

    name: str
    flags: dict
    cell: Cell
    stored: bool = False  # a stored model evaluated again


def run_bench(listing: BenchListing, settings: BenchSettings) -> Leaderboard | None:
    """List the suites, or evaluate the models on the suite and write its leaderboard."""
    if listing.list:
        print(suites_listing())
        return None
    if settings.suite is None:
        raise FewshotError("a suite is needed: a shipped one's name (fewshot bench --list) or file")
    suite = load_suite(settings.suite)
    out = Path(settings.out or Path("bench") / suite.id)
    claim_folder(out, suite)
    cells = [suite.cell(name) for name in settings.cells] if settings.cells else list(suite.cells)
    stored = read_results(STORED / suite.id, suite.id, True) if settings.stored else []
    jobs = model_jobs(settings, cells) + rerun_jobs(settings, stored, cells)
    board_folder = board_of(out, settings.limit)
    results = board_folder / "results" if settings.limit else out / "results"
    too_few = [c for c in cells if settings.limit and settings.limit > c.episodes]
    if too_few:
        raise FewshotError(
            f"--limit {settings.limit} is more than the {too_few[0].episodes} episodes of cell "
            f"{too_few[0].name}"
        )
    if settings.plan:
        print(plan_lines(jobs, results, stored, settings, out))
        return None
    if settings.executor is None:
        manifests = {cell.name: cell_manifest(cell, settings.data_root, out) for cell in cells}
        failures = run_jobs(jobs, settings, suite, manifests, results)
    else:
        failures = run_on_executor(jobs, settings, cells, out, results)
    failed = (
        f"{len(failures)} of {len(jobs)} evaluations failed: " + "; ".join(failures)
        if failures
        else ""
    )
    try:
        board = leaderboard(suite, stored, read_results(results, suite.id, False), settings.limit)
    except FewshotError as e:
        raise FewshotError(f"{failed} ({e})" if failed else str(e)) from None
    paths = write_leaderboard(board, board_folder)
    print(summary_lines(board))
    print(f"leaderboard in {', '.join(str(p) for p in paths)}")
    if failed:
        raise FewshotError(f"{failed} (the others are ranked)")
    return board


def suites_listing() -> str:
    """Every shipped suite with its description and cells."""
    lines = []
    for name in shipped_suites():
        suite = load_suite(name)
        lines.append(f"{suite.id}: {suite.description}")
        for cell in suite.cells:
            data = cell.dataset if cell.root is None else f"{cell.dataset} {cell.root}"
            lines.append(
                f"  {cell.name}: {data} {cell.split}, {cell.way}-way {cell.shot}-shot "
                f"{cell.query} queries, {cell.episodes} episodes, seed {cell.seed}"
            )
    return "\n".join(lines)


def board_of(out: Path, limit: int | None) -> Path:
    """The folder of the leaderboard and its results: a quick look (--limit) keeps its own
    apart from the full ones."""
    return out if limit is None else out / f"first-{limit}"


def claim_folder(out: Path, suite: Suite) -> None:
    """Mark `out` as this suite's folder; refuse one that holds another suite's."""
    marker = out / "suite.json"
    if marker.is_file():
        try:
            held = json.loads(marker.read_text())["suite"]
        except (OSError, ValueError, KeyError, TypeError):
            raise FewshotError(f"{marker} is not a bench folder's: name another --out") from None
        if held != suite.id:
            raise FewshotError(
                f"{out} holds the results of suite {held}, not {suite.id}: name another --out"
            )
        return
    atomic_write_json({"suite": suite.id, "file": str(suite.path)}, marker)


def cell_root(data_root: str | None, cell: Cell) -> str | None:
    """The data root of a cell's data set: --data-root, with the cell's folder under it."""
    if cell.root is None:
        return data_root
    return str(resolve_data_root(data_root) / cell.root)


def cell_manifest(cell: Cell, data_root: str | None, out: Path) -> Path:
    """The cell's manifest in `out/manifests`: read and checked where it is, else drawn from
    the data and written; its SHA-256 must be the suite's pin where the cell has one."""
    path = out / "manifests" / f"{cell.name}.npz"
    if path.is_file():
        manifest = read_manifest(path)
    else:
        geometry = {"resize": cell.resize, "channels": cell.channels}
        per_class = cell.shot + cell.query
        split = load_split(
            cell.dataset, cell.split, cell_root(data_root, cell), **geometry, per_class=per_class
        )
        data = {"dataset": cell.dataset, "split": cell.split}
        manifest = draw_manifest(split, data, cell.shape, cell.seed, cell.episodes)
    if cell.sha256 and manifest.sha256 != cell.sha256:
        raise FewshotError(
            f"cell {cell.name}: the episodes drawn now have SHA-256 {manifest.sha256[:12]}, the "
            f"suite pins {cell.sha256[:12]}: the sampler or the data set differs from the "
            "suite's (results would not pair with its stored ones)"
        )
    if not path.is_file():
        write_manifest(manifest, path)
    return path


def model_flags(settings: BenchSettings, model: str) -> dict:
    """The evaluation's flags of one model of the command line."""
    flags = {key: getattr(settings, key) for key in RERUN_KEYS}
    flags.update(amp=settings.amp, backbone_weights=settings.backbone_weights)
    flags["backbone" if names_backbone(model) else "checkpoint"] = model
    return flags


def model_jobs(settings: BenchSettings, cells: list[Cell]) -> list[Job]:
    """The jobs of the command line's models: each on each cell."""
    return [
        Job(name, model_flags(settings, model), cell)
        for model, name in zip(settings.models, settings.names, strict=True)
        for cell in cells
    ]


def rerun_jobs(settings: BenchSettings, stored: list[CellResult], cells: list[Cell]) -> list[Job]:
    """The jobs that evaluate stored models again (--rerun-stored), with the settings their
    results record."""
    wanted = settings.rerun_stored or []
    known = {r.name for r in stored}
    unknown = [name for name in wanted if name != "all" and name not in known]
    if unknown:
        raise FewshotError(
            f"--rerun-stored names no stored model: {unknown[0]!r}; stored: "
            + (", ".join(sorted(known)) or "none")
        )
    jobs = []
    names = {c.name for c in cells}
    for result in stored:
        if result.cell in names and ("all" in wanted or result.name in wanted):
            jobs.append(Job(result.name, stored_flags(result), cell_of(cells, result.cell), True))
    return jobs


def cell_of(cells: list[Cell], name: str) -> Cell:
    """The cell of that name."""
    return next(cell for cell in cells if cell.name == name)


def stored_flags(result: CellResult) -> dict:
    """The evaluation's flags that give a stored result again: its model (a checkpoint of the
    checkout, or a frozen backbone) and the settings its record holds."""
    record = result.record
    flags = {key: record[key] for key in RERUN_KEYS if record.get(key) is not None}
    flags["amp"] = "off" if record["precision"] == "float32" else record["precision"]
    if "checkpoint" in record:
        checkpoint = Path(record["checkpoint"])
        flags["checkpoint"] = str(checkpoint if checkpoint.is_absolute() else REPO / checkpoint)
    else:
        flags["backbone"] = record["backbone"]
    return flags


def result_file(results: Path, job: Job) -> Path:
    """Where the job's result is written."""
    return results / slug(job.name) / f"{job.cell.name}.json"


def plan_lines(
    jobs: list[Job], results: Path, stored: list[CellResult], settings: BenchSettings, out: Path
) -> str:
    """The jobs, each with what is there of it (with --executor: its job's state)."""
    lines = [f"{len(jobs)} evaluations, results in {results}:"]
    if settings.executor is not None and jobs:
        folder = board_of(out, settings.limit) / "jobs"
        lines[0] = f"{len(jobs)} evaluations, results in {results}, jobs in {folder}:"
    for job in jobs:
        # A result there is read back only if it is this very evaluation's, which the run
        # checks; the plan builds no model.
        there = result_file(results, job)
        state = "result present" if there.is_file() else "to run"
        if settings.executor is not None:
            state, _ = job_state(job_task(job, settings, out), there, settings.overwrite)
        lines.append(f"  {job.name} on {job.cell.name}: {state}")
    if stored:
        models = sorted({r.name for r in stored})
        lines.append(f"ranked with the stored results of {len(models)} models: {', '.join(models)}")
    return "\n".join(lines)


def run_jobs(
    jobs: list[Job], settings: BenchSettings, suite: Suite, manifests: dict, results: Path
) -> list[str]:
    """Run every job (a model's cells one after another, its features kept in memory between
    them); a job that fails is named with its reason and the others go on."""
    failures, memories = [], {}
    planned: dict[str, int] = {}  # each model's images of all its episodes
    for job in jobs:
        cell = job.cell
        episodes = settings.limit or cell.episodes
        planned[job.name] = planned.get(job.name, 0) + episodes * cell.way * cell.shape.pool
    bar = tqdm(jobs, desc="bench", unit="cell", disable=not jobs)
    for job in bar:
        bar.set_postfix_str(f"{job.name} {job.cell.name}")
        flags = {**job.flags, "device": settings.device, "overwrite": settings.overwrite}
        flags.update(
            dataset=job.cell.dataset,
            split=job.cell.split,
            data_root=cell_root(settings.data_root, job.cell),
            resize=job.cell.resize,
            channels=job.cell.channels,
            episodes_file=str(manifests[job.cell.name]),
            episodes=settings.limit or job.cell.episodes,
            out=str(results / slug(job.name) / f"{job.cell.name}.json"),
        )
        memory = memories.setdefault(job.name, FeatureMemory(planned[job.name]))
        try:
            evaluation = build(EvalSettings, [("flags", flags)])
            evaluate_to_file(evaluation, bar.write, memory, result_fields(job, suite), reuse=True)
        except FewshotError as e:
            failures.append(f"{job.name} on {job.cell.name}: {e}")
            bar.write(f"failed: {failures[-1]}")
    return failures


def job_task(job: Job, settings: BenchSettings, out: Path) -> Task:
    """The job as a `fewshot bench` command of its own, in OUT/jobs/MODEL/CELL (OUT/first-N/jobs
    with --limit): the model on the one cell, with the settings its result depends on (a
    stored model by --rerun-stored, which reads them from its stored record)."""
    assert settings.suite is not None  # a bench of jobs has its suite
    values: dict = {"cells": [job.cell.name], "out": str(out), "limit": settings.limit}
    values.update(data_root=settings.data_root, device=settings.device)
    values.update(overwrite=settings.overwrite)
    if job.stored:
        argv = ["bench", settings.suite]
        values.update(rerun_stored=[job.name])
    else:
        argv = ["bench", settings.suite, job.flags.get("checkpoint") or job.flags["backbone"]]
        model = settings_keys(ModelSettings)
        values.update({key: value for key, value in job.flags.items() if key in model})
        # The job's leaderboard is of no use: the bench ranks with the stored results at its end.
        values.update(name=[job.name], stored=False)
    given = {key: value for key, value in values.items() if value != DEFAULTS[key]}
    folder = board_of(out, settings.limit) / "jobs" / slug(job.name) / job.cell.name
    return Task((*argv, *setting_flags(BenchSettings, given)), folder)


def job_state(task: Task, result: Path, overwrite: bool) -> tuple[str, bool]:
    """The job's state and whether it runs: done (its result there), result present (written
    without a job), failed or to run; one whose result is there runs again with --overwrite,
    which replaces another model's result of its name (its own is read back)."""
    if result.is_file():
        state = "done" if (task.folder / DONE).is_file() else "result present"
        return (f"{state}, to run again (--overwrite)", True) if overwrite else (state, False)
    return ("failed, to run again" if (task.folder / FAILED).is_file() else "to run"), True


def run_on_executor(
    jobs: list[Job], settings: BenchSettings, cells: list[Cell], out: Path, results: Path
) -> list[str]:
    """Run the jobs without their result (a failed one again) as commands of their own by
    --executor; the failed ones, each named with its log."""
    tasks = {}
    for job in jobs:
        task = job_task(job, settings, out)
        if job_state(task, result_file(results, job), settings.overwrite)[1]:
            tasks[task] = job
    executor = settings.make_executor(board_of(out, settings.limit)) if tasks else None
    # Drawn here, before any job: jobs of one cell running at once would each draw them.
    for cell in cells:
        cell_manifest(cell, settings.data_root, out)
    if executor is None:
        return []
    for task in tasks:  # its status is what this run writes
        (task.folder / DONE).unlink(missing_ok=True)
        (task.folder / FAILED).unlink(missing_ok=True)
    print(f"running {len(tasks)} of {len(jobs)} evaluations as jobs", flush=True)
    try:
        outcomes = executor.run(list(tasks))
    except Interrupted as e:
        raise Interrupted(e.signum, "its jobs stopped; run it again to go on") from None
    # Named in the jobs' order, not the order they ended in.
    failed = {outcome.task for outcome in outcomes if outcome.status != 0}
    return [
        f"{job.name} on {job.cell.name} (log {task.folder / LOG})"
        for task, job in tasks.items()
        if task in failed
    ]


def result_fields(job: Job, suite: Suite):
    """What a bench result adds to the evaluation's record: the model's name, the suite and
    cell, and the queries right in each episode."""

    def fields(record: dict, accuracies) -> dict:
        queries = record["way"] * record["query"]
        added = {"name": job.name, "suite": suite.id, "cell": job.cell.name, "queries": queries}
        added["correct"] = correct_counts(accuracies, queries)
        if job.stored:
            added["stored_model"] = True  # it stands for the stored result of its name
        return added

    return fields


def leaderboard(
    suite: Suite, stored: list[CellResult], results: list[CellResult], limit: int | None
) -> Leaderboard:
    """The leaderboard of the folder's results and the stored ones (a stored model evaluated
    again here stands for its stored result)."""
    again = {(r.name, r.cell) for r in results if r.record.get("stored_model")}
    kept = [r for r in stored if (r.name, r.cell) not in again]
    return build_leaderboard(suite, kept + results, limit)


def summary_lines(board: Leaderboard) -> str:
    """Each cell's ranking in a few lines: rank, model, accuracy ± CI, tied with the best."""
    lines = []
    for ranking in board.cells:
        lines.append(f"{ranking.cell} ({ranking.episodes} episodes):")
        for s in ranking.standings:
            tie = " (= best)" if s.tied and s.difference is not None else ""
            lines.append(f"  {s.rank:>4g}  {s.name:<40} {s.accuracy:6.2f} ± {s.ci95:.2f} %{tie}")
    lines.append(board.across.note)
    return "\n".join(lines)


# Each setting's default: a job's command gives only the settings that differ from theirs.
DEFAULTS = {
    f.name: f.default_factory() if f.default_factory is not MISSING else f.default
    for f in fields(BenchSettings)
}

COMMANDS = [
    Command(
        ("bench",),
        "models on a benchmark suite's cells, ranked among the zoo's stored results",
        (BenchListing, BenchSettings),
        run_bench,
    )
]
