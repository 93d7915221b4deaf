"""Varied episodes (Meta-Dataset style): the sampler's rules, the ragged layout's head problems
and EHG re-splits against hand-built references, seeded evaluation, and the commands."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from cli_errors import error_line
from test_evaluate import small_split

from fewshot.backbones import Conv4
from fewshot.cli.main import main
from fewshot.datasets.varied import (
    VariedSampler,
    VariedShape,
    check_varied,
    episode_shots,
)
from fewshot.evaluation.episodes import episode_accuracies
from fewshot.heads import protonet
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.methods.resplit import draw_varied_resplits, episode_loss
from fewshot.runtime.errors import FewshotError

SHAPE = VariedShape(way=3, max_way=8, shot=6, max_support=25, query=2)


def uneven_labels() -> torch.Tensor:
    """12 classes with 4..15 images each, shuffled."""
    labels = torch.cat([torch.full((4 + c,), c) for c in range(12)])
    return labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))]


def test_varied_episodes_follow_the_meta_dataset_rules():
    labels = uneven_labels()
    counts = torch.bincount(labels)
    sampler = VariedSampler(labels, SHAPE, seed=1)
    ways, totals, unequal = set(), [], 0
    for _ in range(300):
        index = sampler.sample()
        way, pool = index.shape[1:]
        shots = episode_shots(index, SHAPE.query)[0]
        ways.add(way)
        totals.append(int(shots.sum()))
        unequal += int(shots.min() != shots.max())
        assert SHAPE.way <= way <= SHAPE.max_way and pool == int(shots.max()) + SHAPE.query
        classes = labels[index[0, :, 0]]
        assert len(set(classes.tolist())) == way  # distinct classes
        for row, c, shot in zip(index[0], classes, shots, strict=True):
            real = row[: shot + SHAPE.query]
            assert (row[shot + SHAPE.query :] == -1).all() and (real >= 0).all()
            assert (labels[real] == c).all() and real.unique().numel() == len(real)
            assert 1 <= shot <= min(SHAPE.shot, int(counts[c]) - SHAPE.query)
        assert shots.sum() <= SHAPE.max_support
    assert ways == set(range(SHAPE.way, SHAPE.max_way + 1))
    assert unequal > 200 and max(totals) > 3 * min(totals)


def test_the_support_budget_is_shared_in_proportion_to_class_sizes():
    # Two classes of 12 and 100 images, 2 queries: the big one's share is larger on average
    # (alpha_c * n_c), each capped at what it can give.
    labels = torch.cat([torch.zeros(12), torch.ones(100)]).long()
    sampler = VariedSampler(labels, VariedShape(2, 2, 60, 200, 2), seed=0)
    small, big = torch.stack([sampler.draw_shots(torch.tensor([0, 1])) for _ in range(400)]).T
    assert (small <= 10).all() and (big <= 60).all() and (small >= 1).all()
    assert big.float().mean() > 3 * small.float().mean()


def test_same_seed_same_varied_episodes_and_resume():
    labels = uneven_labels()
    a, b = VariedSampler(labels, SHAPE, 7), VariedSampler(labels, SHAPE, 7)
    assert all(torch.equal(a.sample(), b.sample()) for _ in range(5))
    state = a.state_dict()
    expected = [a.sample() for _ in range(3)]
    c = VariedSampler(labels, SHAPE, 0)
    c.load_state_dict(state)
    assert all(torch.equal(e, c.sample()) for e in expected)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        (VariedShape(13, 14, 2, 50, 1), "13-way episodes need 13 classes, 12"),
        (VariedShape(2, 3, 2, 50, 4), "1 support image \\+ 4 queries per class, but class 0"),
        (VariedShape(2, 8, 2, 5, 1), "budget of 5 images cannot give one image to each class"),
        (VariedShape(4, 3, 2, 50, 1), "1 <= way <= max way"),
    ],
)
def test_impossible_varied_episodes_are_refused(shape, message):
    with pytest.raises(FewshotError, match=message):
        check_varied(uneven_labels(), shape, "")


def reference_protonet_loss(embeddings, shots, order=None):
    """ProtoNet's query loss and accuracy of one varied episode [1, way, pool, d], by a loop
    over classes: prototypes the means of each class's first shots[c] (reordered by `order`
    [way, pool] when given), its next `query` entries the queries."""
    way, pool = embeddings.shape[1:3]
    query = pool - int(shots.max())
    support, queries = [], []
    for c in range(way):
        rows = embeddings[0, c] if order is None else embeddings[0, c, order[c]]
        support.append(rows[: shots[0, c]].mean(0))
        queries.append(rows[shots[0, c] : shots[0, c] + query])
    prototypes = torch.stack(support)
    q = torch.cat(queries)
    logits = -((q[:, None] - prototypes[None]) ** 2).sum(-1)
    labels = torch.arange(way).repeat_interleave(query)
    return F.cross_entropy(logits, labels), (logits.argmax(1) == labels).double().mean()


def test_a_varied_episode_and_its_resplits_match_a_loop_over_classes():
    index = VariedSampler(uneven_labels(), SHAPE, 3).sample()
    while len(episode_shots(index, SHAPE.query).unique()) < 2:
        index = VariedSampler(uneven_labels(), SHAPE, 3).sample()
    shots = episode_shots(index, SHAPE.query)
    way, pool = index.shape[1:]
    embeddings = torch.randn(1, way, pool, 5, dtype=torch.float64)
    embeddings[index < 0] = float("nan")  # padding is never read
    loss, accuracy = episode_loss(embeddings, protonet, torch.tensor(1.0), shots)
    expected = reference_protonet_loss(embeddings, shots)
    torch.testing.assert_close(loss, expected[0])
    torch.testing.assert_close(accuracy[0].double(), expected[1])
    perm = draw_varied_resplits(shots, pool, 4, torch.Generator().manual_seed(0))
    assert perm.shape == (4, 1, way, pool) and torch.equal(
        perm[0, 0], torch.arange(pool).expand(way, -1)
    )
    loss, accuracy = episode_loss(embeddings, protonet, torch.tensor(1.0), shots, perm)
    each = [reference_protonet_loss(embeddings, shots, order[0]) for order in perm]
    torch.testing.assert_close(loss, torch.stack([e[0] for e in each]).mean())
    torch.testing.assert_close(accuracy.double(), torch.stack([e[1] for e in each]))


def test_varied_resplits_are_distinct_and_permute_only_each_class_entries():
    shots = torch.tensor([[1, 3, 2]])
    perm = draw_varied_resplits(shots, 5, 12, torch.Generator().manual_seed(0))  # query 2
    supports = set()
    for order in perm[:, 0]:
        for c, shot in enumerate(shots[0].tolist()):
            real = shot + 2
            assert sorted(order[c, :real].tolist()) == list(range(real))
        supports.add(tuple(tuple(sorted(order[c, :s].tolist())) for c, s in enumerate([1, 3, 2])))
    assert len(supports) == 12


def test_equal_shots_as_a_tensor_give_the_int_shot_result():
    embeddings = torch.randn(1, 4, 5, 6, dtype=torch.float64)
    perm = torch.stack([torch.randperm(5).expand(4, 5) for _ in range(3)])[:, None]
    by_int = episode_loss(embeddings, protonet, torch.tensor(2.0), 2, perm)
    by_tensor = episode_loss(embeddings, protonet, torch.tensor(2.0), torch.full((1, 4), 2), perm)
    torch.testing.assert_close(by_int, by_tensor)


def test_padding_images_never_reach_the_backbone():
    torch.manual_seed(0)
    method = EmbeddingMethod(Conv4(in_channels=1, image_size=28), "protonet").train()
    shots = torch.tensor([[1, 3, 2]])
    images = torch.randn(1, 3, 5, 1, 28, 28)
    first = method(images, None, shots)
    grads = torch.autograd.grad(first[0], list(method.parameters()))
    images[0, 0, 3:] = 1e4  # class 0's padding (1 support + 2 queries, then 2 padding)
    images[0, 2, 4:] = -1e4
    second = method(images, None, shots)
    torch.testing.assert_close(first, second)
    for a, b in zip(grads, torch.autograd.grad(second[0], list(method.parameters())), strict=True):
        torch.testing.assert_close(a, b)


def test_seeded_varied_evaluation_does_not_depend_on_the_cache(omniglot_test):
    split = small_split(omniglot_test, classes=30)
    method = EmbeddingMethod(Conv4(in_channels=1, channels=16, image_size=28), "protonet")
    shape = VariedShape(5, 20, 10, 100, 5)
    cpu = torch.device("cpu")
    cached = episode_accuracies(method, split, shape, 6, 0, cpu, cache=True)
    each = episode_accuracies(method, split, shape, 6, 0, cpu, cache=False)
    torch.testing.assert_close(cached, each, atol=1e-6, rtol=0)
    assert len(cached) == 6 and not torch.equal(
        cached, episode_accuracies(method, split, shape, 6, 1, cpu, cache=True)
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-way", "10"], "--max-way does not apply to fixed episodes"),
        (["--varied", "--way", "5", "--max-way", "4"], "--max-way must be at least --way 5"),
        (["--varied", "--max-way", "30", "--max-support", "20"], "--max-support must give one"),
        (["--varied", "--method", "maml", "--max-way", "9"], "--max-way must be --way 5 for"),
        (
            ["--varied", "--method", "relation", "--method-options", '{"combine": "sum"}'],
            "combine 'sum' reads episodes of one shot, not varied episodes",
        ),
    ],
)
def test_varied_flags_are_checked_before_any_data(capsys, tmp_path, args, message):
    command = ["train", "--dataset", "omniglot", "--out", str(tmp_path / "run"), *args]
    assert message in error_line(capsys, command)


def test_train_and_evaluate_on_varied_episodes(capsys, tmp_path, tiny_omniglot_root):
    run = tmp_path / "run"
    common = ["--varied", "--way", "3", "--max-way", "6", "--shot", "4", "--query", "2"]
    main(
        ["train", "--dataset", "omniglot", "--data-root", str(tiny_omniglot_root), "--out",
         str(run), "--episodes-per-epoch", "4", "--epochs", "1", "--episodes-per-batch", "2",
         "--resplits", "2", "--val-episodes", "4", "--backbone-options", '{"channels": 8}',
         *common]
    )  # fmt: skip
    out = tmp_path / "eval.json"
    main(
        ["eval", "--checkpoint", str(run / "last.pt"), "--data-root", str(tiny_omniglot_root),
         "--episodes", "5", "--out", str(out), *common]
    )  # fmt: skip
    record = json.loads(out.read_text())
    assert record["varied"] is True and record["max_way"] == 6 and record["episodes"] == 5
    assert 0 <= record["accuracy"] <= 100 and math.isfinite(record["ci95"])
    capsys.readouterr()
    command = ["eval", "--checkpoint", str(run / "last.pt"), "--episodes-per-batch", "2", *common]
    assert "--episodes-per-batch must be 1 with --varied" in error_line(capsys, command)
