"""Transductive classifiers against independent float64 references: numpy for BD-CSPN and
PT-MAP, a plain per-episode PyTorch loop for TIM; batching, query order, a shifted query domain;
PT-MAP on real 20-way episodes; the benchmark's smoke run."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from test_benchmarks import run

from benchmarks import bench_transductive
from fewshot.datasets import REPO_DATA
from fewshot.datasets.batches import images_to_device
from fewshot.heads import (
    CLASSIFIERS,
    HEADS,
    TRANSDUCTIVE,
    bd_cspn,
    centroid,
    pt_map,
    query_assumption,
    query_refusal,
    tim,
)
from fewshot.runtime.errors import FewshotError
from fewshot.training.checkpoint import load_trained

WAY, SHOT, QUERIES, DIM = 3, 2, 4, 5  # 4 queries per class
FAST_TIM = {"steps": 40, "lr": 1e-2}  # W moves far in few steps: a reference that tests something


def episodes(
    batch: int, seed: int, dtype=torch.float64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random query [B, way*Q, d], support [B, way*shot, d], shuffled labels [B, way*shot]."""
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, WAY * QUERIES, DIM, generator=gen, dtype=dtype)
    support = torch.randn(batch, WAY * SHOT, DIM, generator=gen, dtype=dtype)
    labels = torch.stack([torch.randperm(WAY * SHOT, generator=gen) % WAY for _ in range(batch)])
    return query, support, labels


def one_hot(labels: np.ndarray, way: int) -> np.ndarray:
    return np.eye(way)[labels]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """cos(a_i, b_k) [n, k]."""
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    return a @ b.T / (na[:, None] * nb[None])


def reference_bd_cspn(q, s, y, way, epsilon, shift):
    """BD-CSPN per episode, class by class: shift, pseudo-labels, weighted sums."""
    if shift:
        q = q + s.mean(0) - q.mean(0)
    basic = np.stack([s[y == n].mean(0) for n in range(way)])
    pseudo = cosines(q, basic).argmax(1)
    rectified = []
    for n in range(way):
        members = np.concatenate([s[y == n], q[pseudo == n]])
        w = np.exp(epsilon * cosines(members, basic[n : n + 1])[:, 0])
        rectified.append((w / w.sum()) @ members)
    return cosines(q, np.stack(rectified))


@pytest.mark.parametrize(("epsilon", "shift"), [(10.0, True), (1.0, False), (3.0, True)])
def test_bd_cspn_matches_numpy(epsilon, shift):
    query, support, labels = episodes(2, seed=0)
    logits = bd_cspn(query, support, labels, WAY, SHOT, epsilon=epsilon, shift=shift)
    for b in range(2):
        expected = reference_bd_cspn(
            query[b].numpy(), support[b].numpy(), labels[b].numpy(), WAY, epsilon, shift
        )
        np.testing.assert_allclose(logits[b].numpy(), expected, rtol=0, atol=1e-5)
    assert logits.abs().max() <= 1 + 1e-12


def reference_tim(query, support, labels, way, steps, lr, temperature, alpha, lambda_):
    """TIM-GD per episode as the official code writes it: explicit distances, log(p + 1e-12),
    one torch.optim.Adam per episode."""
    logits = []
    for q, s, y in zip(query, support, labels, strict=True):
        q, s = q / q.norm(dim=1, keepdim=True), s / s.norm(dim=1, keepdim=True)
        targets = torch.nn.functional.one_hot(y, way).to(s.dtype)
        w = torch.stack([s[y == k].mean(0) for k in range(way)]).requires_grad_()
        optimizer = torch.optim.Adam([w], lr=lr)

        def scores(x, w=w):
            return -temperature / 2 * ((x[:, None, :] - w[None]) ** 2).sum(2)

        for _ in range(steps):
            p_s, p_q = scores(s).softmax(1), scores(q).softmax(1)
            ce = -(targets * torch.log(p_s + 1e-12)).sum(1).mean()
            cond = -(p_q * torch.log(p_q + 1e-12)).sum(1).mean()
            marginal = p_q.mean(0)
            ent = -(marginal * torch.log(marginal)).sum()
            loss = lambda_ * ce - (ent - alpha * cond)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        logits.append(scores(q).detach())
    return torch.stack(logits)


