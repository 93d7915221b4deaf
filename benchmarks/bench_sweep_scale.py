"""`fewshot sweep` at scale (issue 73, item 5): a spec of 10,000 training jobs read, checked,
planned and submitted, and the report of a finished sweep of 1,000 evaluations, in seconds.

No job runs: every figure is the sweep's own work on this machine, in a temporary folder
(--folder: another file system, a cluster's shared one, where a stat and an fsync cost more).

(a) The spec: models/omniglot/quickstart.json, a matrix of seed 0..S-1 x resplits 1..R
(default 1000 x 10: 10,000 training jobs), one `evaluate` shape (5w1s), compare: resplits. Timed
one by one: `read_spec` (YAML, types, the config file, every override and matrix value checked
against TrainSettings), `expand` (the training jobs and their evaluations), every job folder's
owner check, `plan_lines`, and the whole `fewshot sweep SPEC --plan` (run_sweep, its output
captured). The check builds the settings once per matrix value, not per job: `read_spec` of a
spec of S jobs (seed 0..S-1 x resplits [1]: nearly the same values, a tenth of the jobs) is
timed too, and the ratio printed.

(b) The training jobs submitted as Slurm arrays, our side of it: the Task list as `run_jobs`
builds it (`Job.prepare`: each job's command.txt written atomically), one
DelayedSubmission(SlurmTask(), task) pickled per job as submitit's map_array does (cloudpickle,
a file each), and submitit's whole map_array once per array of at most --array-size tasks
(slurm.array_chunks), as SlurmExecutor calls it (its parameters), with a stub `sbatch` on the
PATH that answers a job id (the pickles, each array's sbatch file, each job's pickle moved to
its name). Then how many arrays the jobs take, and the plan of the submitted sweep (each
training folder's command.txt read by the owner check). Where `sinfo` answers
(scripts/slurm_cluster.sh start), a real array of --array-size `true` commands is submitted
through submitit, timed, and cancelled with scancel at once (--no-cluster: not).

(c) A finished sweep: seed 0..99 x resplits 1..10 (1,000 training runs, 1,000 evaluations of
1,000 episodes each): each job's command.txt and done.json (`Job.prepare`, `record_end`), each
evaluation's result as `fewshot eval --per-episode --out` writes it (the keys of its record,
random per-episode accuracies of a 5-way 15-query episode around 96%). Timed: `write_report`
(the accuracies table and resplits compared across the 100 seeds) and `fewshot sweep SPEC`
(run_sweep, every job done: nothing runs, the report is written).

Each figure is the median of --repeats runs. --smoke: small sizes, one run, no cluster.

    .venv/bin/python -m benchmarks.bench_sweep_scale
    .venv/bin/python -m benchmarks.bench_sweep_scale --folder /shared/tmp --repeats 1
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy
import torch

from fewshot.cli.sweep import SweepSettings, run_sweep
from fewshot.evaluation.stats import ci95
from fewshot.runtime.io import atomic_write_json
from fewshot.sweeps import slurm
from fewshot.sweeps.executors import Task, record_end
from fewshot.sweeps.jobs import DONE_STATE, Sweep, expand, plan_lines
from fewshot.sweeps.report import write_report
from fewshot.sweeps.spec import Spec, read_spec

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "models" / "omniglot" / "quickstart.json"
WAY, SHOT, QUERY = 5, 1, 15  # the evaluated shape (fewshot eval's default query)
ARRAY_SIZE = 1000  # tasks an array holds at most (Slurm's default MaxArraySize is 1001)
T = TypeVar("T")


def spec_text(name: str, out: Path, seeds: int, resplits: int, episodes: int) -> str:
    """A sweep spec: the quickstart config, seed 0..seeds-1 x resplits 1..resplits, one shape,
    compare: resplits where there are two resplits values or more."""
    lines = [
        f"name: {name}",
        f"config: {json.dumps(str(CONFIG))}",
        f"out: {json.dumps(str(out))}",
        "overrides: {episodes_per_epoch: 50}",
        "matrix:",
        f"  seed: {json.dumps(list(range(seeds)))}",
        f"  resplits: {json.dumps(list(range(1, resplits + 1)))}",
        "evaluate:",
        f"  shapes: [{{way: {WAY}, shot: {SHOT}}}]",
        f"  episodes: {episodes}",
    ]
    if resplits > 1:
        lines.append("compare: resplits")
    return "\n".join(lines) + "\n"


def write_spec(root: Path, name: str, seeds: int, resplits: int, episodes: int) -> Path:
    """Write a spec (its sweep's folder beside it); its path."""
    path = root / f"{name}.yaml"
    path.write_text(spec_text(name, root / name, seeds, resplits, episodes), encoding="utf-8")
    return path


def timed(work: Callable[[], T], repeats: int) -> tuple[float, T]:
    """The median wall seconds of `repeats` calls of `work`, and its last result."""
    seconds, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = work()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), result


