"""Per-parameter L2 regularization of image classifiers (paper Section 7, Table "MNIST, ...").

Softmax regression or the 784-300-10 MLP (3072-300-10 on CIFAR-10) with one regularization
weight per parameter: R^tr = CE(theta; mini-batch of D^tr) + sum_i exp(rho_i) theta_i^2, with
hyperparameters rho = log-weights (one tensor per parameter tensor) learned by Adam on the
validation cross-entropy. Observed set: 10000 training images split 8000 / 2000 (gamma 0.2) into
U seeded splits (`fewshot.hpo.make_splits`); test set: 10000 test images. Inner SGD step size
0.05 (MNIST, Fashion-MNIST) or 0.01 (CIFAR-10), Adam 0.01, as the paper states.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from functools import partial

import torch
import torch.nn.functional as F

from fewshot.errors import FewshotError
from fewshot.hpo.ensemble import StepCallback, make_splits, oehg, optimize_offline
from fewshot.hpo.hypergrad import Bilevel, rhg, trhg
from fewshot.hpo.images import (
    MinibatchStream,
    classifier_logits,
    evaluate,
    flat_pixels,
    init_classifier,
    load_image_dataset,
)
from fewshot.hpo.trees import Theta

DATASETS = ("mnist", "fashion-mnist", "cifar10")
METHODS = ("rhg", "trhg", "oehg")


@dataclass(frozen=True)
class ObservedData:
    """The observed set (to be split into train / validation) and the held-out test set."""

    x: torch.Tensor
    y: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int


def draw_observed_data(
    dataset: str,
    seed: int = 0,
    data_root: str | os.PathLike | None = None,
    n_observed: int = 10000,
    n_test: int = 10000,
) -> ObservedData:
    """A seeded draw of `n_observed` training images and `n_test` test images, flat in [0, 1]."""
    if dataset not in DATASETS:
        raise FewshotError(f"--dataset {dataset!r}: choose from {', '.join(DATASETS)}")
    train = load_image_dataset(dataset, "train", data_root)
    test = load_image_dataset(dataset, "test", data_root)
    if n_observed > len(train.labels) or n_test > len(test.labels):
        raise FewshotError(
            f"{dataset} has {len(train.labels)} training and {len(test.labels)} test images; "
            f"asked for {n_observed} and {n_test}"
        )
    gen = torch.Generator().manual_seed(seed)
    obs = torch.randperm(len(train.labels), generator=gen)[:n_observed]
    te = torch.randperm(len(test.labels), generator=gen)[:n_test]
    return ObservedData(
        flat_pixels(train, obs), train.labels[obs], flat_pixels(test, te), test.labels[te], 10
    )


def regularization_problem(inner_lr: float) -> Bilevel:
    """Inner: mini-batch CE + sum exp(rho) theta^2; outer: validation CE."""

    def inner(theta: Theta, rho: Theta, data: MinibatchStream) -> torch.Tensor:
        x, y, _ = data.next()
        penalty = sum((torch.exp(rho[k]) * theta[k] ** 2).sum() for k in theta)
        return F.cross_entropy(classifier_logits(theta, x), y) + penalty

    def outer(theta: Theta, rho: Theta, data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = data
        return F.cross_entropy(classifier_logits(theta, x), y)

    return Bilevel(inner, outer, inner_lr)


@dataclass(frozen=True)
class Settings:
    """A per-parameter regularization run (paper's protocol; step counts fit a small CPU)."""

    dataset: str = "mnist"
    model: str = "sr"
    method: str = "oehg"
    splits: int | None = None  # U; default 5 for OEHG, 1 for RHG / T-RHG
    seed: int = 0
    gamma: float = 0.2
    outer_steps: int | None = None  # T; default OEHG 1000, RHG / T-RHG the same inner budget
    inner_steps: int = 128  # K of RHG / T-RHG
    truncate: int = 16
    inner_lr: float | None = None  # default 0.05, CIFAR-10 0.01 (the paper's)
    outer_lr: float = 0.01
    batch: int = 256
    init_log_lam: float = math.log(1e-4)
    device: str = "cpu"

    def split_count(self) -> int:
        """U for this method."""
        return self.splits if self.splits is not None else (5 if self.method == "oehg" else 1)

    def step_size(self) -> float:
        """The inner SGD learning rate."""
        if self.inner_lr is not None:
            return self.inner_lr
        return 0.01 if self.dataset == "cifar10" else 0.05

    def outer_step_count(self) -> int:
        """T; RHG / T-RHG get OEHG's total of (U + 1) * 1000 = 6000 inner steps by default."""
        if self.outer_steps is not None:
            return self.outer_steps
        return 1000 if self.method == "oehg" else math.ceil(6000 / self.inner_steps)

    def check(self) -> None:
        """Raise FewshotError on settings that cannot run."""
        if self.method not in METHODS:
            raise FewshotError(f"--method {self.method!r}: choose from {', '.join(METHODS)}")
        if self.method != "oehg" and self.split_count() != 1:
            raise FewshotError("--splits applies to oehg only (RHG / T-RHG use one split)")
        if not 0 < self.truncate <= self.inner_steps:
            raise FewshotError(f"--truncate {self.truncate} must lie in 1..--inner-steps")


@dataclass
class RegularizationResult:
    """Test metrics of the deployed model, and the learned weights' summary."""

    settings: dict
    test_accuracy: float
    test_loss: float
    seconds: float
    mean_log_lam: dict[str, float] = field(default_factory=dict)
    outer_losses: list[float] = field(default_factory=list)


def run_image_regularization(
    settings: Settings, data: ObservedData, on_step: StepCallback | None = None
) -> RegularizationResult:
    """Learn per-parameter weights with RHG / T-RHG / OEHG and test the deployed model."""
    settings.check()
    start = time.perf_counter()
    device = torch.device(settings.device)
    x, y = data.x.to(device), data.y.to(device)
    splits = make_splits(len(y), settings.gamma, settings.split_count(), settings.seed)
    split_data = [
        (
            MinibatchStream(x[s.train], y[s.train], settings.batch, settings.seed + 10 * i),
            (x[s.val], y[s.val]),
        )
        for i, s in enumerate(splits)
    ]
    problem = regularization_problem(settings.step_size())
    theta0 = {
        k: v.to(device)
        for k, v in init_classifier(
            settings.model, x.shape[1], data.num_classes, settings.seed
        ).items()
    }
    rho0 = {k: torch.full_like(v, settings.init_log_lam) for k, v in theta0.items()}
    steps = settings.outer_step_count()
    if settings.method == "oehg":
        deploy = MinibatchStream(
            x[splits[0].train], y[splits[0].train], settings.batch, settings.seed
        )
        result = oehg(
            problem, theta0, rho0, split_data, deploy, steps, settings.outer_lr, 1, on_step
        )
    else:
        K = settings.inner_steps
        estimator = (
            partial(rhg, steps=K)
            if settings.method == "rhg"
            else partial(trhg, steps=K, truncate=settings.truncate)
        )
        result = optimize_offline(
            estimator, problem, theta0, rho0, split_data, steps, settings.outer_lr, K, on_step
        )
    accuracy, loss = evaluate(result.theta, data.x_test.to(device), data.y_test.to(device))
    return RegularizationResult(
        settings=asdict(settings),
        test_accuracy=accuracy,
        test_loss=loss,
        seconds=time.perf_counter() - start,
        mean_log_lam={k: float(v.mean()) for k, v in result.lam.items()},
        outer_losses=result.outer_losses,
    )
