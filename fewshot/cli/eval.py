"""`fewshot eval`: a checkpoint on seeded test episodes, accuracy ± 95% CI, the result as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from fewshot.datasets import (
    FOLDER,
    channels_setting,
    check_data_options,
    dataset_names,
    load_split,
    resize_setting,
)
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.folder import describe_source
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import EvalResult, episode_accuracies
from fewshot.heads import CLASSIFIERS, TRANSDUCTIVE
from fewshot.methods.base import Method
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.runtime.device import device_setting, resolve_device
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_write_json, file_sha256, prepare_output, same_json
from fewshot.runtime.memory import MemoryTerm, check_memory
from fewshot.runtime.precision import amp_setting, precision_name
from fewshot.runtime.settings import (
    Command,
    SettingError,
    check_fields,
    check_options,
    seed_setting,
    setting,
)
from fewshot.training.checkpoint import as_trained, checkpoint_file, load_trained

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


def method_label(config: dict) -> str:
    """How messages name a checkpoint's method: `--method NAME`, or pretraining."""
    return f"--method {config['method']}" if "method" in config else "a pretrained model"


@dataclass(frozen=True, kw_only=True)
class EpisodeSettings:
    """Which seeded test episodes, drawn from which data, on which device."""

    dataset: str | None = setting(
        None, help="dataset to evaluate on (default: the training dataset)", choices=dataset_names
    )
    split: str = setting("test", help="split to draw the episodes from")
    data_root: str | None = setting(
        None,
        help="data folder (default: $FEWSHOT_DATA or the repository's data/; for a model "
        "trained on a folder data set, evaluated on it: that folder)",
    )
    resize: int | None = resize_setting()
    channels: int | None = channels_setting()
    way: int = setting(5, help="classes per episode", low=1)
    shot: int = setting(1, help="support images per class", low=1)
    query: int = setting(15, help="query images per class", low=1)
    episodes: int = setting(1000, help="number of seeded episodes (>= 2 for a CI)", low=2)
    episodes_per_batch: int = setting(
        8, help="episodes per head call (memory and speed; the episodes stay the same)", low=1
    )
    seed: int = seed_setting(0, help="seed of the test episodes")
    device: str = device_setting()
    cache: bool | None = setting(
        None,
        help="embed every image once, where that is exact (embedding methods, the default "
        "there); --no-cache: embed every episode",
    )
    amp: str = amp_setting()
    classifier: str | None = setting(
        None,
        help="test-time classifier on the model's frozen features (embedding methods and "
        "pretrained models; default: the model's own head, nearest centroid for a pretrained one)",
        choices=lambda: tuple(CLASSIFIERS),
    )
    classifier_options: dict = setting(
        help="the classifier's keyword options as JSON, e.g. '{\"cl2n\": true}' (centroid: "
        "SimpleShot's centring on the base-class mean and L2 normalisation) or '{\"C\": 1}'",
        default_factory=dict,
    )

    def __post_init__(self) -> None:
        check_fields(self)
        check_data_options(self)
        if self.classifier is None:
            if self.classifier_options:
                raise SettingError("classifier_options", "needs --classifier")
        else:
            check_options(
                "classifier_options", self.classifier_options, CLASSIFIERS[self.classifier]
            )

    @property
    def transductive(self) -> bool:
        """Whether the classifier also uses each episode's unlabelled queries."""
        return self.classifier in TRANSDUCTIVE

    def use_classifier(self, method: Method, config: dict) -> None:
        """Give an embedding method the --classifier (refused, before any data, for methods
        that do not classify embeddings)."""
        if self.classifier is None:
            return
        if not isinstance(method, EmbeddingMethod):
            raise FewshotError(
                f"--classifier does not apply to {method_label(config)}: it adapts its whole "
                "network to every episode rather than classifying fixed features"
            )
        method.use_classifier(self.classifier, self.classifier_options)

    def base_center(
        self, method: Method, config: dict, device: torch.device
    ) -> torch.Tensor | None:
        """SimpleShot's base-class mean feature for centroid's CL2N: the mean embedding of
        the model's training split (None when the classifier does not centre)."""
        if not self.classifier_options.get("cl2n"):
            return None
        base = load_split(
            config["dataset"],
            config["train_split"],
            self.training_root(config),
            resize=config["resize"],
            channels=config["channels"],
        )
        base = as_trained(config, base, config["dataset"])
        return method.embed_split(base, device).mean(dim=0)

    def training_root(self, config: dict) -> str | None:
        """Where the data a model (of checkpoint settings `config`) was trained on is:
        --data-root; for a folder data set the folder the checkpoint names, unless it is the
        one evaluated on (no --dataset) and --data-root says where it is now."""
        if config["dataset"] == FOLDER and (self.dataset is not None or not self.data_root):
            return config["data_root"]
        return self.data_root

    def evaluated_root(self, config: dict) -> str | None:
        """The data root of the evaluated dataset: --data-root for the one --dataset names,
        the model's own data root for its own dataset (see `training_root`)."""
        return self.data_root if self.dataset else self.training_root(config)

    def episode_split(self, dataset: str, config: dict, path: str | Path) -> ImageSplit:
        """The split the episodes are drawn from. A folder data set is read at --resize and
        --channels, by default at the geometry of checkpoint `path` (settings `config`), said
        in one line where its first image has another (cross-domain evaluation); a built-in
        dataset has its own."""
        root, channels, side = self.evaluated_root(config), self.channels, self.resize
        if dataset == FOLDER:
            channels, side = channels or config["in_channels"], side or config["image_size"]
            own = describe_source(Path(root), self.split)
            if own != f"{channels}x{side}x{side}":
                print(
                    f"{root} {self.split}: its {own} images (the first's geometry) are read "
                    f"as {channels}x{side}x{side}, the geometry of {path}"
                )
        pool = self.shot + self.query  # a built-in dataset refuses --resize and --channels
        return load_split(dataset, self.split, root, resize=side, channels=channels, per_class=pool)

    @property
    def shape(self) -> EpisodeShape:
        """The episode shape these settings ask for."""
        return EpisodeShape(self.way, self.shot, self.query, self.episodes_per_batch)

    def cache_for(self, method: Method, name: str) -> bool:
        """Whether `method` (named `name` in messages) evaluates with the cache: by default where
        it has one; --cache where it has none is refused (call this before reading data)."""
        if self.cache and not method.caches:
            raise FewshotError(f"--cache does not apply to {name}: it adapts to every episode")
        return method.caches if self.cache is None else self.cache

    def accuracies(
        self, method: Method, config: dict, split: ImageSplit, device: torch.device, cache: bool
    ) -> torch.Tensor:
        """Per-episode accuracies of a trained method (of checkpoint settings `config`) on these
        episodes, in this evaluation's precision (whatever it was trained in), with its
        --classifier, once their memory is known to fit."""
        method.amp = self.amp
        pool = self.shot + self.query
        terms = method.memory_terms(self.episodes_per_batch, self.way, pool, self.shot, 1, False)
        if terms:
            cached = method.cache_bytes(len(split.labels)) if cache else 0
            what = f"the cached embeddings of {len(split.labels)} images"
            check_memory([*terms, MemoryTerm(cached, what, "--no-cache")], device, "the evaluation")
        center = self.base_center(method, config, device)
        if center is not None:
            method.head_options["center"] = center
        return episode_accuracies(
            method, split, self.shape, self.episodes, self.seed, device, cache, progress=True
        )


