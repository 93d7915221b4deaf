"""`fewshot sweep`: a spec's errors in one line, its plan, its jobs run on local workers and
skipped once done, an interrupted job resumed to the very weights of an uninterrupted one, a
failed job named while the others finish and run again on request, and a report whose
comparisons are the paired t-test's numbers."""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from cli_errors import error_line
from scipy import stats

from fewshot.benchmark.results import slug
from fewshot.cli.main import build_parser, main
from fewshot.runtime.io import load_checkpoint
from fewshot.runtime.settings import build
from fewshot.sweeps.executors import Task, command_line, record_end
from fewshot.sweeps.jobs import expand
from fewshot.sweeps.spec import read_spec
from fewshot.training.settings import TrainSettings, read_config_file

REPO = Path(__file__).resolve().parents[1]
CONFIG = "models/omniglot/quickstart.json"
# Seconds-long runs on the tests' tiny Omniglot (data/, linked into each test's folder).
TINY = {"epochs": 1, "episodes_per_epoch": 2, "val_episodes": 2, "way": 5, "query": 2}
TINY |= {"data_root": "data", "device": "cpu"}
SUITE = {  # one cell of four test episodes
    "name": "tiny",
    "version": 1,
    "description": "a test's suite",
    "dataset": "omniglot",
    "cells": [{"name": "5w1s", "way": 5, "shot": 1, "episodes": 4}],
}


@pytest.fixture(autouse=True)
def folder(tmp_path, monkeypatch, tiny_omniglot_root) -> Path:
    """Each test runs in a folder of its own holding the shipped configs and the tiny data."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").symlink_to(REPO / "models")
    (tmp_path / "data").symlink_to(tiny_omniglot_root)
    return tmp_path


def write_spec(path: str = "spec.yaml", **keys) -> str:
    """A spec of the quickstart config's tiny runs, with `keys` set; returns its path."""
    spec = {"name": "demo", "config": CONFIG, "out": "sweep", "overrides": dict(TINY)}
    spec["matrix"] = {"seed": [0, 1]}
    Path(path).write_text(yaml.safe_dump({**spec, **keys}, sort_keys=False))
    return path


def sweep(*flags: str) -> int:
    """`fewshot sweep spec.yaml FLAGS`'s exit status."""
    return main(["sweep", "spec.yaml", *flags])


