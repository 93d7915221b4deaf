"""The benchmark scripts run on their smallest settings and print well-formed figures."""

from __future__ import annotations

import re
import sys

import pytest

from benchmarks import (
    bench_ehg,
    bench_logistic,
    bench_precision,
    bench_pretrain,
    bench_svm,
    bench_throughput,
)

SECONDS = r"\d+\.\d+"


def run(monkeypatch, capsys, module, *argv: str) -> str:
    """Run a benchmark's main() with these arguments; its standard output."""
    monkeypatch.setattr(sys, "argv", [module.__name__, *argv])
    module.main()
    return capsys.readouterr().out


@pytest.fixture(autouse=True)
def shipped_data(monkeypatch):
    """Omniglot from the repository's data/, whatever FEWSHOT_DATA says."""
    monkeypatch.delenv("FEWSHOT_DATA", raising=False)


def test_bench_precision_times_both_precisions(monkeypatch, capsys):
    out = run(
        monkeypatch,
        capsys,
        bench_precision,
        *("--backbones", "conv4", "--heads", "protonet", "--repeats", "1", "--query", "2"),
        *("--no-synthetic", "--episodes", "16", "--eval-classes", "40", "--device", "cpu"),
    )
    assert "(b) cached evaluation of the first 40 of the 1692 test classes" in out
    step = re.search(rf"Omniglot 20w1s2q x2 +conv4 +protonet +({SECONDS}) +({SECONDS}) +", out)
    assert step and float(step[1]) > 0 and float(step[2]) > 0
    assert re.search(rf"^float32 +{SECONDS} s +accuracy", out, re.M)
    assert re.search(rf"^bf16 +{SECONDS} s +accuracy", out, re.M)
    assert re.search(r"accuracies differ in \d+ episodes", out)


def test_bench_throughput_training_step(monkeypatch, capsys):
    out = run(
        monkeypatch,
        capsys,
        bench_throughput,
        *("--no-eval", "--heads", "protonet", "--repeats", "1", "--query", "2", "--device", "cpu"),
    )
    assert "2 episodes of 5-way 1-shot 2-query at 84x84 (30 images)" in out
    assert re.search(rf"conv4 +train_step protonet +{SECONDS} +{SECONDS}x", out)


def test_bench_ehg_steps(monkeypatch, capsys):
    out = run(
        monkeypatch,
        capsys,
        bench_ehg,
        *("--backbones", "conv4", "--heads", "protonet", "--shots", "1"),
        *("--resplits", "1,2", "--repeats", "1", "--no-naive", "--device", "cpu"),
        *("--query", "2"),
    )
    assert "5-way, 2 queries" in out
    assert re.search(r"conv4 +protonet +1 +2 ", out)


def test_bench_svm_both_solvers(monkeypatch, capsys):
    out = run(
        monkeypatch,
        capsys,
        bench_svm,
        *("--cases", "3w2s2q/16", "--episodes", "2", "--repeats", "1", "--device", "cpu"),
    )
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


def test_bench_logistic_smoke(monkeypatch, capsys):
    out = run(monkeypatch, capsys, bench_logistic, "--smoke", "--device", "cpu")
    number = r"\d+\.\d+"
    for solver in (r"batched logistic \(8/call, cpu\)", r"scikit-learn lbfgs tol 1e-10"):
        row = rf"{solver} +({number}) +{number} +{number}x +({number}) ± {number}"
        figures = re.search(row, out)
        assert figures, out
        assert float(figures[1]) > 0 and 90 < float(figures[2]) <= 100
    assert re.search(r"tol 1e-10: \+0\.000 ± 0\.000 points .* 0/16 episodes differ", out), out
    assert re.search(r"^goal: .*: (met|NOT met) \(\d+\.\dx, equal accuracy\)$", out, re.M), out


def test_bench_pretrain_smoke(monkeypatch, capsys):
    out = run(monkeypatch, capsys, bench_pretrain, "--smoke", "--device", "cpu")
    ours = re.search(rf"fewshot pretrain step +({SECONDS}) ms", out)
    bare = re.search(rf"bare PyTorch loop +({SECONDS}) ms", out)
    assert ours and bare and float(ours[1]) > 0 and float(bare[1]) > 0
    assert re.search(r"ratio \d+\.\d+x: goal <= 1.1x (met|MISSED)", out)


def test_bench_vs_learn2learn_smoke(monkeypatch, capsys):
    pytest.importorskip("learn2learn")
    from benchmarks import bench_vs_learn2learn

    # --glibc-defaults: the benchmark would keep this worker's peak heap for good.
    out = run(monkeypatch, capsys, bench_vs_learn2learn, "--smoke", "--glibc-defaults")
    assert re.search(r"^cpu: .+, \d+ threads, load average", out, re.M), out
    assert "queries, auto = threads, the C library's default allocator" in out, out
    for variant in ("maml", "imaml", "anil"):
        row = rf"^{variant} +5-way 1-shot, 1 step +auto +({SECONDS}) +({SECONDS}) +(\S+) "
        figures = re.search(rf"{row} goal <= 0\.7x (met|MISSED)$", out, re.M)
        assert figures, out
        assert float(figures[1]) > 0 and float(figures[2]) > 0
        assert float(figures[3]) < 1e-5  # the same meta-gradient as learn2learn's
        reference = rf"^{variant} +5-way 1-shot, 1 step +learn2learn +{SECONDS} +1\.00$"
        assert re.search(reference, out, re.M), out
