"""Evaluation: seeded episodes, and cache == per-episode embedding."""

from __future__ import annotations

import pytest
import torch

from fewshot.backbones import Conv4
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import episode_accuracies, evaluate
from fewshot.methods.embedding import EmbeddingMethod


def small_split(omniglot_test, classes: int = 40) -> ImageSplit:
    """The first `classes` classes of the Omniglot test split."""
    keep = omniglot_test.labels < classes
    return ImageSplit(
        omniglot_test.images[keep],
        omniglot_test.labels[keep],
        omniglot_test.class_names[:classes],
        (0.0,),
        (1.0,),
        "omniglot-test-subset",
    )


@pytest.mark.parametrize("head", ["protonet", "ridge", "svm"])
def test_cache_gives_the_same_accuracies(omniglot_test, head):
    torch.manual_seed(0)
    model = EmbeddingMethod(Conv4(1, image_size=28), head)
    split = small_split(omniglot_test)
    shape = EpisodeShape(5, 1, 5, 4)
    options = {"max_iter": 3} if head == "svm" else None
    cached = episode_accuracies(model, split, shape, 20, 11, torch.device("cpu"), True, options)
    direct = episode_accuracies(model, split, shape, 20, 11, torch.device("cpu"), False, options)
    assert cached.shape == (20,)
    assert torch.equal(cached, direct)


def test_same_seed_same_result_other_seed_other_episodes(omniglot_test):
    torch.manual_seed(0)
    model = EmbeddingMethod(Conv4(1, image_size=28), "protonet")
    split = small_split(omniglot_test)
    shape = EpisodeShape(5, 1, 3, 5)
    a = evaluate(model, split, shape, 30, 5, torch.device("cpu"))
    b = evaluate(model, split, shape, 30, 5, torch.device("cpu"))
    c = episode_accuracies(model, split, shape, 30, 6, torch.device("cpu"))
    assert a == b
    assert a.line() == f"accuracy: {a.accuracy:.2f} ± {a.ci95:.2f} %"
    assert not torch.equal(c, episode_accuracies(model, split, shape, 30, 5, torch.device("cpu")))
