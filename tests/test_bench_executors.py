"""`fewshot bench --executor`: each (model, cell) a `fewshot bench` job of its own, run by the
sweeps' executors; the results those of the in-process bench, done jobs skipped, a failed job
named with its log while the others are ranked, the plan, the executors' flags refused where
they do nothing and a missing tool named in one line; the Slurm executor's batches cut into
arrays under the cluster's MaxArraySize; and a bench through a real one-node Slurm cluster
(skipped without one, as tests/test_sweeps_slurm.py is)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from cli_errors import error_line
from test_bench import ZOO, final_error, standings
from test_bench import bench as bench  # the fixtures: a tiny model, a small suite, bench(...)
from test_bench import model as model
from test_bench import suite as suite
from test_sweeps_slurm import cluster_up

import fewshot.sweeps.slurm
from fewshot.benchmark.results import read_results
from fewshot.sweeps.executors import Task
from fewshot.sweeps.slurm import SlurmExecutor, SlurmOptions, array_chunks, max_array_size

CELLS = ("5w1s", "5w5s")


def results_of(folder: Path) -> dict[tuple[str, str], dict]:
    """Each (model, cell)'s result record in a bench folder's results/."""
    records = {}
    for result in read_results(folder / "results", "tiny-v1", False):
        records[result.name, result.cell] = json.loads(result.path.read_text())
    return records


def test_jobs_on_local_workers_give_the_results_of_the_bench_in_this_process(
    model, suite, bench, tmp_path, capsys
):
    alone, jobs = tmp_path / "alone", tmp_path / "jobs"
    assert bench(suite, model, ZOO, "--out", alone, "--name", "tiny", "zoo") == 0
    flags = ("--executor", "local", "--workers", "2", "--name", "tiny", "zoo")
    assert bench(suite, model, ZOO, "--out", jobs, *flags) == 0
    printed = capsys.readouterr().out
    assert "running 4 of 4 evaluations as jobs" in printed and "leaderboard in " in printed
    want, got = results_of(alone), results_of(jobs)
    assert sorted(got) == [(name, cell) for name in ("tiny", "zoo") for cell in CELLS]
    for key, record in want.items():
        assert got[key]["correct"] == record["correct"], key
        assert got[key]["accuracy"] == record["accuracy"], key
        assert got[key]["episodes_sha256"] == record["episodes_sha256"], key
    assert standings(jobs) == standings(alone)
    # Each job in its folder: its log, its status, its command (one model on one cell).
    for name in ("tiny", "zoo"):
        for cell in CELLS:
            folder = jobs / "jobs" / name / cell
            assert (folder / "log.txt").is_file() and not (folder / "failed.json").exists()
            command = shlex.split(json.loads((folder / "done.json").read_text())["command"])
            assert command[:2] == ["fewshot", "bench"] and command[3] in (model, str(ZOO))
            assert command[command.index("--cells") + 1] == cell
            assert command[command.index("--name") + 1] == name
            assert command[command.index("--out") + 1] == str(jobs)
            assert "--no-stored" in command and "--device" in command
    # Run again: every job is done, none runs, nothing is written again but the leaderboard.
    logs = {path: path.read_text() for path in (jobs / "jobs").rglob("log.txt")}
    times = {path: path.stat().st_mtime_ns for path in (jobs / "results").rglob("*.json")}
    assert bench(suite, model, ZOO, "--out", jobs, *flags) == 0
    assert "running" not in capsys.readouterr().out
    assert {path: path.read_text() for path in logs} == logs
    assert {path: path.stat().st_mtime_ns for path in times} == times


def test_a_failed_job_is_named_with_its_log_and_the_others_ranked(
    model, suite, bench, tmp_path, capsys
):
    out, missing = tmp_path / "bench", tmp_path / "missing.pt"
    assert bench(suite, model, missing, "--out", out, "--executor", "local", "--workers", 2) == 2
    err = final_error(capsys)
    logs = [out / "jobs" / "missing" / cell / "log.txt" for cell in CELLS]
    assert err == (
        f"fewshot bench: error: 2 of 4 evaluations failed: missing on 5w1s (log {logs[0]}); "
        f"missing on 5w5s (log {logs[1]}) (the others are ranked)"
    )
    for log in logs:
        record = json.loads((log.parent / "failed.json").read_text())
        assert record["status"] == 2 and "checkpoint not found" in record["last_lines"][-1]
    assert standings(out) == {cell: [("tiny", 1.0)] for cell in CELLS}
    # The plan: the done jobs, and the failed ones that the next run runs again.
    assert bench(suite, model, missing, "--out", out, "--executor", "local", "--plan") == 0
    assert capsys.readouterr().out.splitlines() == [
        f"4 evaluations, results in {out / 'results'}, jobs in {out / 'jobs'}:",
        "  tiny on 5w1s: done",
        "  tiny on 5w5s: done",
        "  missing on 5w1s: failed, to run again",
        "  missing on 5w5s: failed, to run again",
    ]
    missing.symlink_to(model)
    assert bench(suite, model, missing, "--out", out, "--executor", "local") == 0
    assert "running 2 of 4 evaluations as jobs" in capsys.readouterr().out
    for log in logs:
        assert (log.parent / "done.json").is_file() and not (log.parent / "failed.json").exists()
    assert {name for name, _ in standings(out)["5w1s"]} == {"missing", "tiny"}


def test_the_plan_lists_the_jobs_and_runs_none(model, suite, bench, tmp_path, capsys):
    out = tmp_path / "bench"
    assert bench(suite, model, "--out", out, "--cells", "5w1s") == 0  # in this process
    capsys.readouterr()
    for flags, tail in (((), ""), (("--overwrite",), ", to run again (--overwrite)")):
        assert bench(suite, model, "--out", out, "--executor", "local", "--plan", *flags) == 0
        assert capsys.readouterr().out.splitlines() == [
            f"2 evaluations, results in {out / 'results'}, jobs in {out / 'jobs'}:",
            f"  tiny on 5w1s: result present{tail}",
            "  tiny on 5w5s: to run",
        ]
    assert bench(suite, model, "--out", out, "--executor", "local", "--plan", "--limit", 5) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(f"jobs in {out / 'first-5' / 'jobs'}:")
    assert lines[1:] == ["  tiny on 5w1s: to run", "  tiny on 5w5s: to run"]
    assert not (out / "jobs").exists() and not (out / "first-5").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--executor", "local", "--partition", "gpu"], "--partition does not apply to --executor"),
        (["--executor", "local", "--time-min", "5"], "--time-min does not apply to --executor loc"),
        (["--executor", "local", "--gpus", "1"], "--gpus does not apply to --executor local"),
        (["--executor", "slurm", "--workers", "2"], "--workers does not apply to --executor slurm"),
        (["--workers", "2"], "--workers does not apply to a run without --executor (got 2; "),
        (["--cpus", "4"], "--cpus does not apply to a run without --executor"),
        (["--executor", "ray"], "--executor must be one of local, slurm, got 'ray'"),
    ],
)
def test_an_executors_flags_are_refused_where_they_do_nothing(tmp_path, capsys, flags, message):
    out = tmp_path / "bench"
    args = ["bench", "omniglot-v1", "conv4", "--out", str(out), "--no-stored", *flags]
    assert message in error_line(capsys, args)
    assert not out.exists()
    # The sweep's are the same settings.
    if "--executor" in flags and flags[1] == "local":
        assert message in error_line(capsys, ["sweep", "spec.yaml", *flags])


@pytest.mark.parametrize("missing", ["submitit", "sbatch"])
def test_a_missing_slurm_tool_is_named_in_one_line_with_how_to_get_it(
    model, suite, tmp_path, capsys, monkeypatch, tiny_omniglot_root, missing
):
    if missing == "submitit":
        monkeypatch.setitem(sys.modules, "submitit", None)  # its import fails
        want = "--executor slurm needs submitit: pip install 'fewshot[slurm]'"
    else:
        real = fewshot.sweeps.slurm.shutil.which
        monkeypatch.setattr(
            fewshot.sweeps.slurm.shutil,
            "which",
            lambda name, *args, **kwargs: None if name == "sbatch" else real(name, *args, **kwargs),
        )
        want = "--executor slurm needs Slurm's sbatch on the PATH"
    out = tmp_path / "bench"
    args = ["bench", suite, model, "--out", str(out), "--no-stored", "--executor", "slurm"]
    err = error_line(capsys, [*args, "--data-root", str(tiny_omniglot_root)])
    assert err.startswith(f"fewshot bench: error: {want}")
    if missing == "sbatch":
        assert err.endswith("scripts/slurm_cluster.sh starts a one-node cluster for tests)")
    assert not (out / "jobs").exists() and not (out / "manifests").exists()


def test_a_batch_is_cut_into_arrays_under_max_array_size():
    tasks = [Task(("eval", str(i)), Path(str(i))) for i in range(7)]
    assert [len(array) for array in array_chunks(tasks, 3)] == [3, 3, 1]
    assert [task for array in array_chunks(tasks, 3) for task in array] == tasks
    assert array_chunks(tasks, 7) == [tasks] and array_chunks(tasks, 1000) == [tasks]
    assert array_chunks([], 3) == []


class FakeJob:
    """A submitit job that ended with exit status 0."""

    def __init__(self, job_id: str):
        self.job_id = job_id

    def result(self) -> int:
        """The task's exit status."""
        return 0