def quiet(work: Callable[[], T]) -> Callable[[], T]:
    """`work` with its standard output captured (a plan of 20,000 lines, a report)."""

    def run() -> T:
        with contextlib.redirect_stdout(io.StringIO()):
            return work()

    return run


def matrix_values(spec: Spec) -> int:
    """The matrix's values, every key's together: what the spec check builds settings for."""
    return sum(len(values) for values in spec.matrix.values())


def check_owners(sweep: Sweep) -> None:
    """Every job's folder owner check, as run_sweep makes them before anything runs."""
    for job in sweep.jobs:
        job.check_owner()


def the_spec(root: Path, args: argparse.Namespace) -> Path:
    """(a): read, check, expand and plan the large spec; the ratio to a spec of a tenth of the
    jobs and nearly the same values. Returns the large spec's path."""
    large = write_spec(root, "scale", args.seeds, args.resplits, args.episodes)
    small = write_spec(root, "tenth", args.seeds, 1, args.episodes)
    read_spec(small)  # untimed: the first call imports yaml and reads the config's modules
    seconds, spec = timed(lambda: read_spec(large), args.repeats)
    small_seconds, small_spec = timed(lambda: read_spec(small), args.repeats)
    jobs, small_jobs = args.seeds * args.resplits, args.seeds
    values, small_values = matrix_values(spec), matrix_values(small_spec)
    print(
        f"spec: {CONFIG.relative_to(REPO)}, matrix seed 0..{args.seeds - 1} x resplits "
        f"1..{args.resplits} ({jobs} training jobs), evaluate {WAY}w{SHOT}s, compare resplits; "
        f"median of {args.repeats}"
    )
    print(f"(a) read_spec, {jobs} training jobs ({values} matrix values): {seconds:.3f} s")
    print(
        f"(a) read_spec, {small_jobs} training jobs ({small_values} matrix values): "
        f"{small_seconds:.3f} s"
    )
    print(
        f"(a) read_spec ratio {seconds / small_seconds:.2f}x for {jobs / small_jobs:.1f}x the "
        f"jobs and {values / small_values:.2f}x the values: checked once per value, not per job"
    )
    seconds, sweep = timed(lambda: expand(spec, spec.folder), args.repeats)
    print(
        f"(a) expand to {len(sweep.jobs)} jobs ({len(sweep.training)} training, "
        f"{len(sweep.evaluations)} evaluations): {seconds:.3f} s"
    )
    seconds, _ = timed(lambda: check_owners(sweep), args.repeats)
    print(f"(a) owner checks of {len(sweep.jobs)} job folders (none made yet): {seconds:.3f} s")
    seconds, plan = timed(lambda: plan_lines(sweep), args.repeats)
    lines = len(plan.splitlines())
    print(f"(a) plan_lines of {len(sweep.jobs)} jobs ({lines} lines): {seconds:.3f} s")
    settings = SweepSettings(spec=str(large), plan=True, out=str(spec.folder))
    seconds, _ = timed(quiet(lambda: run_sweep(settings)), args.repeats)
    print(
        f"(a) fewshot sweep SPEC --plan, whole (run_sweep, {len(sweep.jobs)} jobs): {seconds:.3f} s"
    )
    return large


