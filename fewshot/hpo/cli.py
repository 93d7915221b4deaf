"""`fewshot hpo ...`: regularization learning, the bias-variance diagnostic, hyper-cleaning and
per-parameter image regularization, one `Command` each (settings checked before data is read)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from fewshot.hpo.results import plot_curve, result_path, result_stem
from fewshot.hpo.tasks import bias_variance, cleaning, image_regularization, regularization
from fewshot.hpo.tasks.cleaning_data import draw_cleaning_data
from fewshot.io import atomic_write_json
from fewshot.settings import Command


@contextmanager
def _progress(total: int, label: str) -> Iterator[Callable[..., None]]:
    """A step counter whose bar appears at the first step (an error before it prints one line)."""
    bar: tqdm | None = None

    def update(*_: object) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc=label, unit="step", leave=False)
        bar.update(1)

    try:
        yield update
    finally:
        if bar is not None:
            bar.close()


def run_regularization(settings: regularization.Settings) -> None:
    """Learn lambda on a LIBSVM set; write the JSON result and the test-loss plot."""
    s = settings
    data = regularization.load_task_data(s)
    with _progress(s.outer_steps, f"{s.dataset} {s.model} {s.method}") as step:
        result = regularization.run(data, s, progress=step)
    stem = result_stem("regularization", s.dataset, s.model, s.method, s.seed, s.per_parameter)
    path = Path(s.out) / f"{stem}.json"
    atomic_write_json(asdict(result), path)
    plot_curve(result.curve, path.with_suffix(".png"), stem)
    print(f"test loss: {result.test_loss:.4f}")
    if result.test_accuracy is not None:
        print(f"test accuracy: {result.test_accuracy:.2f} %")
    print(f"wrote {path}")


def run_bias_variance(settings: bias_variance.Settings) -> None:
    """The bias^2 / variance table of the RHG hypergradient across lambda and U."""
    rows = bias_variance.bias_variance_table(
        split_counts=settings.counts(),
        inner_steps=settings.inner_steps,
        repeats=settings.repeats,
        seed=settings.seed,
    )
    out = Path(settings.out)
    atomic_write_json({"rows": bias_variance.rows_as_dicts(rows)}, out / "bias_variance.json")
    bias_variance.plot(rows, str(out / "bias_variance.png"))
    print(bias_variance.format_table(rows))
    print(f"wrote {out / 'bias_variance.json'} and {out / 'bias_variance.png'}")


def run_cleaning(settings: cleaning.Settings) -> None:
    """Learn per-example weights on corrupted labels; print and write the scores."""
    s = settings
    data = draw_cleaning_data(s.dataset, s.n_train, s.n_val, s.n_test, s.noise, s.seed, s.data_root)
    with _progress(s.outer_step_count(), f"{s.dataset} {s.model} {s.method}") as step:
        result = cleaning.run_cleaning(s, data, on_step=step)
    path = result_path(s.out, "cleaning", s.dataset, s.model, s.method, s.seed)
    atomic_write_json(asdict(result), path)
    print(f"test accuracy: {result.test_accuracy:.2f} %")
    print(f"precision: {result.precision:.2f} %")
    print(f"recall: {result.recall:.2f} %")
    print(f"F1: {result.f1:.2f} %")
    print(f"Weight Tr test accuracy: {result.weight_tr_accuracy:.2f} %")
    print(f"Dirty Tr test accuracy: {result.dirty_tr_accuracy:.2f} %")
    print(f"flagged {result.flagged} of {s.n_train} (corrupted: {result.corrupted})")
    print(f"wrote {path}")


def run_image_regularization(settings: image_regularization.Settings) -> None:
    """Learn one L2 weight per parameter of an image classifier; print and write the result."""
    s = settings
    data = image_regularization.draw_observed_data(s.dataset, s.seed, s.data_root)
    with _progress(s.outer_step_count(), f"{s.dataset} {s.model} {s.method}") as step:
        result = image_regularization.run_image_regularization(s, data, on_step=step)
    path = result_path(s.out, "image-regularization", s.dataset, s.model, s.method, s.seed)
    atomic_write_json(asdict(result), path)
    print(f"test loss: {result.test_loss:.4f}")
    print(f"test accuracy: {result.test_accuracy:.2f} %")
    print(f"wrote {path}")


COMMANDS: list[Command] = [
    Command(
        ("hpo", "regularization"),
        "learn the regularization strength of lasso/ridge/logistic/SVM on a LIBSVM set",
        (regularization.Settings,),
        run_regularization,
    ),
    Command(
        ("hpo", "bias-variance"),
        "hypergradient error = bias^2 + variance on ridge regression, across lambda and U",
        (bias_variance.Settings,),
        run_bias_variance,
    ),
    Command(
        ("hpo", "cleaning"),
        "data hyper-cleaning: learn per-example weights on corrupted MNIST labels",
        (cleaning.Settings,),
        run_cleaning,
    ),
    Command(
        ("hpo", "image-regularization"),
        "one L2 weight per parameter of SR / MLP on MNIST, Fashion-MNIST or CIFAR-10",
        (image_regularization.Settings,),
        run_image_regularization,
    ),
]