@pytest.mark.parametrize(
    ("keys", "text", "message"),
    [
        ({"colour": "red"}, None, "spec.yaml: unknown keys colour"),
        ({"name": 3}, None, 'spec.yaml: "name" must be a string'),
        ({"overrides": {"epoch": 1}}, None, 'overrides key "epoch" is not a setting'),
        ({"overrides": {"epochs": 0}}, None, 'spec.yaml overrides: "epochs" must be >= 1'),
        ({"matrix": {"resplits": [1, 0]}}, None, 'spec.yaml matrix: "resplits" must be >= 1'),
        ({"matrix": {"sed": [0]}}, None, 'matrix key "sed" is not a setting'),
        ({"config": "models/nope.json"}, None, "spec.yaml: config file not found: models/nope"),
        ({"matrix": {"seed": []}}, None, '"matrix.seed" must be a list of one value or more'),
        ({"matrix": {"train_split": ["a b", "a_b"]}}, None, "both name the run folder"),
        ({"compare": "resplits"}, None, '"compare" must name a matrix key other than seed'),
        (
            {"matrix": {"resplits": [1, 5], "seed": [0, 1]}, "compare": "resplits"},
            None,
            '"compare" needs evaluate',
        ),
        ({"evaluate": {"shapes": [{"way": 1, "shot": 1}]}}, None, 'shape 1: "way" must be >= 2'),
        ({"evaluate": {"suite": "nope-v1"}}, None, 'spec.yaml evaluate: "suite" no suite \'nope'),
        ({"overrides": {"val_way": None}}, None, '"val_way" cannot be given on a command line'),
        ({}, "name: [\n", "spec.yaml is not valid YAML"),
        ({"matrix": {"arm": {"a": {"hed": "ridge"}}}}, None, 'matrix key "hed" is not a setting'),
        ({"matrix": {"arm": {"a": 3}}}, None, "named variants must each be a mapping"),
        (
            {"config": None, "matrix": {"arm": {"a": {"config": CONFIG}, "b": {"head": "ridge"}}}},
            None,
            '"config" must be given (or a config key in every named variant)',
        ),
        ({"matrix": {"arm": {"a": {"config": "nope.json"}}}}, None, "config file not found"),
        ({"matrix": [{"seed": [0]}, {"resplits": [1]}]}, None, "must have the first block's keys"),
        ({"matrix": [{"seed": [0]}, {"seed": [0]}]}, None, "gives the run seed=0 twice"),
        ({"matrix": {"arm": {"a": {"epochs": 2}}}}, None, "and overrides both set 'epochs'"),
        (
            {"evaluate": {"shapes": [{"way": 5, "shot": 1}], "options": {"way": 20}}},
            None,
            'evaluate options: "way" is given by the spec itself',
        ),
        (
            {"evaluate": {"shapes": [{"way": 5, "shot": 1}], "options": {"inner_step": 3}}},
            None,
            'evaluate options: "inner_step" is not a setting of fewshot eval',
        ),
        (
            {"evaluate": {"shapes": [{"way": 5, "shot": 1}], "options": {"query": 0}}},
            None,
            'evaluate options: "query" must be >= 1',
        ),
        ({"evaluate": {"suite": "x.yaml", "options": {"query": 3}}}, None, "give shapes too"),
        ({"evaluate": {"shapes": [{"way": 5, "shot": 1}], "checkpoint": "mid"}}, None, "mid"),
    ],
)
def test_a_bad_spec_is_one_line_naming_the_file_and_the_key(capsys, keys, text, message):
    write_spec(**keys)
    if text is not None:
        Path("spec.yaml").write_text(text)
    assert message in error_line(capsys, ["sweep", "spec.yaml"])
    assert not Path("sweep").exists()  # refused before any job


def test_the_plan_lists_every_job_with_its_state_and_runs_nothing(capsys):
    write_spec(
        matrix={"resplits": [1, 5], "seed": [0, 1]}, evaluate={"shapes": [{"way": 5, "shot": 1}]}
    )
    jobs = expand(read_spec(Path("spec.yaml")), Path("sweep")).training
    for job, state in zip(jobs, ("done.json", "failed.json", "last.pt"), strict=False):
        job.prepare()  # its command.txt: the folder is this sweep's
        (job.folder / state).write_text("{}")
    assert sweep("--plan") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "sweep demo in sweep: training jobs: 4 (1 done, 1 failed, 1 to resume, 1 to run), "
        "evaluations: 4 (4 to run)"
    )
    assert lines[1:5] == [
        "  train resplits=1,seed=0: done",
        "  train resplits=1,seed=1: failed",
        "  train resplits=5,seed=0: to resume",
        "  train resplits=5,seed=1: to run",
    ]
    assert lines[5] == "  eval resplits=1,seed=0 5w1s: to run"
    assert not jobs[3].folder.exists() and not Path("sweep/evals").exists()
    # A folder another command wrote is refused before anything runs.
    (jobs[0].folder / "command.txt").write_text("fewshot train --epochs 9\n")
    assert "holds another job" in error_line(capsys, ["sweep", "spec.yaml"])


def test_each_jobs_command_line_builds_the_settings_the_spec_gives(capsys):
    for name in ("my images", "b"):
        Path(name).mkdir()
    # JSON lists and objects, words (one with a space), booleans, numbers, a value like a flag.
    overrides = {**TINY, "lr_schedule": [[1, 0.5]], "head": "ridge", "head_options": {"lam": 2.0}}
    overrides |= {"extra_data": ["folder:my images", "folder:b"]}
    matrix = {
        "channels_last": [True, False],
        "label_smoothing": [0, 0.1],
        "val_split": ["val", "-v"],
    }
    write_spec(overrides=overrides, matrix=matrix)
    spec = read_spec(Path("spec.yaml"))
    config = read_config_file(CONFIG)
    for job in expand(spec, Path("sweep")).training:
        args = build_parser().parse_args(shlex.split(command_line(job.argv))[1:])
        _, settings = args._command.build_settings(args)
        values = dict(part.split("=") for part in job.run.split(","))
        given = {k: yaml.safe_load(v) for k, v in values.items()}
        want = build(
            TrainSettings, [("c", config), ("s", {**overrides, **given, "out": str(job.folder)})]
        )
        assert settings == want, job.run


