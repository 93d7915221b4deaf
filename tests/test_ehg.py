"""EHG: distinct seeded re-splits, and the embed-once gradient equals the per-split average."""

from __future__ import annotations

import math
import time

import pytest
import torch

from fewshot.backbones import Conv4, ResNet12
from fewshot.heads import get_head
from fewshot.methods.resplit import (
    distinct_resplits,
    draw_resplits,
    episode_loss,
    reembedding_gradients,
)


def support_sets(perm: torch.Tensor, shot: int) -> list[list[frozenset]]:
    """For each episode, the list over splits of its per-class support sets."""
    u, b = perm.shape[:2]
    return [
        [tuple(frozenset(row[:shot].tolist()) for row in perm[s, e]) for s in range(u)]
        for e in range(b)
    ]


def test_splits_are_distinct_permutations_with_the_original_first():
    gen = torch.Generator().manual_seed(0)
    perm = draw_resplits(batch=6, way=3, shot=1, query=1, u=8, generator=gen)
    assert perm.shape == (8, 6, 3, 2)
    assert torch.equal(perm[0], torch.arange(2).expand(6, 3, 2))
    assert torch.equal(perm.sort(-1).values, torch.arange(2).expand_as(perm))
    # 2^3 = 8 distinct splits exist: asking for all 8 must give each exactly once
    for episode in support_sets(perm, 1):
        assert len(set(episode)) == 8


def test_splits_are_seeded_and_uniform():
    a = draw_resplits(4, 5, 1, 15, 5, torch.Generator().manual_seed(1))
    b = draw_resplits(4, 5, 1, 15, 5, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    many = draw_resplits(2000, 2, 2, 3, 2, torch.Generator().manual_seed(2))[1]
    # each pooled image is support with probability shot/pool = 0.4
    freq = torch.zeros(5)
    freq.index_add_(0, many[..., :2].flatten(), torch.ones(2000 * 2 * 2))
    assert torch.allclose(freq / (2000 * 2), torch.full((5,), 0.4), atol=0.03)


def test_split_limits():
    assert distinct_resplits(5, 1, 1) == 32
    assert distinct_resplits(5, 1, 15) == 16**5
    assert distinct_resplits(2, 2, 2) == math.comb(4, 2) ** 2
    # Capped: exact below the cap, the cap above it, at once for any way.
    assert distinct_resplits(3, 1, 1, at_most=100) == 8
    assert distinct_resplits(3, 1, 1, at_most=8) == 8
    assert distinct_resplits(10**12, 1, 1, at_most=5) == 5
    generator = torch.Generator().manual_seed(0)
    assert draw_resplits(1, 5, 1, 1, 32, generator).shape == (32, 1, 5, 2)
    for u in (0, 33):  # the settings refuse these by flag; the function states its precondition
        with pytest.raises(ValueError, match="distinct re-splits"):
            draw_resplits(1, 5, 1, 1, u, generator)


@pytest.mark.parametrize(
    ("way", "shot", "query", "u"), [(5, 1, 5, 7776), (5, 1, 5, 2000), (3, 2, 2, 150)]
)
def test_every_allowed_number_of_splits_is_drawn_quickly_and_distinct(way, shot, query, u):
    # U at (or near) all C(shot+query, shot)^way splits: drawn by numbering, not rejection.
    start = time.perf_counter()
    perm = draw_resplits(3, way, shot, query, u, torch.Generator().manual_seed(0))
    assert time.perf_counter() - start < 5.0
    assert torch.equal(perm[0], torch.arange(shot + query).expand(3, way, shot + query))
    assert torch.equal(perm.sort(-1).values, torch.arange(shot + query).expand_as(perm))
    for episode in support_sets(perm, shot):
        assert len(set(episode)) == u


def tiny_resnet(size: int) -> ResNet12:
    """A narrow ResNet-12 with dropout and DropBlock off, so every pass is deterministic."""
    return ResNet12(
        in_channels=1, channels=(4, 6, 6, 8), image_size=size, drop_rate=0.0, drop_block_size=2
    )


@pytest.mark.parametrize("head_name", ["protonet", "ridge", "svm"])
@pytest.mark.parametrize("backbone_name", ["conv4", "resnet12"])
def test_embed_once_gradient_equals_average_of_split_gradients(backbone_name, head_name):
    torch.manual_seed(0)
    size = 28 if backbone_name == "conv4" else 32
    net = Conv4(1, channels=6, image_size=size) if backbone_name == "conv4" else tiny_resnet(size)
    net = net.double().train()  # BatchNorm uses batch statistics: the same pooled images per pass
    scale = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)
    params = [*net.parameters(), scale]
    head = get_head(head_name)
    b, way, shot, query, u = 2, 3, 2, 2, 4
    images = torch.randn(b, way, shot + query, 1, size, size, dtype=torch.float64)
    perm = draw_resplits(b, way, shot, query, u, torch.Generator().manual_seed(3))

    emb = net(images.flatten(0, 2)).view(b, way, shot + query, -1)
    loss, _ = episode_loss(emb, head, scale, shot, perm)
    fast = torch.autograd.grad(loss, params)
    reference = reembedding_gradients(net, params, images, head, scale, shot, perm)
    for f, r in zip(fast, reference, strict=True):
        assert torch.allclose(f, r, rtol=1e-7, atol=1e-10)
    # and the average really mixes different splits: split 0 alone gives another gradient
    alone = reembedding_gradients(net, params, images, head, scale, shot, perm[:1])
    assert not torch.allclose(alone[-1], reference[-1])


def test_one_split_is_the_plain_loss():
    emb = torch.randn(2, 5, 4, 8)
    head = get_head("protonet")
    identity = draw_resplits(2, 5, 1, 3, 1, torch.Generator().manual_seed(0))
    plain = episode_loss(emb, head, torch.tensor(1.0), 1)
    assert torch.equal(plain[0], episode_loss(emb, head, torch.tensor(1.0), 1, identity)[0])
    # by hand: prototypes are the first image of each class
    q = emb[:, :, 1:].reshape(2, 15, 8)
    protos = emb[:, :, 0]
    logits = -((q[:, :, None] - protos[:, None]) ** 2).sum(-1)
    labels = torch.arange(5).repeat_interleave(3).expand(2, 15)
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
    assert torch.allclose(plain[0], want, atol=1e-5)
