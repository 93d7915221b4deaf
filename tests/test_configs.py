"""The model zoo's configs load, build and train, carry the paper's settings, and the table
script lists exactly the paper's runs."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from tracked import tracked
from trainers import make_trainer

from fewshot.datasets import GEOMETRY
from fewshot.evaluation.metrics import read_metrics
from fewshot.methods import build_method
from fewshot.training.settings import (
    PretrainSettings,
    TrainSettings,
    make_config,
    read_config_file,
)

REPO = Path(__file__).resolve().parents[1]


def shipped_configs() -> list[Path]:
    """The configs the repository ships: the JSON files of models/ that git tracks (a file a
    user writes there, e.g. an `--out` result, is none of them), every one outside git."""
    configs = tracked("models/*/*.json")
    if configs is None:
        return sorted((REPO / "models").glob("*/*.json"))
    # git's * crosses folders: models/bench/ holds the zoo's stored results, not configs.
    return [path for path in configs if path.parent.parent == REPO / "models"]


ALL_CONFIGS = shipped_configs()
# models/<dataset>/pretrain_*.json are `fewshot pretrain` configs, the others `fewshot train`'s.
PRETRAIN_CONFIGS = [p for p in ALL_CONFIGS if p.stem.startswith("pretrain_")]
CONFIGS = [p for p in ALL_CONFIGS if p not in PRETRAIN_CONFIGS]
# Paper / MetaOptNet: training shot of the MetaOptNet heads per dataset.
METAOPTNET_TRAIN_SHOT = {"miniimagenet": 15, "tieredimagenet": 10, "cifar-fs": 5, "fc100": 15}
TABLE_SCRIPT = REPO / "experiments" / "fewshot_table" / "table.py"
SYNTHETIC = REPO / "experiments" / "resnet12_rehearsal" / "synthetic.py"


def load_module(path: Path, name: str) -> ModuleType:
    """A Python file as a module (experiments/ is not installed with fewshot)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


SYNTHETIC_IMAGES = load_module(SYNTHETIC, "synthetic_images")


def config_id(path: Path) -> str:
    """Short test id: dataset/name."""
    return f"{path.parent.name}/{path.stem}"


@pytest.mark.parametrize("path", CONFIGS, ids=config_id)
def test_config_loads_and_builds(path):
    config = make_config(str(path), {})
    assert config.dataset == path.parent.name
    channels, size = GEOMETRY[config.dataset]
    model = build_method({**config.to_dict(), "in_channels": channels, "image_size": size})
    if config.method == "embedding":
        assert model.backbone.out_dim > 0
        assert model.head_name == config.head
    elif config.method in ("matching", "relation"):  # a comparison module for a head
        assert model.head_name == config.method
    else:  # a MAML-family method: a classifier of the training way on its backbone
        assert model.variant == config.method
        assert model.network.classifier.out_features == config.way == config.val_way


# Optimizer steps of test_config_trains: a ResNet-12 step of two 5-way 15-shot 15-query
# episodes at 84x84 takes tens of seconds on a 2-core CPU. Two: the loss at the initial
# weights, then after one update (every config's falls by 0.5-100 %; a third step cost the
# suite about a minute).
TRAIN_STEPS = 2
# Episodes of at most 20 ways, 5 shots and 5 queries a class: the same step on fewer images (the
# 60-way and 15-shot configs took 20-35 s each; with two queries ProtoNet's loss did not fall).
EPISODE_CAP = {"way": 20, "shot": 5, "query": 5}
# What only the data's name, the run's length and folder, and validation read: configs equal in
# everything else train identically on the same synthetic images, so one of them trains for all.
NOT_READ_BY_TRAINING = frozenset(
    {"dataset", "data_root", "train_split", "val_split", "out", "epochs", "episodes_per_epoch",
     "val_way", "val_shot", "val_query", "val_episodes", "val_seed", "eval_head_options"}
)  # fmt: skip
TRAINED: dict[str, list[float]] = {}  # training key -> the losses of its steps


def training_key(settings: TrainSettings) -> str:
    """The settings a training step reads, with the images' geometry, as one string."""
    values = {k: v for k, v in settings.to_dict().items() if k not in NOT_READ_BY_TRAINING}
    return json.dumps([values, GEOMETRY[settings.dataset]], sort_keys=True)