def test_named_variants_and_blocks_give_each_job_its_settings_and_config(capsys):
    # A variant sets several settings, or its own config file; a second block adds one cell.
    Path("other.json").write_text(json.dumps({**read_config_file(CONFIG), "lr": 0.01}))
    variants = {"proto": {"head": "protonet"}, "ridge": {"head": "ridge", "config": "other.json"}}
    matrix = [
        {"arm": variants, "resplits": [1, 5], "seed": [0, 1]},
        {"arm": {"proto": variants["proto"]}, "resplits": [10], "seed": [0, 1]},
    ]
    evaluate = {"shapes": [{"way": 5, "shot": 1}], "checkpoint": "best"}
    evaluate |= {"options": {"query": 3, "classifier": "centroid"}}
    write_spec(matrix=matrix, evaluate=evaluate, compare="resplits")
    assert sweep("--plan") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("sweep demo in sweep: training jobs: 10 (10 to run)")
    assert "  train arm=proto,resplits=10,seed=1: to run" in lines
    assert not any("arm=ridge,resplits=10" in line for line in lines)
    spec = read_spec(Path("spec.yaml"))
    flags = ("--query", "3", "--classifier", "centroid")
    sweep_jobs = expand(spec, Path("sweep"), flags)
    for job in sweep_jobs.training:
        args = build_parser().parse_args(shlex.split(command_line(job.argv))[1:])
        _, settings = args._command.build_settings(args)
        parts = dict(job.parts)
        ridge = parts["arm"] == "arm=ridge"
        config = read_config_file("other.json" if ridge else CONFIG)
        given = {"head": "ridge" if ridge else "protonet", "seed": int(parts["seed"][5:])}
        given |= {"resplits": int(parts["resplits"][9:]), "out": str(job.folder)}
        assert settings == build(TrainSettings, [("c", config), ("s", {**TINY, **given})])
    evaluation = sweep_jobs.evaluations[0]
    assert evaluation.argv[:3] == (
        "eval",
        "--checkpoint",
        f"{sweep_jobs.training[0].folder}/best.pt",
    )
    assert evaluation.argv[evaluation.argv.index("--query") + 1] == "3"


def write_result(run: str, accuracies: list[float], shape: str = "5w1s") -> None:
    """An eval job's result file, as fewshot eval --per-episode writes its accuracy."""
    path = Path(f"sweep/evals/{run}/{shape}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    mean = 100 * sum(accuracies) / len(accuracies)
    record = {"accuracy": mean, "ci95": 1.0, "episodes": len(accuracies), "accuracies": accuracies}
    path.write_text(json.dumps(record))


def test_evaluations_present_need_no_training_and_every_pair_of_arms_is_compared(capsys):
    # The recorded evaluations of a study whose run folders are not here: the sweep trains
    # nothing, and compares U1, U2, U3 pairwise across the seeds.
    evaluate = {"shapes": [{"way": 5, "shot": 1}], "episodes": 2}
    write_spec(
        matrix={"resplits": [1, 2, 3], "seed": [0, 1, 2]}, evaluate=evaluate, compare="resplits"
    )
    scores = {u: [0.5 + 0.1 * u + 0.03 * s * s * u for s in range(3)] for u in (1, 2, 3)}
    for u, values in scores.items():
        for s, value in enumerate(values):
            write_result(f"resplits={u},seed={s}", [value, value])
    assert sweep("--plan") == 0
    assert "training jobs: 9 (9 evaluated), evaluations: 9 (9 done)" in capsys.readouterr().out
    assert sweep() == 0
    assert "running" not in capsys.readouterr().out and not Path("sweep/runs").exists()
    report = json.loads(Path("sweep/report.json").read_text())
    pairs = [(c["a"], c["b"]) for c in report["comparisons"]]
    assert pairs == [
        ("resplits=1", "resplits=2"), ("resplits=1", "resplits=3"), ("resplits=2", "resplits=3")
    ]  # fmt: skip
    for c in report["comparisons"]:
        a, b = (scores[int(c[arm][-1])] for arm in ("a", "b"))
        mean, half, p = paired([100 * x for x in a], [100 * x for x in b])
        assert c["difference"] == pytest.approx(mean)
        assert c["difference_ci95"] == pytest.approx(half)
        assert c["p_value"] == pytest.approx(p)


def eval_accuracy(run: str, shape: str = "5w1s") -> float:
    """The accuracy a run's eval result file holds."""
    return json.loads(Path(f"sweep/evals/{run}/{shape}.json").read_text())["accuracy"]


def paired(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """b - a across seeds by hand: mean, t interval half-width, the paired t-test's p."""
    diff = [y - x for x, y in zip(a, b, strict=True)]
    n = len(diff)
    mean = sum(diff) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diff) / (n - 1))
    return mean, stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n), stats.ttest_rel(b, a).pvalue


