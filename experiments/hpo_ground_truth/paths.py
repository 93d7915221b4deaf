"""Lambda paths of AID-FP / RHG (+EHG) for several U against the cvxpy ground truth (Fig. 7-3).

For each U, the estimator (lasso: AID-FP with K inner and Z fixed-point steps; SVM: RHG with K
inner steps) drives Adam on log lam with the ensemble hypergradient over U seeded splits; the
ground truth drives Adam with the exact hypergradient (cvxpy inner solutions) averaged over the
same U splits. Repeating over seeds shows the spread of the estimated paths. Writes
OUT/ground_truth.json and OUT/ground_truth.png (OUT defaults to MODEL_DATASET in this study's
folder) and prints final lambdas.

    OMP_NUM_THREADS=1 python -m experiments.hpo_ground_truth.paths --dataset triazines \
        --resplits 1 16
    OMP_NUM_THREADS=1 python -m experiments.hpo_ground_truth.paths --model svm --dataset heart \
        --resplits 1 16
    python -m experiments.hpo_ground_truth.paths --smoke --out DIR    # the test suite's run
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import torch

from experiments.smoke import add_smoke_flag, smoke_folder
from fewshot.datasets.libsvm import load_dataset
from fewshot.hpo.optimize import Budget, optimize
from fewshot.hpo.splits import make_splits
from fewshot.hpo.tasks.ground_truth import (
    ground_truth_path,
    lasso_hypergradient,
    svm_hypergradient,
)
from fewshot.hpo.tasks.regularization import default_inner_lr, make_problem
from fewshot.runtime.io import atomic_write_json

ESTIMATOR_NAMES = {"lasso": "AID-FP", "svm": "RHG"}
# --smoke: one seed, two outer steps of a few inner and fixed-point steps, U = 1 and 2.
SMOKE = {"seeds": 1, "outer_steps": 2, "inner_steps": 4, "solver_steps": 2, "resplits": [1, 2]}


def estimated_path(data, splits, args) -> list[float]:
    """lam after each outer step of the model's estimator + EHG over `splits`."""
    x, y = torch.from_numpy(data.x_observed), torch.from_numpy(data.y_observed)
    split_data = [((x[s.train], y[s.train]), (x[s.val], y[s.val])) for s in splits]
    problem = make_problem(args.model, default_inner_lr(args.model, data.x_observed))
    theta0 = {
        "w": torch.zeros(x.shape[1], dtype=torch.float64),
        "b": torch.zeros((), dtype=torch.float64),
    }
    path: list[float] = []
    optimize(
        "aid-fp" if args.model == "lasso" else "rhg",
        problem,
        theta0,
        torch.tensor(math.log(args.init_lam), dtype=torch.float64),
        split_data,
        Budget(args.outer_steps, args.inner_steps, solver_steps=args.solver_steps),
        outer_lr=args.outer_lr,
        on_step=lambda t, lam, theta: path.append(math.exp(float(lam))),
    )
    return path


def main(argv: list[str] | None = None) -> None:
    """Run the estimated and exact paths and save them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="lasso", choices=("lasso", "svm"))
    parser.add_argument("--dataset", default="triazines")
    parser.add_argument("--resplits", type=int, nargs="+", default=[1, 16], help="the U values")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--outer-steps", type=int, default=40)
    parser.add_argument("--outer-lr", type=float, default=0.05)
    parser.add_argument("--inner-steps", type=int, default=128)
    parser.add_argument("--solver-steps", type=int, default=20)
    parser.add_argument("--init-lam", type=float, default=0.01)
    parser.add_argument("--gamma", type=float, default=0.2)
    parser.add_argument("--out", help="default: experiments/hpo_ground_truth/MODEL_DATASET")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    args.out = args.out or f"experiments/hpo_ground_truth/{args.model}_{args.dataset}"
    if args.smoke:
        vars(args).update(SMOKE)
        args.out = str(smoke_folder(args.out))

    name = ESTIMATOR_NAMES[args.model]
    data = load_dataset(args.dataset, seed=0)
    x, y = data.x_observed, data.y_observed
    results = []
    for count in args.resplits:
        for seed in range(args.seeds):
            splits = make_splits(len(y), args.gamma, count, seed)
            exact = ground_truth_path(
                [((x[s.train], y[s.train]), (x[s.val], y[s.val])) for s in splits],
                args.init_lam,
                args.outer_steps,
                args.outer_lr,
                lasso_hypergradient if args.model == "lasso" else svm_hypergradient,
            )
            estimate = estimated_path(data, splits, args)
            results.append(
                {"splits": count, "seed": seed, "estimate": estimate, "ground_truth": exact}
            )
            gap = abs(math.log(estimate[-1] / exact[-1]))
            print(
                f"U={count:3d} seed={seed}: final lambda {name} {estimate[-1]:.4g}, "
                f"ground truth {exact[-1]:.4g}, |log ratio| {gap:.3f}",
                flush=True,
            )
    out = Path(args.out)
    atomic_write_json({"settings": vars(args), "runs": results}, out / "ground_truth.json")
    _plot(results, out / "ground_truth.png", f"{args.dataset} {args.model}", name)
    for count in dict.fromkeys(r["splits"] for r in results):
        gaps = [
            abs(math.log(r["estimate"][-1] / r["ground_truth"][-1]))
            for r in results
            if r["splits"] == count
        ]
        finals = [r["estimate"][-1] for r in results if r["splits"] == count]
        print(
            f"U={count}: mean |log(lam_{name} / lam_true)| = {np.mean(gaps):.3f}, "
            f"std of final log lam across seeds = {np.std(np.log(finals)):.3f}"
        )
    print(f"wrote {out / 'ground_truth.json'} and {out / 'ground_truth.png'}")


def _plot(results: list[dict], path: Path, title: str, name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = list(dict.fromkeys(r["splits"] for r in results))
    fig, axes = plt.subplots(1, len(counts), figsize=(5 * len(counts), 3.5), squeeze=False)
    for ax, count in zip(axes[0], counts, strict=True):
        for i, r in enumerate(r for r in results if r["splits"] == count):
            color = f"C{i}"  # one colour per seed: solid ground truth, dashed estimate
            ax.plot(r["ground_truth"], "-", color=color, lw=1.2)
            ax.plot(r["estimate"], "--", color=color, lw=1.2)
        ax.set(
            yscale="log",
            xlabel="outer step",
            ylabel="lambda",
            title=f"{title}, U={count}: solid exact, dashed {name}",
        )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
