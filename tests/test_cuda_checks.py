"""benchmarks/cuda_checks.sh runs end to end on the CPU at tiny sizes (--smoke), so a lent GPU's
few minutes are not spent finding the script broken."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from datafiles import cut_omniglot_root

from fewshot.datasets import REPO_DATA

REPO = Path(__file__).resolve().parents[1]
TRAINED = ["embedding_protonet", "embedding_ridge", "embedding_svm", "maml", "fomaml", "anil"]
TRAINED += ["imaml", "matching", "relation", "anil_channels_last", "trainval"]
PARTS = ["pytest_cuda", "bench_throughput", "bench_ehg", "bench_precision", "bench_adaptation"]
PARTS += [f"train_{name}" for name in TRAINED] + ["eval_trainval", "bench_svm"]
PARTS += ["pretrain", "eval_logistic", "eval_pt-map", "bench_classifiers", "bench_pmf"]
PARTS += ["bench_compile"]
NUMBER = r"\d+\.\d+"


@pytest.mark.slow
def test_the_gpu_script_runs_every_part_at_smoke_size(tmp_path):
    # Omniglot with its validation split cut to 48 classes: the pretraining part's one pass
    # over them, a stand-in for the train split, takes seconds rather than half a minute.
    classes = {"train": None, "val": 48, "trainval": None, "test": None}
    root = cut_omniglot_root(tmp_path / "data", REPO_DATA, classes)
    env = {"PYTHON": sys.executable, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    env["FEWSHOT_DATA"] = str(root)
    out = tmp_path / "out"
    result = subprocess.run(
        ["bash", "benchmarks/cuda_checks.sh", "--smoke", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    summary = (out / "summary.txt").read_text()
    assert result.returncode == 0, summary
    for part in PARTS:
        assert re.search(rf"^{part}: exit 0 \(no limit, took \d+ s\)$", summary, re.M), summary
        assert (out / f"{part}.txt").stat().st_size > 0
    check_bench_adaptation((out / "bench_adaptation.txt").read_text())
    check_bench_throughput((out / "bench_throughput.txt").read_text())
    check_bench_ehg((out / "bench_ehg.txt").read_text())
    check_bench_precision((out / "bench_precision.txt").read_text())
    check_bench_svm((out / "bench_svm.txt").read_text())
    assert "accuracy" in (out / "eval_trainval.txt").read_text()
    assert (out / "eval_trainval.json").is_file()
    check_bench_classifiers((out / "bench_classifiers.txt").read_text())
    check_bench_pmf((out / "bench_pmf.txt").read_text())
    assert re.search(
        r"^default .* ms/step .*x eager", (out / "bench_compile.txt").read_text(), re.M
    )
    # The training runs' folders are temporary: OUT_DIR holds the figures only.
    assert not list(out.rglob("*.pt"))


def check_bench_adaptation(out: str) -> None:
    """bench_adaptation --smoke: each method's step at U = 1 and 5 re-splits, and their ratio."""
    assert "2 episodes of 5-way 1-shot" in out
    for method in ("maml", "fomaml", "anil", "imaml"):
        row = re.search(rf"^{method} +({NUMBER}) +({NUMBER}) +({NUMBER})$", out, re.M)
        assert row, out
        one, five, ratio = map(float, row.groups())
        assert one > 0 and five > 0
        # The ratio (to 0.01) of the times before they were rounded to 0.001 s.
        low, high = (five - 5e-4) / (one + 5e-4), (five + 5e-4) / max(one - 5e-4, 1e-9)
        assert low - 0.005 <= ratio <= high + 0.005


def check_bench_classifiers(out: str) -> None:
    """bench_classifiers --smoke: each classifier's times and accuracy, equal in both batchings."""
    assert "16 seeded 5-way 1-shot 15-query (seed 0)" in out
    for name in ("pt-map", "tim", "finetune", "logistic"):
        # Both batchings give every episode the same accuracy: 0/16 differ.
        row = rf"^{name} +({NUMBER}) +({NUMBER}) +({NUMBER}) ± {NUMBER}  0/16$"
        figures = re.search(row, out, re.M)
        assert figures, out
        # Times of 16 episodes may round to 0.00 s; the accuracy is the model's.
        assert float(figures[1]) >= 0 and float(figures[2]) >= 0 and 90 < float(figures[3]) <= 100
    goal = r"^goal: 16 episodes in one call under 60 s each: (met|MISSED by .+)$"
    assert re.search(goal, out, re.M), out


