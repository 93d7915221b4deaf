"""What `fewshot train` accepts, it honours: every option, under every method and head, either
changes a (tiny, real) training run or is refused before any data is read, in one line naming
the option and the method. The matrix is every TrainSettings field x every method and head."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
import torch
from trainers import make_trainer

from fewshot.datasets import load_split
from fewshot.methods import UNUSED_SETTINGS, build_method
from fewshot.runtime.errors import FewshotError
from fewshot.training.settings import PretrainSettings, TrainSettings, make_config

# Where a run reads and writes, what it runs on and how fast: they choose the place, not the run
# (extra_data: test_sources.py; compile, the same run to float32 rounding: test_compiled.py).
PLACES = {"dataset", "data_root", "out", "device", "extra_data", "compile"}
# The methods with the heads they are tried with (the MAML family has no head, matching and
# relation a comparison module instead).
RUNS = {
    "protonet": {"method": "embedding", "head": "protonet"},
    "ridge": {"method": "embedding", "head": "ridge", "head_options": {"lam": 0.5}},
    "svm": {"method": "embedding", "head": "svm"},
    "matching": {"method": "matching"},
    # SGD 0.1 stalls the tiny relation module within two steps (a constant score, chance
    # accuracy whatever the validation episodes): the paper's Adam 1e-3.
    "relation": {"method": "relation", "optimizer": "adam", "lr": 0.001},
    "maml": {"method": "maml"},
    "fomaml": {"method": "fomaml"},
    "anil": {"method": "anil"},
    "imaml": {"method": "imaml"},
}
# A tiny run: 3-way 1-shot 2-query episodes, one epoch of two steps, six validation episodes.
BASE = {
    "way": 3, "shot": 1, "query": 2, "val_query": 5, "val_episodes": 6, "epochs": 1,
    "episodes_per_epoch": 2, "episodes_per_batch": 1, "amp": "off", "device": "cpu",
    "backbone_options": {"channels": 16},
}  # fmt: skip
HEAD_OPTIONS = {"protonet": {"normalize_by_dim": True}, "ridge": {"lam": 5.0}, "svm": {"C": 1.0}}
METHOD_OPTIONS = {"maml": {"inner_lr": 0.1}, "fomaml": {"inner_lr": 0.1}, "anil": {"inner_lr": 0.1}}
METHOD_OPTIONS["imaml"] = {"proximal": 2.0}
METHOD_OPTIONS |= {"matching": {"fce": True}, "relation": {"loss": "cross_entropy"}}


def other_value(field: str, run: dict, settings: TrainSettings) -> dict:
    """`field` at a valid value other than the run's (with what that value needs)."""
    head = run.get("head", "protonet")
    values = {
        "train_split": "test", "val_split": "test", "method_options": METHOD_OPTIONS.get(
            run["method"], {"any": 1}), "backbone": "resnet12",
        "backbone_options": {"channels": 4}, "head": "ridge" if head != "ridge" else "protonet",
        "head_options": HEAD_OPTIONS[head], "eval_head_options": HEAD_OPTIONS[head], "way": 2,
        "shot": 2, "query": 3, "val_way": 2, "val_shot": 2, "val_query": 4, "val_episodes": 5,
        "val_seed": 7, "epochs": 2, "episodes_per_epoch": 4, "episodes_per_batch": 2,
        "resplits": 2, "optimizer": "sgd" if settings.optimizer == "adam" else "adam",
        "lr": settings.lr / 2, "momentum": 0.5, "weight_decay": 0.01,
        "lr_schedule": [[0, 0.5]], "label_smoothing": 0.2, "augment": True,
        "channels_last": not settings.channels_last, "amp": "bf16", "seed": 1,
        "resize": 32, "channels": 3,  # refused: they apply to --dataset folder
        "backbone_lr": settings.lr / 4, "freeze_backbone": True,
        "normalization": "backbone",  # refused: Conv-4 has no normalisation of its own
        "varied": True, "max_way": 4, "max_support": 10,  # the last two refused without it
    }  # fmt: skip
    if field == "backbone":  # ResNet-12 takes four widths
        return {"backbone": "resnet12", "backbone_options": {"channels": [4, 4, 4, 4]}}
    return {field: values[field]}


