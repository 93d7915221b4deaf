"""Bias-variance decomposition of the RHG hypergradient error on ridge regression (paper Sec. 5).

Setting (paper Appendix, "Supplementary Experiments"): one observed data set D of n = 22 points in
R^5, y = X beta + noise with beta and noise ~ N(0, 1), validation share gamma = 1/11, so there are
V = C(22, 2) = 231 distinct train/validation splits. Conditional on D, with u a uniformly random
split:

    true       = E_u[exact hypergradient of split u]       (closed form, paper's nabla-bar f)
    expected   = E_u[RHG estimate with K steps on split u]  (paper's nabla-tilde f)
    bias^2     = (expected - true)^2
    variance_U = E[(EHG_U - expected)^2],  EHG_U = mean of the RHG estimates of U distinct splits
    error_U    = E[(EHG_U - true)^2] = bias^2 + variance_U

`true` and `expected` are exact averages over all V splits; variance_U and error_U are measured over
`repeats` seeded draws of U splits. Drawing without replacement predicts
variance_U = variance_1 / U * (V - U) / (V - 1), which the report prints next to the measurement.
All V x len(lams) ridge problems are solved at once as one batched bilevel problem.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from fewshot.hpo.ensemble import StepCallback
from fewshot.hpo.hypergrad import Bilevel, rhg
from fewshot.hpo.splits import make_splits
from fewshot.hpo.tasks.base import Task, TaskSettings
from fewshot.hpo.tasks.ridge import ridge_hypergradient
from fewshot.runtime.io import atomic_save_figure, atomic_write_json
from fewshot.runtime.memory import MemoryTerm, check_memory
from fewshot.runtime.settings import SettingError, seed_setting, setting

POINTS, GAMMA = 22, 1 / 11  # the paper's observed set: n = 22, 2 of them for validation
DISTINCT_SPLITS = math.comb(POINTS, round(GAMMA * POINTS))  # V = 231
DIM, LAMBDAS = 5, 50  # features of the set, lambdas of the grid
# Each RHG step keeps about 16 float64 copies of the (lambdas, splits, dim) iterate for the
# backward pass (measured: 6.9 MB a step at 2000 steps).
STEP_BYTES = 16 * LAMBDAS * DISTINCT_SPLITS * DIM * 8


@dataclass(frozen=True, kw_only=True)
class Settings(TaskSettings):
    """`fewshot hpo bias-variance`: the U values, the RHG estimator and the number of draws."""

    resplits: list[int] = setting(
        default_factory=lambda: [1, 2, 4, 8],
        help=f"the U values, each 1..{DISTINCT_SPLITS} (the distinct splits)",
    )
    inner_steps: int = setting(5, help="K of the RHG estimator", low=1)
    repeats: int = setting(400, help="draws of U splits per U", low=1)
    seed: int = seed_setting(0, help="seed of the data set and of the RHG splits")
    out: str = setting("runs/hpo_bias_variance", help="folder for JSON and plot")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.resplits:
            raise SettingError("resplits", "must hold at least one U")
        bad = [c for c in self.resplits if not 1 <= c <= DISTINCT_SPLITS]
        if bad:
            raise SettingError(
                "resplits",
                f"values must lie in 1..{DISTINCT_SPLITS}, the distinct splits of the "
                f"{POINTS}-point set, got {bad[0]}",
            )


@dataclass(frozen=True)
class BiasVarianceRow:
    """Statistics of the U-split ensemble hypergradient at one lambda."""

    lam: float
    splits: int
    true: float
    expected: float
    bias2: float
    variance: float
    error: float
    predicted_variance: float


def sample_regression(n: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """y = X beta + eps with X, beta, eps ~ N(0, 1) (float64)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g, dtype=torch.float64)
    beta = torch.randn(dim, generator=g, dtype=torch.float64)
    return x, x @ beta + torch.randn(n, generator=g, dtype=torch.float64)


