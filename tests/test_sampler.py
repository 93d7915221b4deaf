"""Episode sampler: valid, seeded, resumable episodes; impossible requests refused."""

from __future__ import annotations

import pytest
import torch

from fewshot.datasets.sampler import EpisodeSampler, EpisodeShape
from fewshot.runtime.errors import FewshotError


def uneven_labels() -> torch.Tensor:
    """12 classes with 6..17 images each, shuffled."""
    labels = torch.cat([torch.full((6 + c,), c) for c in range(12)])
    return labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))]


def test_episodes_are_valid():
    labels = uneven_labels()
    shape = EpisodeShape(way=5, shot=2, query=4, episodes_per_batch=50)
    batch = EpisodeSampler(labels, shape, seed=3).sample()
    assert batch.shape == (50, 5, 6)
    episode_labels = labels[batch]
    # every row of a class holds one label, and the classes of an episode differ
    assert (episode_labels == episode_labels[..., :1]).all()
    for ep in episode_labels[..., 0]:
        assert len(set(ep.tolist())) == 5
    # no image twice within an episode
    for ep in batch:
        assert ep.unique().numel() == ep.numel()


def test_every_class_and_image_gets_drawn():
    labels = uneven_labels()
    sampler = EpisodeSampler(labels, EpisodeShape(3, 1, 2, 100), seed=0)
    seen = torch.cat([sampler.sample().flatten() for _ in range(20)])
    assert seen.unique().numel() == len(labels)


def test_same_seed_same_episodes_and_resume():
    labels = uneven_labels()
    shape = EpisodeShape(4, 1, 3, 2)
    a, b = EpisodeSampler(labels, shape, 7), EpisodeSampler(labels, shape, 7)
    assert all(torch.equal(a.sample(), b.sample()) for _ in range(5))
    assert not torch.equal(a.sample(), EpisodeSampler(labels, shape, 8).sample())
    state = a.state_dict()
    expected = [a.sample() for _ in range(3)]
    c = EpisodeSampler(labels, shape, 0)
    c.load_state_dict(state)
    assert all(torch.equal(e, c.sample()) for e in expected)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        (EpisodeShape(13, 1, 1), "13-way episodes need 13 classes, 12"),
        (EpisodeShape(5, 3, 4), "shot \\+ query = 7 images per class, but class 0"),
    ],
)
def test_impossible_requests_are_refused(shape, message):
    labels = torch.cat([torch.full((6 + c,), c) for c in range(12)])
    with pytest.raises(FewshotError, match=message):
        EpisodeSampler(labels, shape, 0, source="toy")


@pytest.mark.parametrize("shape", [EpisodeShape(0, 1, 1), EpisodeShape(5, 1, 1, 0)])
def test_a_shape_the_settings_refuse_is_a_plain_precondition(shape):
    labels = torch.cat([torch.full((6 + c,), c) for c in range(12)])
    with pytest.raises(ValueError, match="way, shot and batch >= 1"):
        EpisodeSampler(labels, shape, 0)
