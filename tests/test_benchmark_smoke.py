"""The benchmark scripts that tests/test_benchmarks.py does not run, in their --smoke mode: each
runs end to end in seconds and prints (or writes) well-formed figures (the benchmarks the GPU
script runs are checked on its smoke run's parts: tests/test_cuda_checks.py)."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest
import torch
from datafiles import write_digits
from test_benchmarks import run

from benchmarks import (
    bench_hpo,
    bench_hpo_cleaning,
    bench_memmap,
    bench_predict,
    bench_sweep_scale,
    bench_vs_metaoptnet,
)

REPO = Path(__file__).resolve().parents[1]
NUMBER = r"\d+\.\d+"


@pytest.fixture(autouse=True)
def torch_threads():
    """Benchmarks set torch's thread count for their timings: give the suite's back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_bench_hpo_smoke(monkeypatch, capsys, tmp_path):
    # MNIST-SR observes 10000 training images: small generated files of that size.
    root = write_digits(tmp_path, n_train=10000, n_test=10000)
    out = run(monkeypatch, capsys, bench_hpo, "--smoke", "--data-root", str(root))
    assert re.search(r"a1a logistic \(1605, 1\d\d\) +MNIST-SR \(8000 x 784\)", out), out
    for name in (r"RHG \(K=4, U=1\)", r"AID-CG \(K=4, Z=2, U=1\)", r"OEHG \(U=5, K=1\)"):
        row = re.search(rf"^{name} +({NUMBER}) +({NUMBER})$", out, re.M)
        assert row and all(float(ms) > 0 for ms in row.groups()), out


def test_bench_hpo_cleaning_smoke(monkeypatch, capsys, tmp_path, digits_root):
    argv = ["--smoke", "--data-root", str(digits_root), "--out", str(tmp_path)]
    out = run(monkeypatch, capsys, bench_hpo_cleaning, *argv)
    assert re.search(rf"^wall time: \d+ s \({NUMBER} min\); target < 15 min$", out, re.M), out
    result = json.loads((tmp_path / "cleaning_mnist_sr_oehg_seed0.json").read_text())
    bench = json.loads((tmp_path / "bench_cleaning_mnist_sr_oehg_seed0.json").read_text())
    assert bench["wall_seconds"] >= bench["hpo_seconds"] == result["seconds_hpo"] > 0
    assert (bench["test_accuracy"], bench["f1"]) == (result["test_accuracy"], result["f1"])
    assert "--n-train 200" in bench["command"] and result["settings"]["n_train"] == 200


def test_bench_predict_smoke(monkeypatch, capsys):
    out = run(monkeypatch, capsys, bench_predict, "--smoke", "--device", "cpu")
    assert "64 query images, 5-way 1-shot support, 1 rounds" in out
    ours = float(re.search(rf"^Method.predict \(batch 256\) +({NUMBER}) s$", out, re.M).group(1))
    cached = float(re.search(rf"^cached evaluation path +({NUMBER}) s$", out, re.M).group(1))
    ratio = float(re.search(rf"^ratio ({NUMBER})x: goal <= 1.1x (met|MISSED)$", out, re.M).group(1))
    assert ratio == pytest.approx(ours / cached, rel=0.05, abs=0.01)
    assert re.search(r"^fewshot predict on 64 PNG files: \d+\.\d+ s", out, re.M), out


def test_bench_sweep_scale_smoke(monkeypatch, capsys, tmp_path):
    out = run(monkeypatch, capsys, bench_sweep_scale, "--smoke", "--folder", str(tmp_path))
    figures = [
        r"\(a\) read_spec, 60 training jobs \(23 matrix values\)",
        r"\(a\) read_spec, 20 training jobs \(21 matrix values\)",
        r"\(a\) expand to 120 jobs \(60 training, 60 evaluations\)",
        r"\(a\) owner checks of 120 job folders \(none made yet\)",
        r"\(a\) plan_lines of 120 jobs \(121 lines\)",
        r"\(a\) fewshot sweep SPEC --plan, whole \(run_sweep, 120 jobs\)",
        r"\(b\) fewshot sweep SPEC --plan of the submitted sweep \(60 command.txt read\)",
        r"\(c\) fewshot sweep SPEC, every job done \(run_sweep: the report only\)",
    ]
    for figure in figures:
        assert re.search(rf"^{figure}: {NUMBER} s$", out, re.M), (figure, out)
    assert re.search(
        rf"^\(b\) Task list of 60 training jobs \(Job.prepare\): {NUMBER} s the first time "
        rf"\(.*\), {NUMBER} s again$",
        out,
        re.M,
    )
    assert re.search(rf"^\(a\) read_spec ratio {NUMBER}x for 3.0x the jobs and 1.10x", out, re.M)
    if "(b) pickling and map_array: skipped" not in out:  # submitit: the slurm extra
        assert re.search(
            rf"^\(b\) submitit map_array of 60 tasks as 4 arrays.*: {NUMBER} s$", out, re.M
        )
    assert "(b) arrays of at most 16 tasks for 60 jobs: 4 (slurm.array_chunks)" in out
    assert "(b) real Slurm submission: skipped (--no-cluster)" in out
    report = rf"^\(c\) write_report: {NUMBER} s \(12 evaluations, 3 comparisons of two resplits"
    assert re.search(report, out, re.M), out
    assert list(tmp_path.iterdir()) == []  # its temporary folder removed


def free_port() -> int:
    """A TCP port nothing listens on now (the benchmark's ranks use it and the next one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bench_memmap_smoke(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(REPO)  # the ranks start as `python -m benchmarks.bench_memmap`
    argv = ["--smoke", "--root", str(tmp_path), "--port", str(free_port())]
    out = run(monkeypatch, capsys, bench_memmap, *argv)
    assert "synthetic tieredImageNet train: 449 images" in out
    for loader in (r"reader \(today\)", r"mapped \(converted\)"):
        for rank in (0, 1):
            row = rf"^\| {loader} \| {rank} \| {NUMBER} \| {NUMBER} \| {NUMBER} \| -?{NUMBER} \|$"
            assert re.search(row, out, re.M), out
    assert re.search(r"^data at all 448695 images \(x\d+\.\d\d\): reading", out, re.M)


def test_bench_vs_metaoptnet_smoke_without_the_reference(monkeypatch, capsys, tmp_path):
    # A fresh clone has no ../shared/reference: the smoke run times fewshot's side alone.
    out = run(monkeypatch, capsys, bench_vs_metaoptnet, "--smoke", "--reference", str(tmp_path))
    assert f"no reference harness at {tmp_path / 'bench_vs_metaoptnet.py'}" in out
    for head in ("protonet", "ridge", "svm"):
        step = re.search(rf"^fewshot EHG U=2 step {head}: ({NUMBER}) ms$", out, re.M)
        assert step and float(step[1]) > 0, out


@pytest.mark.skipif(
    not (bench_vs_metaoptnet.DEFAULT_REFERENCE / "bench_vs_metaoptnet.py").is_file(),
    reason="the MetaOptNet reference harness (../shared/reference) is not beside this clone",
)
def test_bench_vs_metaoptnet_smoke_with_the_reference(monkeypatch, capsys):
    out = run(monkeypatch, capsys, bench_vs_metaoptnet, "--smoke")
    assert "conv4, 5-way 1-shot 2-query, 1 episodes per step" in out
    for row in ("MetaOptNet step protonet", "fewshot step protonet", "fewshot EHG U=2 protonet"):
        figures = re.search(rf"^{row} +({NUMBER}) ms +{NUMBER}x bare", out, re.M)
        assert figures and float(figures[1]) > 0, out