def _batched_ridge(inner_lr: float) -> Bilevel:
    """Independent ridge problems stacked along leading axes (lam: (L, V), theta: (L, V, d))."""

    def mse(theta: torch.Tensor, data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = data  # (V, m, d), (V, m)
        residual = torch.einsum("vmd,lvd->lvm", x, theta) - y
        return (residual**2).mean(-1)

    def inner(theta: torch.Tensor, lam: torch.Tensor, data) -> torch.Tensor:
        return (mse(theta, data) + lam * (theta**2).sum(-1)).sum()

    def outer(theta: torch.Tensor, lam: torch.Tensor, data) -> torch.Tensor:
        return mse(theta, data).sum()

    return Bilevel(inner, outer, inner_lr)


def per_split_hypergradients(
    x: torch.Tensor, y: torch.Tensor, lams: np.ndarray, gamma: float, inner_steps: int, seed: int
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, ...]]]:
    """(exact, rhg) hypergradients of shape (len(lams), V) over all V splits, and their val sets."""
    n = x.shape[0]
    n_val = round(gamma * n)
    splits = make_splits(n, gamma, math.comb(n, n_val), seed)
    train = (torch.stack([x[s.train] for s in splits]), torch.stack([y[s.train] for s in splits]))
    val = (torch.stack([x[s.val] for s in splits]), torch.stack([y[s.val] for s in splits]))
    exact = np.array(
        [
            [
                float(ridge_hypergradient(lam, (x[s.train], y[s.train]), (x[s.val], y[s.val])))
                for s in splits
            ]
            for lam in lams
        ]
    )
    # Step size 1/L for the worst-conditioned split at the smallest lambda.
    top = torch.linalg.eigvalsh(train[0].transpose(1, 2) @ train[0] / train[0].shape[1])[:, -1]
    problem = _batched_ridge(1.0 / (2.0 * (float(top.max()) + float(lams.max()))))
    lam = torch.tensor(lams, dtype=torch.float64)[:, None].expand(len(lams), len(splits))
    theta0 = torch.zeros(len(lams), len(splits), x.shape[1], dtype=torch.float64)
    estimate = rhg(problem, theta0, lam.contiguous(), train, val, inner_steps).grad.numpy()
    return exact, estimate, [tuple(s.val.tolist()) for s in splits]


def bias_variance_table(
    n: int = POINTS,
    dim: int = DIM,
    gamma: float = GAMMA,
    lams: np.ndarray | None = None,
    resplits: tuple[int, ...] = (1, 2, 4, 8),
    inner_steps: int = 5,
    repeats: int = 400,
    seed: int = 0,
) -> list[BiasVarianceRow]:
    """The bias^2 / variance / error rows for every lambda and every U in `resplits`."""
    lams = np.linspace(0.3, 3.0, LAMBDAS) if lams is None else np.asarray(lams, dtype=float)
    x, y = sample_regression(n, dim, seed)
    exact, estimate, val_sets = per_split_hypergradients(x, y, lams, gamma, inner_steps, seed)
    index = {val: i for i, val in enumerate(val_sets)}
    true, expected = exact.mean(1), estimate.mean(1)
    var_one = ((estimate - expected[:, None]) ** 2).mean(1)
    total = len(val_sets)
    rows = []
    for count in resplits:
        draws = [
            [index[tuple(s.val.tolist())] for s in make_splits(n, gamma, count, seed=1000 + r)]
            for r in range(repeats)
        ]
        ensembles = np.stack([estimate[:, d].mean(1) for d in draws], axis=1)  # (L, repeats)
        variance = ((ensembles - expected[:, None]) ** 2).mean(1)
        error = ((ensembles - true[:, None]) ** 2).mean(1)
        predicted = var_one / count * (total - count) / (total - 1)
        rows += [
            BiasVarianceRow(
                float(lams[i]),
                count,
                float(true[i]),
                float(expected[i]),
                float((expected[i] - true[i]) ** 2),
                float(variance[i]),
                float(error[i]),
                float(predicted[i]),
            )
            for i in range(len(lams))
        ]
    return rows


def summarize(rows: list[BiasVarianceRow]) -> list[dict[str, float]]:
    """Per U: lambda-averaged bias^2, variance, error, predicted variance, and variance * U."""
    summary = []
    for count in sorted({r.splits for r in rows}):
        sel = [r for r in rows if r.splits == count]
        mean = {
            k: float(np.mean([getattr(r, k) for r in sel]))
            for k in ("bias2", "variance", "error", "predicted_variance")
        }
        summary.append({"splits": count, **mean, "variance_times_U": mean["variance"] * count})
    return summary


