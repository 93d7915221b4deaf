"""`fewshot compare` and `fewshot compare-seeds`: models tested on the very same episodes.

`compare A.pt B.pt` gives each accuracy ± 95% CI and the difference B - A ± its paired CI over
episodes. `compare-seeds --a A1 A2 ... --b B1 B2 ...` takes several training seeds per arm
(seed i of one arm paired with seed i of the other) and gives each arm's mean over seeds and
the mean paired difference, with t intervals across seeds.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from fewshot.cli.episode_settings import EpisodeSettings
from fewshot.cli.eval import given_settings, result_identity
from fewshot.cli.model_settings import method_label
from fewshot.evaluation.episodes import EvalResult
from fewshot.evaluation.stats import Difference, paired_ci, paired_seeds_ci, seeds_ci
from fewshot.methods.feature_cache import backbone_digest
from fewshot.runtime.device import resolve_device
from fewshot.runtime.io import atomic_write_json, file_sha256, json_differences, prepare_output
from fewshot.runtime.settings import Command, SettingError, setting
from fewshot.training.checkpoint import checkpoint_file
from fewshot.training.model_source import Model, checkpoint_model, given_module, module_identity


def names_backbone(arm: str) -> bool:
    """Whether a comparison's arm names a frozen backbone (conv4, timm:NAME, ...) rather than
    a checkpoint: no such file or folder, and not a path or a .pt file's name."""
    path = Path(arm)
    return not path.exists() and len(path.parts) == 1 and path.suffix not in (".pt", ".pth")


def arm_models(
    settings: EpisodeSettings, arms: list[str], device: torch.device
) -> tuple[str, list[Model]]:
    """The data set of the comparison and every arm's model: checkpoints first, then the
    frozen backbones, read as the first checkpoint's model reads the data."""
    loaded = {arm: checkpoint_model(arm, device) for arm in arms if not names_backbone(arm)}
    trained_on = {model.config["dataset"] for model in loaded.values()}
    if settings.dataset is None and len(trained_on) != 1:
        why = (
            f"the models were trained on {', '.join(sorted(trained_on))}"
            if trained_on
            else ("frozen backbones have no data set")
        )
        raise SettingError("dataset", f"must be given: {why}")
    dataset = settings.dataset or trained_on.pop()
    beside = next((model.config for model in loaded.values()), None)
    models = [
        loaded[arm]
        if arm in loaded
        else settings.frozen_model(settings.frozen(arm), dataset, device, beside)
        for arm in arms
    ]
    return dataset, models


def per_episode(settings: EpisodeSettings, arms: list[str]) -> tuple[str, list[torch.Tensor]]:
    """Every model's per-episode accuracies on the same seeded episodes, and the dataset."""
    device = resolve_device(settings.device)
    dataset, models = arm_models(settings, arms, device)
    for model in models:
        settings.prepare(model.method, model.config)
        settings.check_method(model.method)
        settings.check_cache(model.method, method_label(model.config))
    # Each model sees the images as it was trained to (its geometry, its normalisation).
    splits = settings.episode_splits(dataset, [(model.config, model.label) for model in models])
    images = len(splits[0].labels)  # the same split, seen at each model's geometry
    caches = [settings.cache_for(model.method, images) for model in models]
    for note in dict.fromkeys(settings.cache_note(model.method, images) for model in models):
        if note:
            print(note)
    # Every model's evaluation checked before the first one's work.
    for model, data, cache in zip(models, splits, caches, strict=True):
        settings.check_evaluation(model.method, data, device, cache)
    return dataset, [
        settings.accuracies(model.method, model.config, data, device, cache)
        for model, data, cache in zip(models, splits, caches, strict=True)
    ]


def identity(settings: CompareSettings | CompareSeedsSettings) -> dict:
    """What a comparison is computed with: the episodes, how they are evaluated (precision,
    cache), the models' paths and the hashes of their checkpoint files (the paths and the
    cache recorded only: see `result_identity`)."""
    models = [settings.a, settings.b]
    paths = [p for arm in models for p in (arm if isinstance(arm, list) else [arm])]
    # The dataset only when asked for: the record names the one used (the models' by default).
    record = {"dataset": settings.dataset} if settings.dataset else {}
    record.update(split=settings.split, way=settings.way, shot=settings.shot)
    record.update(query=settings.query, episodes=settings.episodes)
    record.update(seed=settings.seed, amp=settings.amp, cache=settings.cache, models=models)
    record.update(
        classifier=settings.classifier,
        classifier_options=settings.classifier_options,
        transductive=settings.transductive,
    )
    record.update(given_settings(settings))
    if settings.data_root:  # other data under the same name is another comparison
        record.update(data_root=str(Path(settings.data_root).resolve()))
    if settings.normalization != "auto":
        record.update(normalization=settings.normalization)
    if settings.manifest:
        record.update(episodes_sha256=settings.manifest.sha256)
    record["checkpoint_sha256"] = [arm_digest(settings, p) for p in paths]
    return record


