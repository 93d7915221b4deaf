"""The backbones carry no trainer assumptions: learn2learn's MAML and a plain loop train them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fewshot.backbones import Conv4, ResNet12


def classifier(backbone: nn.Module, way: int) -> nn.Sequential:
    """Backbone + linear layer, the shape every supervised or MAML codebase expects."""
    return nn.Sequential(backbone, nn.Linear(backbone.out_dim, way))


def task(way: int = 3, shots: int = 2, size: int = 28, channels: int = 1):
    """A separable toy task: each class is a fixed random pattern plus noise."""
    gen = torch.Generator().manual_seed(0)
    patterns = torch.randn(way, channels, size, size, generator=gen)
    labels = torch.arange(way).repeat_interleave(shots)
    x = patterns[labels] + 0.3 * torch.randn(len(labels), channels, size, size, generator=gen)
    return x, labels


def test_learn2learn_maml_adapts_our_backbones():
    l2l = pytest.importorskip("learn2learn")
    torch.manual_seed(0)
    for backbone in (
        Conv4(1, channels=8, image_size=28),
        ResNet12(1, channels=(4, 4, 8, 8), image_size=28, avg_pool=True),
    ):
        maml = l2l.algorithms.MAML(classifier(backbone, 3), lr=0.1, first_order=False)
        x, y = task()
        learner = maml.clone()
        before = F.cross_entropy(learner(x), y)
        for _ in range(3):
            learner.adapt(F.cross_entropy(learner(x), y))
        after = F.cross_entropy(learner(x), y)
        assert after < before
        after.backward()  # second-order meta-gradient reaches the backbone's weights
        grads = [p.grad for p in maml.module[0].parameters()]
        assert all(g is not None for g in grads)
        assert sum(float(g.abs().sum()) for g in grads) > 0


def test_plain_supervised_loop_fits_a_batch():
    torch.manual_seed(0)
    model = classifier(ResNet12(3, channels=(8, 8, 16, 16), image_size=32, drop_rate=0.0), 4)
    x, y = task(way=4, shots=4, size=32, channels=3)
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    losses = []
    for _ in range(15):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]
    assert (model(x).argmax(1) == y).all()
