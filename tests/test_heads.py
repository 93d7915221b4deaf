"""The few-shot heads against independent references: naive loops, primal ridge, cvxpy SVM."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge

from fewshot.heads import HEADS, check_head, get_head, protonet, ridge, svm
from fewshot.heads.svm import crammer_singer_dual
from fewshot.runtime.errors import FewshotError

# An iteration cap the interior-point solvers stop well under on these small problems.
CONVERGED_ITERS = 40


def episodes(
    batch: int, way: int, shot: int, queries: int, dim: int, seed: int, dtype=torch.float64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random query [B, nq, d], support [B, ns, d], shuffled labels [B, ns] (`shot` per class)."""
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, queries, dim, generator=gen, dtype=dtype)
    support = torch.randn(batch, way * shot, dim, generator=gen, dtype=dtype)
    labels = torch.stack([torch.randperm(way * shot, generator=gen) % way for _ in range(batch)])
    return query, support, labels


def permute_support(
    support: torch.Tensor, labels: torch.Tensor, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same support sets with each episode's samples in another order."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.stack([torch.randperm(support.shape[1], generator=gen) for _ in support])
    return torch.gather(support, 1, order.unsqueeze(-1).expand_as(support)), torch.gather(
        labels, 1, order
    )


@pytest.mark.parametrize("normalize_by_dim", [False, True])
def test_protonet_matches_naive_class_means(normalize_by_dim):
    way, shot = 4, 3
    query, support, labels = episodes(3, way, shot, 5, 7, seed=0)
    logits = protonet(query, support, labels, way, shot, normalize_by_dim=normalize_by_dim)
    for b in range(3):
        for m in range(way):
            prototype = support[b][labels[b] == m].mean(dim=0)
            for q in range(5):
                expected = -((query[b, q] - prototype) ** 2).sum()
                if normalize_by_dim:
                    expected = expected / 7
                assert logits[b, q, m].item() == pytest.approx(expected.item(), rel=1e-10)


@pytest.mark.parametrize("dim", [4, 30])  # fewer and more features than support samples
def test_ridge_dual_matches_primal_solve(dim):
    way, shot, lam = 3, 4, 2.5
    query, support, labels = episodes(2, way, shot, 6, dim, seed=1)
    logits = ridge(query, support, labels, way, shot, lam=lam)
    for b in range(2):
        targets = torch.nn.functional.one_hot(labels[b], way).double()
        gram = support[b].T @ support[b] + lam * torch.eye(dim, dtype=torch.float64)
        weights = torch.linalg.solve(gram, support[b].T @ targets)
        torch.testing.assert_close(logits[b], query[b] @ weights, rtol=1e-9, atol=1e-10)


def test_ridge_matches_sklearn_and_float32():
    way, shot, lam = 5, 2, 50.0
    query, support, labels = episodes(2, way, shot, 4, 16, seed=2)
    logits = ridge(query, support, labels, way, shot)  # lam defaults to 50
    logits32 = ridge(query.float(), support.float(), labels, way, shot, lam=lam)
    for b in range(2):
        targets = np.eye(way)[labels[b].numpy()]
        model = Ridge(alpha=lam, fit_intercept=False).fit(support[b].numpy(), targets)
        np.testing.assert_allclose(logits[b].numpy(), model.predict(query[b].numpy()), atol=1e-10)
    torch.testing.assert_close(logits32, logits.float(), rtol=1e-4, atol=1e-5)


def cvxpy_crammer_singer(
    support: np.ndarray, labels: np.ndarray, way: int, C: float, dual_ridge: float
) -> tuple[np.ndarray, np.ndarray]:
    """Solve the Crammer-Singer PRIMAL with cvxpy; return the weights [d, way] and duals [ns, way].

    min 1/2 |W|^2 + C sum xi  s.t.  w_y.x_i - w_m.x_i >= 1 - [m = y_i] - xi_i  for all i, m,
    on features extended by sqrt(dual_ridge) e_i (what the head's dual_ridge term means).
    The dual coefficients are alpha_i[m] = C [m = y_i] - (multiplier of constraint (i, m)).
    """
    samples, dim = support.shape
    features = np.hstack([support, np.sqrt(dual_ridge) * np.eye(samples)])
    targets = np.eye(way)[labels]
    weights = cp.Variable((features.shape[1], way))
    slack = cp.Variable(samples)
    scores = features @ weights
    true_score = cp.sum(cp.multiply(targets, scores), axis=1)
    margins = [true_score - scores[:, m] >= 1 - targets[:, m] - slack for m in range(way)]
    objective = cp.Minimize(0.5 * cp.sum_squares(weights) + C * cp.sum(slack))
    cp.Problem(objective, margins).solve(solver=cp.CLARABEL)
    multipliers = np.stack([constraint.dual_value for constraint in margins], axis=1)
    return weights.value[:dim], C * targets - multipliers


@pytest.mark.parametrize(
    ("way", "shot", "dim", "C", "dual_ridge"),
    [(3, 2, 8, 0.1, 1.0), (4, 1, 6, 1.0, 0.0), (5, 2, 12, 0.5, 0.0), (2, 3, 5, 0.2, 1.0)],
)
def test_svm_matches_cvxpy_crammer_singer(way, shot, dim, C, dual_ridge):
    query, support, labels = episodes(2, way, shot, 5, dim, seed=3)
    support = support / 2  # margins of order 1, so some bounds are active and some not
    alpha = crammer_singer_dual(
        support, labels, way, shot, C=C, max_iter=CONVERGED_ITERS, dual_ridge=dual_ridge
    )
    logits = svm(
        query, support, labels, way, shot, C=C, max_iter=CONVERGED_ITERS, dual_ridge=dual_ridge
    )
    for b in range(2):
        weights, expected_alpha = cvxpy_crammer_singer(
            support[b].numpy(), labels[b].numpy(), way, C, dual_ridge
        )
        np.testing.assert_allclose(alpha[b].numpy(), expected_alpha, atol=1e-6)
        np.testing.assert_allclose(logits[b].numpy(), query[b].numpy() @ weights, atol=1e-5)


def metaoptnet_form_dual(
    support: torch.Tensor, labels: torch.Tensor, way: int, C: float, max_iter: int
) -> torch.Tensor:
    """MetaOptNet's own QP (all ns*way variables, equality constraints, +1 I) solved by qpth."""
    QPFunction = pytest.importorskip("qpth.qp").QPFunction
    samples = support.shape[1]
    kernel = support @ support.transpose(1, 2)
    quadratic = torch.stack([torch.kron(k, torch.eye(way, dtype=k.dtype)) for k in kernel])
    quadratic = quadratic + torch.eye(samples * way, dtype=support.dtype)
    targets = torch.nn.functional.one_hot(labels, way).to(support.dtype).flatten(1)
    sums = torch.kron(torch.eye(samples), torch.ones(1, way)).to(support.dtype)
    solution = QPFunction(verbose=-1, maxIter=max_iter)(
        quadratic,
        -targets,
        torch.eye(samples * way, dtype=support.dtype),
        C * targets,
        sums,
        torch.zeros(samples, dtype=support.dtype),
    )
    return solution.reshape(support.shape[0], samples, way)


@pytest.mark.parametrize("max_iter", [3, 15])
def test_svm_truncated_iterates_equal_metaoptnet_form(max_iter):
    way, shot = 5, 2
    _, support, labels = episodes(3, way, shot, 1, 20, seed=4)
    support = support.relu() / 3
    alpha = crammer_singer_dual(support, labels, way, shot, max_iter=max_iter, solver="qpth")
    expected = metaoptnet_form_dual(support, labels, way, C=0.1, max_iter=max_iter)
    torch.testing.assert_close(alpha, expected, rtol=1e-6, atol=1e-8)


HEAD_OPTIONS = {
    "cosine": {},
    "protonet": {},
    "ridge": {"lam": 0.7},
    "svm": {"max_iter": CONVERGED_ITERS},
}


@pytest.mark.parametrize("name", sorted(HEADS))
def test_gradcheck(name):
    way, shot = 3, 2
    query, support, labels = episodes(1, way, shot, 2, 4, seed=5)
    query.requires_grad_()
    support = (support / 2).requires_grad_()
    head = get_head(name)
    assert torch.autograd.gradcheck(
        lambda q, s: head(q, s, labels, way, shot, **HEAD_OPTIONS[name]),
        (query, support),
        atol=1e-5,
        rtol=1e-3,
    )


@pytest.mark.parametrize("name", sorted(HEADS))
def test_invariant_to_support_order(name):
    way, shot = 4, 3
    query, support, labels = episodes(3, way, shot, 5, 16, seed=6)
    shuffled, shuffled_labels = permute_support(support, labels, seed=7)
    assert not torch.equal(shuffled_labels, labels)
    head = get_head(name)
    torch.testing.assert_close(
        head(query, shuffled, shuffled_labels, way, shot),
        head(query, support, labels, way, shot),
        rtol=1e-7,
        atol=1e-9,
    )


@pytest.mark.parametrize("name", sorted(HEADS))
def test_batch_equals_one_episode_at_a_time(name):
    way, shot = 5, 1
    query, support, labels = episodes(4, way, shot, 6, 10, seed=8)
    head = get_head(name)
    together = head(query, support, labels, way, shot)
    alone = torch.cat(
        [head(query[b : b + 1], support[b : b + 1], labels[b : b + 1], way, shot) for b in range(4)]
    )
    torch.testing.assert_close(together, alone, rtol=1e-7, atol=1e-9)


def test_svm_float32_default_iterations_close_to_optimum():
    way, shot = 5, 5
    query, support, labels = episodes(2, way, shot, 15, 64, seed=9)
    support, query = support.relu() / 8, query.relu() / 8
    exact = svm(query, support, labels, way, shot, max_iter=CONVERGED_ITERS)
    logits32 = svm(query.float(), support.float(), labels, way, shot)
    torch.testing.assert_close(logits32.double(), exact, rtol=1e-3, atol=1e-4)


def test_unknown_head_name_lists_choices():
    with pytest.raises(FewshotError, match="protonet, ridge, svm"):
        get_head("matching")


@pytest.mark.parametrize("name", sorted(HEADS))
def test_inconsistent_episode_is_rejected(name):
    query, support, labels = episodes(2, 3, 2, 4, 5, seed=10)
    head = get_head(name)
    with pytest.raises(FewshotError, match="way=3 x shot=3"):
        head(query, support, labels, 3, 3)
    unbalanced = labels.clone()
    unbalanced[0, labels[0] == 1] = 0
    with pytest.raises(FewshotError, match="exactly 2 times"):
        head(query, support, unbalanced, 3, 2)
    with pytest.raises(FewshotError, match="query"):
        head(query[:, :, :4], support, labels, 3, 2)


def test_the_head_check_costs_the_same_whatever_the_way():
    """The settings' head check runs on an episode of at most 2 classes, 1 shot: a billion-way
    check returns at once (it allocated way x shot squared floats), and SVM still refuses
    one class."""
    check_head("ridge", 10**9, 10**9, {"lam": 1.0})
    with pytest.raises(FewshotError, match="the SVM head needs way >= 2 classes, got way=1"):
        check_head("svm", 1, 5, {})
    with pytest.raises(FewshotError, match="the SVM head needs C > 0"):
        check_head("svm", 10**9, 1, {"C": 0.0})


def test_mismatched_head_inputs_name_the_dimension_in_words():
    support, labels = torch.zeros(2, 5, 8), torch.arange(5).repeat(2, 1)
    with pytest.raises(FewshotError, match=r"query expects 8 features, got 7 \(shape \(2, 3, 7\)"):
        protonet(torch.zeros(2, 3, 7), support, labels, 5, 1)
    with pytest.raises(FewshotError, match=r"query expects 2 episodes, got 3 \(shape \(3, 3, 8\)"):
        protonet(torch.zeros(3, 3, 8), support, labels, 5, 1)
    with pytest.raises(FewshotError, match="support_labels expects 5 support samples, got 4"):
        protonet(torch.zeros(2, 3, 8), support, labels[:, :4], 5, 1)
    with pytest.raises(FewshotError, match=r"support expects 3 dimensions \[episodes, samples"):
        protonet(torch.zeros(3, 8), support[0], labels, 5, 1)
