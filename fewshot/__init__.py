"""fewshot: few-shot meta-learning with ensemble hypergradients (EHG).

The Python API is the command line's equal: `fewshot.train(...)`, `fewshot.pretrain(...)`,
`fewshot.evaluate(...)`, `fewshot.compare(...)`, `fewshot.compare_seeds(...)` and the settings
classes they build (see fewshot.api).
"""

from importlib import metadata

from fewshot.api import compare, compare_seeds, evaluate, pretrain, train
from fewshot.cli.eval import EvalSettings
from fewshot.evaluation.episodes import EvalResult
from fewshot.evaluation.stats import Difference
from fewshot.runtime.errors import FewshotError
from fewshot.training.settings import PretrainSettings, TrainSettings

__version__ = metadata.version("fewshot")  # pyproject.toml's

__all__ = [
    "Difference",
    "EvalResult",
    "EvalSettings",
    "FewshotError",
    "PretrainSettings",
    "TrainSettings",
    "compare",
    "compare_seeds",
    "evaluate",
    "pretrain",
    "train",
]