def arm_digest(settings: EpisodeSettings, arm: str) -> str:
    """What names an arm's weights before any is built: its checkpoint file's SHA-256, or a
    frozen backbone's name, options and weights file's SHA-256 (a module's from Python: its
    weights', class and structure)."""
    if not names_backbone(arm):
        return file_sha256(checkpoint_file(arm))
    given = given_module(arm)
    if given is not None:
        parts = [arm, backbone_digest(given.module, ""), *module_identity(given.module).values()]
        return ":".join(parts)
    weights = settings.backbone_weights
    parts = [arm, json.dumps(settings.backbone_options, sort_keys=True)]
    return ":".join([*parts, file_sha256(weights) if weights else "initialised"])


def prepare_record(settings: CompareSettings | CompareSeedsSettings) -> Path | None:
    """Check --out before the work: a file of other models, weights or episodes is kept
    unless --overwrite (the same comparison may be written again)."""
    if not settings.out:
        return None
    differences = json_differences(result_identity(identity(settings)))
    return prepare_output(settings.out, settings.overwrite, differences)


def episodes_record(
    settings: CompareSettings | CompareSeedsSettings, dataset: str, difference: Difference
) -> dict:
    """The JSON record's common part: what it was computed with, and the difference."""
    return {**identity(settings), "dataset": dataset, "difference": asdict(difference)}


def difference_line(label: str, d: Difference, unit: str) -> str:
    """'B - A: +0.68 ± 0.15 % (...)'."""
    spread = f"{100 * d.mean:+.2f} ± {100 * d.ci95:.2f} %"
    return f"{label}: {spread} ({unit}; {d.test} p = {d.p_value:.3g})"


@dataclass(frozen=True, kw_only=True)
class CompareSettings(EpisodeSettings):
    """`fewshot compare`: two checkpoints on the same seeded episodes."""

    a: str = setting(
        help="checkpoint (or run folder) A, or a frozen backbone's name (conv4, resnet12, "
        "timm:NAME, torchvision:NAME; its weights by --backbone-weights)",
        positional=True,
    )
    b: str = setting(help="checkpoint (or run folder) B, or a frozen backbone", positional=True)
    out: str | None = setting(None, help="JSON file for both models' per-episode accuracies")
    overwrite: bool = setting(False, help="replace another comparison at the --out path")

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.backbones) == 2 and (self.backbone_weights or self.backbone_options):
            raise SettingError(
                "backbone_weights" if self.backbone_weights else "backbone_options",
                "applies to one frozen backbone, and both arms are: compare one of them with "
                "its weights against a checkpoint, or two modules from Python (fewshot.compare)",
            )

    @property
    def backbones(self) -> list[str]:
        """The arms that name frozen backbones."""
        return [arm for arm in (self.a, self.b) if names_backbone(arm)]


def run_compare(settings: CompareSettings) -> Difference:
    """Print A and B's accuracies ± CI and B - A ± its paired CI; optionally write JSON."""
    out = prepare_record(settings)
    dataset, (acc_a, acc_b) = per_episode(settings, [settings.a, settings.b])
    results = [EvalResult.of(acc, settings.shape, settings.seed) for acc in (acc_a, acc_b)]
    for name, path, result in zip("AB", (settings.a, settings.b), results, strict=True):
        print(f"{name} {path}: {result.accuracy:.2f} ± {result.ci95:.2f} %")
    difference = paired_ci(acc_a, acc_b)
    print(difference_line("B - A", difference, f"paired 95% CI over {difference.n} episodes"))
    if out:
        record = episodes_record(settings, dataset, difference)
        for name, path, result, acc in zip(
            "ab", (settings.a, settings.b), results, (acc_a, acc_b), strict=True
        ):
            record[name] = {**asdict(result), "checkpoint": path, "accuracies": acc.tolist()}
        atomic_write_json(record, out)
    return difference


@dataclass(frozen=True, kw_only=True)
class CompareSeedsSettings(EpisodeSettings):
    """`fewshot compare-seeds`: several training seeds per arm, all on the same episodes."""

    a: list[str] = setting(help="arm A: one checkpoint (or run folder) per seed")
    b: list[str] = setting(help="arm B: as many, seed i paired with A's seed i")
    out: str | None = setting(None, help="JSON file for every model's per-episode accuracies")
    overwrite: bool = setting(False, help="replace another comparison at the --out path")

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.a) < 2 or len(self.a) != len(self.b):
            raise SettingError("b", f"needs as many seeds as --a (at least 2), got {len(self.b)}")


def run_compare_seeds(settings: CompareSeedsSettings) -> Difference:
    """Each arm's mean accuracy over seeds ± t interval, and the mean paired difference."""
    out = prepare_record(settings)
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
        record = episodes_record(settings, dataset, difference)
        record.update(a=models[:seeds], b=models[seeds:])
        atomic_write_json(record, out)
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
