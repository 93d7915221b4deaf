"""Evaluation: seeded episodes, and cache == per-episode embedding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fewshot.backbones import Conv4
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sampler import EpisodeSampler, EpisodeShape
from fewshot.evaluation.episodes import episode_accuracies, evaluate, seeded_episodes
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.runtime.io import load_checkpoint
from fewshot.training.checkpoint import load_trained


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


def test_a_checkpoint_of_the_earlier_setting_names_still_loads(tmp_path):
    zoo = Path(__file__).resolve().parents[1] / "models" / "omniglot" / "protonet_conv4_1shot.pt"
    ckpt = load_checkpoint(zoo)
    config = dict(ckpt["config"])
    config["ehg_splits"] = config.pop("resplits")  # U's name before it was `resplits`
    for key in ("method", "method_options"):  # settings added since take their defaults
        config.pop(key)
    old = tmp_path / "old.pt"
    torch.save({**ckpt, "config": config}, old)
    model, settings = load_trained(old, torch.device("cpu"))
    assert settings["resplits"] == ckpt["config"]["resplits"]
    assert settings["method"] == "embedding"
    for key, value in model.state_dict().items():
        assert torch.equal(value, ckpt["model"][key]), key


def test_seeded_episodes_do_not_depend_on_the_episodes_per_batch(omniglot_test):
    zoo = Path(__file__).resolve().parents[1] / "models" / "omniglot" / "protonet_conv4_1shot.pt"
    model, _ = load_trained(zoo, torch.device("cpu"))
    split, episodes, seed = small_split(omniglot_test), 29, 3  # 29: no batch size divides it
    # The episodes the default batch of 8 drew before the blocks: one sampler, 8 at a time.
    old = EpisodeSampler(split.labels, EpisodeShape(5, 1, 15, 8), seed)
    old_batches = [old.sample() for _ in range(4)]
    old_index = torch.cat(old_batches)[:episodes]
    solve = model.solver(split, 1, torch.device("cpu"), True, None)
    old_accuracies = torch.cat([solve(index) for index in old_batches])[:episodes]
    for batch in (1, 3, 8, 13):
        shape = EpisodeShape(5, 1, 15, batch)
        drawn = list(seeded_episodes(split, shape, episodes, seed))
        assert [len(index) for index in drawn[:-1]] == [batch] * (len(drawn) - 1)
        assert torch.equal(torch.cat(drawn), old_index), batch
        for cache in (True, False):
            accuracies = episode_accuracies(
                model, split, shape, episodes, seed, torch.device("cpu"), cache
            )
            assert torch.equal(accuracies, old_accuracies), (batch, cache)
