"""Regularization-parameter learning on LIBSVM data (paper Section 7.1-7.2, Tables 7-2, 7-3, 7-4).

Model: a linear predictor f(x) = w.x + b, theta = {"w": (d,), "b": ()}. Inner loss on the training
part of a split: data loss + penalty; outer loss: the data loss on the validation part.

    ridge: MSE + lam ||w||^2       lasso: MSE + lam ||w||_1
    logistic: mean log(1 + exp(-y f)) + lam ||w||^2       svm: mean max(0, 1 - y f) + lam ||w||^2

The hyperparameter is log lam (so lam stays positive under Adam): a scalar, or one per weight with
`per_parameter` (the high-dimensional task, penalty sum_i lam_i w_i^2 or sum_i lam_i |w_i|).
Protocol: observed set split into train/validation (validation share gamma), SGD (full-batch
gradient descent) inside, Adam outside, T outer steps, K inner steps; RHG/T-RHG/AID restart the
inner model from zero every outer step (Algorithms 1-3, EHG when U > 1), OEHG runs Algorithm 4.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from fewshot.errors import FewshotError
from fewshot.hpo.ensemble import StepCallback, make_splits, oehg, optimize_offline
from fewshot.hpo.hypergrad import Bilevel, aid_cg, aid_fp, rhg, trhg
from fewshot.hpo.libsvm import TabularData
from fewshot.hpo.trees import Theta

MODELS = ("lasso", "ridge", "logistic", "svm")
METHODS = ("rhg", "trhg", "aid-fp", "aid-cg", "oehg")
Data = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Settings:
    """Everything that defines one run besides the data set."""

    model: str
    method: str
    seed: int = 0
    splits: int | None = None  # U; default 5 for OEHG, 1 (plain estimator) otherwise
    per_parameter: bool = False
    gamma: float = 0.2
    outer_steps: int = 1000
    inner_steps: int = 128  # K for RHG/T-RHG/AID; OEHG uses `oehg_inner_steps`
    oehg_inner_steps: int = 1
    truncate: int = 32  # T-RHG: steps back-propagated
    solver_steps: int = 20  # Z for AID
    outer_lr: float = 0.01
    inner_lr: float | None = None  # default 1 / (smoothness bound of the inner loss)
    init_lam: float = 0.01
    eval_points: int = 50  # test-loss curve resolution
    holdout: str = (
        "default"  # observed set of single-file sets: "head", "random" or per-set default
    )

    def split_count(self) -> int:
        """U, resolving the per-method default."""
        return self.splits if self.splits is not None else (5 if self.method == "oehg" else 1)


@dataclass
class RunResult:
    """What one regularization run measured."""

    dataset: str
    settings: dict
    lam: list[float]
    test_loss: float
    test_accuracy: float | None
    wall_seconds: float
    curve: list[tuple[int, float]] = field(default_factory=list)


def data_loss(model: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The per-model mean data loss of predictions f against targets y."""
    if model in ("ridge", "lasso"):
        return lambda f, y: ((f - y) ** 2).mean()
    if model == "logistic":
        return lambda f, y: F.softplus(-y * f).mean()
    if model == "svm":
        return lambda f, y: F.relu(1.0 - y * f).mean()
    raise FewshotError(f"unknown --model {model!r}; choose from {', '.join(MODELS)}")


def predict(theta: Theta, x: torch.Tensor) -> torch.Tensor:
    """f(x) = X w + b."""
    return x @ theta["w"] + theta["b"]


def make_problem(model: str, inner_lr: float, fixed_lr: bool = False) -> Bilevel:
    """The bilevel problem of one model; lam is log lam, a scalar or one entry per weight.

    `inner_lr` is 1 / L of the data loss. An L2 penalty adds curvature 2 lam, so the step is
    1 / (L + 2 max lam): a fixed 1 / L diverges once lam > L / 2. `fixed_lr` keeps `inner_lr`.
    """
    loss = data_loss(model)
    norm = torch.abs if model == "lasso" else torch.square

    def step_size(log_lam: torch.Tensor) -> torch.Tensor:
        return 1.0 / (1.0 / inner_lr + 2.0 * torch.exp(log_lam).max())

    def inner(theta: Theta, log_lam: torch.Tensor, data: Data) -> torch.Tensor:
        x, y = data
        return loss(predict(theta, x), y) + (torch.exp(log_lam) * norm(theta["w"])).sum()

    def outer(theta: Theta, log_lam: torch.Tensor, data: Data) -> torch.Tensor:
        x, y = data
        return loss(predict(theta, x), y)

    return Bilevel(inner, outer, inner_lr if fixed_lr or model == "lasso" else step_size)


