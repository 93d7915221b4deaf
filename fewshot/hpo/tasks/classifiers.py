"""The classifiers of the HPO image tasks, as pure functions of a parameter dict.

"sr": softmax regression (zeros at start); "mlp": in_dim-300-classes with ReLU (nn.Linear-style
uniform start). Any dict of tensors works with `fewshot.hpo`'s estimators. `step_bytes` bounds
from below what back-propagation keeps of one inner step, for the tasks' memory estimates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fewshot.hpo.optimize import OEHG_RESPLITS
from fewshot.hpo.tasks.base import HpoSettings
from fewshot.runtime.device import device_setting
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.settings import setting

CLASSIFIERS = ("sr", "mlp")
MLP_HIDDEN = 300


@dataclass(frozen=True, kw_only=True)
class ClassifierSettings(HpoSettings):
    """The settings the two image tasks (cleaning, image regularization) share."""

    model: str = setting(help="classifier", choices=CLASSIFIERS)
    device: str = device_setting()
    # Only OEHG reads it: each task lists it in TASK_UNUSED for the offline methods.
    resplits: int | None = setting(
        None, help=f"U, OEHG's train/validation splits (oehg; default {OEHG_RESPLITS})", low=1
    )


def init_classifier(kind: str, in_dim: int, num_classes: int, seed: int) -> dict[str, torch.Tensor]:
    """Initial parameters: zeros for softmax regression, nn.Linear-style uniform for the MLP."""
    if kind == "sr":
        return {"w": torch.zeros(in_dim, num_classes), "b": torch.zeros(num_classes)}
    if kind != "mlp":
        raise FewshotError(f"unknown model {kind!r}; choose from {', '.join(CLASSIFIERS)}")
    gen = torch.Generator().manual_seed(seed)

    def uniform(*shape: int, fan_in: int) -> torch.Tensor:
        return (torch.rand(*shape, generator=gen) * 2 - 1) / fan_in**0.5

    return {
        "w1": uniform(in_dim, MLP_HIDDEN, fan_in=in_dim),
        "b1": uniform(MLP_HIDDEN, fan_in=in_dim),
        "w2": uniform(MLP_HIDDEN, num_classes, fan_in=MLP_HIDDEN),
        "b2": uniform(num_classes, fan_in=MLP_HIDDEN),
    }


def parameter_count(kind: str, in_dim: int, num_classes: int) -> int:
    """The number of parameters of a classifier."""
    if kind == "sr":
        return (in_dim + 1) * num_classes
    return (in_dim + 1) * MLP_HIDDEN + (MLP_HIDDEN + 1) * num_classes


def step_bytes(
    kind: str, in_dim: int, num_classes: int, batch: int, drawn: bool, penalised: bool
) -> int:
    """A lower bound on what back-propagation keeps of one inner step (float32): the logits
    and their gradient, the MLP's hidden activations and their gradient, the batch's rows when
    drawn (`drawn`: a copy, unlike the full set), and with one penalty weight per parameter
    (`penalised`) the step's iterate and exp(weights). Measured: 1.0x to 3.1x this."""
    hidden = 2 * MLP_HIDDEN if kind == "mlp" else 0
    floats = batch * (2 * num_classes + hidden + (in_dim if drawn else 0))
    if penalised:
        floats += 2 * parameter_count(kind, in_dim, num_classes)
    return 4 * floats


def classifier_logits(theta: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Logits [n, classes] of either classifier for flat inputs x [n, in_dim]."""
    if "w" in theta:
        return torch.addmm(theta["b"], x, theta["w"])
    hidden = torch.relu(torch.addmm(theta["b1"], x, theta["w1"]))
    return torch.addmm(theta["b2"], hidden, theta["w2"])


@torch.no_grad()
def classifier_scores(
    theta: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
) -> tuple[float, float]:
    """(accuracy in %, mean cross-entropy) of a classifier on (x, y)."""
    logits = classifier_logits(theta, x)
    return 100 * float((logits.argmax(1) == y).float().mean()), float(F.cross_entropy(logits, y))
