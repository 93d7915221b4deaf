"""Wall time of one outer step: RHG(K=128), AID-CG(K=128, Z=20) and OEHG(U=5, K=1), side by side.

Two tasks: logistic regression with one regularization strength on a LIBSVM set (default a1a,
float64, full-batch steps), and MNIST softmax regression with one L2 weight per parameter (the
image-regularization task: 8000 / 2000 split of 10000 observed images, mini-batches of 256,
float32). One outer step = computing the (ensemble) hypergradient, one Adam step on the log
weights and, for OEHG, one step of the deployed model. Reports the median over --repeats after
one warm-up; MNIST is read from --data-root (skipped with a note when it is not there).

    OMP_NUM_THREADS=1 python -m benchmarks.bench_hpo --data-root DIR [--dataset a1a] [--repeats 10]
    python -m benchmarks.bench_hpo --smoke [--data-root DIR]    # seconds: the test suite's run
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fewshot.datasets.libsvm import load_dataset
from fewshot.hpo.batches import Minibatches
from fewshot.hpo.ensemble import oehg, optimize_offline
from fewshot.hpo.hypergrad import Bilevel, aid_cg, rhg
from fewshot.hpo.splits import make_splits
from fewshot.hpo.tasks.classifiers import init_classifier
from fewshot.hpo.tasks.image_regularization import draw_observed_data, regularization_problem
from fewshot.hpo.tasks.regularization import default_inner_lr, make_problem
from fewshot.runtime.errors import FewshotError

# --smoke: K = 4, Z = 2, one timed step.
SMOKE = {"repeats": 1, "inner_steps": 4, "solver_steps": 2}


@dataclass
class Task:
    """One bilevel problem with its U = 5 splits, ready to time."""

    name: str
    problem: Bilevel
    theta0: dict[str, torch.Tensor]
    lam0: Any
    splits: list[tuple[Any, Any]]


def libsvm_task(dataset: str, data_root: str | None) -> Task:
    """Logistic regression, one lambda, float64 full-batch steps."""
    data = load_dataset(dataset, seed=0, data_root=data_root)
    x, y = torch.from_numpy(data.x_observed), torch.from_numpy(data.y_observed)
    splits = [
        ((x[s.train], y[s.train]), (x[s.val], y[s.val])) for s in make_splits(len(y), 0.2, 5, 0)
    ]
    theta0 = {
        "w": torch.zeros(x.shape[1], dtype=torch.float64),
        "b": torch.zeros((), dtype=torch.float64),
    }
    return Task(
        f"{dataset} logistic {tuple(x.shape)}",
        make_problem("logistic", default_inner_lr("logistic", data.x_observed)),
        theta0,
        torch.tensor(math.log(0.01), dtype=torch.float64),
        splits,
    )


def mnist_sr_task(data_root: str | None) -> Task:
    """MNIST softmax regression, one weight per parameter, mini-batches of 256."""
    data = draw_observed_data("mnist", 0, data_root)
    splits = [
        (Minibatches((data.x[s.train], data.y[s.train]), 256), (data.x[s.val], data.y[s.val]))
        for s in make_splits(len(data.y), 0.2, 5, 0)
    ]
    theta0 = init_classifier("sr", data.x.shape[1], data.num_classes, 0)
    lam0 = {k: torch.full_like(v, math.log(1e-4)) for k, v in theta0.items()}
    return Task("MNIST-SR (8000 x 784)", regularization_problem(0.05), theta0, lam0, splits)


def _median_ms(step: Callable[[], object], repeats: int) -> float:
    step()  # warm-up: first autograd calls allocate
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def time_task(task: Task, repeats: int, k: int, z: int) -> list[float]:
    """Milliseconds per outer step of RHG (K = k), AID-CG (K = k, Z = z) and OEHG on one task."""
    p, theta0, lam0, splits = task.problem, task.theta0, task.lam0, task.splits

    def offline(estimator) -> Callable[[], object]:
        return lambda: optimize_offline(estimator, p, theta0, lam0, splits[:1], 1, 0.01, 0)

    steps = [
        offline(lambda *a, **kw: rhg(*a, steps=k, **kw)),
        offline(lambda *a, **kw: aid_cg(*a, steps=k, solver_steps=z, **kw)),
        lambda: oehg(p, theta0, lam0, splits, splits[0][0], 1, 0.01, 1),
    ]
    return [_median_ms(step, repeats) for step in steps]


def main() -> None:
    """Time the three methods on both tasks and print one table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="a1a", help="LIBSVM classification set")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--inner-steps", type=int, default=128, help="K of RHG and AID-CG")
    parser.add_argument("--solver-steps", type=int, default=20, help="Z of AID-CG")
    parser.add_argument("--smoke", action="store_true", help="K = 4, Z = 2, 1 repeat")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    k, z = args.inner_steps, args.solver_steps

    tasks = [libsvm_task(args.dataset, args.data_root)]
    try:
        tasks.append(mnist_sr_task(args.data_root))
    except FewshotError as e:
        print(f"MNIST-SR skipped: {e}")
    columns = [time_task(task, args.repeats, k, z) for task in tasks]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); ms per outer step")
    print(f"{'method':28s}" + "".join(f" {task.name:>24s}" for task in tasks))
    names = (f"RHG (K={k}, U=1)", f"AID-CG (K={k}, Z={z}, U=1)", "OEHG (U=5, K=1)")
    for i, name in enumerate(names):
        print(f"{name:28s}" + "".join(f" {column[i]:24.2f}" for column in columns))


if __name__ == "__main__":
    main()
