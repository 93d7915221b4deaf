"""MetaOptNet-SVM head: the Crammer-Singer multi-class SVM dual, a differentiable QP.

Dual, for support x_i with labels y_i and coefficients alpha_i in R^way:

    min_alpha  1/2 sum_ij (x_i.x_j + dual_ridge [i=j]) alpha_i.alpha_j - sum_i alpha_i[y_i]
    s.t.       alpha_i <= C onehot(y_i),   sum_m alpha_i[m] = 0,

and class m scores a query q as sum_i (q.x_i) alpha_i[m]. dual_ridge = 1 is MetaOptNet's
stabiliser; it equals the plain SVM on support features extended by sqrt(dual_ridge) e_i.

Two solvers: "interior-point" (the default, `fewshot.heads.crammer_singer`: exploits the
problem's structure, solves to a tolerance, implicit gradient) and "qpth", MetaOptNet's solver,
for comparison with its truncated interior point (15 iterations in training, 3 in testing):
an optional extra (`pip install fewshot[qpth]`), whose metadata pins numpy < 2.

For qpth the equality constraint is eliminated by writing alpha_i = basis beta_i, with basis a
fixed way x (way-1) basis of the zero-sum vectors. Newton steps are affine invariant, so qpth's
iterates are the same as for MetaOptNet's form (also when truncated at max_iter), but each step
factors fewer and smaller matrices.
"""

from __future__ import annotations

import torch

from fewshot.heads.crammer_singer import check_problem, solve_crammer_singer
from fewshot.heads.episode_inputs import check_query, support_one_hot
from fewshot.runtime.errors import FewshotError

SOLVERS = ("interior-point", "qpth")
# Iteration caps when max_iter is not given: the native solver stops at its tolerance long
# before (8-20 iterations); qpth runs MetaOptNet's 15.
DEFAULT_MAX_ITER = {"interior-point": 50, "qpth": 15}


class _Gram(torch.autograd.Function):
    """x x^T [B, n, n], whose backward is one matrix product, (g + g^T) x, where autograd's
    would be two (one per operand) and their sum."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x @ x.transpose(1, 2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return (grad + grad.transpose(1, 2)) @ x


def _qpth_dual(
    kernel: torch.Tensor, one_hot: torch.Tensor, C: float, max_iter: int, tol: float | None
) -> torch.Tensor:
    """alpha [B, ns, way] after max_iter of qpth's interior-point steps (its eps = tol)."""
    try:
        from qpth.qp import QPFunction  # here: qpth loads cvxpy, seconds only it needs
    except ImportError:
        raise FewshotError(
            'the SVM head\'s solver "qpth" needs the qpth extra: pip install "fewshot[qpth]"'
        ) from None
    episodes, samples, way = one_hot.shape
    dtype, device = kernel.dtype, kernel.device
    eye = torch.eye(samples, dtype=dtype, device=device)
    # Columns e_a - e_last span the zero-sum vectors of R^way.
    basis = torch.eye(way, way - 1, dtype=dtype, device=device)
    basis[-1] = -1.0
    # Quadratic term kernel (x) basis^T basis, built as a broadcast Kronecker product.
    basis_gram = basis.T @ basis
    reduced = samples * (way - 1)
    quadratic = (kernel[:, :, None, :, None] * basis_gram[None, None, :, None, :]).reshape(
        episodes, reduced, reduced
    )
    linear = -(one_hot @ basis).reshape(episodes, reduced)
    # alpha <= C onehot(y): the same matrix for every episode, so qpth gets it unbatched.
    inequality = torch.kron(eye, basis)
    bound = C * one_hot.reshape(episodes, samples * way)
    no_equality = kernel.new_empty(0)
    options = {} if tol is None else {"eps": tol}
    solve = QPFunction(verbose=-1, maxIter=max_iter, **options)
    beta = solve(quadratic, linear, inequality, bound, no_equality, no_equality)
    return beta.reshape(episodes, samples, way - 1) @ basis.T


def crammer_singer_dual(
    support: torch.Tensor,
    support_labels: torch.Tensor,
    way: int,
    shot: int | None,
    C: float = 0.1,
    max_iter: int | None = None,
    dual_ridge: float = 1.0,
    tol: float | None = None,
    solver: str = "interior-point",
) -> torch.Tensor:
    """Return the dual coefficients alpha [B, ns, way] of each episode's SVM.

    `tol`: the interior point's relative accuracy (default: by dtype, see
    `fewshot.heads.crammer_singer.default_tol`); `max_iter`: its iteration cap (default 50;
    qpth: MetaOptNet's 15 steps, truncated).
    """
    if solver not in SOLVERS:
        raise FewshotError(
            f"the SVM head's solver must be one of {', '.join(SOLVERS)}, got {solver!r}"
        )
    max_iter = DEFAULT_MAX_ITER[solver] if max_iter is None else max_iter
    check_problem(way, C, max_iter, tol)
    if not dual_ridge >= 0:
        raise FewshotError(f"the SVM head needs dual_ridge >= 0, got {dual_ridge}")
    one_hot = support_one_hot(support, support_labels, way, shot)
    eye = torch.eye(support.shape[1], dtype=support.dtype, device=support.device)
    kernel = _Gram.apply(support) + dual_ridge * eye
    if solver == "qpth":
        return _qpth_dual(kernel, one_hot, C, max_iter, tol)
    return solve_crammer_singer(kernel, one_hot, C, tol, max_iter).alpha


def svm(
    query: torch.Tensor,
    support: torch.Tensor,
    support_labels: torch.Tensor,
    way: int,
    shot: int | None,
    C: float = 0.1,
    max_iter: int | None = None,
    dual_ridge: float = 1.0,
    tol: float | None = None,
    solver: str = "interior-point",
) -> torch.Tensor:
    """Return the Crammer-Singer SVM scores Q S^T alpha [B, nq, way] of each query."""
    check_query(query, support)
    alpha = crammer_singer_dual(
        support, support_labels, way, shot, C, max_iter, dual_ridge, tol, solver
    )
    # Primal weights first (cheaper than Q S^T when way < queries), as rows alpha^T S [way, d]:
    # contiguous in d, their products and gradients run about 1.3x faster than with S^T alpha.
    return query @ (alpha.transpose(1, 2) @ support).transpose(1, 2)