@pytest.mark.parametrize(
    "options",
    [
        FAST_TIM,
        {"steps": 25, "lr": 3e-2, "temperature": 5.0, "alpha": 0.5, "lambda_": 1.0},
        {},  # the defaults: 1000 steps of lr 1e-4
    ],
)
def test_tim_equals_per_episode_adam_loop(options):
    query, support, labels = episodes(2, seed=1)
    with torch.no_grad():  # as evaluation calls it: trains all the same
        logits = tim(query, support, labels, WAY, SHOT, **options)
    settings = {"steps": 1000, "lr": 1e-4, "temperature": 15.0, "alpha": 0.1, "lambda_": 0.1}
    expected = reference_tim(query, support, labels, WAY, **{**settings, **options})
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    assert not logits.requires_grad
    # Not vacuous: the weights moved away from the normalised support means.
    untrained = tim(query, support, labels, WAY, SHOT, **{**options, "steps": 0})
    assert (logits - untrained).abs().max() > 1e-3


def reference_pt_map(q, s, y, way, beta, lam, alpha, steps, epsilon, center, tol):
    """PT-MAP per episode as its code (test_standard.py): power transform, normalisation,
    centring, then Sinkhorn (the code's loop and stopping test) and MAP steps."""
    ns = len(s)
    x = (np.maximum(np.concatenate([s, q]), 0) + epsilon) ** beta
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    if center:
        for part in (slice(0, ns), slice(ns, None)):
            x[part] = x[part] - x[part].mean(0)
            x[part] = x[part] / np.linalg.norm(x[part], axis=1, keepdims=True)
    xs, xq = x[:ns], x[ns:]
    columns = len(q) / way

    def sinkhorn(mus):
        cost = ((xq[:, None, :] - mus[None]) ** 2).sum(2)
        plan = np.exp(-lam * cost)
        plan = plan / plan.sum()
        u = np.zeros(len(q))
        for _ in range(1000):
            if np.abs(u - plan.sum(1)).max() <= tol:
                break
            u = plan.sum(1)
            plan = plan / u[:, None]
            plan = plan * (columns / plan.sum(0))[None]
        return plan

    mus = np.stack([xs[y == n].mean(0) for n in range(way)])
    for _ in range(steps):
        mask = np.concatenate([one_hot(y, way), sinkhorn(mus)])
        mus = mus + alpha * ((mask.T @ x) / mask.sum(0)[:, None] - mus)
    return np.log(sinkhorn(mus))


@pytest.mark.parametrize(
    "options",
    [
        {},  # beta 0.5, lam 10, alpha 0.2, 30 steps, centred
        {"center": False, "tol": 1e-10, "steps": 5},
        {"beta": 1.0, "lam": 3.0, "alpha": 0.5, "steps": 8, "epsilon": 0.0},
    ],
)
def test_pt_map_matches_numpy(options):
    query, support, labels = episodes(2, seed=2)
    query = query + 0.5  # both signs, mostly non-negative: the clamp matters, not everything
    logits = pt_map(query, support, labels, WAY, SHOT, **options)
    settings = {"beta": 0.5, "lam": 10.0, "alpha": 0.2, "steps": 30, "epsilon": 1e-6}
    settings |= {"center": True, "tol": 1e-6} | options
    for b in range(2):
        expected = reference_pt_map(
            query[b].numpy(), support[b].numpy(), labels[b].numpy(), WAY, **settings
        )
        np.testing.assert_allclose(logits[b].numpy(), expected, rtol=0, atol=1e-5)
    # Each query's assignments sum to 1 (to the Sinkhorn tolerance).
    assert (logits.exp().sum(2) - 1).abs().max() < 1e-3


