"""Wall time of one outer step: RHG(K=128), AID-CG(K=128, Z=20) and OEHG(U=5, K=1) on a1a.

Logistic regression with one regularization strength, float64, the task's own losses and step
sizes. One outer step = computing the (ensemble) hypergradient, one Adam step on log lambda and,
for OEHG, one step of the deployed model. Reports the median over --repeats after one warm-up.

    OMP_NUM_THREADS=1 python scripts/bench_hpo.py [--dataset a1a] [--repeats 10]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch

from fewshot.hpo.ensemble import make_splits, oehg, optimize_offline
from fewshot.hpo.hypergrad import aid_cg, rhg
from fewshot.hpo.libsvm import load_dataset
from fewshot.hpo.regularization import default_inner_lr, make_problem


def _median_seconds(step: Callable[[], object], repeats: int) -> float:
    step()  # warm-up: first autograd calls allocate
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    """Time the three methods side by side and print a small table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="a1a")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    data = load_dataset(args.dataset, seed=0, data_root=args.data_root)
    x = torch.from_numpy(data.x_observed)
    y = torch.from_numpy(data.y_observed)
    splits = [
        ((x[s.train], y[s.train]), (x[s.val], y[s.val])) for s in make_splits(len(y), 0.2, 5, 0)
    ]
    problem = make_problem("logistic", default_inner_lr("logistic", data.x_observed))
    theta0 = {
        "w": torch.zeros(x.shape[1], dtype=torch.float64),
        "b": torch.zeros((), dtype=torch.float64),
    }
    lam0 = torch.tensor(math.log(0.01), dtype=torch.float64)

    def offline(estimator) -> Callable[[], object]:
        return lambda: optimize_offline(estimator, problem, theta0, lam0, splits[:1], 1, 0.01, 0)

    def online_step() -> object:
        return oehg(problem, theta0, lam0, splits, splits[0][0], 1, 0.01, 1)

    rows = [
        ("RHG (K=128, U=1)", offline(lambda *a: rhg(*a, steps=128))),
        ("AID-CG (K=128, Z=20, U=1)", offline(lambda *a: aid_cg(*a, steps=128, solver_steps=20))),
        ("OEHG (U=5, K=1)", online_step),
    ]
    print(
        f"{args.dataset}: observed {tuple(x.shape)}, logistic regression, float64, "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)"
    )
    print(f"{'method':28s} {'ms / outer step':>16s}")
    for name, step in rows:
        print(f"{name:28s} {1000 * _median_seconds(step, args.repeats):16.2f}")


if __name__ == "__main__":
    main()
