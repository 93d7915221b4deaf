"""The Python API: each command as a function, with the command line's settings, layered
defaults (method, backbone with head, config file) and refusals (FewshotError, with the same
one-line message). Keyword arguments are the flags' names with underscores."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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
from fewshot.training.settings import PretrainSettings, RunSettings, TrainSettings


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


def evaluate(checkpoint: str | Path, **values: Any) -> EvalResult:
    """`fewshot eval`: accuracy ± 95% CI on seeded test episodes (also written as JSON)."""
    settings = build(EvalSettings, [("flags", {"checkpoint": str(checkpoint), **_flags(values)})])
    return run_eval(settings)


def compare(a: str | Path, b: str | Path, **values: Any) -> Difference:
    """`fewshot compare`: B - A on the very same seeded episodes, with its paired 95% CI."""
    settings = build(CompareSettings, [("flags", {"a": str(a), "b": str(b), **_flags(values)})])
    return run_compare(settings)


def compare_seeds(a: list[str | Path], b: list[str | Path], **values: Any) -> Difference:
    """`fewshot compare-seeds`: the mean paired difference of arms B and A across seeds."""
    arms = {"a": [str(p) for p in a], "b": [str(p) for p in b]}
    return run_compare_seeds(build(CompareSeedsSettings, [("flags", {**arms, **_flags(values)})]))


def predict(
    checkpoint: str | Path,
    support: str | Path,
    query: str | Path | list[str | Path],
    **values: Any,
) -> Prediction:
    """`fewshot predict`: the classes of query images (files or folders of them) from a
    support folder of class folders; `.classes`, `.paths`, `.scores` [n, way], `.predicted`.
    For tensors of images, a trained model's own `predict(support, labels, query)`."""
    queries = [str(q) for q in (query if isinstance(query, list | tuple) else [query])]
    paths = {"checkpoint": str(checkpoint), "support": str(support), "query": queries}
    return run_predict(build(PredictSettings, [("flags", {**paths, **_flags(values)})]))
