"""`fewshot hpo cleaning` (data hyper-cleaning) and `fewshot hpo image-regularization`."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from fewshot.device import resolve_device
from fewshot.errors import FewshotError
from fewshot.io import atomic_write_json


def add_cleaning_parser(hpo_subparsers: argparse._SubParsersAction) -> None:
    """Add the `cleaning` and `image-regularization` sub-commands under `fewshot hpo`."""
    from fewshot.hpo import cleaning, image_regularization

    c = cleaning.Settings()
    p = hpo_subparsers.add_parser(
        "cleaning", help="data hyper-cleaning: learn per-example weights on corrupted MNIST labels"
    )
    p.add_argument("--dataset", required=True, choices=cleaning.DATASETS)
    p.add_argument("--model", required=True, choices=("sr", "mlp"))
    p.add_argument("--method", required=True, choices=cleaning.METHODS)
    p.add_argument("--splits", type=int, default=None, help="U (default 5 for oehg, else 1)")
    _add_common(p)
    p.add_argument("--noise", type=float, default=c.noise, help="share of corrupted labels")
    p.add_argument("--n-train", type=int, default=c.n_train)
    p.add_argument("--n-val", type=int, default=c.n_val)
    p.add_argument("--n-test", type=int, default=c.n_test)
    p.add_argument("--outer-steps", type=int, default=None, help="T (default: equal budgets)")
    p.add_argument("--inner-steps", type=int, default=c.inner_steps, help="K of RHG / T-RHG")
    p.add_argument("--truncate", type=int, default=c.truncate, help="T-RHG window")
    p.add_argument("--inner-lr", type=float, default=None, help="default 0.5 (sr) / 0.2 (mlp)")
    p.add_argument("--outer-lr", type=float, default=c.outer_lr, help="Adam on weight logits")
    p.add_argument("--batch", type=int, default=None, help="default: all (sr), 500 (mlp)")
    p.add_argument("--val-batch", type=int, default=None, help="default: all (sr), 500 (mlp)")
    p.add_argument("--threshold", type=float, default=c.threshold, help="flag weights below")
    p.add_argument("--extra-val", type=int, default=c.extra_val, help="moved per OEHG split")
    p.add_argument("--retrain-steps", type=int, default=c.retrain_steps)
    p.set_defaults(func=_run_cleaning)

    r = image_regularization.Settings()
    p = hpo_subparsers.add_parser(
        "image-regularization",
        help="one L2 weight per parameter of SR / MLP on MNIST, Fashion-MNIST or CIFAR-10",
    )
    p.add_argument("--dataset", required=True, choices=image_regularization.DATASETS)
    p.add_argument("--model", required=True, choices=("sr", "mlp"))
    p.add_argument("--method", required=True, choices=image_regularization.METHODS)
    p.add_argument("--splits", type=int, default=None, help="U (default 5 for oehg, else 1)")
    _add_common(p)
    p.add_argument("--outer-steps", type=int, default=None, help="T (default: equal budgets)")
    p.add_argument("--inner-steps", type=int, default=r.inner_steps, help="K of RHG / T-RHG")
    p.add_argument("--truncate", type=int, default=r.truncate, help="T-RHG window")
    p.add_argument("--inner-lr", type=float, default=None, help="default 0.05 (0.01 CIFAR-10)")
    p.add_argument("--outer-lr", type=float, default=r.outer_lr, help="Adam on log lambda")
    p.add_argument("--batch", type=int, default=r.batch, help="inner SGD mini-batch")
    p.set_defaults(func=_run_image_regularization)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="folder for the JSON result")
    p.add_argument("--data-root", default=None, help="folder holding mnist/ ... (default: data/)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))


def _check_positive(args: argparse.Namespace, *flags: str) -> None:
    for flag in flags:
        value = getattr(args, flag)
        if value is not None and value <= 0:
            raise FewshotError(f"--{flag.replace('_', '-')} must be positive, got {value}")


def _progress(total: int, label: str) -> tqdm:
    return tqdm(total=total, desc=label, unit="step", leave=False)


def _run_cleaning(args: argparse.Namespace) -> None:
    from fewshot.hpo.cleaning import Settings, draw_cleaning_data, run_cleaning

    _check_positive(
        args,
        "splits",
        "outer_steps",
        "inner_steps",
        "inner_lr",
        "outer_lr",
        "batch",
        "val_batch",
        "retrain_steps",
    )
    if args.extra_val < 0:
        raise FewshotError(f"--extra-val must be >= 0, got {args.extra_val}")
    settings = Settings(
        dataset=args.dataset,
        model=args.model,
        method=args.method,
        splits=args.splits,
        seed=args.seed,
        n_train=args.n_train,
        n_val=args.n_val,
        n_test=args.n_test,
        noise=args.noise,
        outer_steps=args.outer_steps,
        inner_steps=args.inner_steps,
        truncate=args.truncate,
        inner_lr=args.inner_lr,
        outer_lr=args.outer_lr,
        batch=args.batch,
        val_batch=args.val_batch,
        threshold=args.threshold,
        extra_val=args.extra_val,
        retrain_steps=args.retrain_steps,
        device=resolve_device(args.device).type,
    )
    settings.check()
    data = draw_cleaning_data(
        args.dataset, args.n_train, args.n_val, args.n_test, args.noise, args.seed, args.data_root
    )
    label = f"{args.dataset} {args.model} {args.method}"
    with _progress(settings.outer_step_count(), label) as bar:
        result = run_cleaning(settings, data, on_step=lambda t, lam, theta: bar.update(1))
    path = (
        Path(args.out) / f"cleaning_{args.dataset}_{args.model}_{args.method}_seed{args.seed}.json"
    )
    atomic_write_json(asdict(result), path)
    print(f"test accuracy: {result.test_accuracy:.2f} %")
    print(f"precision: {result.precision:.2f} %")
    print(f"recall: {result.recall:.2f} %")
    print(f"F1: {result.f1:.2f} %")
    print(f"Weight Tr test accuracy: {result.weight_tr_accuracy:.2f} %")
    print(f"Dirty Tr test accuracy: {result.dirty_tr_accuracy:.2f} %")
    print(f"flagged {result.flagged} of {settings.n_train} (corrupted: {result.corrupted})")
    print(f"wrote {path}")


def _run_image_regularization(args: argparse.Namespace) -> None:
    from fewshot.hpo.image_regularization import (
        Settings,
        draw_observed_data,
        run_image_regularization,
    )

    _check_positive(args, "splits", "outer_steps", "inner_steps", "inner_lr", "outer_lr", "batch")
    settings = Settings(
        dataset=args.dataset,
        model=args.model,
        method=args.method,
        splits=args.splits,
        seed=args.seed,
        outer_steps=args.outer_steps,
        inner_steps=args.inner_steps,
        truncate=args.truncate,
        inner_lr=args.inner_lr,
        outer_lr=args.outer_lr,
        batch=args.batch,
        device=resolve_device(args.device).type,
    )
    settings.check()
    data = draw_observed_data(args.dataset, args.seed, args.data_root)
    label = f"{args.dataset} {args.model} {args.method}"
    with _progress(settings.outer_step_count(), label) as bar:
        result = run_image_regularization(
            settings, data, on_step=lambda t, lam, theta: bar.update(1)
        )
    stem = f"imgreg_{args.dataset}_{args.model}_{args.method}_seed{args.seed}"
    path = Path(args.out) / f"{stem}.json"
    atomic_write_json(asdict(result), path)
    print(f"test loss: {result.test_loss:.4f}")
    print(f"test accuracy: {result.test_accuracy:.2f} %")
    print(f"wrote {path}")
