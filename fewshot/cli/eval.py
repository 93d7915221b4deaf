"""`fewshot eval`: a checkpoint on seeded test episodes, accuracy ± 95% CI, the result as JSON."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from fewshot.cli.episode_settings import EpisodeSettings
from fewshot.cli.model_settings import (
    ModelSettings,
    check_model_choice,
    checkpoint_setting,
    frozen_backbone_setting,
    method_label,
)
from fewshot.datasets import FOLDER, resolve_data_root
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.folder import list_split
from fewshot.datasets.varied import varied_name
from fewshot.evaluation.episodes import EvalResult, episode_records
from fewshot.methods.base import Method
from fewshot.methods.feature_cache import FOLDER as FEATURES
from fewshot.methods.feature_cache import FeatureMemory
from fewshot.methods.pmf import PMF, PmfAdapter
from fewshot.runtime.device import resolve_device
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_write_json, check_writable, json_differences, prepare_output
from fewshot.runtime.precision import precision_name
from fewshot.runtime.settings import Command, SettingError, setting
from fewshot.training.model_source import (
    Model,
    checkpoint_model,
    result_folder_name,
)

# The checkpoint's settings that decide how its method solves a test episode (the weights are
# named by the checkpoint's hash): recorded with the result, and a rerun must match them.
METHOD_SETTINGS = (
    "stage",
    "method",
    "method_options",
    "head",
    "head_options",
    "eval_head_options",
)


# What a result records but does not depend on: which path named the checkpoint or a frozen
# backbone's weights (their hashes are the identity), and whether the embeddings were cached
# (exact either way).
RECORDED_ONLY = ("checkpoint", "backbone_weights", "models", "cache")
# Results of the models shipped in a checkout's models/ (and of frozen backbones) go to the
# user's results/, not beside the model.
RESULTS = Path("results")


def result_identity(record: dict) -> dict:
    """The part of a result's record that decides the result (a rerun with the same identity
    rewrites it in place)."""
    return {key: value for key, value in record.items() if key not in RECORDED_ONLY}


# Settings a record holds only when given, so that the records of their defaults keep their
# identity (results written before the setting existed included); --resize and --channels: a
# folder read at another geometry is other images, so another result.
RECORDED_WHEN_GIVEN = ("batch_norm", "inner_steps", "resize", "channels")


def given_settings(settings: ModelSettings) -> dict:
    """The settings of RECORDED_WHEN_GIVEN that were given, as a record holds them."""
    values = {key: getattr(settings, key, None) for key in RECORDED_WHEN_GIVEN}
    return {key: value for key, value in values.items() if value is not None}


def shipped(checkpoint: Path) -> bool:
    """Whether a checkpoint is one of a checkout's shipped models: under its models/ folder
    (beside hubconf.py), wherever the installed package is."""
    return any(
        folder.name == "models" and (folder.parent / "hubconf.py").is_file()
        for folder in checkpoint.resolve().parents
    )


@dataclass(frozen=True, kw_only=True)
class EvalSettings(EpisodeSettings):
    """`fewshot eval`: a checkpoint, or a frozen backbone, on seeded episodes; JSON result."""

    checkpoint: str | None = checkpoint_setting()
    backbone: str | None = frozen_backbone_setting("; needs --dataset")
    out: str | None = setting(None, help="JSON result path (default: next to the checkpoint)")
    per_episode: bool = setting(False, help="also write every episode's accuracy to the JSON")
    save_episodes: str | None = setting(
        None,
        help="also write every episode's images (split indices; files for a folder data set), "
        "predictions and accuracy to this JSON file, for fewshot show",
    )
    overwrite: bool = setting(False, help="replace a result of other settings at the --out path")

    def __post_init__(self) -> None:
        check_model_choice(self.checkpoint, self.backbone)
        if self.backbone is not None and self.dataset is None and self.episodes_file is None:
            raise SettingError(
                "dataset", "must be given with --backbone: a frozen backbone has no data set"
            )
        super().__post_init__()
        if self.classifier == PMF and self.save_episodes:
            raise SettingError(
                "save_episodes",
                "does not apply to --classifier pmf: the saved predictions come from fewshot "
                "predict's path, which does not fine-tune",
            )

    @property
    def backbones(self) -> list[str]:
        """--backbone, where given."""
        return [self.backbone] if self.backbone else []

    def model(self, device: torch.device) -> Model:
        """The checkpoint's model, or the frozen backbone's for the evaluated data."""
        if self.checkpoint is not None:
            return checkpoint_model(self.checkpoint, device)
        return self.frozen_model(self.frozen(self.backbone), self.dataset, device)

    def result_path(self, model: Model, dataset: str, record: dict) -> Path:
        """Where the JSON result goes: --out, or a name made of what decides the result
        (`dataset`: its name, or folder-NAME for a folder; a digest of the rest of `record`)
        beside the checkpoint, or in results/ for a model shipped in a checkout's models/ and
        for a frozen backbone (results/backbones/NAME)."""
        if self.out:
            return Path(self.out)
        identity = json.dumps(result_identity(record), sort_keys=True)
        digest = hashlib.sha256(identity.encode()).hexdigest()[:8]
        parts = [
            "eval",
            dataset,
            self.split,
            f"{self.way}w{self.shot}s{self.query}q" if not self.varied else varied_name(self),
            f"{self.episodes}ep",
            f"seed{self.seed}",
            *([record["classifier"]] if record["classifier"] else []),
            record["precision"],
            digest,
        ]
        checkpoint = model.checkpoint
        if checkpoint is None:
            folder = RESULTS / "backbones" / result_folder_name(model.config["backbone"])
        elif shipped(checkpoint):
            folder = RESULTS / checkpoint.parent.name / checkpoint.stem
        else:
            folder = checkpoint.parent
        return folder / ("_".join(parts) + ".json")


def model_record(model: Model) -> dict:
    """What a result records of the model: its identity (checkpoint and hash, or frozen
    backbone) and the settings that decide how its method solves an episode."""
    method_settings = {key: model.config[key] for key in METHOD_SETTINGS if key in model.config}
    return {**model.identity, **json.loads(json.dumps(method_settings))}  # as JSON reads back


def run_eval(settings: EvalSettings) -> EvalResult:
    """`fewshot eval`: load a checkpoint (or a frozen backbone), evaluate on seeded episodes,
    print and write JSON."""
    result, path = evaluate_to_file(settings)
    print(f"result in {path}")
    print(result.line())
    return result


# What `evaluate_to_file` adds to a result's record: a function of the record and the
# per-episode accuracies.
RecordExtra = Callable[[dict, torch.Tensor], dict]


def evaluate_to_file(
    settings: EvalSettings,
    say: Callable[[str], None] = print,
    features: FeatureMemory | None = None,
    extra: RecordExtra | None = None,
    reuse: bool = False,
) -> tuple[EvalResult, Path]:
    """Evaluate as `fewshot eval` does and write the JSON result; return it and its path.
    `say` prints the notes; `features` keeps an embedding method's features of each split in
    memory for the next evaluation of the same model (fewshot bench's cells); `extra` adds to
    the record; `reuse`: where the result file holds this very result, read it back instead."""
    device = resolve_device(settings.device)
    model = settings.model(device)
    method, config = model.method, model.config
    if config.get("freeze_backbone") and model.checkpoint is not None:
        use_run_features(method, model.checkpoint)
    dataset = settings.dataset or config["dataset"]
    settings.prepare(method, config)
    # Everything the result depends on (the episodes per batch does not: see EPISODE_BLOCK).
    record = model_record(model)
    record.update(dataset=dataset, split=settings.split)
    label = dataset
    if dataset == FOLDER:  # which folder: two of them give two results
        root = Path(settings.evaluated_root(config)).resolve()
        record["data_root"], label = str(root), f"folder-{root.name}"
    record.update(
        classifier=settings.classifier_name(model),
        classifier_options=settings.classifier_options,
        # A query's prediction depends on the others: a transductive classifier, or the MAML
        # family's BatchNorm on each episode's queries.
        transductive=method.transductive,
    )
    record.update(given_settings(settings))
    precision = precision_name(settings.amp, device.type)
    settings.check_cache(method, method_label(config))
    record.update(precision=precision)
    record.update(episodes=settings.episodes, way=settings.way, shot=settings.shot)
    record.update(query=settings.query, seed=settings.seed)
    if settings.manifest:  # only then: the records of seeded episodes keep their identity
        record.update(episodes_sha256=settings.manifest.sha256)
    if settings.varied:  # only then: the records of fixed episodes keep their identity
        record.update(varied=True, max_way=settings.shape.max_way)
        record.update(max_support=settings.max_support)
    # Before the work: a result of other settings is kept unless --overwrite.
    path = settings.result_path(model, label, record)
    differences = json_differences(result_identity(record))
    if reuse and path.is_file() and not differences(path):
        summary = json.loads(path.read_text()).get("summary")
        if summary:
            return EvalResult(**summary), path
    out = prepare_output(path, settings.overwrite, differences)
    saved = settings.save_episodes and prepare_output(settings.save_episodes, settings.overwrite)
    if saved and saved.resolve() == out.resolve():
        raise FewshotError(
            f"--save-episodes {settings.save_episodes} is the result's path too: name another "
            "file (one would replace the other)"
        )
    settings.check_method(method)
    [split] = settings.episode_splits(dataset, [(config, model.label)])
    own = getattr(method, "feature_cache", None)  # a frozen backbone's are on disk already
    if features is not None and own is None and features.pays(len(split.labels)):
        method.use_feature_cache(features)
    record["cache"] = cache = settings.cache_for(method, len(split.labels))
    note = settings.cache_note(method, len(split.labels))
    if note and features is None:
        say(note)
    settings.check_evaluation(method, split, device, cache)
    record["dataset_fingerprint"] = split.fingerprint()
    accuracies = settings.accuracies(method, config, split, device, cache)
    result = EvalResult.of(accuracies, settings.shape, settings.seed)
    record.update(asdict(result))
    adapter = getattr(method, "adapter", None)
    if isinstance(adapter, PmfAdapter):
        record.update(adapter.record())
    if settings.per_episode:
        record["accuracies"] = accuracies.tolist()
    if extra is not None:
        record.update(extra(record, accuracies), summary=asdict(result))
    atomic_write_json(record, out)
    if saved:
        write_episodes(settings, method, split, device, record, saved)
        say(f"episodes in {settings.save_episodes} (draw them with fewshot show)")
    return result, path


def use_run_features(method: Method, checkpoint: Path) -> None:
    """A frozen backbone's run: its evaluation cache reads (and adds to) the run folder's
    feature cache, where that folder can be written."""
    try:
        check_writable(checkpoint.parent / FEATURES / ".probe")
    except FewshotError:
        return  # a read-only run: each evaluation embeds its split, as for any model
    method.use_feature_cache(checkpoint.parent / FEATURES)


def write_episodes(
    settings: EvalSettings,
    method: Method,
    split: ImageSplit,
    device: torch.device,
    record: dict,
    out: Path,
) -> None:
    """Every evaluated episode (`episode_records`) with what reads its images back: the data
    set, split, data root and the geometry it was read at (a folder's), its fingerprint, the
    class names and the result."""
    keys = ("checkpoint", "backbone", "dataset", "split", "way", "shot", "query", "seed")
    keys += ("accuracy", "ci95", "dataset_fingerprint")
    root = record.get("data_root") or str(resolve_data_root(settings.data_root).resolve())
    files = None
    if record["dataset"] == FOLDER:  # the split's image files, in the order it was read
        files = [str(path) for path in list_split(Path(root), settings.split).images]
    shape = settings.shape
    batches = settings.episode_batches(shape.episodes_per_batch)
    episodes = episode_records(
        method, split, shape, settings.episodes, settings.seed, device, files, batches
    )
    folder = record["dataset"] == FOLDER
    data = {"data_root": root, "resize": split.image_size if folder else None}
    data["channels"] = split.channels if folder else None
    saved = {key: record[key] for key in keys if key in record}
    saved |= data | {"class_names": split.class_names}
    atomic_write_json({**saved, "episodes": episodes}, out)


COMMANDS = [
    Command(("eval",), "evaluate a checkpoint on seeded test episodes", (EvalSettings,), run_eval)
]
