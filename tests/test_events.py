"""TensorBoard event files, read back with TensorBoard's own reader: `train` and `pretrain` log
every epoch's metrics row, a resumed run continues without a step twice, the HPO outer loops
log their hypergradient norms, and without tensorboard a run works and says so once."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing import event_accumulator as tb
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
from test_distributed import torchrun
from test_pretrain import pretrain_settings
from test_train import tiny_config
from trainers import make_trainer

from fewshot.cli.main import main
from fewshot.hpo import Budget, optimize
from fewshot.hpo.outer_log import HISTOGRAMS, log_outer_step, logging_to
from fewshot.hpo.splits import make_splits
from fewshot.hpo.tasks.ridge import ridge_hypergradient, ridge_problem, ridge_smoothness
from fewshot.runtime import events
from fewshot.runtime.events import EVENT_FILES, EventLog
from fewshot.runtime.run_folder import RunFolder
from fewshot.training.trainer import Trainer


@pytest.fixture(autouse=True)
def tiny_data(tiny_omniglot_root, monkeypatch):
    """Every run here reads Omniglot cut to 24 classes per split."""
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))


@pytest.fixture(autouse=True)
def fresh_writer_check():
    """Whether tensorboard imports is decided again by each test, and after the last."""
    events.summary_writer_class.cache_clear()
    yield
    events.summary_writer_class.cache_clear()


def read_events(folder: Path) -> tb.EventAccumulator:
    """Every event file of a folder, as TensorBoard's reader loads them (purges included)."""
    reader = tb.EventAccumulator(str(folder), size_guidance={tb.HISTOGRAMS: 0})  # 0: keep them all
    reader.Reload()
    return reader


def steps_and_values(reader: tb.EventAccumulator, tag: str) -> list[tuple[int, float]]:
    """(step, value) of every event of a scalar tag, in the order read."""
    return [(e.step, e.value) for e in reader.Scalars(tag)]


def metrics_rows(run: Path) -> list[dict]:
    """The rows of a run folder's metrics.jsonl."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def logged_hparams(reader: tb.EventAccumulator) -> dict:
    """The settings logged for the hparams dashboard, {name: value}."""
    content = reader.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = HParamsPluginData.FromString(content).session_start_info
    return {name: getattr(v, v.WhichOneof("kind")) for name, v in start.hparams.items()}


def assert_events_equal_metrics(run: Path, unit: str, per_step: int, steps: int) -> None:
    """One event per epoch of every tag, equal to that epoch's metrics row (float32 events)."""
    reader = read_events(run)
    rows = metrics_rows(run)
    epochs = [row["epoch"] for row in rows]
    want = {
        "train/loss": [row["train_loss"] for row in rows],
        "train/accuracy": [row["train_acc"] for row in rows],
        "val/accuracy": [row["val_acc"] for row in rows],
        "val/ci95": [row["val_ci95"] for row in rows],
        "val/accuracy_lower": [row["val_acc"] - row["val_ci95"] for row in rows],
        "val/accuracy_upper": [row["val_acc"] + row["val_ci95"] for row in rows],
        "lr": [row["lr"] for row in rows],
        "time/step_seconds": [row["seconds"] / steps for row in rows],
        f"time/{unit}_per_second": [steps * per_step / row["seconds"] for row in rows],
    }
    assert sorted(reader.Tags()["scalars"]) == sorted(want)
    for tag, values in want.items():
        got = steps_and_values(reader, tag)
        assert [step for step, _ in got] == epochs, tag
        assert [value for _, value in got] == pytest.approx(values, rel=1e-6, abs=1e-6), tag


def test_train_logs_every_epoch_and_its_settings(tmp_path):
    config = tiny_config(tmp_path, epochs=3)
    make_trainer(config).fit()
    run = tmp_path / "run"
    assert len(metrics_rows(run)) == 3
    assert_events_equal_metrics(run, "episodes", config.episodes_per_batch, 3)
    hparams = logged_hparams(read_events(run))
    assert hparams["method"] == config.method and hparams["way"] == config.way
    assert json.loads(hparams["lr_schedule"]) == config.lr_schedule
    layout = read_events(run).PluginTagToContent("custom_scalars")
    assert layout, "the validation accuracy's band chart"


def test_pretrain_logs_images_per_second(tmp_path):
    settings = pretrain_settings(tmp_path)
    trainer = make_trainer(settings)
    trainer.fit()
    per_step = settings.batch_size
    assert_events_equal_metrics(tmp_path / "pre", "images", per_step, trainer.steps_per_epoch)