class FakeSubmitit:
    """The submitit module as the Slurm executor calls it: its AutoExecutor (this object)
    records the parameters and each array it submits."""

    def __init__(self) -> None:
        self.AutoExecutor = self.executor
        self.arrays: list[list[Task]] = []
        self.parameters: dict = {}

    def executor(self, folder: Path, cluster: str) -> FakeSubmitit:
        """AutoExecutor(folder=..., cluster="slurm"): this object."""
        assert cluster == "slurm" and folder
        return self

    def update_parameters(self, **parameters) -> None:
        """Record the parameters."""
        self.parameters = parameters

    def map_array(self, fn, tasks: list[Task]) -> list[FakeJob]:
        """Record the array and 'submit' it: its jobs' ids are ARRAY_INDEX."""
        self.arrays.append(tasks)
        array = 100 + len(self.arrays)
        return [FakeJob(f"{array}_{i}") for i in range(len(tasks))]


@pytest.mark.parametrize(("limit", "sizes"), [(4, [3, 3, 1]), (1001, [7])])
def test_the_slurm_executor_submits_one_array_per_chunk(
    tmp_path, capsys, monkeypatch, limit, sizes
):
    submitit = FakeSubmitit()
    monkeypatch.setattr(fewshot.sweeps.slurm, "submitit_module", lambda: submitit)
    monkeypatch.setattr(fewshot.sweeps.slurm, "max_array_size", lambda: limit)
    tasks = [Task(("eval", str(i)), tmp_path / str(i)) for i in range(7)]
    outcomes = SlurmExecutor(tmp_path, SlurmOptions(parallelism=64)).run(tasks)
    assert [len(array) for array in submitit.arrays] == sizes
    assert [task for array in submitit.arrays for task in array] == tasks
    assert [outcome.task for outcome in outcomes] == tasks
    assert all(outcome.status == 0 for outcome in outcomes)
    # The arrays share the jobs running at once.
    assert submitit.parameters["slurm_array_parallelism"] == 64 // len(sizes)
    printed = capsys.readouterr().out.splitlines()[0]
    if len(sizes) == 1:
        assert printed == "submitted 7 jobs (array 101)"
    else:
        assert printed == (
            "submitted 7 jobs as 3 arrays (the cluster's MaxArraySize is 4): 101, 102, 103"
        )