@functools.cache
def split(root: str, name: str):
    """A split of the tiny Omniglot, read once for the whole matrix."""
    return load_split("omniglot", name, root)


def observe(settings: TrainSettings, root: str) -> tuple:
    """What a run produced: its weights, its metrics (times left out) and the memory format
    of its convolution weights."""
    data = (split(root, settings.train_split), split(root, settings.val_split))
    trainer = make_trainer(settings, data=data)
    trainer.fit()
    weights = {k: v.detach().clone() for k, v in trainer.method.state_dict().items()}
    rows = [
        {k: v for k, v in row.items() if "seconds" not in k} for row in trainer.progress.history
    ]
    formats = [
        p.is_contiguous(memory_format=torch.channels_last)
        for p in trainer.method.parameters()
        if p.dim() == 4
    ]
    return weights, rows, formats


def same(a: tuple, b: tuple) -> bool:
    """Whether two observations are the very same run."""
    (wa, ra, fa), (wb, rb, fb) = a, b
    return (
        wa.keys() == wb.keys()
        and all(wa[k].shape == wb[k].shape and torch.equal(wa[k], wb[k]) for k in wa)
        and ra == rb
        and fa == fb
    )


# Honoured, but no accuracy can show it: validation reports accuracies, and dividing every
# ProtoNet logit by the dimension cannot change an argmax.
INVISIBLE = {("protonet", "eval_head_options")}
FIELDS = [f.name for f in dataclasses.fields(TrainSettings) if f.name not in PLACES]
FIELDS.remove("method")  # the matrix's other axis


@functools.cache
def pretrained(root: str, folder: str) -> str:
    """A tiny pretraining checkpoint of BASE's backbone, for --init."""
    settings = PretrainSettings(
        batch_size=32, epochs=1, val_episodes=6, data_root=root, out=folder, device="cpu",
        backbone_options=BASE["backbone_options"],
    )  # fmt: skip
    make_trainer(settings, data=(split(root, "train"), split(root, "val"))).fit()
    return f"{folder}/last.pt"


def backbone_file(settings: TrainSettings, folder: Path) -> str:
    """A state dict of the run's backbone (the MAML family's keeps no BatchNorm statistics)
    with other weights than the run's own, for --backbone-weights."""
    torch.manual_seed(5)
    path = folder / "backbone.pt"
    method = build_method({**settings.to_dict(), "in_channels": 1, "image_size": 28})
    torch.save(method.backbone.state_dict(), path)
    return str(path)


@functools.cache
def baseline(name: str, root: str, folder: str) -> tuple:
    """The settings and observation of a run's tiny baseline (trained once per run)."""
    settings = make_config(None, {**BASE, **RUNS[name], "data_root": root, "out": folder})
    return settings, observe(settings, root)


@pytest.mark.slow
@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("name", RUNS)
def test_every_option_changes_the_run_or_is_refused_naming_it(
    name, field, tiny_omniglot_root, tmp_path_factory
):
    root, method = str(tiny_omniglot_root), RUNS[name]["method"]
    settings, observed = baseline(name, root, str(tmp_path_factory.getbasetemp() / f"base_{name}"))
    if field == "init":  # a pretrained backbone to start from
        change = {"init": pretrained(root, str(tmp_path_factory.getbasetemp() / "pretrained"))}
    elif field == "backbone_weights":
        change = {field: backbone_file(settings, tmp_path_factory.mktemp("weights"))}
    else:
        change = other_value(field, RUNS[name], settings)
    out = tmp_path_factory.mktemp("changed")
    try:
        changed = make_config(
            None, {**BASE, **RUNS[name], "data_root": root, **change, "out": str(out / "run")}
        )
    except FewshotError as e:
        message = str(e)
        assert "--" + field.replace("_", "-") in message and "\n" not in message
        if field in UNUSED_SETTINGS[method]:
            assert f"--method {method}" in message
        assert not (out / "run").exists()
        return
    assert field not in UNUSED_SETTINGS[method], f"{field} is declared unused but accepted"
    if (name, field) in INVISIBLE:
        return
    assert not same(observe(changed, root), observed), f"{change} changed nothing"