def heavy(path: Path) -> bool:
    """Whether a few steps of a config take minutes on a 2-core CPU: ResNet-12 at 84x84 (1.5-3
    minutes for 3 steps) and the MAML family (meta-batches of 32 inner loops)."""
    settings = make_config(str(path), {})
    return settings.method not in ("embedding", "matching", "relation") or (
        settings.backbone == "resnet12" and GEOMETRY[settings.dataset][1] >= 84
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=pytest.mark.heavy) if heavy(p) else p for p in CONFIGS],
    ids=config_id,
)
def test_config_trains(path, tmp_path, monkeypatch):
    """A few steps of the config as it is (precision, memory format, head, optimizer, lr,
    augmentation, episode batch, re-splits; its episodes cut to EPISODE_CAP) on synthetic images
    of its dataset's geometry, one fixed pattern per class: a finite loss that falls, then a
    validation."""
    shipped = make_config(str(path), {})
    settings = dataclasses.replace(
        shipped,
        epochs=1,
        episodes_per_epoch=TRAIN_STEPS * shipped.episodes_per_batch,
        val_episodes=8,
        out=str(tmp_path / "run"),
        init=None,  # a pretraining run's checkpoint (Meta-Baseline): tests/test_pretrain.py
    )
    cut = {
        field: min(getattr(settings, field), most)
        for name, most in EPISODE_CAP.items()
        for field in (name, f"val_{name}")
    }
    settings = dataclasses.replace(settings, **cut)
    channels, size = GEOMETRY[settings.dataset]
    # Exactly the classes and images of one episode, so every step sees the same images (in
    # new roles, augmented): the loss can fall within a few steps.
    train = SYNTHETIC_IMAGES.synthetic_split(
        settings.way, settings.shot + settings.query, channels, size, seed=0
    )
    val = SYNTHETIC_IMAGES.synthetic_split(
        settings.val_way, settings.val_shot + settings.val_query, channels, size, seed=1
    )
    trainer = make_trainer(settings, data=(train, val))
    key = training_key(settings)
    if key in TRAINED:
        accuracy = trainer.validate()[0]
    else:
        losses = TRAINED[key] = []
        step = trainer.train_step

        def recorded_step() -> tuple[float, float]:
            """The trainer's step, its loss kept."""
            loss, acc = step()
            losses.append(loss)
            return loss, acc

        monkeypatch.setattr(trainer, "train_step", recorded_step)
        trainer.fit()
        accuracy = read_metrics(settings.out)[-1].val_acc
    losses = TRAINED[key]
    assert len(losses) == TRAIN_STEPS and all(map(math.isfinite, losses)), losses
    assert losses[-1] < losses[0], losses
    assert 0 <= accuracy <= 100


def heavy_pretraining(path: Path) -> bool:
    """Whether a few pretraining steps take minutes on a 2-core CPU (ResNet-12 at 84x84)."""
    settings = make_config(str(path), {}, PretrainSettings)
    return settings.backbone == "resnet12" and GEOMETRY[settings.dataset][1] >= 84


@pytest.mark.parametrize("path", PRETRAIN_CONFIGS, ids=config_id)
def test_pretrain_config_loads_and_builds(path):
    config = make_config(str(path), {}, PretrainSettings)
    assert config.dataset == path.parent.name
    assert (config.val_way, config.val_shot, config.val_query) == (5, 1, 15)