def pickle_tasks(tasks: list[Task], folder: Path) -> int:
    """Pickle one DelayedSubmission(SlurmTask(), task) a file, as submitit's map_array does;
    the bytes written."""
    import submitit

    folder.mkdir(parents=True, exist_ok=True)
    function = slurm.SlurmTask()  # map_array's one callable, pickled with each task
    written = 0
    for index, task in enumerate(tasks):
        path = folder / f"{index}.pkl"
        submitit.helpers.DelayedSubmission(function, task).dump(path)
        written += path.stat().st_size
    return written


@contextlib.contextmanager
def stub_sbatch(folder: Path) -> Iterator[None]:
    """An `sbatch` first on the PATH that answers a job id and submits nothing."""
    folder.mkdir(parents=True, exist_ok=True)
    sbatch = folder / "sbatch"
    sbatch.write_text("#!/bin/sh\necho 'Submitted batch job 4242'\n", encoding="utf-8")
    sbatch.chmod(0o755)
    path = os.environ["PATH"]
    os.environ["PATH"] = f"{folder}{os.pathsep}{path}"
    try:
        yield
    finally:
        os.environ["PATH"] = path


def submitit_executor(folder: Path, parallelism: int) -> Any:
    """submitit's Slurm executor with the parameters SlurmExecutor gives it (its defaults)."""
    import submitit

    options = slurm.SlurmOptions(parallelism=parallelism)
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    executor.update_parameters(
        timeout_min=options.time_min,
        cpus_per_task=options.cpus,
        slurm_array_parallelism=options.parallelism,
    )
    return executor


def submit_arrays(executor: Any, tasks: list[Task], size: int) -> list:
    """Submit `tasks` as SlurmExecutor does: map_array once per array of at most `size`; the
    jobs."""
    arrays = slurm.array_chunks(tasks, size)
    return [job for array in arrays for job in executor.map_array(slurm.SlurmTask(), array)]


def forget(jobs: list) -> None:
    """Take the stub's job ids out of submitit's watcher of Slurm jobs (one for the process): a
    real sweep later in this process (the test suite's) would ask sacct about them too."""
    for job in jobs:
        job.watcher._registered.discard(job.job_id)


def cluster_answer() -> str | None:
    """None where a Slurm cluster answers `sinfo`; otherwise why not, in a few words."""
    if shutil.which("sinfo") is None:
        return "no sinfo on the PATH"
    try:
        done = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer in 20 s"
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return f"sinfo: {lines[-1] if lines else f'exit status {done.returncode}'}"
    return None


def real_array(folder: Path, size: int) -> None:
    """Submit an array of `size` `true` commands through submitit, time it, cancel it."""
    import submitit

    executor = submitit_executor(folder, parallelism=size)
    executor.update_parameters(timeout_min=1)
    start = time.perf_counter()
    jobs = executor.map_array(submitit.helpers.CommandFunction(["true"]), range(size))
    seconds = time.perf_counter() - start
    array = jobs[0].job_id.split("_")[0]
    subprocess.run(["scancel", array], check=False, timeout=60)
    forget(jobs)
    print(
        f"(b) real Slurm: an array of {len(jobs)} `true` tasks submitted through submitit in "
        f"{seconds:.3f} s (array {array}, cancelled)"
    )


