"""Regularization-parameter learning on LIBSVM data (paper Section 7.1-7.2, Tables 7-2, 7-3, 7-4).

Model: a linear predictor f(x) = w.x + b, theta = {"w": (d,), "b": ()}. Inner loss on the training
part of a split: data loss + penalty; outer loss: the data loss on the validation part.

    ridge: MSE + lam ||w||^2       lasso: MSE + lam ||w||_1
    logistic: mean log(1 + exp(-y f)) + lam ||w||^2       svm: mean max(0, 1 - y f) + lam ||w||^2

The hyperparameter is log lam (so lam stays positive under Adam): a scalar, or one per weight with
`per_parameter` (the high-dimensional task, penalty sum_i lam_i w_i^2 or sum_i lam_i |w_i|).
Protocol: observed set split into train/validation (validation share gamma), full-batch gradient
descent inside, Adam outside, T outer steps, K inner steps; RHG/T-RHG/AID restart the inner
model from zero every outer step (Algorithms 1-3, EHG when U > 1), OEHG runs Algorithm 4.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from fewshot.datasets.libsvm import DATASETS, TabularData, load_dataset
from fewshot.errors import FewshotError
from fewshot.hpo.hypergrad import Bilevel
from fewshot.hpo.optimize import METHODS, Budget, check_method_settings, optimize, split_count
from fewshot.hpo.splits import make_splits
from fewshot.hpo.trees import Theta
from fewshot.settings import SettingError, check_fields, seed_setting, setting

MODELS = ("lasso", "ridge", "logistic", "svm")
REGRESSION_MODELS = ("lasso", "ridge")
HOLDOUTS = {"default": None, "head": False, "random": True}  # -> load_dataset's shuffle
Data = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class Settings:
    """`fewshot hpo regularization`: everything that defines one run."""

    dataset: str = setting(help="LIBSVM set", choices=sorted(DATASETS))
    model: str = setting(help="linear model", choices=MODELS)
    method: str = setting(help="hypergradient method", choices=METHODS)
    splits: int | None = setting(None, help="U (default 5 for oehg, else 1)", low=1)
    per_parameter: bool = setting(False, help="one lambda per weight")
    seed: int = seed_setting(0, help="seed of the splits (and of a random holdout)")
    out: str = setting(help="folder for the JSON result and the loss plot")
    data_root: str | None = setting(None, help="folder holding libsvm/ (default: data/)")
    gamma: float = setting(0.2, help="validation share", above=0, below=1)
    outer_steps: int = setting(1000, help="T", low=1)
    inner_steps: int = setting(128, help="K (not oehg)", low=1)
    oehg_inner_steps: int = setting(1, help="inner steps per outer step of oehg", low=1)
    truncate: int = setting(32, help="T-RHG window (trhg)", low=1)
    solver_steps: int = setting(20, help="Z for AID (aid-fp, aid-cg)", low=1)
    outer_lr: float = setting(0.01, help="Adam on log lambda", above=0)
    inner_lr: float | None = setting(
        None,
        help="fixed inner step (default: 1/(L + 2 max lambda), L of the data loss; lasso 1/L)",
        above=0,
    )
    init_lam: float = setting(0.01, help="initial lambda", above=0)
    holdout: str = setting(
        "default",
        help="sets without a test file: observed set = file head or seeded random subset",
        choices=tuple(HOLDOUTS),
    )
    eval_points: int = setting(50, help="test-loss curve resolution", low=1, flag=False)

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.out.strip():
            raise SettingError("out", "must name a folder")
        check_method_settings(self.method, self.splits, self.inner_steps, self.truncate)
        regression = DATASETS[self.dataset].task == "regression"
        if regression != (self.model in REGRESSION_MODELS):
            kind = "regression (lasso, ridge)" if regression else "classification (logistic, svm)"
            raise SettingError("model", f"{self.model} does not fit {self.dataset}, a {kind} set")
        if self.model == "svm" and self.method == "aid-cg":
            raise SettingError(
                "method",
                "aid-cg cannot learn the svm's lambda: the hinge loss has no curvature, so its "
                "Hessian system is singular (use rhg, trhg, aid-fp or oehg)",
            )

    def split_count(self) -> int:
        """U, resolving the per-method default."""
        return split_count(self.method, self.splits)

    def budget(self) -> Budget:
        """The step counts of the run."""
        return Budget(
            self.outer_steps,
            self.inner_steps,
            self.truncate,
            self.solver_steps,
            self.oehg_inner_steps,
        )


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


def load_task_data(settings: Settings) -> TabularData:
    """The observed and test sets the settings name (holdout and seed applied)."""
    shuffle = HOLDOUTS[settings.holdout]
    return load_dataset(settings.dataset, settings.seed, settings.data_root, shuffle)


def data_loss(model: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The per-model mean data loss of predictions f against targets y."""
    if model in REGRESSION_MODELS:
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


def linear_scores(model: str, theta: Theta, data: Data) -> tuple[float, float | None]:
    """(test loss, test accuracy in % or None for regression) of a linear model."""
    with torch.no_grad():
        f = predict(theta, data[0])
        loss = float(data_loss(model)(f, data[1]))
        if model in REGRESSION_MODELS:
            return loss, None
        return loss, 100.0 * float((torch.where(f >= 0, 1.0, -1.0) == data[1]).double().mean())


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))


def run(
    data: TabularData, settings: Settings, progress: Callable[[int], None] | None = None
) -> RunResult:
    """One HPO run: learn lam on the observed set, report the deployed model on the test set."""
    if data.name != settings.dataset:
        raise FewshotError(f"the data is {data.name}, but the settings name {settings.dataset}")
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
            curve.append((t + 1, linear_scores(settings.model, theta, test)[0]))
        if progress is not None:
            progress(t)

    start = time.perf_counter()
    result = optimize(
        settings.method,
        problem,
        theta0,
        lam0,
        split_data,
        settings.budget(),
        outer_lr=settings.outer_lr,
        seed=settings.seed,
        on_step=on_step,
    )
    loss, accuracy = linear_scores(settings.model, result.theta, test)
    lam = torch.exp(result.lam).reshape(-1).tolist()
    return RunResult(
        data.name, asdict(settings), lam, loss, accuracy, time.perf_counter() - start, curve
    )
