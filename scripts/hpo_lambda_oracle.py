"""The ceiling of lambda selection on a LIBSVM set: test accuracy of the deployed model over a grid.

For every seed, the model that OEHG deploys (gradient descent on the training part of the first
train/validation split, as Eq. 53-3) is trained to the end with each fixed lambda of a grid, and
scored on the test set. Choosing lambda by test accuracy per seed ("oracle") bounds what any
hyperparameter method can reach under this protocol, e.g. on heart's 100 observed examples:

    python scripts/hpo_lambda_oracle.py --dataset heart --model logistic --seeds 5
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch

from fewshot.hpo.ensemble import make_splits
from fewshot.hpo.libsvm import load_dataset
from fewshot.hpo.regularization import default_inner_lr, evaluate, make_problem

GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)


def main() -> None:
    """Print a seeds x lambda table of test accuracies and the oracle's mean."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="heart")
    parser.add_argument("--model", default="logistic", choices=("logistic", "svm"))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--gamma", type=float, default=0.2)
    parser.add_argument("--steps", type=int, default=2000, help="gradient steps (OEHG's T)")
    parser.add_argument("--data-root", default=None)
    args = parser.parse_args()

    print(f"{args.dataset} {args.model}: test accuracy % of the deployed model per fixed lambda")
    print("seed " + " ".join(f"{lam:>7.0e}" for lam in GRID) + "   best")
    best = []
    for seed in range(args.seeds):
        data = load_dataset(args.dataset, seed, args.data_root)
        split = make_splits(len(data.y_observed), args.gamma, 1, seed)[0]
        x = torch.as_tensor(data.x_observed, dtype=torch.float64)
        y = torch.as_tensor(data.y_observed, dtype=torch.float64)
        test = (
            torch.as_tensor(data.x_test, dtype=torch.float64),
            torch.as_tensor(data.y_test, dtype=torch.float64),
        )
        problem = make_problem(args.model, default_inner_lr(args.model, data.x_observed))
        row = []
        for lam in GRID:
            theta = {
                "w": torch.zeros(x.shape[1], dtype=torch.float64),
                "b": torch.zeros((), dtype=torch.float64),
            }
            log_lam = torch.tensor(math.log(lam), dtype=torch.float64)
            theta = problem.descend(theta, log_lam, (x[split.train], y[split.train]), args.steps)
            row.append(evaluate(args.model, theta, test)[1])
        best.append(max(row))
        print(f"{seed:4d} " + " ".join(f"{a:7.2f}" for a in row) + f" {best[-1]:6.2f}")
    print(f"oracle (lambda chosen on the test set per seed): {np.mean(best):.2f} % mean")


if __name__ == "__main__":
    main()
