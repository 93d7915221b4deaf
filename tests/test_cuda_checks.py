"""benchmarks/cuda_checks.sh runs end to end on the CPU at tiny sizes (--smoke), so a lent GPU's
few minutes are not spent finding the script broken."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRAINED = ["embedding_protonet", "embedding_ridge", "embedding_svm", "maml", "fomaml", "anil"]
TRAINED += ["imaml", "matching", "relation", "anil_channels_last", "trainval"]
PARTS = ["pytest_cuda", "bench_throughput", "bench_ehg", "bench_precision", "bench_adaptation"]
PARTS += [f"train_{name}" for name in TRAINED] + ["eval_trainval", "bench_svm"]
PARTS += ["pretrain", "eval_logistic", "eval_pt-map", "bench_classifiers", "bench_pmf"]
PARTS += ["bench_compile"]


@pytest.mark.slow
def test_the_gpu_script_runs_every_part_at_smoke_size(tmp_path):
    env = {"PYTHON": sys.executable, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        ["bash", "benchmarks/cuda_checks.sh", "--smoke", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    summary = (tmp_path / "summary.txt").read_text()
    assert result.returncode == 0, summary
    for part in PARTS:
        assert re.search(rf"^{part}: exit 0 \(no limit, took \d+ s\)$", summary, re.M), summary
        assert (tmp_path / f"{part}.txt").stat().st_size > 0
    assert "ratio" in (tmp_path / "bench_adaptation.txt").read_text()
    assert "accuracy" in (tmp_path / "eval_trainval.txt").read_text()
    assert (tmp_path / "eval_trainval.json").is_file()
    assert "goals" in (tmp_path / "bench_svm.txt").read_text()
    assert "goal: 16 episodes in one call" in (tmp_path / "bench_classifiers.txt").read_text()
    assert re.search(
        r"^default .* ms/step .*x eager", (tmp_path / "bench_compile.txt").read_text(), re.M
    )
    # The training runs' folders are temporary: OUT_DIR holds the figures only.
    assert not list(tmp_path.rglob("*.pt"))