def test_pt_map_episodes_stop_their_sinkhorn_each_at_its_own_iteration():
    # Twelve episodes whose Sinkhorn loops stop after 6 to 37 iterations: in different blocks
    # of SINKHORN_BLOCK iterations, each where the code's test stops it (a loose tolerance,
    # so that an iteration more or less shows).
    query, support, labels = episodes(12, seed=12)
    options = {"steps": 3, "tol": 1e-4, "lam": 3.0}
    logits = pt_map(query, support, labels, WAY, SHOT, **options)
    settings = {"beta": 0.5, "alpha": 0.2, "epsilon": 1e-6, "center": True} | options
    for b in range(12):
        expected = reference_pt_map(
            query[b].numpy(), support[b].numpy(), labels[b].numpy(), WAY, **settings
        )
        np.testing.assert_allclose(logits[b].numpy(), expected, rtol=0, atol=1e-9)


def test_pt_map_on_real_twenty_way_episodes_matches_numpy(omniglot_test):
    # The zoo ProtoNet's features of 20 test classes' drawings, two 20-way 1-shot 15-query
    # episodes: each Sinkhorn runs hundreds of iterations here (the batched products and the
    # per-block test against the code's loop and its test at every iteration).
    checkpoint = REPO_DATA.parent / "models" / "omniglot" / "protonet_conv4_trainval.pt"
    method, _ = load_trained(checkpoint, torch.device("cpu"))
    index = torch.cat([torch.nonzero(omniglot_test.labels == c)[:16, 0] for c in range(20)])
    with torch.no_grad():
        features = method.embed(images_to_device(omniglot_test, index, torch.device("cpu")))
    features = features.view(20, 16, -1)
    gen = torch.Generator().manual_seed(13)
    drawings = torch.stack([torch.randperm(16, generator=gen) for _ in range(2 * 20)])
    chosen = features[torch.arange(20).repeat(2)[:, None], drawings].view(2, 20, 16, -1)
    support, query = chosen[:, :, 0], chosen[:, :, 1:].flatten(1, 2)
    labels = torch.arange(20).expand(2, -1)
    logits = pt_map(query, support, labels, 20, 1)
    settings = {"beta": 0.5, "lam": 10.0, "alpha": 0.2, "steps": 30, "epsilon": 1e-6}
    settings |= {"center": True, "tol": 1e-6}
    query_labels = torch.arange(20).repeat_interleave(15)
    for b in range(2):
        expected = reference_pt_map(
            query[b].double().numpy(),
            support[b].double().numpy(),
            labels[b].numpy(),
            20,
            **settings,
        )
        np.testing.assert_allclose(logits[b].double().numpy(), expected, rtol=1e-6, atol=1e-6)
        # The same predictions, so the same per-episode accuracy.
        assert torch.equal(logits[b].argmax(1), torch.from_numpy(expected.argmax(1)))
        assert (logits[b].argmax(1) == query_labels).double().mean() > 0.5  # chance: 0.05


METHODS = {"bd-cspn": (bd_cspn, {}), "tim": (tim, FAST_TIM), "pt-map": (pt_map, {})}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_batch_equals_episodes_and_query_order_is_free(name):
    method, options = METHODS[name]
    query, support, labels = episodes(3, seed=3)
    together = method(query, support, labels, WAY, SHOT, **options)
    alone = [
        method(query[b : b + 1], support[b : b + 1], labels[b : b + 1], WAY, SHOT, **options)
        for b in range(3)
    ]
    torch.testing.assert_close(together, torch.cat(alone), rtol=0, atol=1e-9)
    order = torch.randperm(WAY * QUERIES, generator=torch.Generator().manual_seed(4))
    shuffled = method(query[:, order], support, labels, WAY, SHOT, **options)
    torch.testing.assert_close(shuffled, together[:, order], rtol=0, atol=1e-9)
    # Transductive: the other queries change a query's logits.
    others = method(query[:, :-1], support, labels, WAY, SHOT, **options)
    assert (others - together[:, :-1]).abs().max() > 1e-6