def test_events_are_flushed_every_epoch(tmp_path, monkeypatch):
    """A job is watched while it runs: each epoch's events are on disk before the next one."""
    seen = []
    real = Trainer._train_epoch

    def watched(self):
        reader = read_events(tmp_path / "run")
        seen.append(len(reader.Scalars("val/accuracy")) if reader.Tags()["scalars"] else 0)
        real(self)

    monkeypatch.setattr(Trainer, "_train_epoch", watched)
    make_trainer(tiny_config(tmp_path, epochs=3)).fit()
    assert seen == [0, 1, 2]


def test_a_resumed_run_logs_no_step_twice(tmp_path, monkeypatch):
    """Killed after logging epoch 2 but before its checkpoint, then resumed from epoch 1's: the
    epoch is trained and logged again, and TensorBoard keeps only the second."""
    config = tiny_config(tmp_path, epochs=2)
    real_save = Trainer.save

    def killed_in_epoch_2(self, path):
        if self.progress.epoch == 2:
            raise KeyboardInterrupt  # as a SIGKILL would, after the events were flushed
        real_save(self, path)

    monkeypatch.setattr(Trainer, "save", killed_in_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        make_trainer(config).fit()
    run = tmp_path / "run"
    assert [step for step, _ in steps_and_values(read_events(run), "val/accuracy")] == [1, 2]
    stale = steps_and_values(read_events(run), "time/step_seconds")[1]

    monkeypatch.setattr(Trainer, "save", real_save)
    make_trainer(config, resume=str(run / "last.pt")).fit()
    assert len(list(run.glob(EVENT_FILES))) == 2
    assert_events_equal_metrics(run, "episodes", config.episodes_per_batch, 3)
    assert steps_and_values(read_events(run), "time/step_seconds")[1] != stale
    # The web app's own reader (without its fast data server) drops the stale epoch too.
    web = plugin_event_accumulator.EventAccumulator(str(run))
    web.Reload()
    assert [event.step for event in web.Tensors("val/accuracy")] == [1, 2]


def test_a_fresh_run_over_another_replaces_its_events(tmp_path):
    make_trainer(tiny_config(tmp_path, epochs=2)).fit()
    run = tmp_path / "run"
    with RunFolder(run, fresh=True, overwrite=True) as folder:
        make_trainer(tiny_config(tmp_path, epochs=1)).fit(folder)
    assert len(list(run.glob(EVENT_FILES))) == 1
    assert_events_equal_metrics(run, "episodes", 2, 3)


def test_without_tensorboard_runs_work_and_say_so_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` fails
    make_trainer(tiny_config(tmp_path / "a", epochs=1)).fit()
    make_trainer(tiny_config(tmp_path / "b", epochs=1)).fit()
    notes = [line for line in capsys.readouterr().out.splitlines() if "tensorboard" in line]
    assert notes == [
        "note: tensorboard is not installed, so no TensorBoard event files are written "
        '(install it with: pip install "tensorboard>=2.14", or scripts/setup.sh)'
    ]
    for run in (tmp_path / "a" / "run", tmp_path / "b" / "run"):
        assert len(metrics_rows(run)) == 1
        assert not list(run.glob(EVENT_FILES))


@pytest.mark.slow
def test_under_torchrun_only_rank_0_writes_events(tmp_path, tiny_omniglot_root):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FEWSHOT_DATA": str(tiny_omniglot_root)}
    out = tmp_path / "ddp"
    args = ["-m", "fewshot", "train", "--way=5", "--shot=1", "--query=2", "--epochs=1"]
    torchrun([*args, "--episodes-per-epoch=8", "--episodes-per-batch=4", f"--out={out}"], env)
    assert len(list(out.glob(EVENT_FILES))) == 1
    assert_events_equal_metrics(out, "episodes", 4, 2)


def test_an_event_log_of_no_folder_writes_nothing_and_imports_nothing(tmp_path, capsys):
    """Ranks other than 0 (folder None) neither write events nor print the note."""
    with EventLog(None) as log:
        log.scalars(1, {"loss": 1.0})
    assert events.summary_writer_class.cache_info().currsize == 0
    assert capsys.readouterr().out == ""


def test_hpo_logs_the_hypergradient_norm_of_every_outer_step(tmp_path):
    """Ridge regression's hypergradient in closed form is the reference for the logged norm;
    lam is logged after each step as the step callback sees it."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 4, generator=g, dtype=torch.float64)
    y = x @ torch.randn(4, generator=g, dtype=torch.float64)
    splits = make_splits(24, 0.25, 3, seed=0)
    data = [((x[s.train], y[s.train]), (x[s.val], y[s.val])) for s in splits]
    problem = ridge_problem(1.0 / max(ridge_smoothness(2.0, train) for train, _ in data))
    lams = [torch.tensor(1.0, dtype=torch.float64)]
    with EventLog(tmp_path) as log, logging_to(log, 4):
        optimize(
            "rhg",
            problem,
            torch.zeros(4, dtype=torch.float64),
            lams[0],
            data,
            Budget(outer_steps=4, inner_steps=400),
            outer_lr=0.1,
            on_step=lambda t, lam, theta: lams.append(lam),
        )
    reader = read_events(tmp_path)
    exact = [
        abs(float(torch.stack([ridge_hypergradient(lam, tr, va) for tr, va in data]).mean()))
        for lam in lams[:-1]
    ]
    norms = steps_and_values(reader, "outer/hypergrad_norm")
    assert [step for step, _ in norms] == [1, 2, 3, 4]
    assert [value for _, value in norms] == pytest.approx(exact, rel=1e-3)
    logged = [value for _, value in steps_and_values(reader, "lam")]
    assert logged == pytest.approx([float(lam) for lam in lams[1:]], rel=1e-6)
    assert len(reader.Scalars("outer/val_loss")) == 4


def test_hpo_command_logs_into_its_out_folder_per_run(tmp_path):
    """Through `fewshot hpo`, OEHG's loop logs into --out/events/RESULT with the settings; a
    rerun of the same run replaces its events."""
    args = ["hpo", "regularization", "--dataset", "heart", "--model", "svm", "--method", "oehg"]
    args += ["--out", str(tmp_path), "--outer-steps", "6", "--resplits", "2", "--per-parameter"]
    for _ in range(2):
        assert main(args) == 0
    folder = tmp_path / "events" / "heart_svm_oehg_pp_seed0"
    assert len(list(folder.glob(EVENT_FILES))) == 1
    reader = read_events(folder)
    norms = steps_and_values(reader, "outer/hypergrad_norm")
    assert [step for step, _ in norms] == list(range(1, 7))
    assert all(math.isfinite(v) and v > 0 for _, v in norms)
    assert len(reader.Histograms("lam")) == 6  # one lam per feature: a distribution
    saved = json.loads((tmp_path / "heart_svm_oehg_pp_seed0.json").read_text())
    hparams = logged_hparams(reader)
    assert hparams["method"] == "oehg" and hparams["resplits"] == saved["settings"]["resplits"]


def test_a_larger_lam_is_logged_as_a_distribution_at_spaced_steps(tmp_path):
    """Each histogram costs more than a small task's outer step: about HISTOGRAMS per run."""
    lam = {"weights": torch.arange(5.0), "scale": torch.tensor(2.0)}
    grad = {"weights": torch.full((5,), 2.0), "scale": torch.tensor(-1.0)}
    steps = 2 * HISTOGRAMS + 50
    with EventLog(tmp_path) as log, logging_to(log, steps):
        for t in range(steps):
            log_outer_step(t, grad, lam, 0.5)
    reader = read_events(tmp_path)
    histograms = [e.step for e in reader.Histograms("lam/weights")]
    assert histograms == [*range(3, steps, 3), steps]
    assert reader.Histograms("lam/weights")[0].histogram_value.sum == pytest.approx(10.0)
    assert len(reader.Scalars("lam/scale")) == steps  # a single value: every step
    assert reader.Scalars("outer/hypergrad_norm")[0].value == pytest.approx(math.sqrt(21))
    assert reader.Scalars("hypergrad_norm/lam/weights")[0].value == pytest.approx(math.sqrt(20))


def test_settings_that_are_not_numbers_or_text_are_logged_as_json(tmp_path):
    with EventLog(tmp_path) as log:
        log.hparams({"schedule": [[1, 0.5]], "init": None, "amp": "off"}, ["val/accuracy"])
    hparams = logged_hparams(read_events(tmp_path))
    assert hparams == {"schedule": "[[1, 0.5]]", "init": "null", "amp": "off"}