def test_max_array_size_is_the_clusters_or_slurms_default(tmp_path, monkeypatch):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\necho 'MaxJobCount             = 10000'\n")
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    max_array_size.cache_clear()
    try:
        assert max_array_size() == 1001  # not said: Slurm's default
        max_array_size.cache_clear()
        scontrol.write_text("#!/bin/sh\necho 'MaxArraySize            = 40001'\n")
        assert max_array_size() == 40001
        scontrol.write_text("#!/bin/sh\necho 'MaxArraySize            = 5'\n")
        assert max_array_size() == 40001  # read once
        max_array_size.cache_clear()
        scontrol.unlink()
        assert max_array_size() == 1001  # no scontrol
    finally:
        max_array_size.cache_clear()


@pytest.mark.slow
@pytest.mark.skipif(
    not cluster_up(),
    reason="no Slurm cluster here: start one with scripts/slurm_cluster.sh install && "
    "scripts/slurm_cluster.sh start (as root; .ci/run does)",
)
def test_a_bench_runs_as_a_job_array_on_a_slurm_cluster(model, suite, bench, tmp_path, capsys):
    alone, jobs = tmp_path / "alone", tmp_path / "jobs"
    assert bench(suite, model, "--out", alone) == 0
    assert bench(suite, model, "--out", jobs, "--executor", "slurm", "--time-min", "10") == 0
    printed = capsys.readouterr().out
    assert "submitted 2 jobs (array " in printed
    assert len(list((jobs / "slurm").glob("*_log.out"))) == 2  # one Slurm log a job
    want, got = results_of(alone), results_of(jobs)
    assert sorted(got) == [("tiny", cell) for cell in CELLS]
    for key, record in want.items():
        assert got[key]["correct"] == record["correct"], key
    for cell in CELLS:
        assert (jobs / "jobs" / "tiny" / cell / "done.json").is_file()
    assert standings(jobs) == standings(alone)
    # Entered again: nothing is submitted.
    assert bench(suite, model, "--out", jobs, "--executor", "slurm") == 0
    assert "submitted" not in capsys.readouterr().out
