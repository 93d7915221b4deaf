"""`fewshot hpo ...`: regularization learning, the bias-variance diagnostic, and hyper-cleaning."""

from __future__ import annotations

import argparse
import importlib
import warnings
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from fewshot.errors import FewshotError
from fewshot.io import atomic_write_json


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `hpo` with its sub-commands."""
    hpo = subparsers.add_parser("hpo", help="hypergradient hyperparameter optimisation (EHG/OEHG)")
    hpo_sub = hpo.add_subparsers(dest="hpo_command", required=True)
    _add_regularization(hpo_sub)
    _add_bias_variance(hpo_sub)
    _add_cleaning(hpo_sub)


def _add_cleaning(hpo_sub: argparse._SubParsersAction) -> None:
    """Hyper-cleaning lives in fewshot.hpo.cleaning_cli (owned separately), added when it loads."""
    try:
        module = importlib.import_module("fewshot.hpo.cleaning_cli")
    except ModuleNotFoundError as e:
        if e.name == "fewshot.hpo.cleaning_cli":
            return  # not written yet: `fewshot hpo` simply has no cleaning command
        raise
    try:
        module.add_cleaning_parser(hpo_sub)
    except ImportError as e:
        # A half-finished cleaning module must not take the other hpo commands down with it.
        warnings.warn(f"`fewshot hpo cleaning` unavailable: {e}", stacklevel=2)


def _add_regularization(hpo_sub: argparse._SubParsersAction) -> None:
    from fewshot.hpo.libsvm import DATASETS
    from fewshot.hpo.regularization import METHODS, MODELS, Settings

    defaults = Settings(model="ridge", method="rhg")
    p = hpo_sub.add_parser(
        "regularization",
        help="learn the regularization strength of lasso/ridge/logistic/SVM on a LIBSVM set",
    )
    p.add_argument("--dataset", required=True, help=f"one of: {', '.join(sorted(DATASETS))}")
    p.add_argument("--model", required=True, choices=MODELS)
    p.add_argument("--method", required=True, choices=METHODS)
    p.add_argument("--splits", type=int, default=None, help="U (default 5 for oehg, else 1)")
    p.add_argument("--per-parameter", action="store_true", help="one lambda per weight")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="folder for the JSON result and the loss plot")
    p.add_argument("--data-root", default=None, help="folder holding libsvm/ (default: data/)")
    p.add_argument("--gamma", type=float, default=defaults.gamma, help="validation share")
    p.add_argument("--outer-steps", type=int, default=defaults.outer_steps, help="T")
    p.add_argument("--inner-steps", type=int, default=defaults.inner_steps, help="K (not oehg)")
    p.add_argument("--oehg-inner-steps", type=int, default=defaults.oehg_inner_steps)
    p.add_argument("--truncate", type=int, default=defaults.truncate, help="T-RHG window")
    p.add_argument("--solver-steps", type=int, default=defaults.solver_steps, help="Z for AID")
    p.add_argument("--outer-lr", type=float, default=defaults.outer_lr, help="Adam on log lambda")
    p.add_argument(
        "--inner-lr",
        type=float,
        default=None,
        help="fixed inner step (default: 1/(L + 2 max lambda), L of the data loss; lasso 1/L)",
    )
    p.add_argument("--init-lam", type=float, default=defaults.init_lam)
    p.add_argument(
        "--holdout",
        choices=("default", "head", "random"),
        default="default",
        help="sets without a test file: observed set = file head or seeded random subset",
    )
    p.set_defaults(func=_run_regularization)


def _positive(value: float | int | None, flag: str) -> None:
    if value is not None and value <= 0:
        raise FewshotError(f"{flag} must be positive, got {value}")


def _run_regularization(args: argparse.Namespace) -> None:
    from fewshot.hpo.libsvm import load_dataset
    from fewshot.hpo.regularization import Settings, run

    for flag in (
        "splits",
        "outer_steps",
        "inner_steps",
        "oehg_inner_steps",
        "solver_steps",
        "outer_lr",
        "inner_lr",
        "init_lam",
    ):
        _positive(getattr(args, flag), "--" + flag.replace("_", "-"))
    settings = Settings(
        model=args.model,
        method=args.method,
        seed=args.seed,
        splits=args.splits,
        per_parameter=args.per_parameter,
        gamma=args.gamma,
        outer_steps=args.outer_steps,
        inner_steps=args.inner_steps,
        oehg_inner_steps=args.oehg_inner_steps,
        truncate=args.truncate,
        solver_steps=args.solver_steps,
        outer_lr=args.outer_lr,
        inner_lr=args.inner_lr,
        init_lam=args.init_lam,
        holdout=args.holdout,
    )
    shuffle = {"default": None, "head": False, "random": True}[args.holdout]
    data = load_dataset(args.dataset, args.seed, args.data_root, shuffle)
    with tqdm(
        total=settings.outer_steps,
        desc=f"{args.dataset} {args.model} {args.method}",
        unit="step",
        leave=False,
    ) as bar:
        result = run(data, settings, progress=lambda t: bar.update(1))
    out = Path(args.out)
    stem = f"{args.dataset}_{args.model}_{args.method}{'_pp' if args.per_parameter else ''}"
    stem += f"_seed{args.seed}"
    atomic_write_json(asdict(result), out / f"{stem}.json")
    _plot_curve(result.curve, out / f"{stem}.png", stem)
    print(f"test loss: {result.test_loss:.4f}")
    if result.test_accuracy is not None:
        print(f"test accuracy: {result.test_accuracy:.2f} %")
    print(f"wrote {out / (stem + '.json')}")


def _plot_curve(curve: list[tuple[int, float]], path: Path, title: str) -> None:
    """Test loss against outer step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([s for s, _ in curve], [v for _, v in curve])
    ax.set(xlabel="outer step", ylabel="test loss", title=title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _add_bias_variance(hpo_sub: argparse._SubParsersAction) -> None:
    p = hpo_sub.add_parser(
        "bias-variance",
        help="hypergradient error = bias^2 + variance on ridge regression, across lambda and U",
    )
    p.add_argument("--splits", default="1,2,4,8", help="comma-separated U values")
    p.add_argument("--inner-steps", type=int, default=5, help="K of the RHG estimator")
    p.add_argument("--repeats", type=int, default=400, help="draws of U splits per U")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/hpo_bias_variance", help="folder for JSON and plot")
    p.set_defaults(func=_run_bias_variance)


def _parse_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise FewshotError(
            f"--splits {text!r}: expected comma-separated integers like 1,2,4,8"
        ) from None
    if not counts or min(counts) < 1:
        raise FewshotError(f"--splits {text!r}: every U must be at least 1")
    return counts


def _run_bias_variance(args: argparse.Namespace) -> None:
    from fewshot.hpo.bias_variance import bias_variance_table, format_table, plot, rows_as_dicts

    counts = _parse_counts(args.splits)
    _positive(args.inner_steps, "--inner-steps")
    _positive(args.repeats, "--repeats")
    rows = bias_variance_table(
        split_counts=counts, inner_steps=args.inner_steps, repeats=args.repeats, seed=args.seed
    )
    out = Path(args.out)
    atomic_write_json({"rows": rows_as_dicts(rows)}, out / "bias_variance.json")
    plot(rows, str(out / "bias_variance.png"))
    print(format_table(rows))
    print(f"wrote {out / 'bias_variance.json'} and {out / 'bias_variance.png'}")
