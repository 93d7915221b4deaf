"""Every head and test-time classifier on episodes of unequal shots (shot=None, Meta-Dataset's
varied episodes) against independent references: per-class loops, float64 ridge solves, cvxpy's
Crammer-Singer SVM, scikit-learn's logistic regression and the per-episode references of the
classifiers' own tests, which take each class's own count."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_classifiers import reference_finetune, sklearn_probabilities
from test_heads import CONVERGED_ITERS, cvxpy_crammer_singer
from test_transductive import FAST_TIM, reference_bd_cspn, reference_pt_map, reference_tim

from fewshot.heads import (
    CLASSIFIERS,
    HEADS,
    bd_cspn,
    centroid,
    check_head,
    cosine,
    finetune,
    logistic,
    protonet,
    pt_map,
    ridge,
    svm,
    tim,
)
from fewshot.heads.svm import crammer_singer_dual
from fewshot.runtime.errors import FewshotError

# Two episodes' shots per class: unequal within each and between them, 10 support images each.
COUNTS = ((1, 4, 2, 3), (3, 3, 1, 3))
WAY = len(COUNTS[0])
# Options that keep the iterative classifiers quick.
QUICK = {"tim": FAST_TIM, "pt-map": {"steps": 5}, "finetune": {"steps": 10}}


def unequal_episodes(
    queries: int,
    dim: int,
    seed: int,
    counts: tuple[tuple[int, ...], ...] = COUNTS,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random query [B, nq, d], support [B, ns, d] and shuffled labels [B, ns], class m of
    episode b counts[b][m] times."""
    gen = torch.Generator().manual_seed(seed)
    samples = sum(counts[0])
    query = torch.randn(len(counts), queries, dim, generator=gen, dtype=dtype)
    support = torch.randn(len(counts), samples, dim, generator=gen, dtype=dtype)
    labels = [torch.arange(len(c)).repeat_interleave(torch.tensor(c)) for c in counts]
    shuffled = [y[torch.randperm(samples, generator=gen)] for y in labels]
    return query, support, torch.stack(shuffled)


