"""The classifiers of the HPO image tasks, as pure functions of a parameter dict.

"sr": softmax regression (zeros at start); "mlp": in_dim-300-classes with ReLU (nn.Linear-style
uniform start). Any dict of tensors works with `fewshot.hpo`'s estimators.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from fewshot.hpo.tasks.base import HpoSettings
from fewshot.runtime.device import device_setting
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.settings import setting

CLASSIFIERS = ("sr", "mlp")
MLP_HIDDEN = 300


@dataclass(frozen=True, kw_only=True)
class ClassifierSettings(HpoSettings):
    """The settings the two image tasks (cleaning, image regularization) share."""

    OFFLINE_RESPLITS: ClassVar[bool] = False

    model: str = setting(help="classifier", choices=CLASSIFIERS)
    device: str = device_setting()


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
