"""`fewshot hpo`'s memory check: a run whose estimate cannot fit is one line naming the estimate,
what is available and the flag to lower, before any data is read (the LIBSVM sets: before any
step, their shapes being known from the file); the estimate bounds a measured peak from below."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from fewshot.cli.main import main
from fewshot.hpo.tasks import bias_variance, cleaning, image_regularization, regularization
from fewshot.runtime import memory

MIB = 2**20
IMAGES = "image-regularization --dataset mnist --device cpu --model"
CLEANING = "cleaning --dataset mnist --device cpu --model sr"
HEART = "regularization --dataset heart --model svm"
MNIST_SIZES = {"train": 60000, "test": 10000}
# (command, the flag the refusal must name): each makes a different part of the estimate the
# largest, with 100 MiB available.
TOO_BIG = [
    (f"{IMAGES} mlp --method rhg --inner-steps 2000", "--inner-steps"),
    (f"{IMAGES} sr --method trhg --inner-steps 400 --truncate 300", "--truncate"),
    (f"{IMAGES} sr --method oehg --resplits 40", "--resplits"),
    (f"{CLEANING} --method oehg --resplits 20 --extra-val 0", "--resplits"),
    (f"{CLEANING} --method aid-cg --n-train 50000 --n-val 5000 --n-test 5000", "--n-train"),
    (f"{HEART} --method rhg --inner-steps 1000000", "--inner-steps"),
    (f"{HEART} --method oehg --oehg-inner-steps 1000000", "--oehg-inner-steps"),
    ("regularization --dataset a1a --model logistic --method aid-fp --resplits 1000", "--resplits"),
    ("bias-variance --inner-steps 100", "--inner-steps"),
]


@pytest.mark.parametrize(("command", "lower"), TOO_BIG, ids=[c for c, _ in TOO_BIG])
def test_a_run_that_cannot_fit_is_refused_before_the_work(
    command, lower, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 100 * MIB)

    def never(*args, **kwargs):
        pytest.fail("the work began")

    for module in (cleaning, image_regularization):
        monkeypatch.setattr(module, "load_image_dataset", never)  # image tasks: the data read
    # Cleaning checks its counts against the MNIST files' headers first: their counts, here.
    monkeypatch.setattr(cleaning, "split_length", lambda name, split, root: MNIST_SIZES[split])
    monkeypatch.setattr(regularization, "optimize", never)  # LIBSVM: read, then the first step
    monkeypatch.setattr(bias_variance, "bias_variance_table", never)
    assert main(["hpo", *command.split(), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "error: the run needs about " in err, err
    assert err.endswith(f" but 100.0 MiB are available on cpu: lower {lower}"), err


def test_what_fits_is_not_refused(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 100 * MIB)
    command = "hpo regularization --dataset pyrim --model ridge --method rhg --outer-steps 1"
    assert main([*command.split(), "--inner-steps", "4", "--out", str(tmp_path)]) == 0


# Runs one tiny task in a fresh process: its estimate (what the run adds to the data already
# held) and the peak it measured over what was held before (on the CPU the resident set's
# high-water mark, reset first through /proc/self/clear_refs; on CUDA max_memory_allocated).
MEASURE = """
import dataclasses, json, re, sys
from pathlib import Path
import numpy as np
import torch
from fewshot.datasets.libsvm import TabularData
from fewshot.hpo.tasks import image_regularization, regularization
task, device = sys.argv[1], torch.device(sys.argv[2])
g = torch.Generator().manual_seed(0)
if task == "image-regularization":
    n, t = image_regularization.N_OBSERVED, image_regularization.N_TEST
    data = image_regularization.ObservedData(
        torch.rand(n, 784, generator=g), torch.randint(0, 10, (n,), generator=g),
        torch.rand(t, 784, generator=g), torch.randint(0, 10, (t,), generator=g), 10,
    ).to(device)
    settings = image_regularization.Settings(
        dataset="mnist", model="mlp", method="rhg", inner_steps=60, outer_steps=1, out="o",
        device=device.type,
    )
    _, *work = image_regularization.memory_terms(settings)  # the data is held already
else:
    x = torch.randn(4000, 100, generator=g, dtype=torch.float64).numpy()
    y = np.where(x[:, 0] > 0, 1.0, -1.0)
    data = TabularData("a1a", "classification", x, y, x[:500], y[:500])
    settings = regularization.Settings(
        dataset="a1a", model="logistic", method="rhg", inner_steps=300, outer_steps=1, out="o"
    )
    work = regularization.memory_terms(settings, *x.shape)
def resident(key):
    status = Path("/proc/self/status").read_text()
    return int(re.search(key + r":\\s+(\\d+) kB", status).group(1)) * 1024
run = (image_regularization if task == "image-regularization" else regularization).run
run(dataclasses.replace(settings, inner_steps=1), data)  # the libraries' one-off buffers
if device.type == "cuda":
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
else:
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark := the resident set
    before = resident("VmRSS")
run(settings, data)
if device.type == "cuda":
    peak = torch.cuda.max_memory_allocated(device) - before
else:
    peak = resident("VmHWM") - before
print(json.dumps({"estimate": sum(term.size for term in work), "peak": peak}))
"""
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
LINUX = pytest.mark.skipif(
    not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's resettable peak RSS"
)


@pytest.mark.parametrize(
    ("task", "device"),
    [
        pytest.param("image-regularization", "cpu", marks=LINUX),
        pytest.param("regularization", "cpu", marks=LINUX),
        pytest.param("image-regularization", "cuda", marks=CUDA),
    ],
)
def test_the_estimate_bounds_a_measured_peak_from_below(task, device):
    # One thread: a busy CPU runs the 60 MLP steps several times faster.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, task, device],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=300,
    ).stdout
    measured = json.loads(out.splitlines()[-1])
    # A lower bound, but not a uselessly low one: the peaks measured 2.0x and 1.9x of it.
    assert measured["estimate"] <= measured["peak"] <= 3 * measured["estimate"], measured