@dataclass(frozen=True, kw_only=True)
class EvalSettings(EpisodeSettings):
    """`fewshot eval`: a checkpoint on seeded episodes, the result as JSON."""

    checkpoint: str = setting(help="a .pt file written by fewshot train (or its run folder)")
    out: str | None = setting(None, help="JSON result path (default: next to the checkpoint)")
    per_episode: bool = setting(False, help="also write every episode's accuracy to the JSON")
    overwrite: bool = setting(False, help="replace a result of other settings at the --out path")

    def result_path(self, checkpoint: Path, dataset: str) -> Path:
        """Where the JSON result goes (`dataset`: its name, or folder-NAME for a folder)."""
        if self.out:
            return Path(self.out)
        name = f"eval_{dataset}_{self.split}_{self.way}w{self.shot}s_seed{self.seed}.json"
        return checkpoint.with_name(name)


def run_eval(settings: EvalSettings) -> EvalResult:
    """`fewshot eval`: load a checkpoint, evaluate on seeded episodes, print and write JSON."""
    device = resolve_device(settings.device)
    checkpoint = checkpoint_file(settings.checkpoint)
    method, config = load_trained(checkpoint, device)
    dataset = settings.dataset or config["dataset"]
    settings.use_classifier(method, config)
    # Everything the result depends on (the episodes per batch does not: see EPISODE_BLOCK).
    record = {"checkpoint": str(checkpoint), "checkpoint_sha256": file_sha256(checkpoint)}
    method_settings = {key: config[key] for key in METHOD_SETTINGS if key in config}
    record.update(json.loads(json.dumps(method_settings)))  # as the JSON file reads back
    record.update(dataset=dataset, split=settings.split)
    label = dataset
    if dataset == FOLDER:  # which folder: two of them give two results
        root = Path(settings.evaluated_root(config)).resolve()
        record["data_root"], label = str(root), f"folder-{root.name}"
    record.update(
        classifier=settings.classifier,
        classifier_options=settings.classifier_options,
        transductive=settings.transductive,
    )
    precision = precision_name(settings.amp, device.type)
    cache = settings.cache_for(method, method_label(config))
    record.update(cache=cache, precision=precision)
    record.update(episodes=settings.episodes, way=settings.way, shot=settings.shot)
    record.update(query=settings.query, seed=settings.seed)
    # Before the work: a result of other settings is kept unless --overwrite.
    out = prepare_output(
        settings.result_path(checkpoint, label), settings.overwrite, same_json(record)
    )
    method.check_way(settings.way)
    split = as_trained(config, settings.episode_split(dataset, config, checkpoint), checkpoint)
    record["dataset_fingerprint"] = split.fingerprint()
    accuracies = settings.accuracies(method, config, split, device, cache)
    result = EvalResult.of(accuracies, settings.shape, settings.seed)
    print(result.line())
    record.update(asdict(result))
    if settings.per_episode:
        record["accuracies"] = accuracies.tolist()
    atomic_write_json(record, out)
    return result


COMMANDS = [
    Command(("eval",), "evaluate a checkpoint on seeded test episodes", (EvalSettings,), run_eval)
]