@pytest.mark.slow
@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=pytest.mark.heavy) if heavy_pretraining(p) else p
        for p in PRETRAIN_CONFIGS
    ],
    ids=config_id,
)
def test_pretrain_config_trains(path, tmp_path):
    """Three pretraining steps of the config as it is (classifier, optimizer, batch size,
    augmentation, precision, memory format) on synthetic images of its geometry: finite losses,
    every backbone weight moved, then a validation by nearest centroid. Three steps of
    different batches say nothing of the trend (RFS's SGD 0.05 on ResNet-12 overshoots first
    on these 4 classes: 1.42, 5.61, 26.5, 22.9, 10.5, 9.8, 6.5, 3.1 on the CIFAR-FS config);
    the loss falling per epoch is tested in test_pretrain.py and shown by the Omniglot runs."""
    shipped = make_config(str(path), {}, PretrainSettings)
    settings = dataclasses.replace(shipped, epochs=1, val_episodes=8, out=str(tmp_path / "run"))
    channels, size = GEOMETRY[settings.dataset]
    # 4 classes of 3/4 batch each: one pass is exactly TRAIN_STEPS batches.
    per_class = TRAIN_STEPS * settings.batch_size // 4
    train = SYNTHETIC_IMAGES.synthetic_split(4, per_class, channels, size, seed=0)
    val = SYNTHETIC_IMAGES.synthetic_split(5, 16, channels, size, seed=1)
    trainer = make_trainer(settings, data=(train, val))
    assert trainer.steps_per_epoch == TRAIN_STEPS
    before = [p.detach().clone() for p in trainer.method.backbone.parameters()]
    losses = [trainer.train_step()[0] for _ in range(TRAIN_STEPS)]
    assert all(map(math.isfinite, losses)), losses
    after = list(trainer.method.backbone.parameters())
    assert all(not a.equal(b) for a, b in zip(before, after, strict=True))
    assert 0 <= trainer.validate()[0] <= 100


# The MetaOptNet paper's runs: the embedding methods on its four data sets.
PAPER_CONFIGS = [
    p
    for p in CONFIGS
    if p.parent.name in METAOPTNET_TRAIN_SHOT and not read_config_file(p).get("method")
]


@pytest.mark.parametrize(
    ("name", "way", "steps", "inner_lr", "batch"),
    [
        ("omniglot/maml_conv4_5way1shot", 5, 1, 0.4, 32),
        ("omniglot/maml_conv4_20way1shot", 20, 5, 0.1, 16),
        ("miniimagenet/maml_conv4_5way1shot", 5, 5, 0.01, 4),
    ],
)
def test_maml_configs_have_the_maml_papers_settings(name, way, steps, inner_lr, batch):
    c = make_config(str(REPO / "models" / f"{name}.json"), {})
    assert (c.method, c.way, c.episodes_per_batch) == ("maml", way, batch)
    assert (c.method_options["inner_steps"], c.method_options["inner_lr"]) == (steps, inner_lr)
    assert (c.optimizer, c.lr, c.lr_schedule) == ("adam", 0.001, [])
    assert c.epochs * c.episodes_per_epoch // c.episodes_per_batch == 60_000  # meta-iterations


ANIL_CONFIGS = sorted((REPO / "models" / "omniglot").glob("anil_conv4_*way*shot.json"))


@pytest.mark.parametrize("path", ANIL_CONFIGS, ids=lambda p: p.stem)
def test_anil_configs_are_their_maml_twins(path):
    """ANIL is MAML with only the classifier adapted: every other setting is the MAML paper's
    of the same shape (the ANIL paper reports its Omniglot numbers against MAML's at 20 ways)."""
    anil = read_config_file(path)
    maml = read_config_file(path.with_name(path.name.replace("anil", "maml")))
    differ = {k for k in anil.keys() | maml.keys() if anil.get(k) != maml.get(k)}
    assert differ == {"method", "out"}
    assert anil["method"] == "anil"


def test_every_omniglot_maml_shape_has_an_anil_config():
    shapes = {p.name.split("_")[-1] for p in (REPO / "models" / "omniglot").glob("maml_conv4_*")}
    assert {p.name.split("_")[-1] for p in ANIL_CONFIGS} == {
        s for s in shapes if s.endswith("shot.json")
    }


def test_paper_configs_cover_every_setting():
    names = {config_id(p) for p in PAPER_CONFIGS}
    expected = {
        f"{d}/{m}_{b}_{s}shot"
        for d in METAOPTNET_TRAIN_SHOT
        for m in ("protonet", "ridge", "svm")
        for b in ("conv4", "resnet12")
        for s in (1, 5)
    }
    assert names == expected


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=config_id)
def test_paper_settings(path):
    c = make_config(str(path), {})
    test_shot = int(path.stem.split("_")[-1].removesuffix("shot"))
    assert (c.way, c.query, c.val_way, c.val_query, c.val_shot) == (5, 15, 5, 15, test_shot)
    assert c.shot == (test_shot if c.head == "protonet" else METAOPTNET_TRAIN_SHOT[c.dataset])
    assert (c.optimizer, c.lr, c.momentum, c.weight_decay) == ("sgd", 0.1, 0.9, 5e-4)
    assert [c.lr_factor(e) for e in (19, 20, 39, 40, 49, 50, 99)] == [
        1.0, 0.06, 0.06, 0.012, 0.012, 0.0024, 0.0024,
    ]  # fmt: skip
    assert (c.epochs, c.episodes_per_epoch, c.episodes_per_batch) == (100, 1000, 2)
    assert (c.augment, c.label_smoothing, c.resplits) == (True, 0.1, 1)
    size = GEOMETRY[c.dataset][1]
    if c.backbone == "resnet12":
        assert c.backbone_options == {"drop_block_size": 5 if size == 84 else 2}
    assert c.head_options == ({"normalize_by_dim": True} if c.head == "protonet" else {})
    assert c.eval_head_options == {}  # the SVM is solved to convergence in testing too


