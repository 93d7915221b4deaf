"""Ceilings of lambda selection on a LIBSVM set: the test accuracy an exact choice of lambda gives.

For every seed and every lambda of a fine grid, the model OEHG deploys (gradient descent on the
training part of the first train/validation split, Eq. 53-3) is trained for the run's T steps and
scored on the test set. Three choices of lambda per seed are compared:

- test oracle: the grid lambda with the best test accuracy, a bound no method can pass;
- validation, U splits: the lambda minimising the mean validation loss over the seed's first U
  splits (each model trained on its split's training part), i.e. the exact minimiser of the outer
  objective that a perfect hypergradient method with EHG/OEHG would reach;
- validation, 1 split: the same with the first split alone (a perfect plain RHG/AID).

    python -m experiments.hpo_heart.lambda_oracle --dataset heart --model logistic --seeds 20 \
        | tee experiments/hpo_heart/lambda_selection.txt
    python -m experiments.hpo_heart.lambda_oracle --smoke    # seconds: the test suite's run
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch

from experiments.smoke import add_smoke_flag
from fewshot.datasets.libsvm import load_dataset
from fewshot.hpo.splits import make_splits
from fewshot.hpo.tasks.regularization import default_inner_lr, linear_scores, make_problem

GRID = np.logspace(-5, 0.5, 23)  # four points per decade
# --smoke: two seeds (the interval needs two), two splits, a few gradient steps.
SMOKE = {"seeds": 2, "resplits": 2, "steps": 5}


def main(argv: list[str] | None = None) -> None:
    """Print per-seed choices of lambda and the mean test accuracy of each choice."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="heart")
    parser.add_argument("--model", default="logistic", choices=("logistic", "svm"))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--resplits", type=int, default=5, help="U")
    parser.add_argument("--gamma", type=float, default=0.2)
    parser.add_argument("--steps", type=int, default=2000, help="gradient steps (OEHG's T)")
    parser.add_argument("--data-root", default=None)
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if args.smoke:  # it writes nothing: its output is what it prints
        vars(args).update(SMOKE)

    log_grid = torch.tensor(np.log(GRID), dtype=torch.float64)
    print(f"{args.dataset} {args.model}, {len(GRID)} lambdas in [{GRID[0]:.0e}, {GRID[-1]:.1f}],")
    print(f"T={args.steps} steps, U={args.resplits}: test accuracy % of the deployed model")
    print(f"seed | test oracle: lambda, acc | val U={args.resplits}: lambda, acc | val U=1: ...")
    chosen = {"test oracle": [], f"validation, U={args.resplits}": [], "validation, U=1": []}
    for seed in range(args.seeds):
        data = load_dataset(args.dataset, seed, args.data_root)
        x = torch.as_tensor(data.x_observed, dtype=torch.float64)
        y = torch.as_tensor(data.y_observed, dtype=torch.float64)
        test = (
            torch.as_tensor(data.x_test, dtype=torch.float64),
            torch.as_tensor(data.y_test, dtype=torch.float64),
        )
        problem = make_problem(args.model, default_inner_lr(args.model, data.x_observed))
        theta0 = {
            "w": torch.zeros(x.shape[1], dtype=torch.float64),
            "b": torch.zeros((), dtype=torch.float64),
        }
        val_loss = []  # per split: validation loss at every grid lambda
        for i, split in enumerate(make_splits(len(y), args.gamma, args.resplits, seed)):
            train = (x[split.train], y[split.train])
            val = (x[split.val], y[split.val])
            per_lam = [problem.descend(theta0, lam, train, args.steps) for lam in log_grid]
            val_loss.append([linear_scores(args.model, t, val)[0] for t in per_lam])
            if i == 0:  # the deployed model trains on the first split's training part
                test_acc = np.array([linear_scores(args.model, t, test)[1] for t in per_lam])
        val_loss = np.array(val_loss)
        picks = (
            int(np.argmax(test_acc)),
            int(np.argmin(val_loss.mean(axis=0))),
            int(np.argmin(val_loss[0])),
        )
        for name, j in zip(chosen, picks, strict=True):
            chosen[name].append(test_acc[j])
        print(f"{seed:4d} | " + " | ".join(f"{GRID[j]:.1e}, {test_acc[j]:6.2f}" for j in picks))
    for name, accs in chosen.items():
        a = np.array(accs)
        ci = 1.96 * a.std(ddof=1) / math.sqrt(len(a)) if len(a) > 1 else float("nan")
        print(f"{name:>16}: {a.mean():.2f} +- {ci:.2f} % (mean over {len(a)} seeds, 95% CI)")


if __name__ == "__main__":
    main()
