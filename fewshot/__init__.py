"""fewshot: few-shot meta-learning with ensemble hypergradients (EHG).

The Python API is the command line's equal: `fewshot.train(...)`, `fewshot.pretrain(...)`,
`fewshot.evaluate(...)`, `fewshot.compare(...)`, `fewshot.compare_seeds(...)`, `fewshot.bench(...)`,
`fewshot.predict(...)` and the settings
classes they build (see fewshot.api); `fewshot.FewShotClassifier` classifies images in memory
with any of its models, a frozen backbone or an nn.Module (see fewshot.classifier).
"""

import importlib
import re
from pathlib import Path
from typing import Any


def _version() -> str:
    """The installed distribution's version, else (a source tree on the path, not installed)
    the one in the pyproject.toml beside the package."""
    from importlib import metadata

    try:
        return metadata.version("fewshot")
    except metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        found = pyproject.is_file() and re.search(
            r'^version = "([^"]+)"', pyproject.read_text(), re.M
        )
        return found.group(1) if found else "unknown"


# The API's names and their modules, imported on first use: the `fewshot` command imports this
# package before torch, so that Ctrl-C while torch loads is one line (fewshot.cli.run).
_API = {
    "train": "fewshot.api",
    "pretrain": "fewshot.api",
    "evaluate": "fewshot.api",
    "compare": "fewshot.api",
    "bench": "fewshot.api",
    "Leaderboard": "fewshot.benchmark.leaderboard",
    "compare_seeds": "fewshot.api",
    "predict": "fewshot.api",
    "FewShotClassifier": "fewshot.classifier",
    "Prediction": "fewshot.cli.predict",
    "EvalSettings": "fewshot.cli.eval",
    "EvalResult": "fewshot.evaluation.episodes",
    "Difference": "fewshot.evaluation.stats",
    "FewshotError": "fewshot.runtime.errors",
    "PretrainSettings": "fewshot.training.settings",
    "TrainSettings": "fewshot.training.settings",
}
__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    """The API name `name`, from its module (PEP 562), or `__version__`, found on first use:
    the `fewshot` command starts, and takes over Ctrl-C, before reading any metadata."""
    if name == "__version__":
        globals()[name] = _version()
        return globals()[name]
    if name not in _API:
        raise AttributeError(f"module 'fewshot' has no attribute {name!r}")
    return getattr(importlib.import_module(_API[name]), name)


def __dir__() -> list[str]:
    """The package's names, the lazily imported API's among them."""
    return sorted({*globals(), *_API, "__version__"})
