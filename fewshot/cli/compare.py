"""`fewshot compare` and `fewshot compare-seeds`: models tested on the very same episodes.

`compare A.pt B.pt` gives each accuracy ± 95% CI and the difference B - A ± its paired CI over
episodes. `compare-seeds --a A1 A2 ... --b B1 B2 ...` takes several training seeds per arm
(seed i of one arm paired with seed i of the other) and gives each arm's mean over seeds and
the mean paired difference, with t intervals across seeds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from fewshot.datasets import load_split
from fewshot.device import resolve_device
from fewshot.evaluate import EpisodeSettings, EvalResult, load_trained
from fewshot.io import atomic_write_json, check_writable
from fewshot.settings import Command, SettingError, setting
from fewshot.stats import Difference, paired_ci, paired_seeds_ci, seeds_ci


def checkpoint_of(path: str) -> str:
    """A checkpoint path, or a run folder's best.pt."""
    return str(Path(path) / "best.pt") if Path(path).is_dir() else path


def per_episode(settings: EpisodeSettings, paths: list[str]) -> tuple[str, list[torch.Tensor]]:
    """Every model's per-episode accuracies on the same seeded episodes, and the dataset."""
    device = resolve_device(settings.device)
    models = [load_trained(checkpoint_of(path), device) for path in paths]
    trained_on = {config["dataset"] for _, config in models}
    if settings.dataset is None and len(trained_on) > 1:
        raise SettingError(
            "dataset", f"must be given: the models were trained on {', '.join(sorted(trained_on))}"
        )
    dataset = settings.dataset or trained_on.pop()
    split = load_split(dataset, settings.split, settings.data_root)
    return dataset, [settings.accuracies(model, split, config) for model, config in models]


def difference_line(label: str, d: Difference, unit: str) -> str:
    """'B - A: +0.68 ± 0.15 % (...)'."""
    spread = f"{100 * d.mean:+.2f} ± {100 * d.ci95:.2f} %"
    return f"{label}: {spread} ({unit}; {d.test} p = {d.p_value:.3g})"


@dataclass(frozen=True, kw_only=True)
class CompareSettings(EpisodeSettings):
    """`fewshot compare`: two checkpoints on the same seeded episodes."""

    a: str = setting(help="checkpoint (or run folder) A", positional=True)
    b: str = setting(help="checkpoint (or run folder) B", positional=True)
    out: str | None = setting(None, help="JSON file for both models' per-episode accuracies")


def run_compare(settings: CompareSettings) -> Difference:
    """Print A and B's accuracies ± CI and B - A ± its paired CI; optionally write JSON."""
    if settings.out:
        check_writable(settings.out)
    dataset, (acc_a, acc_b) = per_episode(settings, [settings.a, settings.b])
    results = [EvalResult.of(acc, settings.shape, settings.seed) for acc in (acc_a, acc_b)]
    for name, path, result in zip("AB", (settings.a, settings.b), results, strict=True):
        print(f"{name} {path}: {result.accuracy:.2f} ± {result.ci95:.2f} %")
    difference = paired_ci(acc_a, acc_b)
    print(difference_line("B - A", difference, f"paired 95% CI over {difference.n} episodes"))
    if settings.out:
        record = {"dataset": dataset, "split": settings.split, "difference": asdict(difference)}
        for name, path, result, acc in zip(
            "ab", (settings.a, settings.b), results, (acc_a, acc_b), strict=True
        ):
            record[name] = {**asdict(result), "checkpoint": path, "accuracies": acc.tolist()}
        atomic_write_json(record, settings.out)
    return difference


@dataclass(frozen=True, kw_only=True)
class CompareSeedsSettings(EpisodeSettings):
    """`fewshot compare-seeds`: several training seeds per arm, all on the same episodes."""

    a: list[str] = setting(help="arm A: one checkpoint (or run folder) per seed")
    b: list[str] = setting(help="arm B: as many, seed i paired with A's seed i")
    out: str | None = setting(None, help="JSON file for every model's per-episode accuracies")

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.a) < 2 or len(self.a) != len(self.b):
            raise SettingError("b", f"needs as many seeds as --a (at least 2), got {len(self.b)}")


def run_compare_seeds(settings: CompareSeedsSettings) -> Difference:
    """Each arm's mean accuracy over seeds ± t interval, and the mean paired difference."""
    if settings.out:
        check_writable(settings.out)
    dataset, accuracies = per_episode(settings, [*settings.a, *settings.b])
    means = [float(acc.double().mean()) for acc in accuracies]
    arm_a, arm_b = means[: len(settings.a)], means[len(settings.a) :]
    seeds = len(arm_a)
    for name, arm in (("A", arm_a), ("B", arm_b)):
        mean, half = seeds_ci(arm)
        print(f"{name} ({seeds} seeds): {100 * mean:.2f} ± {100 * half:.2f} % (t interval)")
    difference = paired_seeds_ci(arm_a, arm_b)
    print(difference_line("B - A", difference, f"t interval across {seeds} paired seeds"))
    if settings.out:
        models = [
            {"checkpoint": path, "accuracy": 100 * mean, "accuracies": acc.tolist()}
            for path, mean, acc in zip([*settings.a, *settings.b], means, accuracies, strict=True)
        ]
        record = {"dataset": dataset, "split": settings.split, "difference": asdict(difference)}
        record.update(way=settings.way, shot=settings.shot, query=settings.query)
        record.update(episodes=settings.episodes, seed=settings.seed)
        record.update(a=models[:seeds], b=models[seeds:])
        atomic_write_json(record, settings.out)
    return difference


COMMANDS = [
    Command(
        ("compare",),
        "two checkpoints on the same seeded episodes: B - A ± its paired 95% CI",
        (CompareSettings,),
        run_compare,
    ),
    Command(
        ("compare-seeds",),
        "several training seeds per arm: means and the paired difference across seeds",
        (CompareSeedsSettings,),
        run_compare_seeds,
    ),
]
