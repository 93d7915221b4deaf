"""A batched, differentiable solver for the Crammer-Singer SVM dual of the MetaOptNet head.

Per episode, with kernel K [n, n] (positive definite: the support Gram matrix + dual_ridge I),
one-hot labels Y [n, way] and bound U = C Y:

    min_A  1/2 sum_m A[:, m]' K A[:, m] - <Y, A>   s.t.   A <= U,   A 1 = 0.

Why a primal-dual interior point (Mehrotra predictor-corrector) written for this problem:
the quadratic term is K acting on each class column separately, and the inequalities are bounds,
so each Newton system splits into one n x n system per class, (K + diag(W[:, m])) dA_m + dmu =
G_m, coupled only through the n row-sum constraints, whose n x n Schur complement
T = sum_m (K + diag(W[:, m]))^-1 closes it. An iteration costs `way` Cholesky factorisations of
n x n matrices instead of one of the (n way) x (n way) matrix a generic QP solver such as qpth
factors (20-way 5-shot: 20 matrices of 100 x 100 against one of 2000 x 2000), and converges to
high accuracy in 5-20 iterations whatever the conditioning of K. First-order methods with exact
per-sample projections (a scaled simplex) were the alternative: their iteration count grows with
sqrt(cond(K)), and ResNet-12 kernels have condition numbers of 10^4 and more.

Where the time goes (5-way 5-shot, 8 episodes, one CPU thread, benchmarks/bench_svm.py): at these
sizes each operation's fixed cost, not its arithmetic, sets the time, so the code counts them. The
start's barrier weights are the same for every class (one factorisation, not `way`); slack and
multiplier are one tensor, so every step length, update and product is one operation for both;
H^-1 v is a product and a sum (a batched matrix-vector product, one GEMM call per small matrix,
is 2x slower at 5-way and 4x at 20-way); the LAPACK codes are read once, at the end; a step goes
99.5% of the way to the boundary, not 99% (one step fewer at 5-way 5-shot). On a GPU the
convergence flag is read every GPU_CHECK_EVERY steps, not every step: a read stalls the launch
queue. In the head's forward+backward there (thread time, 6.9 ms; 2.8 ms with the solver
replaced by a constant) the solver takes 4.2 ms: 7 steps, each a Newton factorisation (0.18 ms:
the 40 Choleskys 0.06, their inverses 0.09, at LAPACK's cost for 25 x 25), two solves (0.03 ms
each) and ~0.16 ms of element-wise operations, plus the start and the gradient's factorisation.
The steps are set by the stopping rule (products s z held to tol^2): the gap falls from ~0.3 to
~1e-10 by 20-40x a step, each step 0.96-0.99 of the way to the boundary; Gondzio's correctors,
a step fraction of 0.9999, other start weights or floors, and an active-set crossover each left
the count at 7 (the active set is identified only when the bound itself is met).

The gradient comes from the optimality conditions at the solution (implicit differentiation, as
OptNet): the backward pass solves one more Newton system with the final factorisation, so memory
does not grow with the iterations. For K -> A it gives dL/dK = -sym(V A'), where V solves the
Newton system with the incoming gradient on its right-hand side.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fewshot.runtime.errors import FewshotError

SIGMA_POWER = 3  # Mehrotra's centering: sigma = (affine gap / gap)^3
STEP_FRACTION = 0.995  # of the way to the boundary of the positive orthant
# Steps between reads of the convergence flag on a GPU, where a read stalls the launch queue;
# an episode that converged in between stays put, so only the steps counted differ. Two: at
# most one wasted step. On the CPU a read costs nothing and is made every step.
GPU_CHECK_EVERY = 2


@dataclass
class QPSolution:
    """The dual coefficients [B, n, way], the iterations run and which episodes converged."""

    alpha: torch.Tensor
    iterations: int
    converged: torch.Tensor


def default_tol(dtype: torch.dtype) -> float:
    """The relative accuracy at which an episode counts as solved: float64 to about its
    limit; float32 to an alpha error several times below that of MetaOptNet's 15 qpth
    iterations on trained Conv-4 features (1e-4 fell short of it there)."""
    return 1e-10 if dtype == torch.float64 else 1e-5


class _Newton:
    """The Newton system of one interior-point iterate, factorised once and solved for any
    right-hand side: (K + diag(W[m])) dA[m] + dmu = G[m] for every class m, sum_m dA[m] = -r.

    Class-major layout: A, W, G are [B, way, n] (row m is class m's column of the dual); W may
    be [B, 1, n], the same weights for every class: one factorisation serves them all.
    `infos` are the factorisations' LAPACK codes, read once the solve ends (no synchronisation).
    """

    def __init__(self, kernel: torch.Tensor, weights: torch.Tensor, way: int):
        matrices = kernel.unsqueeze(1).expand(-1, weights.shape[1], -1, -1).clone()
        matrices.diagonal(dim1=-2, dim2=-1).add_(weights)
        factor, info = torch.linalg.cholesky_ex(matrices)
        self.inverses = torch.cholesky_inverse(factor)  # [B, way or 1, n, n], symmetric
        self.schur_factor, schur_info = torch.linalg.cholesky_ex(
            self.inverses.expand(-1, way, -1, -1).sum(1)
        )
        self.infos = (info, schur_info)

    def _apply(self, vectors: torch.Tensor) -> torch.Tensor:
        """H_m^-1 v_m [B, way, n], as a product and a sum (see the module's notes)."""
        return (self.inverses * vectors.unsqueeze(-2)).sum(-1)

    def solve(
        self, rhs: torch.Tensor, row_residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """dA [B, way, n] and dmu [B, n] for class right-hand sides rhs and row sums -r."""
        partial = self._apply(rhs)
        total = partial.sum(1) if row_residual is None else partial.sum(1) + row_residual
        dmu = torch.cholesky_solve(total.unsqueeze(-1), self.schur_factor).squeeze(-1)
        return partial - self._apply(dmu.unsqueeze(1)), dmu


def _failed(infos: list[torch.Tensor]) -> bool:
    """Whether any factorisation broke down (one synchronisation)."""
    return bool(torch.cat([info.flatten() for info in infos]).ne(0).any())


def _max_step(reach: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Per episode, the largest t <= 1 keeping values + t steps >= 0, given reach = -1 / values
    (values > 0): 1 / max(1, largest steps / -values) [B]."""
    return (steps * reach).amax((1, 2, 3)).clamp(min=1.0).reciprocal()


def _start(
    kernel: torch.Tensor, targets: torch.Tensor, bound: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """Mehrotra's start: the Newton step of the problem with unit barrier weights (a least-
    squares point; the weights are the same for every class, so one factorisation), its slack
    and dual shifted into the positive orthant and balanced. Returns alpha, the pair (slack,
    dual) [B, 2, way, n], the row multipliers and the factorisation's codes."""
    newton = _Newton(kernel, torch.ones_like(targets[:, :1]), targets.shape[1])
    alpha, mu = newton.solve(targets + bound)
    pair = torch.stack((bound - alpha, alpha - bound), 1)
    floor = 1e-3 * (1 + bound.flatten(1).amax(1))  # never exactly 0
    shift = (-1.5 * pair.flatten(2).amin(2)).clamp(min=0) + floor[:, None]
    pair = pair + shift[..., None, None]
    product = pair.prod(1).flatten(1).sum(1)
    # Each of slack and dual moves by half the product over the other's sum.
    pair = pair + (0.5 * product[:, None] / pair.flatten(2).sum(2).flip(1))[..., None, None]
    return alpha, pair, mu, newton.infos


def _interior_point(
    kernel: torch.Tensor,
    targets: torch.Tensor,
    C: float,
    tol: float,
    max_iter: int,
    check_every: int,
    factor_solution: bool,
) -> tuple[torch.Tensor, _Newton | None, int, torch.Tensor]:
    """Solve the dual (targets class-major [B, way, n]), reading the convergence flag every
    `check_every` steps; return alpha [B, way, n], the Newton factorisation at the solution
    (only if `factor_solution`: the gradient needs it), the steps taken and which episodes
    converged.

    The iterate is alpha, the pair (slack S of alpha <= U, its multiplier Z) [B, 2, way, n],
    both > 0, and the row-sum multipliers mu [B, n]. A step is about ninety operations on small
    tensors: their fixed costs, not the arithmetic, set its time, so each one is counted."""
    way, count = targets.shape[1], targets.shape[1] * targets.shape[2]
    bound = C * targets
    alpha, pair, mu, infos = _start(kernel, targets, bound)
    infos = list(infos)
    steps = 0
    while True:
        slack, dual = pair.unbind(1)
        fitted = alpha @ kernel  # K A (K is symmetric: (K A)' = A' K)
        stationarity = fitted - targets + dual + mu.unsqueeze(1)
        rows, bounds = alpha.sum(1), alpha + slack - bound
        products = slack * dual
        # Relative to 1 + |K A|, the terms of the gradient K A - Y. A bound that is barely
        # active or barely inactive leaves an error in alpha of the order of sqrt(s z): the
        # products are held to tol squared.
        dual_error = torch.maximum(
            stationarity.abs().amax((1, 2)), products.amax((1, 2)) / (tol * (1 + C))
        )
        primal_error = torch.cat((bounds, rows.unsqueeze(1)), 1).abs().amax((1, 2))
        converged = (dual_error <= tol * (1 + fitted.abs().amax((1, 2)))) & (
            primal_error <= tol * (1 + C)
        )
        if steps == max_iter or (steps % check_every == 0 and bool(converged.all())):
            break
        weights = dual / slack
        newton = _Newton(kernel, weights, way)
        infos += newton.infos
        # Newton: (K + W) dA + dmu = G, dS = -bounds - dA, dZ = -(c + Z dS) / S for the
        # complementarity residual c. The predictor's c = S Z makes G and dZ two sums.
        base = torch.addcmul(dual, weights, bounds, value=-1) - stationarity
        dA, _ = newton.solve(base, rows)
        inward = -bounds
        dS = inward - dA
        affine = torch.stack((dS, -torch.addcmul(dual, weights, dS)), 1)
        reach = -1.0 / pair
        t = _max_step(reach, affine).view(-1, 1, 1, 1)
        # Mehrotra's centering: sigma = (affine gap / gap)^3, c = S Z + dS dZ - sigma gap.
        gap = products.sum((1, 2))
        affine_gap = torch.addcmul(pair, t, affine).prod(1).sum((1, 2))
        sigma = (affine_gap / gap.clamp_min(torch.finfo(gap.dtype).tiny)) ** SIGMA_POWER
        extra = (affine.prod(1) - (sigma * gap / count).view(-1, 1, 1)) / slack
        dA, dmu = newton.solve(base + extra, rows)
        dS = inward - dA
        step = torch.stack((dS, -torch.addcmul(dual + extra, weights, dS)), 1)
        # A solved episode stays put.
        t = (STEP_FRACTION * _max_step(reach, step)).masked_fill(converged, 0.0)
        alpha = torch.addcmul(alpha, t.view(-1, 1, 1), dA)
        pair = torch.addcmul(pair, t.view(-1, 1, 1, 1), step)
        mu = torch.addcmul(mu, t.view(-1, 1), dmu)
        steps += 1
    newton = None
    if factor_solution:
        newton = _Newton(kernel, dual / slack, way)
        infos += newton.infos
    if _failed(infos):
        raise FewshotError(
            "the SVM's Newton system is singular (duplicated support features with "
            "dual_ridge 0?); use dual_ridge > 0"
        )
    return alpha, newton, steps, converged


class _CrammerSingerQP(torch.autograd.Function):
    """alpha(K) with the implicit gradient of the KKT conditions at the solution."""

    @staticmethod
    def forward(ctx, kernel, targets, C, tol, max_iter, check_every, info):
        alpha, newton, iterations, converged = _interior_point(
            kernel.detach(),
            targets.transpose(1, 2).contiguous(),
            C,
            tol,
            max_iter,
            check_every,
            ctx.needs_input_grad[0],
        )
        info.update(iterations=iterations, converged=converged)
        ctx.newton = newton
        ctx.save_for_backward(alpha)
        return alpha.transpose(1, 2)

    @staticmethod
    def backward(ctx, grad_alpha):
        (alpha,) = ctx.saved_tensors
        # V solves the Newton system (symmetric) with the incoming gradient: dL/dK = -V A'.
        v, _ = ctx.newton.solve(grad_alpha.transpose(1, 2))
        grad_kernel = -(v.transpose(1, 2) @ alpha)
        grad_kernel = (grad_kernel + grad_kernel.transpose(1, 2)) / 2
        return grad_kernel, None, None, None, None, None, None


def check_problem(
    way: int, C: float, max_iter: int, tol: float | None, check_every: int | None = None
) -> None:
    """One-line errors for a problem no solver can take."""
    if way < 2:
        raise FewshotError(f"the SVM head needs way >= 2 classes, got way={way}")
    if not C > 0:
        raise FewshotError(f"the SVM head needs C > 0, got C={C}")
    if max_iter < 1:
        raise FewshotError(f"the SVM head needs max_iter >= 1, got {max_iter}")
    if tol is not None and not tol > 0:
        raise FewshotError(f"the SVM head needs tol > 0, got {tol}")
    if check_every is not None and check_every < 1:
        raise FewshotError(f"the SVM solver needs check_every >= 1, got {check_every}")


def solve_crammer_singer(
    kernel: torch.Tensor,
    targets: torch.Tensor,
    C: float = 0.1,
    tol: float | None = None,
    max_iter: int = 50,
    check_every: int | None = None,
) -> QPSolution:
    """The Crammer-Singer dual of every episode: kernel [B, n, n], one-hot targets [B, n, way];
    differentiable with respect to the kernel. `tol`: relative residual of the optimality
    conditions (default: `default_tol` of the kernel's dtype); `check_every`: steps between
    reads of the convergence flag (default: 1 on the CPU, GPU_CHECK_EVERY elsewhere; the
    solution is the same, the steps run may not be)."""
    check_problem(targets.shape[-1], C, max_iter, tol, check_every)
    tol = default_tol(kernel.dtype) if tol is None else tol
    if check_every is None:
        check_every = 1 if kernel.device.type == "cpu" else GPU_CHECK_EVERY
    if not bool(torch.isfinite(kernel).all()):
        raise FewshotError("the SVM kernel has non-finite entries (the embeddings diverged?)")
    info: dict = {}
    alpha = _CrammerSingerQP.apply(
        kernel, targets.to(kernel.dtype), C, tol, max_iter, check_every, info
    )
    return QPSolution(alpha, info["iterations"], info["converged"])
