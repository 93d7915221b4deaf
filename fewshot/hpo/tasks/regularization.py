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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from fewshot.datasets.libsvm import DATASETS, TabularData, load_dataset
from fewshot.hpo.ensemble import StepCallback
from fewshot.hpo.hypergrad import Bilevel
from fewshot.hpo.optimize import Budget, optimize
from fewshot.hpo.splits import make_splits, validation_size
from fewshot.hpo.tasks.base import (
    OFFLINE_METHODS,
    HpoSettings,
    Task,
    run_stem,
)
from fewshot.hpo.trees import Theta
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_save_figure, atomic_write_json
from fewshot.runtime.memory import MemoryTerm, check_memory
from fewshot.runtime.settings import SettingError, setting

MODELS = ("lasso", "ridge", "logistic", "svm")
REGRESSION_MODELS = ("lasso", "ridge")
HOLDOUTS = {"default": None, "head": False, "random": True}  # -> load_dataset's shuffle
Data = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class Settings(HpoSettings):
    """`fewshot hpo regularization`: everything that defines one run."""

    # Fields a method does not read, besides HpoSettings' (METHOD_UNUSED); `unused` adds
    # --holdout for the sets with a test file.
    TASK_UNUSED: ClassVar[dict[str, frozenset[str]]] = {
        m: frozenset({"oehg_inner_steps"}) for m in OFFLINE_METHODS
    }

    dataset: str = setting(help="LIBSVM set", choices=sorted(DATASETS))
    model: str = setting(help="linear model", choices=MODELS)
    per_parameter: bool = setting(False, help="one lambda per weight")
    gamma: float = setting(0.2, help="validation share", above=0, below=1)
    outer_steps: int = setting(1000, help="T", low=1)
    oehg_inner_steps: int = setting(1, help="inner steps per outer step (oehg)", low=1)
    truncate: int = setting(32, help="T-RHG window (trhg)", low=1)
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
        super().__post_init__()
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

    def unused(self) -> dict[str, frozenset[str]]:
        """The method's unused fields, and --holdout where the set has a test file."""
        owners = super().unused()
        if DATASETS[self.dataset].test_file is not None:
            owners[f"--dataset {self.dataset}"] = frozenset({"holdout"})
        return owners

    def kept_steps(self) -> tuple[int, str | None]:
        """As HpoSettings', with OEHG's steps per outer step set by --oehg-inner-steps."""
        if self.method == "oehg":
            return self.oehg_inner_steps, "--oehg-inner-steps"
        return super().kept_steps()

    def outer_step_count(self) -> int:
        """T."""
        return self.outer_steps

    def budget(self) -> Budget:
        """The step counts of the run, OEHG's inner steps per outer step included."""
        return replace(super().budget(), oehg_inner_steps=self.oehg_inner_steps)

    def check_observed(self, n: int) -> None:
        """SettingError unless `n` observed examples leave both parts of a split non-empty and
        have U distinct splits."""
        n_val = validation_size(n, self.gamma)
        if not 1 <= n_val <= n - 1:
            raise SettingError(
                "gamma", f"{self.gamma} leaves an empty train or validation set of {n} examples"
            )
        distinct, count = math.comb(n, n_val), self.resplit_count()
        if count > distinct:
            raise SettingError(
                "resplits",
                f"must be <= {distinct}, got {count}: {n} examples with {n_val} for validation "
                f"allow only {distinct} distinct splits",
            )


@dataclass
class RegularizationResult:
    """What one regularization run measured."""

    dataset: str
    settings: dict
    lam: list[float]
    test_loss: float
    test_accuracy: float | None
    wall_seconds: float
    curve: list[tuple[int, float]] = field(default_factory=list)


