"""Data hyper-cleaning (paper Section 7, after Franceschi et al. 2017) on MNIST / Fashion-MNIST.

Every training example i has a weight lam_i = sigmoid(logit_i) in [0, 1]; the inner problem
minimises mean_i lam_i * CE_i(theta) over a batch, the outer problem the validation
cross-entropy. Weights are learned by `fewshot.hpo.optimize` (any method) with Adam on the
logits; the data and OEHG's splits are in `fewshot.hpo.tasks.cleaning_data`.

An example is *flagged* (judged corrupted) when its final weight is below `threshold` (0.5, the
weight every example starts at); precision / recall / F1 count corrupted examples as positives.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F

from fewshot.hpo.batches import Minibatches
from fewshot.hpo.ensemble import StepCallback
from fewshot.hpo.hypergrad import Bilevel
from fewshot.hpo.optimize import OEHG_RESPLITS, optimize
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
from fewshot.hpo.tasks.cleaning_data import (
    CLEANING_DATASETS,
    CleaningData,
    CleanValidationSplits,
    cleaner_scores,
    draw_cleaning_data,
    training_data,
)
from fewshot.hpo.tasks.image_data import (
    FLAT_SIZES,
    NUM_CLASSES,
    load_image_dataset,
    split_length,
)
from fewshot.hpo.trees import Theta
from fewshot.runtime.device import resolve_device
from fewshot.runtime.memory import MemoryTerm, check_memory
from fewshot.runtime.settings import SettingError, setting

# The image splits a cleaning run reads.
SPLITS = ("train", "test")


@dataclass(frozen=True, kw_only=True)
class Settings(ClassifierSettings):
    """`fewshot hpo cleaning`: everything a run depends on (the paper's setting, our steps)."""

    # Fields a method does not read, besides HpoSettings' (METHOD_UNUSED): the offline methods
    # learn on the original split, without OEHG's splits and the examples they move.
    TASK_UNUSED: ClassVar[dict[str, frozenset[str]]] = {
        m: frozenset({"resplits", "extra_val"}) for m in OFFLINE_METHODS
    }

    dataset: str = setting(help="image set", choices=CLEANING_DATASETS)
    noise: float = setting(0.5, help="share of corrupted labels", low=0, below=1)
    n_train: int = setting(8000, help="training examples", low=1)
    n_val: int = setting(2000, help="validation examples", low=1)
    n_test: int = setting(10000, help="test examples", low=1)
    outer_steps: int | None = setting(None, help="T (default: equal budgets)", low=1)
    inner_steps: int = setting(64, help="K of RHG / T-RHG / AID (not oehg)", low=1)
    inner_lr: float | None = setting(None, help="default 0.5 (sr) / 0.2 (mlp)", above=0)
    outer_lr: float = setting(0.1, help="Adam on weight logits", above=0)
    batch: int | None = setting(None, help="default: all (sr), 500 (mlp)", low=1)
    val_batch: int | None = setting(None, help="default: all (sr), 500 (mlp)", low=1)
    threshold: float = setting(0.5, help="flag weights below", above=0, below=1)
    extra_val: int = setting(400, help="examples moved per OEHG split (oehg)", low=0)
    retrain_steps: int = setting(1000, help="Dirty Tr / Weight Tr SGD steps", low=1)
    clean_confidence: float = setting(0.9, help="OEHG: clean", above=0, high=1, flag=False)
    resplit_every: int = setting(50, help="OEHG: re-draw splits", low=1, flag=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        count = self.resplit_count()
        extra = self.extra_val * (count - 1)
        if self.method == "oehg" and extra > self.n_train:
            raise SettingError(
                "resplits",
                f"{count} needs {count - 1} x extra_val ({self.extra_val}) = {extra} training "
                f"examples moved to validation, more than n_train ({self.n_train})",
            )

    def check_image_counts(self, train_images: int, test_images: int) -> None:
        """SettingError unless the data set holds the examples asked for."""
        if self.n_train + self.n_val > train_images:
            raise SettingError(
                "n_train",
                f"{self.n_train} + n_val {self.n_val} exceed the {train_images} training "
                f"images of {self.dataset}",
            )
        if self.n_test > test_images:
            raise SettingError("n_test", f"{self.n_test} exceeds the {test_images} test images")

    def step_size(self) -> float:
        """The inner (and retraining) learning rate."""
        return self.inner_lr if self.inner_lr is not None else (0.5 if self.model == "sr" else 0.2)

    def batch_size(self) -> int:
        """The inner mini-batch size (n_train = full-batch gradient descent)."""
        if self.batch is not None:
            return self.batch
        return self.n_train if self.model == "sr" else 500

    def val_batch_size(self) -> int:
        """The validation mini-batch size of the outer loss (>= the set size: all of it)."""
        if self.val_batch is not None:
            return self.val_batch
        return self.n_val + self.extra_val if self.model == "sr" else 500

    def outer_step_count(self) -> int:
        """T; RHG / T-RHG / AID get as many inner steps in total as OEHG (U + 1 per outer step).

        OEHG's default T is 1000 for SR and 3000 for the MLP, which needs the longer run
        (experiments/hpo_cleaning/NOTE.md).
        """
        if self.outer_steps is not None:
            return self.outer_steps
        oehg_steps = 1000 if self.model == "sr" else 3000
        if self.method == "oehg":
            return oehg_steps
        return math.ceil(oehg_steps * (OEHG_RESPLITS + 1) / self.inner_steps)  # + deployed model


def cleaning_problem(inner_lr: float) -> Bilevel:
    """Inner: weighted training cross-entropy; outer: validation cross-entropy (no weights)."""

    def inner(theta: Theta, logit: torch.Tensor, batch: tuple) -> torch.Tensor:
        x, y, index = batch  # index: the examples' positions in the weight vector
        losses = F.cross_entropy(classifier_logits(theta, x), y, reduction="none")
        return (torch.sigmoid(logit[index]) * losses).mean()

    def outer(theta: Theta, logit: torch.Tensor, batch: tuple) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(classifier_logits(theta, x), y)

    return Bilevel(inner, outer, inner_lr)


def train_classifier(
    kind: str,
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    steps: int,
    lr: float,
    seed: int,
    batch: int,
) -> Theta:
    """Plain SGD on the unweighted cross-entropy (the Dirty Tr / Weight Tr retraining rows)."""
    problem = cleaning_problem(lr)
    theta = init_classifier(kind, x.shape[1], num_classes, seed)
    theta = {k: v.to(x.device) for k, v in theta.items()}
    always = torch.full((len(y),), math.inf, device=x.device)  # sigmoid(inf) = weight 1
    gen = torch.Generator().manual_seed(seed)
    return problem.descend(theta, always, training_data(x, y, batch), steps, gen)


@dataclass
class CleaningResult:
    """Everything a run reports (accuracies and F1 in %)."""

    settings: dict
    test_accuracy: float
    test_loss: float
    precision: float
    recall: float
    f1: float
    flagged: int
    corrupted: int
    weight_tr_accuracy: float
    dirty_tr_accuracy: float
    seconds_hpo: float
    seconds_total: float
    outer_losses: list[float] = field(default_factory=list)
    corrupted_mean_weight: float = 0.0
    clean_mean_weight: float = 0.0


def memory_terms(s: Settings) -> list[MemoryTerm]:
    """Lower bounds on what a run keeps at its peak: the three sets, OEHG's U splits (a copy of
    the training and validation sets and a model each), and the inner steps one hypergradient
    back-propagates through."""
    in_dim = FLAT_SIZES[s.dataset]
    batch = min(s.batch_size(), s.n_train)  # a larger batch is the whole set
    step = step_bytes(s.model, in_dim, NUM_CLASSES, batch, batch < s.n_train, penalised=False)
    count = s.resplit_count() if s.method == "oehg" else 0
    split = (s.n_train + s.n_val) * in_dim + parameter_count(s.model, in_dim, NUM_CLASSES)
    return [
        MemoryTerm(4 * (s.n_train + s.n_val + s.n_test) * in_dim, "the data", "--n-train"),
        MemoryTerm(4 * count * split, f"OEHG's splits for U = {count}", "--resplits"),
        s.kept_steps_memory(step, "--batch"),
    ]


def load(settings: Settings) -> CleaningData:
    """The seeded draw the settings name, with corrupted labels, on the settings' device:
    the examples asked for checked against the files' headers first, then the memory (an
    estimate that grows with them), then the images read."""
    s = settings
    device = resolve_device(s.device)
    s.check_image_counts(*(split_length(s.dataset, split, s.data_root) for split in SPLITS))
    check_memory(memory_terms(s), device)
    train, test = (load_image_dataset(s.dataset, split, s.data_root) for split in SPLITS)
    data = draw_cleaning_data(train, test, s.n_train, s.n_val, s.n_test, s.noise, s.seed)
    return data.to(device)


def run(
    settings: Settings, data: CleaningData, on_step: StepCallback | None = None
) -> CleaningResult:
    """Learn the example weights with the chosen method, then score, retrain and compare."""
    start = time.perf_counter()
    device = data.x_train.device
    lr = settings.step_size()
    problem = cleaning_problem(lr)
    init = init_classifier(settings.model, data.x_train.shape[1], data.num_classes, settings.seed)
    theta0 = {k: v.to(device) for k, v in init.items()}
    logit0 = torch.zeros(len(data.y_train), device=device)
    batch = settings.batch_size()
    full_train = training_data(data.x_train, data.y_train, batch)
    if settings.method == "oehg":
        splits = CleanValidationSplits(
            data,
            settings.resplit_count(),
            settings.extra_val,
            confidence=settings.clean_confidence,
            every=settings.resplit_every,
            batch=batch,
            val_batch=settings.val_batch_size(),
            seed=settings.seed,
        )
    else:
        splits = [(full_train, Minibatches((data.x_val, data.y_val), settings.val_batch_size()))]
    result = optimize(
        settings.method,
        problem,
        theta0,
        logit0,
        splits,
        settings.budget(),
        outer_lr=settings.outer_lr,
        seed=settings.seed,
        deploy=full_train,
        on_step=on_step,
    )
    seconds_hpo = time.perf_counter() - start
    weights = torch.sigmoid(result.lam)
    flagged = weights < settings.threshold
    scores = cleaner_scores(flagged, data.corrupted)
    accuracy, loss = classifier_scores(result.theta, data.x_test, data.y_test)
    keep = ~flagged
    retrain = partial(
        train_classifier,
        settings.model,
        num_classes=data.num_classes,
        steps=settings.retrain_steps,
        lr=lr,
        seed=settings.seed,
        batch=batch,
    )
    weight_tr = retrain(data.x_train[keep], data.y_train[keep])
    dirty_tr = retrain(data.x_train, data.y_train)
    return CleaningResult(
        settings=asdict(replace(settings, device=device.type)),
        test_accuracy=accuracy,
        test_loss=loss,
        precision=scores["precision"],
        recall=scores["recall"],
        f1=scores["f1"],
        flagged=int(flagged.sum()),
        corrupted=int(data.corrupted.sum()),
        weight_tr_accuracy=classifier_scores(weight_tr, data.x_test, data.y_test)[0],
        dirty_tr_accuracy=classifier_scores(dirty_tr, data.x_test, data.y_test)[0],
        seconds_hpo=seconds_hpo,
        seconds_total=time.perf_counter() - start,
        outer_losses=result.outer_losses,
        corrupted_mean_weight=float(weights[data.corrupted].mean()),
        clean_mean_weight=float(weights[~data.corrupted].mean()),
    )


def result_stem(dataset: str, model: str, method: str, seed: int) -> str:
    """The result file name without suffix: cleaning_DATASET_MODEL_METHOD_seedS."""
    return run_stem("cleaning_", dataset, model, method, seed)


def outputs(s: Settings) -> list[Path]:
    """OUT/STEM.json."""
    return [Path(s.out) / f"{result_stem(s.dataset, s.model, s.method, s.seed)}.json"]


def report(s: Settings, result: CleaningResult) -> list[str]:
    """The test accuracy, the cleaner's scores and the two retrained baselines."""
    return [
        f"test accuracy: {result.test_accuracy:.2f} %",
        f"precision: {result.precision:.2f} %",
        f"recall: {result.recall:.2f} %",
        f"F1: {result.f1:.2f} %",
        f"Weight Tr test accuracy: {result.weight_tr_accuracy:.2f} %",
        f"Dirty Tr test accuracy: {result.dirty_tr_accuracy:.2f} %",
        f"flagged {result.flagged} of {s.n_train} (corrupted: {result.corrupted})",
    ]


TASK = Task(
    name="cleaning",
    help="data hyper-cleaning: learn per-example weights on corrupted MNIST labels",
    settings=Settings,
    load=load,
    run=run,
    steps=lambda s: s.outer_step_count(),
    outputs=outputs,
    write=write_json,
    report=report,
)