def test_config_outputs_are_distinct():
    outs = [read_config_file(p).get("out") for p in ALL_CONFIGS]
    assert len(set(outs)) == len(outs)


def flag(command: list[str], name: str) -> Path | str:
    """The value after `name` in a command (a Path for path flags); '1' for a missing EHG flag."""
    if name not in command:
        return "1"
    value = command[command.index(name) + 1]
    return Path(value) if name in ("--config", "--out", "--checkpoint") else value


def test_table_dry_run_lists_the_papers_runs(tmp_path):
    command = [sys.executable, "-m", "experiments.fewshot_table.table", "--dry-run"]
    result = subprocess.run(
        [*command, "--data-root", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},  # as its README runs it: a module
    )
    commands = [shlex.split(line) for line in result.stdout.splitlines()]
    trains = [c for c in commands if c[:2] == ["fewshot", "train"]]
    evals = [c for c in commands if c[:2] == ["fewshot", "eval"]]
    assert len(commands) == len(trains) + len(evals)
    # 24 configs (3 methods x 2 backbones x 2 shots x 2 datasets), each plain and with EHG U=5.
    runs = [
        (flag(c, "--config").relative_to(REPO / "models"), flag(c, "--resplits")) for c in trains
    ]
    expected = {
        (Path(d) / f"{m}_{b}_{s}shot.json", u)
        for d in ("miniimagenet", "tieredimagenet")
        for m in ("protonet", "ridge", "svm")
        for b in ("conv4", "resnet12")
        for s in (1, 5)
        for u in ("1", "5")
    }
    assert len(runs) == len(set(runs)) == 48 and set(runs) == expected
    # Every run is evaluated once, on 2000 seeded 5-way test episodes of its own test shot.
    outs = [flag(c, "--out") for c in trains]
    assert sorted(flag(c, "--checkpoint").parent for c in evals) == sorted(outs)
    for c in evals:
        settings = dict(zip(c[2::2], c[3::2], strict=False))
        assert settings["--episodes"] == "2000" and settings["--way"] == "5"
        assert settings["--split"] == "test" and settings["--seed"] == "0"
        assert settings["--data-root"] == str(tmp_path)
        assert f"_{settings['--shot']}shot" in settings["--checkpoint"]


def test_only_filters_and_table_cells(tmp_path):
    script = load_module(TABLE_SCRIPT, "train_fewshot_table")
    runs = script.select(script.all_runs(), ["protonet,ridge", "conv4", "ehg", "tieredimagenet"])
    assert sorted(r.name for r in runs) == [
        f"tieredimagenet/{m}_conv4_{s}shot_ehg5" for m in ("protonet", "ridge") for s in (1, 5)
    ]
    with pytest.raises(script.FewshotError, match="unknown resnet18"):
        script.select(script.all_runs(), ["resnet18"])
    run_dir = tmp_path / "tieredimagenet" / "svm_resnet12_5shot_ehg5"
    run_dir.mkdir(parents=True)
    (run_dir / "test.json").write_text(json.dumps({"accuracy": 81.234, "ci95": 0.5555}))
    lines = script.table(tmp_path, 2000).splitlines()
    # Conv-4 rows come first, then ResNet-12; the last column is tieredImageNet 5-shot.
    conv4, resnet12 = [line for line in lines if line.startswith("| MetaOptNet-SVM(+EHG)")]
    assert "81.23" not in conv4 and conv4.count("—") == 4
    assert resnet12.split(" | ")[-1] == "81.23 ± 0.56 (80.62 ± 0.55) |"
    assert resnet12.count("—") == 3
