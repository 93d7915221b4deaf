"""MetaOptNet-SVM head: the Crammer-Singer multi-class SVM dual, a QP solved by qpth.

Dual, for support x_i with labels y_i and coefficients alpha_i in R^way:

    min_alpha  1/2 sum_ij (x_i.x_j + dual_ridge [i=j]) alpha_i.alpha_j - sum_i alpha_i[y_i]
    s.t.       alpha_i <= C onehot(y_i),   sum_m alpha_i[m] = 0,

and class m scores a query q as sum_i (q.x_i) alpha_i[m]. dual_ridge = 1 is MetaOptNet's
stabiliser; it equals the plain SVM on support features extended by sqrt(dual_ridge) e_i.

The equality constraint is eliminated by writing alpha_i = basis beta_i, with basis a fixed
way x (way-1) basis of the zero-sum vectors. Newton steps are affine invariant, so qpth's
interior-point iterates are the same as for MetaOptNet's form (also when truncated at
max_iter), but each step factors fewer and smaller matrices.
"""

from __future__ import annotations

import torch

from fewshot.heads.episode_inputs import check_query, support_one_hot
from fewshot.runtime.errors import FewshotError


def crammer_singer_dual(
    support: torch.Tensor,
    support_labels: torch.Tensor,
    way: int,
    shot: int,
    C: float = 0.1,
    max_iter: int = 15,
    dual_ridge: float = 1.0,
) -> torch.Tensor:
    """Return the dual coefficients alpha [B, ns, way] after max_iter interior-point steps."""
    if way < 2:
        raise FewshotError(f"the SVM head needs way >= 2 classes, got way={way}")
    if C <= 0 or max_iter < 1 or dual_ridge < 0:
        raise FewshotError(
            f"SVM needs C > 0, max_iter >= 1, dual_ridge >= 0; got C={C}, max_iter={max_iter}, "
            f"dual_ridge={dual_ridge}"
        )
    one_hot = support_one_hot(support, support_labels, way, shot)
    episodes, samples, _ = support.shape
    dtype, device = support.dtype, support.device
    eye = torch.eye(samples, dtype=dtype, device=device)
    kernel = support @ support.transpose(1, 2) + dual_ridge * eye
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
    no_equality = support.new_empty(0)
    from qpth.qp import QPFunction  # here: qpth loads cvxpy, seconds that only this head needs

    solve = QPFunction(verbose=-1, maxIter=max_iter)
    beta = solve(quadratic, linear, inequality, bound, no_equality, no_equality)
    return beta.reshape(episodes, samples, way - 1) @ basis.T


def svm(
    query: torch.Tensor,
    support: torch.Tensor,
    support_labels: torch.Tensor,
    way: int,
    shot: int,
    C: float = 0.1,
    max_iter: int = 15,
    dual_ridge: float = 1.0,
) -> torch.Tensor:
    """Return the Crammer-Singer SVM scores Q S^T alpha [B, nq, way] of each query."""
    check_query(query, support)
    alpha = crammer_singer_dual(support, support_labels, way, shot, C, max_iter, dual_ridge)
    return query @ support.transpose(1, 2) @ alpha
