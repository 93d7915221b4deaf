"""Per-parameter L2 regularization of image classifiers (paper Section 7, Table "MNIST, ...").

Softmax regression or the 784-300-10 MLP (3072-300-10 on CIFAR-10) with one regularization
weight per parameter: R^tr = CE(theta; mini-batch of D^tr) + sum_i exp(rho_i) theta_i^2, with
hyperparameters rho = log-weights (one tensor per parameter tensor) learned by Adam on the
validation cross-entropy. Observed set: 10000 training images split 8000 / 2000 (gamma 0.2) into
U seeded splits (`fewshot.hpo.splits.make_splits`); test set: 10000 test images. Inner SGD step
size 0.05 (MNIST, Fashion-MNIST) or 0.01 (CIFAR-10), Adam 0.01, as the paper states. The inner
mini-batches are drawn by the estimators from generators derived from the seed.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F

from fewshot.hpo.batches import Minibatches
from fewshot.hpo.ensemble import StepCallback
from fewshot.hpo.hypergrad import Bilevel
from fewshot.hpo.optimize import OEHG_RESPLITS, optimize
from fewshot.hpo.splits import make_splits, validation_size
from fewshot.hpo.tasks.base import (
    OFFLINE_METHODS,
    Task,
    run_stem,
    write_json,
)
from fewshot.hpo.tasks.classifiers import (
    ClassifierSettings,
    classifier_logits,
    classifier_scores,
    init_classifier,
    parameter_count,
    step_bytes,
)
from fewshot.hpo.tasks.image_data import (
    FLAT_SIZES,
    IMAGE_DATASETS,
    NUM_CLASSES,
    flat_pixels,
    load_image_dataset,
)
from fewshot.hpo.trees import Theta
from fewshot.runtime.device import resolve_device
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.memory import MemoryTerm, check_memory
from fewshot.runtime.settings import setting

N_OBSERVED, N_TEST = 10000, 10000  # the paper's observed and test images


@dataclass(frozen=True)
class ObservedData:
    """The observed set (to be split into train / validation) and the held-out test set."""

    x: torch.Tensor
    y: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int

    def to(self, device: torch.device) -> ObservedData:
        """The same data on `device`."""
        moved = {k: v.to(device) if torch.is_tensor(v) else v for k, v in asdict(self).items()}
        return ObservedData(**moved)


def draw_observed_data(
    dataset: str,
    seed: int = 0,
    data_root: str | os.PathLike | None = None,
    n_observed: int = N_OBSERVED,
    n_test: int = N_TEST,
) -> ObservedData:
    """A seeded draw of `n_observed` training images and `n_test` test images, flat in [0, 1]."""
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
        flat_pixels(train, obs),
        train.labels[obs],
        flat_pixels(test, te),
        test.labels[te],
        NUM_CLASSES,
    )


def regularization_problem(inner_lr: float) -> Bilevel:
    """Inner: batch CE + sum exp(rho) theta^2; outer: validation CE."""

    def inner(theta: Theta, rho: Theta, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        penalty = sum((torch.exp(rho[k]) * theta[k] ** 2).sum() for k in theta)
        return F.cross_entropy(classifier_logits(theta, x), y) + penalty

    def outer(theta: Theta, rho: Theta, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(classifier_logits(theta, x), y)

    return Bilevel(inner, outer, inner_lr)


@dataclass(frozen=True, kw_only=True)
class Settings(ClassifierSettings):
    """`fewshot hpo image-regularization` (paper's protocol; step counts fit a small CPU)."""

    # Fields a method does not read, besides HpoSettings' (METHOD_UNUSED): the offline methods
    # learn on one split.
    TASK_UNUSED: ClassVar[dict[str, frozenset[str]]] = {
        m: frozenset({"resplits"}) for m in OFFLINE_METHODS
    }

    dataset: str = setting(help="image set", choices=IMAGE_DATASETS)
    gamma: float = setting(0.2, help="validation share", above=0, below=1, flag=False)
    outer_steps: int | None = setting(None, help="T (default: equal budgets)", low=1)
    inner_lr: float | None = setting(None, help="default 0.05 (0.01 CIFAR-10)", above=0)
    batch: int = setting(256, help="inner SGD mini-batch", low=1)
    init_log_lam: float = setting(math.log(1e-4), help="initial log weight", flag=False)

    def step_size(self) -> float:
        """The inner SGD learning rate."""
        if self.inner_lr is not None:
            return self.inner_lr
        return 0.01 if self.dataset == "cifar10" else 0.05

    def outer_step_count(self) -> int:
        """T; RHG / T-RHG / AID get OEHG's total of (U + 1) * 1000 = 6000 inner steps by default."""
        if self.outer_steps is not None:
            return self.outer_steps
        oehg_steps = 1000
        if self.method == "oehg":
            return oehg_steps
        return math.ceil(oehg_steps * (OEHG_RESPLITS + 1) / self.inner_steps)


@dataclass
class ImageRegularizationResult:
    """Test metrics of the deployed model, and the learned weights' summary."""

    settings: dict
    test_accuracy: float
    test_loss: float
    seconds: float
    mean_log_lam: dict[str, float] = field(default_factory=dict)
    outer_losses: list[float] = field(default_factory=list)


def memory_terms(s: Settings) -> list[MemoryTerm]:
    """Lower bounds on what a run keeps at its peak: the data, the U splits' copies of it (and
    OEHG's U models), and the inner steps one hypergradient back-propagates through."""
    in_dim = FLAT_SIZES[s.dataset]
    params = parameter_count(s.model, in_dim, NUM_CLASSES)
    count = s.resplit_count()
    train_rows = N_OBSERVED - validation_size(N_OBSERVED, s.gamma)
    batch = min(s.batch, train_rows)  # a larger batch is the whole set
    step = step_bytes(s.model, in_dim, NUM_CLASSES, batch, batch < train_rows, penalised=True)
    models = params if s.method == "oehg" else 0
    return [
        MemoryTerm(4 * (N_OBSERVED + N_TEST) * in_dim, "the data", None),
        MemoryTerm(
            4 * count * (N_OBSERVED * in_dim + models),
            f"the data's copies for U = {count}",
            "--resplits" if s.method == "oehg" else None,
        ),
        s.kept_steps_memory(step, "--batch"),
    ]


def load(settings: Settings) -> ObservedData:
    """The seeded draw the settings name, on the settings' device (memory checked first)."""
    device = resolve_device(settings.device)
    check_memory(memory_terms(settings), device)
    return draw_observed_data(settings.dataset, settings.seed, settings.data_root).to(device)


def run(
    settings: Settings, data: ObservedData, on_step: StepCallback | None = None
) -> ImageRegularizationResult:
    """Learn per-parameter weights with the chosen method and test the deployed model."""
    start = time.perf_counter()
    x, y, device = data.x, data.y, data.x.device
    splits = make_splits(len(y), settings.gamma, settings.resplit_count(), settings.seed)
    split_data = [
        (Minibatches((x[s.train], y[s.train]), settings.batch), (x[s.val], y[s.val]))
        for s in splits
    ]
    problem = regularization_problem(settings.step_size())
    init = init_classifier(settings.model, x.shape[1], data.num_classes, settings.seed)
    theta0 = {k: v.to(device) for k, v in init.items()}
    rho0 = {k: torch.full_like(v, settings.init_log_lam) for k, v in theta0.items()}
    result = optimize(
        settings.method,
        problem,
        theta0,
        rho0,
        split_data,
        settings.budget(),
        outer_lr=settings.outer_lr,
        seed=settings.seed,
        on_step=on_step,
    )
    accuracy, loss = classifier_scores(result.theta, data.x_test, data.y_test)
    return ImageRegularizationResult(
        settings=asdict(replace(settings, device=device.type)),
        test_accuracy=accuracy,
        test_loss=loss,
        seconds=time.perf_counter() - start,
        mean_log_lam={k: float(v.mean()) for k, v in result.lam.items()},
        outer_losses=result.outer_losses,
    )


def result_stem(dataset: str, model: str, method: str, seed: int) -> str:
    """The result file name without suffix: imgreg_DATASET_MODEL_METHOD_seedS."""
    return run_stem("imgreg_", dataset, model, method, seed)


def outputs(s: Settings) -> list[Path]:
    """OUT/STEM.json."""
    return [Path(s.out) / f"{result_stem(s.dataset, s.model, s.method, s.seed)}.json"]


def report(s: Settings, result: ImageRegularizationResult) -> list[str]:
    """The deployed model's test loss and accuracy."""
    return [f"test loss: {result.test_loss:.4f}", f"test accuracy: {result.test_accuracy:.2f} %"]


TASK = Task(
    name="image-regularization",
    help="one L2 weight per parameter of SR / MLP on MNIST, Fashion-MNIST or CIFAR-10",
    settings=Settings,
    load=load,
    run=run,
    steps=lambda s: s.outer_step_count(),
    outputs=outputs,
    write=write_json,
    report=report,
)