def separated_clusters(
    batch: int, way: int, shot: int, queries: int, dim: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Non-negative clusters (random class means in [0, 2]^d, noise in [0, 0.3]^d) whose queries
    all moved by one random vector in [0, 3]^d: query, support, support and query labels."""
    gen = torch.Generator().manual_seed(seed)
    means = 2 * torch.rand(batch, way, dim, generator=gen, dtype=torch.float64)

    def draw(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.stack([torch.randperm(way * count, generator=gen) % way for _ in range(batch)])
        noise = 0.3 * torch.rand(batch, way * count, dim, generator=gen, dtype=torch.float64)
        return means.gather(1, y.unsqueeze(2).expand(-1, -1, dim)) + noise, y

    support, support_labels = draw(shot)
    query, query_labels = draw(queries)
    query = query + 3 * torch.rand(dim, generator=gen, dtype=torch.float64)
    return query, support, support_labels, query_labels


@pytest.mark.parametrize("shot", [1, 5])
def test_shifted_query_domain_beats_nearest_centroid(shot):
    query, support, labels, query_labels = separated_clusters(20, 5, shot, 10, 16, seed=5)

    def accuracy(logits: torch.Tensor) -> float:
        return (logits.argmax(2) == query_labels).double().mean().item()

    baseline = accuracy(centroid(query, support, labels, 5, shot))
    assert baseline < 0.7  # the shift hurts the inductive classifier
    for name in sorted(TRANSDUCTIVE):
        assert accuracy(CLASSIFIERS[name](query, support, labels, 5, shot)) >= max(baseline, 0.99)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_float32_and_requires_grad(name):
    method, options = METHODS[name]
    query, support, labels = episodes(2, seed=6)
    exact = method(query, support, labels, WAY, SHOT, **options)
    query32, support32 = query.float().requires_grad_(), support.float().requires_grad_()
    logits = method(query32, support32, labels, WAY, SHOT, **options)
    assert logits.dtype == torch.float32 and not logits.requires_grad
    torch.testing.assert_close(logits, exact.float(), rtol=0, atol=1e-3)


def test_registry():
    assert frozenset({"bd-cspn", "tim", "pt-map"}) == TRANSDUCTIVE
    assert CLASSIFIERS["bd-cspn"] is bd_cspn
    assert CLASSIFIERS["tim"] is tim
    assert CLASSIFIERS["pt-map"] is pt_map
    assert not TRANSDUCTIVE & set(HEADS)  # not trainable heads


def test_a_single_query_is_what_each_classifier_cannot_read():
    """Why one query is refused (`query_refusal`): PT-MAP spreads it evenly over the classes,
    BD-CSPN's shift moves it onto the support's mean (its logits no longer depend on it), TIM's
    marginal entropy flattens its scores (its first query: 0.97 among the others here)."""
    query, support, labels = episodes(1, seed=9)
    one, other = query[:, :1], query[:, 1:2]
    uniform = torch.full((1, 1, WAY), 1 / WAY, dtype=torch.float64)
    assert torch.allclose(pt_map(one, support, labels, WAY, SHOT).exp(), uniform)
    shifted = [bd_cspn(q, support, labels, WAY, SHOT) for q in (one, other)]
    assert torch.allclose(*shifted)
    alone = tim(one, support, labels, WAY, SHOT).softmax(-1).max()
    among = tim(query, support, labels, WAY, SHOT)[0, 0].softmax(-1).max()
    assert alone < 0.5 < among


@pytest.mark.parametrize("way", [2, 3, 5, 10, 20])
def test_the_fewest_queries_each_classifier_takes(way):
    """PT-MAP: as many as the classes (its equal shares); BD-CSPN and TIM: two, and half the
    classes (below it they fall under nearest centroid); an inductive classifier or a
    model's own head (None): any."""
    for name in ("centroid", "logistic", None):
        assert query_refusal(name, 1, way) is None and query_assumption(name, way) is None
    for name in sorted(TRANSDUCTIVE):
        fewest = way if name == "pt-map" else max(2, math.ceil(way / 2))
        assert query_refusal(name, fewest, way) is None
        refusal = query_refusal(name, fewest - 1, way)
        assert refusal.startswith(f"{query_assumption(name, way)}; ")
        assert refusal.endswith(f", or give {fewest} queries or more")
        assert f"over the {way} classes" in refusal


@pytest.mark.parametrize(
    ("method", "options", "message"),
    [
        (bd_cspn, {"epsilon": 0.0}, "bd-cspn epsilon must be positive"),
        (tim, {"steps": -1}, "tim steps must be non-negative"),
        (tim, {"lr": 0.0}, "tim needs lr > 0"),
        (tim, {"temperature": -1.0}, "temperature > 0"),
        (pt_map, {"beta": 0.0}, "pt-map needs beta > 0"),
        (pt_map, {"alpha": 1.5}, "0 < alpha <= 1"),
        (pt_map, {"steps": -2}, "pt-map steps must be non-negative"),
    ],
)
def test_bad_options_are_named(method, options, message):
    query, support, labels = episodes(1, seed=7)
    with pytest.raises(FewshotError, match=message):
        method(query, support, labels, WAY, SHOT, **options)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_bad_episodes_are_refused(name):
    method = METHODS[name][0]
    query, support, labels = episodes(2, seed=8)
    with pytest.raises(FewshotError, match="needs at least one query"):
        method(query[:, :0], support, labels, WAY, SHOT)
    with pytest.raises(FewshotError, match="way=3 x shot=3"):
        method(query, support, labels, WAY, 3)
    with pytest.raises(FewshotError, match="query"):
        method(query[:, :, :4], support, labels, WAY, SHOT)
    with pytest.raises(FewshotError, match="every class"):
        method(query, support, torch.zeros_like(labels), WAY, SHOT)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", sorted(METHODS))
def test_cuda_equals_cpu(name):
    method, options = METHODS[name]
    gen = torch.Generator().manual_seed(9)
    query = torch.rand(4, 75, 640, generator=gen)
    support = torch.rand(4, 25, 640, generator=gen)
    labels = torch.arange(5).repeat_interleave(5).expand(4, -1)
    on_cpu = method(query, support, labels, 5, 5, **options)
    cuda = torch.device("cuda")
    on_gpu = method(query.to(cuda), support.to(cuda), labels.to(cuda), 5, 5, **options)
    assert on_gpu.device.type == "cuda" and on_gpu.dtype == torch.float32
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, rtol=1e-4, atol=1e-4)


