"""The SVM head's native solver against independent references: cvxpy's solution of the same
dual QP, the optimality conditions checked from scratch, central finite differences, qpth's
converged gradient, and real Omniglot Conv-4 features."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
import torch

from fewshot.datasets import REPO_DATA, load_split
from fewshot.datasets.batches import images_to_device
from fewshot.heads import svm
from fewshot.heads.crammer_singer import solve_crammer_singer
from fewshot.heads.svm import _Gram, crammer_singer_dual
from fewshot.runtime.errors import FewshotError
from fewshot.training.checkpoint import load_trained

ZOO = REPO_DATA.parent / "models" / "omniglot" / "protonet_conv4_trainval.pt"


def problem(support: torch.Tensor, labels: torch.Tensor, way: int, dual_ridge: float = 1.0):
    """The kernel [B, n, n] and one-hot targets [B, n, way] of support [B, n, d]."""
    eye = torch.eye(support.shape[1], dtype=support.dtype)
    kernel = support @ support.transpose(1, 2) + dual_ridge * eye
    return kernel, torch.nn.functional.one_hot(labels, way).to(support.dtype)


def cvxpy_dual(kernel: np.ndarray, targets: np.ndarray, C: float) -> np.ndarray:
    """The same dual QP solved by cvxpy (Clarabel at tight tolerances)."""
    alpha = cp.Variable(targets.shape)
    factor = np.linalg.cholesky(kernel)
    objective = 0.5 * cp.sum_squares(factor.T @ alpha) - cp.sum(cp.multiply(targets, alpha))
    constraints = [alpha <= C * targets, cp.sum(alpha, axis=1) == 0]
    tight = {"tol_gap_abs": 1e-13, "tol_gap_rel": 1e-13, "tol_feas": 1e-13, "max_iter": 500}
    cp.Problem(cp.Minimize(objective), constraints).solve(solver=cp.CLARABEL, **tight)
    return alpha.value


def kkt_residual(kernel: torch.Tensor, targets: torch.Tensor, alpha: torch.Tensor, C: float):
    """The largest violation of the optimality conditions, from alpha alone: feasibility, and
    complementarity with the multipliers stationarity implies (row multiplier -max_m g_im,
    bound multipliers z = max_m g_im - g >= 0, where g = K alpha - Y)."""
    grad = kernel @ alpha - targets
    z = grad.amax(-1, keepdim=True) - grad
    slack = C * targets - alpha
    return max(
        (-slack).clamp(min=0).max().item(),
        alpha.sum(-1).abs().max().item(),
        (z * slack).abs().max().item(),
    )


def random_episodes(way: int, shot: int, dim: int, seed: int, batch: int = 2) -> tuple:
    """Support [B, way*shot, d] with margins of order one, and shuffled labels."""
    gen = torch.Generator().manual_seed(seed)
    support = torch.randn(batch, way * shot, dim, generator=gen, dtype=torch.float64) / 2
    labels = torch.stack([torch.randperm(way * shot, generator=gen) % way for _ in range(batch)])
    return support, labels


@pytest.fixture(scope="module")
def omniglot_features() -> tuple[torch.Tensor, torch.Tensor]:
    """Conv-4 features [N, 64] (the zoo's trained ProtoNet) of real Omniglot test images of 40
    classes, and their labels."""
    split = load_split("omniglot", "test", REPO_DATA)
    model, _ = load_trained(str(ZOO), torch.device("cpu"))
    index = torch.nonzero(split.labels < 40).squeeze(1)
    with torch.no_grad():
        features = model.embed(images_to_device(split, index, torch.device("cpu")))
    return features.double(), split.labels[index]


def real_episodes(features, labels, way: int, shot: int, seed: int, batch: int = 2) -> tuple:
    """Support [B, way*shot, 64] of real images of `way` classes, `shot` each."""
    gen = torch.Generator().manual_seed(seed)
    episodes = []
    for _ in range(batch):
        classes = torch.randperm(40, generator=gen)[:way]
        picks = [torch.nonzero(labels == c).squeeze(1)[:shot] for c in classes]
        episodes.append(features[torch.cat(picks)])
    return torch.stack(episodes), torch.arange(way).repeat_interleave(shot).expand(batch, -1)


SHAPES = [(5, 1), (5, 5), (20, 1), (20, 5)]


@pytest.mark.parametrize("C", [0.01, 0.1, 1.0, 10.0])
@pytest.mark.parametrize(("way", "shot"), SHAPES)
@pytest.mark.parametrize("data", ["random", "omniglot"])
def test_the_solution_equals_cvxpys_and_satisfies_the_optimality_conditions(
    data, way, shot, C, request
):
    if data == "random":
        support, labels = random_episodes(way, shot, 16, seed=way + shot, batch=1)
    else:
        features = request.getfixturevalue("omniglot_features")
        support, labels = real_episodes(*features, way, shot, seed=1, batch=1)
    kernel, targets = problem(support, labels, way)
    solution = solve_crammer_singer(kernel, targets, C)
    assert bool(solution.converged.all()) and solution.iterations <= 30
    assert kkt_residual(kernel, targets, solution.alpha, C) < 1e-8
    for b in range(len(kernel)):
        expected = cvxpy_dual(kernel[b].numpy(), targets[b].numpy(), C)
        np.testing.assert_allclose(solution.alpha[b].numpy(), expected, atol=1e-6)


@pytest.mark.parametrize(
    "case", ["duplicated points", "duplicated points, other labels", "all-zero features"]
)
def test_degenerate_episodes_are_solved_exactly(case):
    way, shot, C = 5, 2, 0.1
    support, _ = random_episodes(way, shot, 8, seed=4)
    labels = torch.arange(way).repeat_interleave(shot).expand(2, -1)  # samples 0, 1: class 0
    if case == "duplicated points":
        support[:, 1] = support[:, 0]  # two copies of one image in class 0
    elif case == "duplicated points, other labels":
        support[:, shot] = support[:, 0]  # one image in classes 0 and 1
    else:
        support = torch.zeros_like(support)
    kernel, targets = problem(support, labels, way)
    solution = solve_crammer_singer(kernel, targets, C)
    assert kkt_residual(kernel, targets, solution.alpha, C) < 1e-8
    for b in range(2):
        expected = cvxpy_dual(kernel[b].numpy(), targets[b].numpy(), C)
        np.testing.assert_allclose(solution.alpha[b].numpy(), expected, atol=1e-6)


@pytest.mark.parametrize(("way", "shot", "C"), [(5, 2, 0.1), (4, 3, 1.0), (20, 1, 0.01)])
def test_the_gradient_equals_central_finite_differences(way, shot, C):
    support, labels = random_episodes(way, shot, 4, seed=11, batch=1)  # episodes independent
    gen = torch.Generator().manual_seed(12)
    query = torch.randn(1, 7, 4, dtype=torch.float64, generator=gen)
    weights = torch.randn(1, 7, way, dtype=torch.float64, generator=gen)

    def loss(query: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
        return (svm(query, support, labels, way, shot, C=C, tol=1e-12) * weights).sum()

    query.requires_grad_()
    support.requires_grad_()
    gradients = torch.autograd.grad(loss(query, support), (query, support))
    step = 1e-6
    for x, gradient in zip((query, support), gradients, strict=True):
        numeric = torch.zeros_like(x)
        with torch.no_grad():
            for i in range(x.numel()):
                delta = torch.zeros_like(x).view(-1)
                delta[i] = step
                args = [query, support]
                args[x is support] = x + delta.view_as(x)
                plus = loss(*args)
                args[x is support] = x - delta.view_as(x)
                numeric.view(-1)[i] = (plus - loss(*args)) / (2 * step)
        scale = numeric.abs().max()
        assert (gradient - numeric).abs().max() <= 1e-5 * scale


def test_the_gradient_equals_qpths_converged_gradient():
    pytest.importorskip("qpth")
    way, shot = 5, 3
    support, labels = random_episodes(way, shot, 10, seed=21)
    support = support.requires_grad_()
    weights = torch.randn(2, way * shot, way, dtype=torch.float64)
    gradients = []
    for options in ({}, {"solver": "qpth", "max_iter": 60, "tol": 1e-14}):
        alpha = crammer_singer_dual(support, labels, way, shot, **options)
        gradients.append(torch.autograd.grad((alpha * weights).sum(), support)[0])
    native, qpth = gradients
    assert (native - qpth).abs().max() <= 1e-5 * qpth.abs().max()


@pytest.mark.parametrize(("way", "shot"), [(5, 5), (20, 1), (20, 5)])
def test_float32_is_at_least_as_accurate_as_qpth_at_metaoptnets_settings(
    way, shot, omniglot_features
):
    """The head's float32 solve at its default tolerance against MetaOptNet's 15 qpth
    iterations, both measured from the float64 solution, on real features."""
    pytest.importorskip("qpth")
    support, labels = real_episodes(*omniglot_features, way, shot, seed=3)
    kernel, targets = problem(support, labels, way)
    exact = solve_crammer_singer(kernel, targets).alpha
    single = solve_crammer_singer(kernel.float(), targets.float())
    assert bool(single.converged.all())
    qpth = crammer_singer_dual(support.float(), labels, way, shot, solver="qpth")
    error = (single.alpha.double() - exact).abs().max()
    assert error <= (qpth.double() - exact).abs().max() and error < 1e-5


def test_the_iterations_used_are_reported_and_capped():
    support, labels = random_episodes(5, 5, 16, seed=5)
    kernel, targets = problem(support, labels, 5)
    full = solve_crammer_singer(kernel, targets)
    assert 5 <= full.iterations < 50 and bool(full.converged.all())
    loose = solve_crammer_singer(kernel, targets, tol=1e-3)
    assert loose.iterations < full.iterations
    capped = solve_crammer_singer(kernel, targets, max_iter=2)
    assert capped.iterations == 2 and not bool(capped.converged.any())


@pytest.mark.parametrize("check_every", [2, 3, 4])
def test_reading_the_convergence_flag_every_few_steps_gives_the_same_solution(check_every):
    """The GPU's schedule, run on the CPU: an episode that converged between two reads stays
    put, so the solution and its gradient are those of a read every step; only the steps run
    differ (rounded up to the schedule)."""
    support, labels = random_episodes(5, 5, 16, seed=7, batch=3)
    kernel, targets = problem(support, labels, 5)
    weights = torch.randn(3, 25, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    solutions, gradients = [], []
    for every in (1, check_every):
        leaf = kernel.clone().requires_grad_()
        solution = solve_crammer_singer(leaf, targets, check_every=every)
        solutions.append(solution)
        gradients.append(torch.autograd.grad((solution.alpha * weights).sum(), leaf)[0])
    each, scheduled = solutions
    assert bool(scheduled.converged.all())
    assert scheduled.iterations == -(-each.iterations // check_every) * check_every
    assert torch.equal(scheduled.alpha, each.alpha)
    assert torch.equal(gradients[1], gradients[0])


def test_the_gram_matrix_gradient_equals_autograds():
    """The head's kernel x x' with its one-product backward, against autograd's, for an
    upstream gradient that is not symmetric."""
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(2, 6, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    upstream = torch.randn(2, 6, 6, dtype=torch.float64, generator=gen)
    (ours,) = torch.autograd.grad((_Gram.apply(x) * upstream).sum(), x)
    (plain,) = torch.autograd.grad(((x @ x.transpose(1, 2)) * upstream).sum(), x)
    torch.testing.assert_close(ours, plain, rtol=1e-12, atol=1e-12)
    assert torch.equal(_Gram.apply(x), x @ x.transpose(1, 2))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"C": 0.0}, "C > 0"),
        ({"max_iter": 0}, "max_iter >= 1"),
        ({"tol": -1.0}, "tol > 0"),
        ({"check_every": 0}, "check_every >= 1"),
        ({"way": 1}, "way >= 2"),
        ({"nan": True}, "non-finite"),
    ],
)
def test_what_the_solver_cannot_take_is_one_line(change, message):
    way = change.get("way", 3)
    support, labels = random_episodes(way, 2, 4, seed=6)
    kernel, targets = problem(support, labels, way)
    if change.get("nan"):
        kernel[0, 0, 0] = float("nan")
    options = {k: v for k, v in change.items() if k in ("C", "max_iter", "tol", "check_every")}
    with pytest.raises(FewshotError, match=message) as error:
        solve_crammer_singer(kernel, targets, **options)
    assert "\n" not in str(error.value)