def format_table(rows: list[BiasVarianceRow], show_lams: int = 5) -> str:
    """A readable table: a few lambdas per U, then the lambda-averaged summary per U."""
    lams = sorted({r.lam for r in rows})
    shown = {lams[i] for i in np.linspace(0, len(lams) - 1, show_lams).round().astype(int)}
    lines = [
        f"{'U':>3} {'lambda':>7} {'true':>10} {'bias^2':>10} {'variance':>10} "
        f"{'predicted':>10} {'error':>10}"
    ]
    for r in rows:
        if r.lam in shown:
            lines.append(
                f"{r.splits:>3} {r.lam:7.3f} {r.true:10.4f} {r.bias2:10.3e} "
                f"{r.variance:10.3e} {r.predicted_variance:10.3e} {r.error:10.3e}"
            )
    lines.append("")
    lines.append(
        f"{'U':>3} {'mean bias^2':>12} {'mean var':>10} {'var x U':>10} {'mean error':>11}"
    )
    for s in summarize(rows):
        lines.append(
            f"{s['splits']:>3} {s['bias2']:12.3e} {s['variance']:10.3e} "
            f"{s['variance_times_U']:10.3e} {s['error']:11.3e}"
        )
    return "\n".join(lines)


def plot(rows: list[BiasVarianceRow], path: str) -> None:
    """Left: error, bias^2 and variance across lambda for U=1. Right: variance against U."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    first = min(r.splits for r in rows)
    sel = [r for r in rows if r.splits == first]
    lams = [r.lam for r in sel]
    for key in ("error", "bias2", "variance"):
        left.plot(lams, [getattr(r, key) for r in sel], label=key)
    left.set(xlabel="lambda", ylabel="squared hypergradient error", title=f"U = {first}")
    left.set_yscale("log")
    left.legend()
    summary = summarize(rows)
    counts = [s["splits"] for s in summary]
    right.loglog(counts, [s["variance"] for s in summary], "o-", label="measured variance")
    right.loglog(
        counts, [s["predicted_variance"] for s in summary], "--", label="var_1 (V-U) / (U (V-1))"
    )
    right.set(xlabel="U (splits)", ylabel="mean variance over lambda", title="EHG variance")
    right.set_xticks(counts, [str(c) for c in counts])
    right.minorticks_off()
    right.legend()
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=120)
    plt.close(fig)


def load(settings: Settings) -> None:
    """Nothing to read (the regression data is drawn from the seed): the memory check only."""
    steps = settings.inner_steps
    terms = [MemoryTerm(steps * STEP_BYTES, f"{steps} kept RHG steps", "--inner-steps")]
    check_memory(terms, torch.device("cpu"))


def run(
    settings: Settings, data: None, on_step: StepCallback | None = None
) -> list[BiasVarianceRow]:
    """The table's rows (no outer loop, so `on_step` is never called)."""
    return bias_variance_table(
        resplits=tuple(settings.resplits),
        inner_steps=settings.inner_steps,
        repeats=settings.repeats,
        seed=settings.seed,
    )


def outputs(settings: Settings) -> list[Path]:
    """OUT/bias_variance.json (settings and rows) and OUT/bias_variance.png."""
    out = Path(settings.out)
    return [out / "bias_variance.json", out / "bias_variance.png"]


def write(settings: Settings, rows: list[BiasVarianceRow], paths: list[Path]) -> None:
    """The rows as JSON, with the settings that made them, and their plot."""
    atomic_write_json({"settings": asdict(settings), "rows": [asdict(r) for r in rows]}, paths[0])
    plot(rows, str(paths[1]))


def report(settings: Settings, rows: list[BiasVarianceRow]) -> list[str]:
    """The table."""
    return [format_table(rows)]


TASK = Task(
    name="bias-variance",
    help="hypergradient error = bias^2 + variance on ridge regression, across lambda and U",
    settings=Settings,
    load=load,
    run=run,
    steps=lambda s: None,
    outputs=outputs,
    write=write,
    report=report,
)