def loop_means(support: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each class's mean support feature [way, d] of one episode, by a loop."""
    return torch.stack([support[labels == m].mean(0) for m in range(int(labels.max()) + 1)])


def test_the_episodes_are_unequal():
    _, _, labels = unequal_episodes(2, 3, seed=0)
    for y, counts in zip(labels, COUNTS, strict=True):
        assert tuple(torch.bincount(y).tolist()) == counts


@pytest.mark.parametrize("name", sorted(CLASSIFIERS))
def test_equal_shots_give_the_same_logits_as_an_integer_shot(name):
    way, shot = 3, 4
    gen = torch.Generator().manual_seed(1)
    query = torch.randn(2, 6, 5, generator=gen, dtype=torch.float64)
    support = torch.randn(2, way * shot, 5, generator=gen, dtype=torch.float64)
    labels = torch.stack([torch.randperm(way * shot, generator=gen) % way for _ in range(2)])
    options = QUICK.get(name, {})
    expected = CLASSIFIERS[name](query, support, labels, way, shot, **options)
    assert torch.equal(CLASSIFIERS[name](query, support, labels, way, None, **options), expected)


@pytest.mark.parametrize("normalize_by_dim", [False, True])
def test_protonet_and_centroid_use_each_class_mean(normalize_by_dim):
    query, support, labels = unequal_episodes(5, 7, seed=2)
    logits = protonet(query, support, labels, WAY, None, normalize_by_dim=normalize_by_dim)
    for b in range(2):
        expected = -(query[b, :, None] - loop_means(support[b], labels[b])).pow(2).sum(2)
        if normalize_by_dim:
            expected = expected / 7
        torch.testing.assert_close(logits[b], expected, rtol=1e-10, atol=1e-12)
    if not normalize_by_dim:
        torch.testing.assert_close(centroid(query, support, labels, WAY, None), logits)


def test_centroid_cl2n_and_cosine_use_each_class_mean():
    query, support, labels = unequal_episodes(5, 7, seed=3)
    center = torch.randn(7, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    logits = centroid(query, support, labels, WAY, None, cl2n=True, center=center)
    cosines = cosine(query, support, labels, WAY, None)
    for b in range(2):
        q, s = F.normalize(query[b] - center, dim=1), F.normalize(support[b] - center, dim=1)
        expected = -(q[:, None] - loop_means(s, labels[b])).pow(2).sum(2)
        torch.testing.assert_close(logits[b], expected, rtol=1e-10, atol=1e-12)
        means = loop_means(support[b], labels[b])
        expected = F.cosine_similarity(query[b][:, None], means[None], dim=2)
        torch.testing.assert_close(cosines[b], expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dim", [4, 30])  # fewer and more features than support samples
def test_ridge_matches_primal_solve(dim):
    lam = 2.5
    query, support, labels = unequal_episodes(6, dim, seed=5)
    logits = ridge(query, support, labels, WAY, None, lam=lam)
    for b in range(2):
        targets = F.one_hot(labels[b], WAY).double()
        gram = support[b].T @ support[b] + lam * torch.eye(dim, dtype=torch.float64)
        weights = torch.linalg.solve(gram, support[b].T @ targets)
        torch.testing.assert_close(logits[b], query[b] @ weights, rtol=1e-9, atol=1e-10)


def cvxpy_dual(kernel: np.ndarray, labels: np.ndarray, way: int, C: float) -> np.ndarray:
    """Solve the Crammer-Singer DUAL of one episode with cvxpy, to a tight tolerance:

    min 1/2 sum_m A[:, m]' K A[:, m] - <Y, A>  s.t.  A <= C Y,  A 1 = 0  (Y one-hot [ns, way]).
    """
    targets = np.eye(way)[labels]
    alpha = cp.Variable(targets.shape)
    kernel = cp.psd_wrap(kernel)
    quadratic = sum(cp.quad_form(alpha[:, m], kernel) for m in range(way))
    objective = cp.Minimize(0.5 * quadratic - cp.sum(cp.multiply(targets, alpha)))
    constraints = [alpha <= C * targets, cp.sum(alpha, axis=1) == 0]
    tight = {"tol_gap_abs": 1e-12, "tol_gap_rel": 1e-12, "tol_feas": 1e-12}
    cp.Problem(objective, constraints).solve(solver=cp.CLARABEL, **tight)
    return alpha.value


@pytest.mark.parametrize(("C", "dual_ridge"), [(0.1, 1.0), (1.0, 0.0), (0.5, 0.0)])
def test_svm_matches_cvxpy_crammer_singer(C, dual_ridge):
    query, support, labels = unequal_episodes(5, 8, seed=6)
    support = support / 2  # margins of order 1, so some bounds are active and some not
    options = {"C": C, "max_iter": CONVERGED_ITERS, "dual_ridge": dual_ridge}
    alpha = crammer_singer_dual(support, labels, WAY, None, **options)
    logits = svm(query, support, labels, WAY, None, **options)
    for b in range(2):
        s, y = support[b].numpy(), labels[b].numpy()
        kernel = s @ s.T + dual_ridge * np.eye(len(s))
        np.testing.assert_allclose(alpha[b].numpy(), cvxpy_dual(kernel, y, WAY, C), atol=1e-8)
        # The primal's weights: a second reference, solved to cvxpy's default tolerance.
        weights, _ = cvxpy_crammer_singer(s, y, WAY, C, dual_ridge)
        np.testing.assert_allclose(logits[b].numpy(), query[b].numpy() @ weights, atol=1e-5)


@pytest.mark.parametrize(
    ("counts", "C", "normalize"),
    [
        (COUNTS, 1.0, True),
        (COUNTS, 10.0, False),
        (((1, 5), (4, 2)), 1.0, True),  # binary: scikit-learn's single weight vector
    ],
)
def test_logistic_matches_sklearn(counts, C, normalize):
    query, support, labels = unequal_episodes(5, 8, seed=7, counts=counts)
    way = len(counts[0])
    logits = logistic(query, support, labels, way, None, C=C, normalize=normalize, tol=1e-10)
    expected = sklearn_probabilities(query, support, labels, C, normalize)
    np.testing.assert_allclose(logits.exp().numpy(), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("classifier", ["linear", "cosine"])
def test_finetune_equals_per_episode_sgd_loop(classifier):
    query, support, labels = unequal_episodes(4, 12, seed=8, dtype=torch.float32)
    with torch.no_grad():
        logits = finetune(query, support, labels, WAY, None, classifier=classifier, seed=3)
    expected = reference_finetune(query, support, labels, WAY, classifier, 100, 0.01, seed=3)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)


def test_bd_cspn_matches_numpy():
    query, support, labels = unequal_episodes(12, 5, seed=9)
    logits = bd_cspn(query, support, labels, WAY, None)
    for b in range(2):
        q, s, y = query[b].numpy(), support[b].numpy(), labels[b].numpy()
        expected = reference_bd_cspn(q, s, y, WAY, epsilon=10.0, shift=True)
        np.testing.assert_allclose(logits[b].numpy(), expected, rtol=0, atol=1e-5)


def test_tim_equals_per_episode_adam_loop():
    query, support, labels = unequal_episodes(12, 5, seed=10)
    logits = tim(query, support, labels, WAY, None, **FAST_TIM)
    settings = {"temperature": 15.0, "alpha": 0.1, "lambda_": 0.1} | FAST_TIM
    expected = reference_tim(query, support, labels, WAY, **settings)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("options", [{}, {"center": False, "tol": 1e-10, "steps": 5}])
def test_pt_map_matches_numpy(options):
    query, support, labels = unequal_episodes(12, 5, seed=11)
    query = query + 0.5  # both signs, mostly non-negative: the clamp matters, not everything
    logits = pt_map(query, support, labels, WAY, None, **options)
    settings = {"beta": 0.5, "lam": 10.0, "alpha": 0.2, "steps": 30, "epsilon": 1e-6}
    settings |= {"center": True, "tol": 1e-6} | options
    for b in range(2):
        q, s, y = query[b].numpy(), support[b].numpy(), labels[b].numpy()
        expected = reference_pt_map(q, s, y, WAY, **settings)
        np.testing.assert_allclose(logits[b].numpy(), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", sorted(HEADS))
def test_gradcheck(name):
    query, support, labels = unequal_episodes(2, 4, seed=12, counts=((1, 3, 2),))
    options = {"svm": {"max_iter": CONVERGED_ITERS}, "ridge": {"lam": 0.7}}.get(name, {})
    assert torch.autograd.gradcheck(
        lambda q, s: HEADS[name](q, s, labels, 3, None, **options),
        (query.requires_grad_(), (support / 2).requires_grad_()),
        atol=1e-5,
        rtol=1e-3,
    )


@pytest.mark.parametrize("name", sorted(CLASSIFIERS))
def test_a_class_without_support_is_refused_in_one_line(name):
    query, support, labels = unequal_episodes(4, 5, seed=13)
    missing = labels.clone()
    missing[1, missing[1] == 2] = 0
    with pytest.raises(FewshotError, match=r"^class 2 has no support image in episode 1: ") as e:
        CLASSIFIERS[name](query, support, missing, WAY, None)
    assert "\n" not in str(e.value)
    out_of_range = labels.clone()
    out_of_range[0, 0] = WAY
    with pytest.raises(
        FewshotError, match=r"^support_labels must be class ids 0\.\.3, got 0\.\.4$"
    ):
        CLASSIFIERS[name](query, support, out_of_range, WAY, None)
    # An integer shot still refuses unequal counts (5 x 2 = 10 samples), naming the alternative.
    with pytest.raises(FewshotError, match=r"exactly 2 times \(shot=None: unequal shots\)$"):
        CLASSIFIERS[name](query, support, labels, 5, 2)


def test_the_head_check_takes_unequal_shots():
    for name in CLASSIFIERS:
        check_head(name, 5, None, {})
    check_head("ridge", 10**9, None, {"lam": 1.0})  # a 2-way episode, however many classes
    check_head("centroid", 5, None, {"cl2n": True})
    with pytest.raises(FewshotError, match="the SVM head needs way >= 2 classes, got way=1"):
        check_head("svm", 1, None, {})
    with pytest.raises(FewshotError, match=r"^way must be at least 1, got way=0$"):
        check_head("protonet", 0, None, {})