def default_inner_lr(model: str, x: np.ndarray) -> float:
    """1 / L for the data loss: L = c sigma_max([X 1])^2 / n, c = 2 (squared), 1/4 (logistic), 1."""
    design = np.hstack([x, np.ones((len(x), 1))])
    top = float(np.linalg.norm(design, 2)) ** 2 / len(x)
    scale = {"ridge": 2.0, "lasso": 2.0, "logistic": 0.25, "svm": 1.0}[model]
    return 1.0 / (scale * top)


def evaluate(model: str, theta: Theta, data: Data) -> tuple[float, float | None]:
    """(test loss, test accuracy in % or None for regression)."""
    with torch.no_grad():
        f = predict(theta, data[0])
        loss = float(data_loss(model)(f, data[1]))
        if model in ("ridge", "lasso"):
            return loss, None
        return loss, 100.0 * float((torch.where(f >= 0, 1.0, -1.0) == data[1]).double().mean())


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))


def run(
    data: TabularData, settings: Settings, progress: Callable[[int], None] | None = None
) -> RunResult:
    """One HPO run: learn lam on the observed set, report the deployed model on the test set."""
    if settings.method not in METHODS:
        raise FewshotError(
            f"unknown --method {settings.method!r}; choose from {', '.join(METHODS)}"
        )
    regression = data.task == "regression"
    if regression != (settings.model in ("ridge", "lasso")):
        kind = "regression (lasso, ridge)" if regression else "classification (logistic, svm)"
        raise FewshotError(
            f"--dataset {data.name} is a {kind} set; --model {settings.model} does not fit"
        )
    splits = make_splits(
        len(data.y_observed), settings.gamma, settings.split_count(), settings.seed
    )
    x, y = _tensor(data.x_observed), _tensor(data.y_observed)
    split_data = [((x[s.train], y[s.train]), (x[s.val], y[s.val])) for s in splits]
    test = (_tensor(data.x_test), _tensor(data.y_test))
    lr = settings.inner_lr or default_inner_lr(settings.model, data.x_observed)
    problem = make_problem(settings.model, lr, fixed_lr=settings.inner_lr is not None)
    dim = x.shape[1]
    theta0 = {"w": torch.zeros(dim, dtype=torch.float64), "b": torch.zeros((), dtype=torch.float64)}
    lam0 = torch.full(
        (dim,) if settings.per_parameter else (), math.log(settings.init_lam), dtype=torch.float64
    )

    every = max(1, settings.outer_steps // settings.eval_points)
    curve: list[tuple[int, float]] = []

    def on_step(t: int, lam: torch.Tensor, theta: Theta) -> None:
        if (t + 1) % every == 0:
            curve.append((t + 1, evaluate(settings.model, theta, test)[0]))
        if progress is not None:
            progress(t)

    start = time.perf_counter()
    result = _optimize(problem, theta0, lam0, split_data, settings, on_step)
    loss, accuracy = evaluate(settings.model, result.theta, test)
    lam = torch.exp(result.lam).reshape(-1).tolist()
    return RunResult(
        data.name, asdict(settings), lam, loss, accuracy, time.perf_counter() - start, curve
    )


def _optimize(problem, theta0, lam0, split_data, settings: Settings, on_step: StepCallback):
    """Dispatch to OEHG or to the offline loop with the chosen estimator."""
    if settings.method == "oehg":
        return oehg(
            problem,
            theta0,
            lam0,
            split_data,
            split_data[0][0],
            settings.outer_steps,
            settings.outer_lr,
            settings.oehg_inner_steps,
            on_step,
        )
    k = settings.inner_steps
    estimators = {
        "rhg": partial(rhg, steps=k),
        "trhg": partial(trhg, steps=k, truncate=min(settings.truncate, k)),
        "aid-fp": partial(aid_fp, steps=k, solver_steps=settings.solver_steps),
        "aid-cg": partial(aid_cg, steps=k, solver_steps=settings.solver_steps),
    }
    return optimize_offline(
        estimators[settings.method],
        problem,
        theta0,
        lam0,
        split_data,
        settings.outer_steps,
        settings.outer_lr,
        k,
        on_step,
    )