@pytest.mark.slow  # twelve jobs: a minute on two cores
def test_a_sweep_runs_its_jobs_skips_them_once_done_and_compares_the_arms(capsys):
    Path("suite.yaml").write_text(yaml.safe_dump(SUITE))
    shapes = [{"way": 5, "shot": 1}]
    evaluate = {"suite": "suite.yaml", "shapes": shapes, "episodes": 4}
    write_spec(matrix={"resplits": [1, 2], "seed": [0, 1]}, evaluate=evaluate, compare="resplits")
    assert sweep("--workers", "2") == 0
    out = capsys.readouterr().out
    runs = ["resplits=1,seed=0", "resplits=1,seed=1", "resplits=2,seed=0", "resplits=2,seed=1"]
    for run in runs:
        folder = Path("sweep/runs") / run
        command = (folder / "command.txt").read_text()
        assert command.startswith(f"fewshot train --config {CONFIG} --epochs 1 ")
        assert shlex.split(command)[-2:] == ["--out", str(folder)]
        assert json.loads((folder / "done.json").read_text())["status"] == 0
        assert "checkpoints in" in (folder / "log.txt").read_text()
        for evaluation in ("5w1s", "bench"):
            assert (Path("sweep/evals") / run / evaluation / "done.json").is_file()
    report = json.loads(Path("sweep/report.json").read_text())
    assert not report["failed"] and not report["not_run"]
    assert Path("sweep/report.md").read_text() in out
    assert "## Leaderboard: tiny-v1" in out and Path("sweep/bench/leaderboard.md").is_file()
    # The arms by hand: seed i of resplits=1 paired with seed i of resplits=2.
    (shape, cell) = report["comparisons"]
    assert (shape["cell"], cell["cell"]) == ("5w1s", "tiny-v1/5w1s")
    a = [eval_accuracy(run) for run in runs[:2]]
    b = [eval_accuracy(run) for run in runs[2:]]
    assert (shape["a_accuracies"], shape["b_accuracies"]) == (a, b)
    mean, half, p = paired(a, b)
    assert shape["difference"] == pytest.approx(mean)
    assert shape["difference_ci95"] == pytest.approx(half)
    assert shape["p_value"] == pytest.approx(p)
    assert shape["a_mean"] == pytest.approx(sum(a) / 2)
    results = [Path("sweep/bench/results") / slug(run) / "5w1s.json" for run in runs]
    benched = [json.loads(path.read_text())["accuracy"] for path in results]
    assert cell["difference"] == pytest.approx(paired(benched[:2], benched[2:])[0])
    # Run again: every job is done, none runs.
    logs = {path: path.read_text() for path in Path("sweep").rglob("log.txt")}
    assert sweep("--workers", "2") == 0
    assert "done:" not in capsys.readouterr().out
    assert {path: path.read_text() for path in logs} == logs