def memory_terms(s: Settings, rows: int, features: int) -> list[MemoryTerm]:
    """Lower bounds on what a run on `rows` x `features` observed data keeps at its peak
    (float64): the U splits' copies of it, and the inner steps one hypergradient
    back-propagates through, each keeping at least 3 vectors as long as the training part and
    4 as long as the weights (measured on the four models: 4.2 to 6.5, and 5.8 to 11)."""
    count = s.resplit_count()
    train_rows = rows - validation_size(rows, s.gamma)
    step = 8 * (3 * train_rows + 4 * (features + 1))
    return [
        MemoryTerm(8 * count * rows * features, f"the data's copies for U = {count}", "--resplits"),
        s.kept_steps_memory(step, "--resplits"),
    ]


def load(settings: Settings) -> TabularData:
    """The observed and test sets the settings name (holdout and seed applied), refused before
    any step if the run cannot fit in memory (the shapes are known once the file is read)."""
    shuffle = HOLDOUTS[settings.holdout]
    data = load_dataset(settings.dataset, settings.seed, settings.data_root, shuffle)
    check_memory(memory_terms(settings, *data.x_observed.shape), torch.device("cpu"))
    return data


def data_loss(model: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The per-model mean data loss of predictions f against targets y."""
    if model in REGRESSION_MODELS:
        return lambda f, y: ((f - y) ** 2).mean()
    if model == "logistic":
        return lambda f, y: F.softplus(-y * f).mean()
    if model == "svm":
        return lambda f, y: F.relu(1.0 - y * f).mean()
    raise ValueError(f"unknown model {model!r}; choose from {', '.join(MODELS)}")


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
    settings: Settings, data: TabularData, on_step: StepCallback | None = None
) -> RegularizationResult:
    """One HPO run: learn lam on the observed set, report the deployed model on the test set."""
    if data.name != settings.dataset:
        raise FewshotError(f"the data is {data.name}, but the settings name {settings.dataset}")
    settings.check_observed(len(data.y_observed))
    splits = make_splits(
        len(data.y_observed), settings.gamma, settings.resplit_count(), settings.seed
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

    def record(t: int, lam: torch.Tensor, theta: Theta) -> None:
        if (t + 1) % every == 0:
            curve.append((t + 1, linear_scores(settings.model, theta, test)[0]))
        if on_step is not None:
            on_step(t, lam, theta)

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
        on_step=record,
    )
    loss, accuracy = linear_scores(settings.model, result.theta, test)
    lam = torch.exp(result.lam).reshape(-1).tolist()
    return RegularizationResult(
        data.name, asdict(settings), lam, loss, accuracy, time.perf_counter() - start, curve
    )


def result_stem(dataset: str, model: str, method: str, seed: int, per_parameter: bool) -> str:
    """The result file name without suffix: DATASET_MODEL_METHOD[_pp]_seedS."""
    return run_stem("", dataset, model, method + ("_pp" if per_parameter else ""), seed)


def plot_curve(curve: list[tuple[int, float]], path: Path, title: str) -> None:
    """Test loss against outer step, saved as an image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([s for s, _ in curve], [v for _, v in curve])
    ax.set(xlabel="outer step", ylabel="test loss", title=title)
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=100)
    plt.close(fig)


def outputs(s: Settings) -> list[Path]:
    """OUT/STEM.json and the test-loss plot OUT/STEM.png."""
    path = Path(s.out) / result_stem(s.dataset, s.model, s.method, s.seed, s.per_parameter)
    return [path.with_suffix(".json"), path.with_suffix(".png")]


def write(s: Settings, result: RegularizationResult, paths: list[Path]) -> None:
    """The result as JSON, and its test-loss curve."""
    atomic_write_json(asdict(result), paths[0])
    plot_curve(result.curve, paths[1], paths[1].stem)


def report(s: Settings, result: RegularizationResult) -> list[str]:
    """The test loss, and the accuracy of a classifier."""
    lines = [f"test loss: {result.test_loss:.4f}"]
    if result.test_accuracy is not None:
        lines.append(f"test accuracy: {result.test_accuracy:.2f} %")
    return lines


TASK = Task(
    name="regularization",
    help="learn the regularization strength of lasso/ridge/logistic/SVM on a LIBSVM set",
    settings=Settings,
    load=load,
    run=run,
    steps=lambda s: s.outer_steps,
    outputs=outputs,
    write=write,
    report=report,
)
