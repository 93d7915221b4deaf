"""Matching and Relation Networks: their comparison modules against hand computations, EHG's
embed-once gradient equal to the mean of the per-split gradients, and both training through
`fewshot train` with their options checked."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from trainers import make_trainer

from fewshot.backbones import Conv4
from fewshot.cli.main import main
from fewshot.methods import build_method
from fewshot.methods.matching import MatchingHead
from fewshot.methods.relation import RelationHead
from fewshot.methods.resplit import draw_resplits, episode_loss, reembedding_gradients
from fewshot.training.settings import TrainSettings


def episode(b=2, way=3, shot=2, nq=4, d=6, seed=0, dtype=torch.float64):
    """Random query [b, nq, d], support [b, way*shot, d] and support labels (class-major)."""
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(b, nq, d, generator=g, dtype=dtype)
    support = torch.randn(b, way * shot, d, generator=g, dtype=dtype)
    labels = torch.arange(way).repeat_interleave(shot).expand(b, -1)
    return query, support, labels


@pytest.mark.parametrize("similarity", ["cosine", "scaled_cosine", "euclidean"])
def test_matching_is_softmax_attention_over_similarities(similarity):
    query, support, labels = episode()
    head = MatchingHead(6, similarity=similarity, temperature=3.0).double()
    got = head(query, support, labels, 3, 2)
    q, s = query.numpy(), support.numpy()
    for e in range(2):
        if similarity == "euclidean":
            logits = -(((q[e][:, None] - s[e][None]) ** 2).sum(-1))
        else:
            logits = (q[e] / np.linalg.norm(q[e], axis=1, keepdims=True)) @ (
                s[e] / np.linalg.norm(s[e], axis=1, keepdims=True)
            ).T
            logits *= 3.0 if similarity == "scaled_cosine" else 1.0
        attention = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        probs = np.stack([attention[:, 2 * c : 2 * c + 2].sum(1) for c in range(3)], 1)
        np.testing.assert_allclose(got[e].detach().numpy(), np.log(probs), rtol=1e-10, atol=1e-12)


def test_matching_temperature_is_learned():
    query, support, labels = (t.float() if t.is_floating_point() else t for t in episode())
    head = MatchingHead(6, similarity="scaled_cosine")
    assert [name for name, _ in head.named_parameters()] == ["temperature"]
    F.nll_loss(head(query, support, labels, 3, 2).flatten(0, 1), torch.zeros(8).long()).backward()
    assert head.temperature.grad.abs() > 0
    assert not list(MatchingHead(6).parameters())  # euclidean and cosine learn nothing


def test_full_context_embeddings_read_the_support():
    torch.manual_seed(0)
    query, support, labels = (t.float() if t.is_floating_point() else t for t in episode())
    head = MatchingHead(6, fce=True, fce_steps=3)
    logits = head(query, support, labels, 3, 2)
    assert logits.shape == (2, 4, 3) and torch.allclose(logits.exp().sum(-1), torch.ones(2, 4))
    logits.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())
    # g(S) depends on the whole support: changing one support sample moves every other's code.
    moved = support.clone()
    moved[:, 0] += 1
    before, after = head.encode_support(support), head.encode_support(moved)
    assert not torch.allclose(before[:, 1:], after[:, 1:])
    other = MatchingHead(6, fce=True, fce_steps=1)
    other.load_state_dict(head.state_dict())
    assert not torch.allclose(other(query, support, labels, 3, 2), logits)


@pytest.mark.parametrize("combine", ["mean", "sum"])
def test_relation_scores_combined_class_maps_against_each_query(combine):
    torch.manual_seed(0)
    head = RelationHead((2, 3, 3), channels=4, hidden=5, combine=combine).double().eval()
    query, support, labels = episode(way=3, shot=2, nq=4, d=18)
    got = head(query, support, labels, 3, 2)
    for e in range(2):
        for i in range(4):
            for c in range(3):
                summed = support[e, 2 * c] + support[e, 2 * c + 1]  # the paper sums the shots
                combined = summed / 2 if combine == "mean" else summed
                pair = torch.cat([combined.view(2, 3, 3), query[e, i].view(2, 3, 3)])
                want = head.score(head.blocks(pair[None]))
                assert torch.allclose(got[e, i, c], want[0, 0], atol=1e-12)


def test_relation_mean_reads_any_shot_on_one_scale():
    """Five copies of each support map score as the one map does with the mean, not the sum."""
    torch.manual_seed(0)
    query, support, labels = episode(way=3, shot=1, nq=4, d=18)
    five = support.repeat_interleave(5, dim=1)
    five_labels = torch.arange(3).repeat_interleave(5).expand(2, -1)
    for combine, same in (("mean", True), ("sum", False)):
        head = RelationHead((2, 3, 3), channels=4, hidden=5, combine=combine).double().eval()
        one_shot = head(query, support, labels, 3, 1)
        assert torch.allclose(head(query, five, five_labels, 3, 5), one_shot) is same


@pytest.mark.parametrize(
    "name", ["matching", "matching_fce", "matching_scaled", "relation_mse", "relation_ce"]
)
def test_embed_once_gradient_equals_average_of_split_gradients(name):
    torch.manual_seed(0)
    net = Conv4(1, channels=2, image_size=28, pooled_blocks=3).double().train()
    if name.startswith("matching"):
        similarity = "scaled_cosine" if name.endswith("scaled") else "euclidean"
        head = MatchingHead(net.out_dim, fce=name.endswith("fce"), similarity=similarity)
        head, loss = head.double(), "cross_entropy"
    else:
        head = RelationHead(net.feature_map, channels=3, hidden=4).double()
        # Its BatchNorm in eval mode: in training it sees the pairs of all U splits at once.
        head.eval()
        loss = "mse" if name.endswith("mse") else "cross_entropy"
    scale = torch.tensor(1.0, dtype=torch.float64)
    params = [*net.parameters(), *head.parameters()]
    b, way, shot, query, u = 2, 3, 1, 2, 4
    images = torch.randn(b, way, shot + query, 1, 28, 28, dtype=torch.float64)
    perm = draw_resplits(b, way, shot, query, u, torch.Generator().manual_seed(3))
    emb = net(images.flatten(0, 2)).view(b, way, shot + query, -1)
    value, _ = episode_loss(emb, head, scale, shot, perm, loss=loss)
    fast = torch.autograd.grad(value, params)
    reference = reembedding_gradients(net, params, images, head, scale, shot, perm, loss=loss)
    for f, r in zip(fast, reference, strict=True):
        assert torch.allclose(f, r, rtol=1e-7, atol=1e-10)
    alone = reembedding_gradients(net, params, images, head, scale, shot, perm[:1], loss=loss)
    assert not torch.allclose(alone[0], reference[0])


def test_relation_mse_is_the_papers_loss():
    logits = torch.randn(2, 6, 3)
    embeddings = torch.randn(2, 3, 3, 4)

    def head(*args):
        return logits

    value, _ = episode_loss(embeddings, head, torch.tensor(1.0), 1, loss="mse")
    targets = F.one_hot(torch.arange(3).repeat_interleave(2), 3).float().expand(2, 6, 3)
    assert torch.allclose(value, ((torch.sigmoid(logits) - targets) ** 2).mean())


@pytest.mark.parametrize(
    ("method", "options"), [("matching", {}), ("matching", {"fce": True}), ("relation", {})]
)
def test_they_train_and_learn(method, options, tmp_path, tiny_omniglot_root, monkeypatch):
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))
    settings = TrainSettings(
        method=method, method_options=options, way=5, shot=1, query=5, epochs=3,
        episodes_per_epoch=40, episodes_per_batch=4, val_episodes=16, optimizer="adam",
        lr=1e-3, lr_schedule=[], out=str(tmp_path / "run"), device="cpu", resplits=3,
    )  # fmt: skip
    trainer = make_trainer(settings)
    assert trainer.method.head_name == method and not trainer.method.scale.requires_grad
    trainer.fit()
    rows = trainer.progress.history
    assert rows[-1]["train_loss"] < rows[0]["train_loss"], rows
    assert rows[-1]["val_acc"] > 30  # 5-way: chance is 20 %


def test_relation_compares_maps_of_a_conv4_without_its_last_pool():
    settings = {**TrainSettings(method="relation").to_dict(), "in_channels": 1, "image_size": 28}
    method = build_method(settings)
    assert method.backbone.feature_map == (64, 3, 3)
    assert method.comparator.feature_map == (64, 3, 3)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--method", "matching", "--head", "ridge"], "--head does not apply to --method matching"),
        (["--method", "relation", "--label-smoothing", "0.1"], "--label-smoothing does not apply"),
        (["--method", "relation", "--method-options", '{"loss": "l1"}'], "loss must be one of"),
        (["--method", "matching", "--method-options", '{"fce_steps": 2}'], "with fce true"),
        (
            ["--method", "matching", "--method-options", '{"similarity": "dot"}'],
            "similarity must be one of euclidean, cosine, scaled_cosine, got 'dot'",
        ),
        (
            ["--method", "matching", "--method-options", '{"temperature": 5}'],
            "temperature must be a positive finite number with similarity scaled_cosine",
        ),
        (
            ["--method", "matching", "--method-options",
             '{"similarity": "scaled_cosine", "temperature": 0}'],
            "temperature must be a positive finite number",
        ),
        (
            ["--method", "relation", "--method-options", '{"combine": "max"}'],
            "combine must be one of mean, sum, got 'max'",
        ),
        (  # 66 billion parameters: refused before any is allocated
            ["--method", "relation", "--method-options", '{"hidden": 1000000000}'],
            "lower --method-options or --backbone-options",
        ),
        (  # a million reads per query: refused by the memory estimate, not by the OOM killer
            ["--method", "matching", "--method-options", '{"fce": true, "fce_steps": 1000000}'],
            "the full context embeddings of 150 queries",
        ),
        (
            ["--method", "relation", "--backbone", "resnet12", "--backbone-options",
             '{"avg_pool": true}'],
            "--backbone-options must keep a feature map for --method relation",
        ),
    ],
)  # fmt: skip
def test_options_they_cannot_take_are_refused(argv, message, tmp_path, capsys):
    assert main(["train", *argv, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r").exists()


def test_weights_are_saved_once_and_a_classifier_can_replace_the_comparison():
    settings = {**TrainSettings(method="relation").to_dict(), "in_channels": 1, "image_size": 28}
    method = build_method(settings).eval()
    names = list(method.state_dict())
    assert any(n.startswith("comparator.") for n in names)
    assert not any(n.startswith("head_fn") for n in names)
    images = torch.rand(2, 5, 3, 1, 28, 28)
    assert method.accuracy(images, 1).shape == (2,)
    method.use_classifier("centroid", {})
    assert method.head_name == "centroid" and method.accuracy(images, 1).shape == (2,)


def test_relation_training_step_matches_the_concatenated_pairs():
    """In training mode (BatchNorm over all pairs) the scores and gradients equal those of the
    paper's formulation: every pair's maps concatenated and run through the whole module."""
    torch.manual_seed(0)
    head = RelationHead((2, 3, 3), channels=4, hidden=5).double().train()
    query, support, labels = episode(way=3, shot=2, nq=4, d=18)
    got = head(query, support, labels, 3, 2)
    classes = (support[:, 0::2] + support[:, 1::2]) / 2  # episode() lists each class's shots
    pairs = torch.cat(
        [
            classes[:, None].expand(2, 4, 3, 18).reshape(-1, 2, 3, 3),
            query[:, :, None].expand(2, 4, 3, 18).reshape(-1, 2, 3, 3),
        ],
        dim=1,
    )
    want = head.score(head.blocks(pairs)).view(2, 4, 3)
    assert torch.allclose(got, want, atol=1e-12)
    grads = torch.autograd.grad(got.square().sum(), [*head.parameters()])
    ref = torch.autograd.grad(want.square().sum(), [*head.parameters()])
    for g, r in zip(grads, ref, strict=True):
        assert torch.allclose(g, r, atol=1e-10)
