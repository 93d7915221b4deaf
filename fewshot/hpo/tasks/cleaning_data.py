"""The data of hyper-cleaning: seeded draws with corrupted labels, OEHG's splits, cleaner scores.

8000 training examples, half of whose labels are replaced by a uniformly drawn wrong label, 2000
clean validation examples and 10000 test examples (MNIST or Fashion-MNIST).

OEHG's U splits (paper: "incorporating a part of the training data that is considered clean by the
model into validation data"): split 0 is the original train/validation split; every other split
moves its own share of the training examples that the deployed model considers clean (it predicts
their given label with probability >= `confidence`) into its validation set. The shares are
disjoint, and they are re-drawn every `every` outer steps as the model improves.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from fewshot.datasets.base import ImageSplit
from fewshot.hpo.batches import Minibatches
from fewshot.hpo.tasks.classifiers import classifier_logits
from fewshot.hpo.tasks.image_data import flat_pixels
from fewshot.hpo.trees import Theta

CLEANING_DATASETS = ("mnist", "fashion-mnist")
Pair = tuple[Minibatches, Minibatches]  # (training data, validation data) of one split


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
        raise ValueError(f"the corruption rate must lie in [0, 1), got {rate}")
    flip = torch.rand(len(labels), generator=gen) < rate
    # Adding 1..C-1 modulo C reaches every other class exactly once: uniform over wrong labels.
    offset = torch.randint(1, num_classes, (len(labels),), generator=gen)
    return torch.where(flip, (labels + offset) % num_classes, labels), flip


def draw_cleaning_data(
    train: ImageSplit,
    test: ImageSplit,
    n_train: int = 8000,
    n_val: int = 2000,
    n_test: int = 10000,
    noise: float = 0.5,
    seed: int = 0,
) -> CleaningData:
    """Seeded train / validation draw from `train`, test draw from `test`, labels corrupted."""
    if n_train + n_val > len(train.labels) or n_test > len(test.labels):
        raise ValueError(
            f"{n_train} + {n_val} training and {n_test} test examples exceed the "
            f"{len(train.labels)} training and {len(test.labels)} test images"
        )
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


def training_data(x: torch.Tensor, y: torch.Tensor, batch: int, ids=None) -> Minibatches:
    """Training rows (x, y, ids); `ids`: their places in the weight vector (default 0..n-1)."""
    ids = torch.arange(len(y), device=y.device) if ids is None else ids
    return Minibatches((x, y, ids), batch)


class CleanValidationSplits:
    """OEHG's splits, a callable (t, deployed theta) -> [(train data, validation data)] * U."""

    def __init__(
        self,
        data: CleaningData,
        resplits: int,
        extra_val: int,
        *,
        confidence: float,
        every: int,
        batch: int,
        val_batch: int,
        seed: int,
    ) -> None:
        self.data, self.resplits, self.extra_val = data, resplits, extra_val
        self.confidence, self.every = confidence, every
        self.batch, self.val_batch = batch, val_batch
        self.gen = torch.Generator().manual_seed(seed + 1)
        self.current: list[Pair] = []
        self.moved_counts: list[int] = []

    def __call__(self, t: int, theta: Theta) -> list[Pair]:
        """Re-draw the splits every `every` steps, else return the current ones."""
        if t % self.every == 0:
            self.current = self._draw(theta)
        return self.current

    def _draw(self, theta: Theta) -> list[Pair]:
        d = self.data
        with torch.no_grad():
            probs = torch.softmax(classifier_logits(theta, d.x_train), dim=1)
            given = probs.gather(1, d.y_train[:, None]).squeeze(1)
        pool = torch.nonzero(given >= self.confidence).squeeze(1).cpu()
        pool = pool[torch.randperm(len(pool), generator=self.gen)]
        share = min(self.extra_val, len(pool) // max(self.resplits - 1, 1))
        splits, self.moved_counts = [], []
        for u in range(self.resplits):
            moved = pool[(u - 1) * share : u * share] if u else pool[:0]
            keep = torch.ones(len(d.y_train), dtype=torch.bool)
            keep[moved] = False
            train_index = torch.nonzero(keep).squeeze(1).to(d.x_train.device)
            moved = moved.to(d.x_train.device)
            train = training_data(
                d.x_train[train_index], d.y_train[train_index], self.batch, train_index
            )
            val = Minibatches(
                (torch.cat([d.x_val, d.x_train[moved]]), torch.cat([d.y_val, d.y_train[moved]])),
                self.val_batch,
            )
            splits.append((train, val))
            self.moved_counts.append(len(moved))
        return splits
