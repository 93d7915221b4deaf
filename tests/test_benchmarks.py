"""The benchmark scripts run on their smallest settings and print well-formed figures (those the
GPU script runs, bench_throughput, bench_ehg, bench_precision, bench_svm among them, are checked
on its smoke run's output: tests/test_cuda_checks.py)."""

from __future__ import annotations

import re
import sys

import pytest

from benchmarks import bench_logistic, bench_pretrain, bench_suite

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


def test_bench_suite_smoke(monkeypatch, capsys):
    out = run(monkeypatch, capsys, bench_suite, "--smoke", "--maml")
    assert "(5w1s, 20w1s; 20 episodes a cell, 15 queries, seed 0), 1 rounds" in out, out
    ours = re.findall(rf"^B \(fewshot bench\) +({SECONDS}) s", out, re.M)
    evals = re.findall(rf"^A \(sum of 2 fewshot eval\) +({SECONDS}) s", out, re.M)
    assert len(ours) == len(evals) == 2 and all(float(s) > 0 for s in ours + evals), out
    ratio = re.search(rf"^ratio B / A ({SECONDS}): goal <= 0.5 (met|MISSED)$", out, re.M)
    assert ratio and float(ratio[1]) == pytest.approx(float(ours[0]) / float(evals[0]), rel=0.01)
    assert re.search(rf"^B \(fewshot bench\) +{SECONDS} s +{SECONDS} s/episode$", out, re.M), out
    # The same episodes in both arms: the same accuracies.
    assert out.count("largest accuracy difference: 0 points") == 2, out


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
    floor = rf"^anil +5-way 1-shot, 1 step +backbone +({SECONDS}) +{SECONDS} +the backbone alone"
    figures = re.search(floor, out, re.M)
    assert figures and float(figures[1]) > 0, out