def submission(spec_path: Path, root: Path, args: argparse.Namespace) -> None:
    """(b): what submitting the large spec's training jobs as Slurm arrays costs here."""
    spec = read_spec(spec_path)
    sweep = expand(spec, root / "submitted")
    # Once as first submitted (each command.txt written), then as a sweep submitted again
    # (each one there already: read by the owner check, not written again).
    seconds, tasks = timed(lambda: [job.prepare() for job in sweep.training], 1)
    again, _ = timed(lambda: [job.prepare() for job in sweep.training], args.repeats)
    print(
        f"(b) Task list of {len(tasks)} training jobs (Job.prepare): {seconds:.3f} s the first "
        f"time (each command.txt written atomically, fsync), {again:.3f} s again"
    )
    try:
        import submitit  # noqa: F401 (the slurm extra)
    except ImportError:
        print("(b) pickling and map_array: skipped (no submitit: pip install 'fewshot[slurm]')")
    else:
        runs = iter(range(args.repeats))
        seconds, written = timed(
            lambda: pickle_tasks(tasks, root / "pickles" / str(next(runs))), args.repeats
        )
        print(
            f"(b) {len(tasks)} DelayedSubmission(SlurmTask(), task) pickled a file each "
            f"(cloudpickle, as map_array): {seconds:.3f} s, {written / len(tasks):.0f} bytes each"
        )
        arrays = len(slurm.array_chunks(tasks, args.array_size))
        # The arrays share --parallelism, as in SlurmExecutor.
        parallelism = max(1, slurm.SlurmOptions().parallelism // arrays)
        executor = submitit_executor(root / "slurm", parallelism)
        with stub_sbatch(root / "bin"):
            every: list = []  # the jobs of every repeat, forgotten after
            seconds, _ = timed(
                lambda: every.extend(submit_arrays(executor, tasks, args.array_size)),
                args.repeats,
            )
            forget(every)
        print(
            f"(b) submitit map_array of {len(tasks)} tasks as {arrays} arrays, a stub sbatch "
            f"(pickles, sbatch files, each pickle moved): {seconds:.3f} s"
        )
    arrays = len(slurm.array_chunks(tasks, args.array_size))
    print(
        f"(b) arrays of at most {args.array_size} tasks for {len(tasks)} jobs: {arrays} "
        "(slurm.array_chunks)"
    )
    settings = SweepSettings(spec=str(spec_path), plan=True, out=str(sweep.folder))
    seconds, _ = timed(quiet(lambda: run_sweep(settings)), args.repeats)
    print(
        f"(b) fewshot sweep SPEC --plan of the submitted sweep ({len(tasks)} command.txt read): "
        f"{seconds:.3f} s"
    )
    why = "--no-cluster" if args.no_cluster else cluster_answer()
    if why is None:
        real_array(root / "real-slurm", args.array_size)
    else:
        print(f"(b) real Slurm submission: skipped ({why})")


def eval_record(job_argv: tuple[str, ...], run: str, accuracies: numpy.ndarray) -> dict:
    """The record `fewshot eval --per-episode --out` writes of one evaluation."""
    values = torch.from_numpy(accuracies)
    digest = hashlib.sha256(run.encode()).hexdigest()
    return {
        "checkpoint": job_argv[job_argv.index("--checkpoint") + 1],
        "checkpoint_sha256": digest,
        "stage": "train",
        "method": "embedding",
        "head": "protonet",
        "head_options": {},
        "method_options": {},
        "eval_head_options": {},
        "dataset": "omniglot",
        "split": "test",
        "classifier": None,
        "classifier_options": {},
        "transductive": False,
        "precision": "float32",
        "cache": True,
        "dataset_fingerprint": hashlib.sha256(b"omniglot test").hexdigest(),
        "accuracy": 100 * float(values.double().mean()),
        "ci95": 100 * ci95(values),
        "episodes": len(accuracies),
        "way": WAY,
        "shot": SHOT,
        "query": QUERY,
        "seed": 0,
        "accuracies": accuracies.tolist(),
    }


def finish(sweep: Sweep, episodes: int) -> None:
    """Make every job of `sweep` done: command.txt and done.json in each folder, and each
    evaluation's per-episode result (accuracy near 96%, up 0.2 points a resplit)."""
    rng = numpy.random.default_rng(0)
    queries = WAY * QUERY
    for job in sweep.jobs:
        task = job.prepare()
        if not job.training:
            values = dict(part.split("=") for part in job.run.split(","))
            mean = 0.955 + 0.002 * (int(values["resplits"]) - 1) + rng.normal(0, 0.004)
            accuracies = rng.binomial(queries, min(mean, 1.0), size=episodes) / queries
            record = eval_record(job.argv, job.run, accuracies)
            atomic_write_json(record, job.result)  # as fewshot eval writes it
        record_end(task, 0, 60.0 if job.training else 5.0)


def the_report(root: Path, args: argparse.Namespace) -> None:
    """(c): the report of a finished sweep of seeds x resplits evaluations."""
    path = write_spec(root, "finished", args.report_seeds, args.resplits, args.episodes)
    spec = read_spec(path)
    sweep = expand(spec, spec.folder)
    start = time.perf_counter()
    finish(sweep, args.episodes)
    made = time.perf_counter() - start
    if any(job.state != DONE_STATE for job in sweep.jobs):  # else run_sweep would run them
        raise SystemExit(f"the finished sweep in {sweep.folder} has jobs not done")
    size = sum(job.result.stat().st_size for job in sweep.evaluations)
    print(
        f"(c) finished sweep: {len(sweep.training)} training runs, {len(sweep.evaluations)} "
        f"evaluations of {args.episodes} episodes ({size / 2**20:.1f} MiB of results; made in "
        f"{made:.1f} s, untimed)"
    )
    write_report(spec, sweep, None)  # untimed: the first imports scipy.stats (half a second)
    seconds, _ = timed(lambda: write_report(spec, sweep, None), args.repeats)
    report = json.loads((sweep.folder / "report.json").read_text(encoding="utf-8"))
    comparisons = report["comparisons"]
    seeds = len(comparisons[0]["seeds"]) if comparisons else 0
    print(
        f"(c) write_report: {seconds:.3f} s ({len(report['evaluations'])} evaluations, "
        f"{len(comparisons)} comparisons of two resplits values, {seeds} paired seeds each)"
    )
    settings = SweepSettings(spec=str(path), out=str(sweep.folder))
    seconds, _ = timed(quiet(lambda: run_sweep(settings)), args.repeats)
    print(f"(c) fewshot sweep SPEC, every job done (run_sweep: the report only): {seconds:.3f} s")
    if comparisons:
        first = comparisons[0]
        print(
            f"(c) report: {first['b']} - {first['a']} {first['cell']}: "
            f"{first['difference']:+.2f} ± {first['difference_ci95']:.2f} points, "
            f"p {first['p_value']:.3g}"
        )


def cpu_model() -> str:
    """The CPU's model name (Linux), or the platform's word for it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load() -> str:
    """The load averages over 1, 5 and 15 minutes."""
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def main() -> None:
    """Time the three parts and print a line per figure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=1000, help="(a, b) seeds of the matrix")
    parser.add_argument("--resplits", type=int, default=10, help="resplits values 1..R")
    parser.add_argument("--report-seeds", type=int, default=100, help="(c) seeds of the matrix")
    parser.add_argument("--episodes", type=int, default=1000, help="episodes of each evaluation")
    parser.add_argument("--array-size", type=int, default=ARRAY_SIZE, help="tasks an array holds")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each timing (median)")
    parser.add_argument("--folder", help="where the sweeps are made (default: a temp folder)")
    parser.add_argument("--no-cluster", action="store_true", help="no real Slurm submission")
    parser.add_argument("--smoke", action="store_true", help="small sizes, one run, no cluster")
    args = parser.parse_args()
    if args.smoke:
        args.seeds, args.report_seeds, args.resplits, args.episodes = 20, 4, 3, 50
        args.array_size, args.repeats, args.no_cluster = 16, 1, True
    print(f"cpu: {cpu_model()}, {os.cpu_count()} cores, load average {load()}")
    with tempfile.TemporaryDirectory(dir=args.folder, prefix="bench_sweep_scale.") as temp:
        root = Path(temp)
        large = the_spec(root, args)
        submission(large, root, args)
        the_report(root, args)
    print(f"load average at the end {load()}")


if __name__ == "__main__":
    main()
