"""--batch-norm transductive for embedding methods: each test episode normalised with its own
BatchNorm statistics (its support's, then its queries'), as Relation Networks' code evaluates,
against a hand computation with the model in training mode."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from cli_errors import error_line
from test_evaluate import small_split
from torch import nn

import fewshot
from fewshot.cli.main import main
from fewshot.datasets.batches import images_to_device
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import episode_accuracies, seeded_episodes
from fewshot.methods.adapters import own_statistics
from fewshot.training.checkpoint import load_trained

MODELS = Path(__file__).resolve().parents[1] / "models" / "omniglot"
RELATION = MODELS / "relation_conv4_5way1shot.pt"
MAML = MODELS / "maml_conv4_5way1shot_cpu.pt"
CPU = torch.device("cpu")


def test_own_statistics_normalises_each_batch_and_keeps_the_running_ones():
    torch.manual_seed(0)
    layer = nn.BatchNorm2d(3).eval()
    layer.running_mean.fill_(5.0)
    layer.running_var.fill_(9.0)
    nn.init.uniform_(layer.weight)
    nn.init.uniform_(layer.bias)
    x = torch.randn(4, 3, 5, 5) * 2 + 1
    mean = x.mean(dim=(0, 2, 3), keepdim=True)
    var = x.var(dim=(0, 2, 3), unbiased=False, keepdim=True)
    by_hand = (x - mean) / torch.sqrt(var + layer.eps) * layer.weight.view(1, 3, 1, 1)
    by_hand = by_hand + layer.bias.view(1, 3, 1, 1)
    with own_statistics(layer):
        out = layer(x)
    torch.testing.assert_close(out, by_hand, atol=1e-5, rtol=1e-5)
    assert torch.equal(layer.running_mean, torch.full((3,), 5.0))
    assert torch.equal(layer.running_var, torch.full((3,), 9.0))
    assert not layer.training and layer.track_running_stats
    with pytest.raises(RuntimeError), own_statistics(layer):
        raise RuntimeError("restored all the same")
    assert not layer.training and layer.track_running_stats


def reference_logits(model, support, labels, query, backbone_only=False):
    """The relation scores of one episode with every BatchNorm layer in training mode (its
    running statistics untouched: momentum 0), or the backbone's alone, support and queries
    one batch each."""
    model = copy.deepcopy(model)
    (model.backbone if backbone_only else model).train()
    for layer in model.modules():
        if isinstance(layer, nn.BatchNorm2d):
            layer.momentum = 0.0
    with torch.no_grad():
        s, q = model.backbone(support), model.backbone(query)
        way = int(labels.max()) + 1
        return model.scale * model.head(q[None], s[None], labels[None], way, 1)[0]


@pytest.fixture(scope="module")
def relation():
    method, _ = load_trained(RELATION, CPU)
    method.amp = "off"
    return method


def test_relation_episodes_on_their_own_statistics_match_a_hand_computation(
    omniglot_test, relation
):
    split = small_split(omniglot_test)
    shape = EpisodeShape(5, 1, 3, 4)
    before = copy.deepcopy(relation.state_dict())
    running = episode_accuracies(relation, split, shape, 12, 3, CPU)
    method = copy.deepcopy(relation)
    method.use_episode_statistics()
    assert method.transductive and not method.caches
    own = episode_accuracies(method, split, shape, 12, 3, CPU)
    other_batch = episode_accuracies(method, split, EpisodeShape(5, 1, 3, 5), 12, 3, CPU)
    expected, differ = [], False
    for index in torch.cat(list(seeded_episodes(split, shape, 12, 3))):
        support = images_to_device(split, index[:, 0], CPU)
        query = images_to_device(split, index[:, 1:].flatten(), CPU)
        logits = reference_logits(relation, support, torch.arange(5), query)
        truth = torch.arange(5).repeat_interleave(3)
        expected.append(float((logits.argmax(1) == truth).float().mean()))
        scores = method.predict(support, torch.arange(5), query)
        torch.testing.assert_close(scores, torch.sigmoid(logits), atol=1e-5, rtol=1e-5)
        differ |= not torch.allclose(scores, relation.predict(support, torch.arange(5), query))
        backbone = copy.deepcopy(relation)
        backbone.use_episode_statistics(backbone_only=True)
        alone = reference_logits(relation, support, torch.arange(5), query, backbone_only=True)
        scores = backbone.predict(support, torch.arange(5), query)
        torch.testing.assert_close(scores, torch.sigmoid(alone), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(alone, logits)  # the relation module's statistics count
    assert own.tolist() == pytest.approx(expected) and torch.equal(own, other_batch)
    assert differ  # the trained statistics give other scores
    assert running.shape == own.shape
    for name, value in relation.state_dict().items():  # nothing learned from the test episodes
        assert torch.equal(value, before[name]), name
    for name, value in method.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_a_query_scored_alone_differs_from_among_the_others(omniglot_test, relation):
    split = small_split(omniglot_test)
    [index] = next(seeded_episodes(split, EpisodeShape(5, 1, 4, 1), 1, 0))
    support = images_to_device(split, index[:, 0], CPU)
    query = images_to_device(split, index[:, 1:].flatten(), CPU)
    method = copy.deepcopy(relation)
    method.use_episode_statistics()
    among = method.predict(support, torch.arange(5), query, batch=3)
    assert torch.allclose(among, method.predict(support, torch.arange(5), query, batch=20))
    alone = method.predict(support, torch.arange(5), query[:2])
    assert not torch.allclose(alone, among[:2])
    assert torch.allclose(
        relation.predict(support, torch.arange(5), query[:2]),
        relation.predict(support, torch.arange(5), query)[:2],
        atol=1e-6,
    )


def test_eval_records_the_batch_norm_and_keeps_the_default_identity(tmp_path, capsys):
    base = ["eval", "--checkpoint", str(RELATION), "--episodes", "16", "--amp", "off"]
    assert main([*base, "--out", str(tmp_path / "running.json")]) == 0
    assert main([*base, "--batch-norm", "transductive", "--out", str(tmp_path / "own.json")]) == 0
    running = json.loads((tmp_path / "running.json").read_text())
    own = json.loads((tmp_path / "own.json").read_text())
    assert "batch_norm" not in running and not running["transductive"]
    assert own["batch_norm"] == "transductive" and own["transductive"] and not own["cache"]
    direct = fewshot.evaluate(
        RELATION, episodes=16, amp="off", batch_norm="transductive", out=tmp_path / "api.json"
    )
    assert direct.accuracy == pytest.approx(own["accuracy"])
    capsys.readouterr()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--batch-norm", "transductive", "--cache"],
            "--cache does not apply to --method relation",
        ),
        (["--batch-norm", "transductive", "--varied"], "--varied does not apply"),
        (["--batch-norm", "per-query"], "--batch-norm per-query applies to fewshot predict"),
        (["--batch-norm", "transductive", "--classifier", "pmf"], "does not apply with"),
        (["--checkpoint", str(MAML), "--batch-norm", "running"], "running does not apply"),
    ],
)
def test_eval_refuses_batch_norm_it_cannot_honour(tmp_path, capsys, args, line):
    base = ["eval", "--checkpoint", str(RELATION), "--episodes", "4"]
    out = tmp_path / "x.json"
    assert line in error_line(capsys, [*base, *args, "--out", str(out)])
    assert not out.exists()
