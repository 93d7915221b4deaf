"""The Python API: each command as a function, with the command line's settings, layered
defaults (method, backbone with head, config file) and refusals (FewshotError, with the same
one-line message). Keyword arguments are the flags' names with underscores."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import nn

from fewshot.benchmark.leaderboard import Leaderboard
from fewshot.cli.bench import BenchListing, BenchSettings, run_bench
from fewshot.cli.compare import (
    CompareSeedsSettings,
    CompareSettings,
    run_compare,
    run_compare_seeds,
)
from fewshot.cli.eval import EvalSettings, run_eval
from fewshot.cli.predict import Prediction, PredictSettings, run_predict
from fewshot.cli.train import PretrainRun, TrainRun, run_train
from fewshot.evaluation.episodes import EvalResult
from fewshot.evaluation.stats import Difference
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.settings import build
from fewshot.training.model_source import MODULE_PREFIX, Backbone, given_modules
from fewshot.training.run_settings import RunSettings
from fewshot.training.settings import PretrainSettings, TrainSettings


def _plain(value: Any) -> Any:
    """A path object as the string the command line would have given (lists too)."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _flags(values: dict) -> dict:
    """Keyword settings with path objects as strings."""
    return {key: _plain(value) for key, value in values.items()}


def _run(run: TrainRun, cls: type[RunSettings], settings: RunSettings | None, values: dict) -> Path:
    """Build the settings as the command does (under a resumed run and a config file), train."""
    if settings is not None and not isinstance(settings, cls):
        raise FewshotError(
            f"settings must be a {cls.__name__}, got {type(settings).__name__} {settings!r}; "
            "a config file goes in config=..."
        )
    values = _flags(values)
    if settings is None:
        settings = build(cls, [*run.sources(), ("flags", values)])
    elif values or run.config or run.resume:
        raise FewshotError("give either a settings object or config/resume/keyword settings")
    return run_train(run, settings)


def train(
    settings: TrainSettings | None = None,
    *,
    config: str | None = None,
    resume: str | None = None,
    overwrite: bool = False,
    **values: Any,
) -> Path:
    """`fewshot train`: episodic meta-training; returns the run folder (best.pt, last.pt,
    metrics.jsonl). E.g. `train(method="maml", epochs=2, out="runs/maml")`."""
    run = TrainRun(_plain(config), _plain(resume), overwrite)
    return _run(run, TrainSettings, settings, values)


def pretrain(
    settings: PretrainSettings | None = None,
    *,
    config: str | None = None,
    resume: str | None = None,
    overwrite: bool = False,
    **values: Any,
) -> Path:
    """`fewshot pretrain`: supervised pretraining on every train class; returns the run folder."""
    run = PretrainRun(_plain(config), _plain(resume), overwrite)
    return _run(run, PretrainSettings, settings, values)


def _modules(values: dict, keys: tuple[str, ...]) -> list[Backbone]:
    """Replace each nn.Module among `values[key]` (a frozen backbone from Python) by the name
    the settings know it by (module:CLASS), with the input it takes (`image_size`, `mean`,
    `std` popped from `values`; else what the module says, else the data's); the modules."""
    given = {key: values[key] for key in keys if isinstance(values.get(key), nn.Module)}
    shared = {key: values.pop(key) for key in ("image_size", "mean", "std") if key in values}
    if shared and not given:
        raise FewshotError(f"{', '.join(shared)}: apply to a backbone given as an nn.Module")
    backbones = []
    for key, module in given.items():
        name = f"{MODULE_PREFIX}{type(module).__name__}"
        name += f"-{key}" if len(given) > 1 else ""
        mean, std = shared.get("mean"), shared.get("std")
        backbones.append(
            Backbone(
                name,
                module=module,
                image_size=shared.get("image_size"),
                mean=tuple(mean) if mean is not None else None,
                std=tuple(std) if std is not None else None,
            )
        )
        values[key] = name
    return backbones


def evaluate(checkpoint: str | Path | None = None, **values: Any) -> EvalResult:
    """`fewshot eval`: accuracy ± 95% CI on seeded test episodes (also written as JSON), of a
    checkpoint or of a frozen backbone (`backbone=` a name such as "timm:resnet18", or any
    nn.Module mapping images to features, with `image_size`, `mean` and `std` where the
    module does not say them), e.g. `evaluate(backbone=model, dataset="folder", ...)`."""
    values = _flags(values)
    modules = _modules(values, ("backbone",))
    if checkpoint is not None:
        values["checkpoint"] = str(checkpoint)
    with given_modules(modules):
        return run_eval(build(EvalSettings, [("flags", values)]))


def bench(suite: str | Path, *models: str | Path, **values: Any) -> Leaderboard:
    """`fewshot bench`: the models (checkpoints or frozen backbones' names) on a suite's cells,
    ranked with the zoo's stored results; returns the leaderboard (also written to `out`),
    e.g. `bench("omniglot-v1", "runs/omni/best.pt", limit=200).cells[0].standings`."""
    values = {**_flags(values), "suite": str(suite), "models": [str(m) for m in models]}
    board = run_bench(BenchListing(), build(BenchSettings, [("flags", values)]))
    assert board is not None  # only --list returns none
    return board


def compare(a: str | Path | nn.Module, b: str | Path | nn.Module, **values: Any) -> Difference:
    """`fewshot compare`: B - A on the very same seeded episodes, with its paired 95% CI; each
    of A and B a checkpoint, a frozen backbone's name or an nn.Module (see `evaluate`)."""
    values = {**_flags(values), "a": a if isinstance(a, nn.Module) else str(a)}
    values["b"] = b if isinstance(b, nn.Module) else str(b)
    modules = _modules(values, ("a", "b"))
    with given_modules(modules):
        return run_compare(build(CompareSettings, [("flags", values)]))


def compare_seeds(a: list[str | Path], b: list[str | Path], **values: Any) -> Difference:
    """`fewshot compare-seeds`: the mean paired difference of arms B and A across seeds."""
    arms = {"a": [str(p) for p in a], "b": [str(p) for p in b]}
    return run_compare_seeds(build(CompareSeedsSettings, [("flags", {**arms, **_flags(values)})]))


def predict(
    checkpoint: str | Path | None = None,
    support: str | Path | None = None,
    query: str | Path | list[str | Path] | None = None,
    **values: Any,
) -> Prediction:
    """`fewshot predict`: the classes of query images (files or folders of them) from a
    support folder of class folders, with a checkpoint or a frozen backbone (`backbone=`, as
    in `evaluate`); `.classes`, `.paths`, `.scores` [n, way], `.predicted`. For images in
    memory (tensors, PIL images), `fewshot.FewShotClassifier`."""
    values = _flags(values)
    for key, value in (("support", support), ("query", query)):
        if value is not None and not isinstance(value, str | os.PathLike | list | tuple):
            raise FewshotError(
                f"{key} must be a folder or image paths, got a {type(value).__name__} (for "
                "images in memory: fewshot.FewShotClassifier)"
            )
    if query is not None:
        values["query"] = [str(q) for q in (query if isinstance(query, list | tuple) else [query])]
    if support is not None:
        values["support"] = str(support)
    if checkpoint is not None:
        values["checkpoint"] = str(checkpoint)
    modules = _modules(values, ("backbone",))
    with given_modules(modules):
        return run_predict(build(PredictSettings, [("flags", values)]))