def start_sweep(*flags: str) -> subprocess.Popen:
    """`fewshot sweep spec.yaml FLAGS` as a process of its own."""
    command = [sys.executable, "-m", "fewshot", "sweep", "spec.yaml", *flags]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_an_interrupted_job_resumes_to_the_weights_of_an_uninterrupted_one(capsys):
    # Two epochs of 40 steps: seconds each, so that a SIGTERM sent when the first epoch's
    # last.pt appears stops the job in its second epoch. Two workers: one thread per job.
    write_spec(overrides={**TINY, "epochs": 2, "episodes_per_epoch": 40}, matrix={"seed": [0]})
    run = Path("sweep/runs/seed=0")
    reference = start_sweep("--workers", "2", "--out", "reference")
    stopped = start_sweep("--workers", "2")
    while not (run / "last.pt").is_file() and stopped.poll() is None:
        time.sleep(0.01)
    stopped.send_signal(signal.SIGTERM)  # what Ctrl-C or a scheduler does
    _, err = stopped.communicate(timeout=300)
    assert stopped.returncode == 128 + signal.SIGTERM, err
    assert err.strip().endswith("interrupted: its jobs stopped; run it again to resume them")
    assert not (run / "done.json").exists() and not (run / "failed.json").exists()
    assert "stopped at epoch" in (run / "log.txt").read_text()
    progress = load_checkpoint(run / "last.pt")["progress"]
    assert progress["epoch"] == 1 and progress["step"] > 0  # within the second epoch
    assert sweep("--workers", "2") == 0  # resumes it
    attempts = [line for line in (run / "log.txt").read_text().splitlines() if line[:2] == "$ "]
    assert len(attempts) == 2 and "--resume" in attempts[1]
    assert reference.wait(timeout=300) == 0, reference.stderr.read()
    want = load_checkpoint(Path("reference/runs/seed=0/last.pt"))["model"]
    got = load_checkpoint(run / "last.pt")["model"]
    assert want.keys() == got.keys()
    for key, value in want.items():
        assert torch.equal(value, got[key]), key


def test_a_failed_job_is_named_while_the_others_finish_and_runs_again_on_request(capsys):
    overrides = {k: v for k, v in TINY.items() if k != "data_root"}
    evaluate = {"shapes": [{"way": 5, "shot": 1}], "episodes": 4}
    write_spec(overrides=overrides, matrix={"data_root": ["data", "missing"]}, evaluate=evaluate)
    failed = Path("sweep/runs/data_root=missing")
    err = error_line(capsys, ["sweep", "spec.yaml", "--workers", "2"])
    assert err.endswith(
        f"1 of 4 jobs failed: train data_root=missing (log {failed / 'log.txt'}); the others are "
        "reported in sweep/report.md"
    )
    record = json.loads((failed / "failed.json").read_text())
    assert record["status"] == 2 and "data root missing is not a folder" in record["last_lines"][-1]
    assert (Path("sweep/evals/data_root=data/5w1s/done.json")).is_file()
    report = Path("sweep/report.md").read_text()
    assert "- eval data_root=missing 5w1s: not run, its training is not done" in report
    # Not run again unless asked: reported as failed.
    log = (failed / "log.txt").read_text()
    assert "1 of 4 jobs failed" in error_line(capsys, ["sweep", "spec.yaml"])
    assert (failed / "log.txt").read_text() == log
    os.symlink("data", "missing")
    assert sweep("--rerun-failed") == 0
    assert (failed / "done.json").is_file() and not (failed / "failed.json").exists()
    assert Path("sweep/evals/data_root=missing/5w1s.json").is_file()


def test_a_job_lost_before_its_log_was_written_is_recorded_as_failed():
    # A Slurm job can die (node lost, cancelled while pending) before its task opened a log.
    task = Task(("train", "--config", CONFIG), Path("lost"))
    task.folder.mkdir()
    assert record_end(task, 1, 0.0).status == 1
    record = json.loads((task.folder / "failed.json").read_text())
    assert record["status"] == 1 and record["last_lines"] == []