def check_bench_pmf(out: str) -> None:
    """bench_pmf --smoke: fine-tuning one episode at a time and two at once, the same accuracies
    and the ratio of the times printed."""
    assert "4 seeded 5-way 1-shot 2-query Omniglot test episodes (seed 0), 2 a call" in out
    rows = [
        re.search(rf"^{name} +({NUMBER}) +({NUMBER}) ± {NUMBER}$", out, re.M)
        for name in ("one at a time", "2 at once")
    ]
    assert all(rows), out
    (alone, one), (together, both) = (map(float, row.groups()) for row in rows)
    assert one == both and 50 < one <= 100  # the same accuracies: the same fine-tuning
    assert "episodes whose accuracy differs: 0/4" in out
    ratio = float(re.search(rf"batched / one at a time: ({NUMBER})x the time", out)[1])
    # The ratio of the times before they were rounded to 0.01 s.
    low, high = (together - 0.005) / (alone + 0.005), (together + 0.005) / max(alone - 0.005, 1e-9)
    assert low - 0.005 <= ratio <= high + 0.005


def check_bench_throughput(out: str) -> None:
    """bench_throughput at smoke size: the cached evaluation and the ProtoNet step's rows."""
    assert "(a) evaluation, 4 seeded episodes, 2 per batch" in out
    assert re.search(rf"^Omniglot test 40 cl., 20-way 1-shot conv4 +{NUMBER} +{NUMBER} ", out, re.M)
    assert "accuracies identical" in out
    assert "2 episodes of 5-way 1-shot 2-query at 84x84 (30 images)" in out
    assert re.search(rf"conv4 +train_step protonet +{NUMBER} +{NUMBER}x", out)


def check_bench_ehg(out: str) -> None:
    """bench_ehg at smoke size: the step at U = 1 and U = 2."""
    assert "5-way, 2 queries" in out
    for u, ratio in (("1", r"1\.00x"), ("2", rf"{NUMBER}x")):
        assert re.search(rf"^conv4 +protonet +1 +{u} +{NUMBER} +{ratio} +{NUMBER}x$", out, re.M)


def check_bench_precision(out: str) -> None:
    """bench_precision at smoke size: the step in both precisions, then the cached evaluation in
    both and how many episodes' accuracies differ."""
    step = re.search(rf"Omniglot 20w1s2q x2 +conv4 +protonet +({NUMBER}) +({NUMBER}) +", out)
    assert step and float(step[1]) > 0 and float(step[2]) > 0, out
    assert "(b) cached evaluation of the first 20 of the 1692 test classes" in out
    assert re.search(rf"^float32 +{NUMBER} s +accuracy", out, re.M)
    assert re.search(rf"^bf16 +{NUMBER} s +accuracy", out, re.M)
    assert re.search(r"accuracies differ in \d+ episodes", out)


def check_bench_svm(out: str) -> None:
    """bench_svm at smoke size: both solvers' time, error against float64 and memory, the solver
    alone, and the goals."""
    number = r"\d+\.\d+(?:e[-+]\d+)?"
    for solver in ("interior-point", r"qpth \(15 it\.\)"):
        row = rf"{solver} +({number}) +{number}x +({number}) +({number}) +{number}x"
        figures = re.search(row, out)
        assert figures, out
        seconds, error, peak = map(float, figures.groups())
        assert seconds > 0 and error < 1e-3 and peak >= 0
    assert re.search(r"interior point \d+ iterations, 2/2 converged", out)
    alone = re.search(
        rf"solver alone: interior-point ({number}) s, qpth \(15 it\.\) ({number}) s", out
    )
    assert alone and min(map(float, alone.groups())) > 0, out
    assert re.search(r"2 x 3w2s2q d=16 +interior point \d+\.\dx faster \(the head \d+\.\dx\)", out)
    assert "goals (cpu run):" in out