def test_bench_transductive_smoke(monkeypatch, capsys):
    monkeypatch.delenv("FEWSHOT_DATA", raising=False)  # Omniglot from the repository's data/
    out = run(monkeypatch, capsys, bench_transductive, "--smoke", "--device", "cpu")
    assert "2 seeded 1-shot 15-query (seed 0), 2 a call" in out, out
    number = r"\d+\.\d+"
    embed = float(re.search(rf"images embedded once in ({number}) s", out)[1])
    for way in (5, 20):
        evaluations = {}
        for name in ("centroid", *sorted(TRANSDUCTIVE)):
            row = rf"^ *{way} {name} +({number}) +({number}) +({number})x +({number}) ± {number}$"
            figures = re.search(row, out, re.M)
            assert figures, out
            seconds, evaluations[name], ratio, accuracy = map(float, figures.groups())
            # The embedding's seconds are printed to 0.1, the others to 0.01.
            assert evaluations[name] == pytest.approx(embed + seconds, abs=0.06)
            # Both evaluations printed to 0.01 s, the ratio to 0.01: within what they allow.
            low = (evaluations[name] - 0.005) / (evaluations["centroid"] + 0.005) - 0.005
            high = (evaluations[name] + 0.005) / max(evaluations["centroid"] - 0.005, 1e-9)
            assert low <= ratio <= high + 0.005, out
            assert 50 < accuracy <= 100
    goal = r"^goal: pt-map's evaluation at most 3x centroid's at 20 ways: (met|MISSED)$"
    assert re.search(goal, out, re.M), out
