"""`fewshot eval`: a checkpoint on seeded test episodes, accuracy ± 95% CI, the result as JSON."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from fewshot.datasets import (
    FOLDER,
    channels_setting,
    check_data_options,
    dataset_geometry,
    dataset_names,
    load_split,
    resize_setting,
    resolve_data_root,
)
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.folder import describe_source, list_split
from fewshot.datasets.sampler import EpisodeShape
from fewshot.datasets.varied import (
    MAX_SUPPORT,
    VARIED_HELP,
    VariedShape,
    check_episode_shape,
    check_varied_options,
    varied_name,
    varied_shape,
)
from fewshot.evaluation.episodes import (
    EvalResult,
    cache_pays,
    episode_accuracies,
    episode_records,
    episodes_images,
    evaluation_terms,
)
from fewshot.heads import CLASSIFIERS, TRANSDUCTIVE, check_head, head_names
from fewshot.methods.adaptation import AdaptationMethod
from fewshot.methods.base import Method
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.methods.feature_cache import FOLDER as FEATURES
from fewshot.methods.test_time_finetune import PMF, PmfAdapter, PmfOptions, search_line
from fewshot.runtime.device import device_setting, resolve_device
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import (
    atomic_write_json,
    check_writable,
    json_differences,
    prepare_output,
)
from fewshot.runtime.memory import check_memory
from fewshot.runtime.precision import amp_setting, precision_name
from fewshot.runtime.settings import (
    Command,
    SettingError,
    check_fields,
    check_options,
    refuse_unused,
    seed_setting,
    setting,
)
from fewshot.training.checkpoint import as_trained, check_geometry, polarity_mismatch
from fewshot.training.model_source import (
    DEFAULT_CLASSIFIER,
    NORMALIZATIONS,
    Backbone,
    Model,
    checkpoint_model,
    frozen_geometry,
    frozen_model,
    given_module,
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


# Episodes per head call by default: without the cache each batch runs the backbone; with it
# the head reads stored features, and larger calls save the iterative classifiers' fixed cost
# per call (PT-MAP: 2000 five-way episodes in 181 s at 8 per call, 18 s at 200, on 2 cores).
EPISODES_PER_BATCH = 8
CACHED_EPISODES_PER_BATCH = 200
# BatchNorm's statistics at test time: the trained ones, each episode's own, or the support's
# with each query alone (`ModelSettings.prepare_batch_norm`).
BATCH_NORMS = ("running", "transductive", "per-query")

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
# identity (results written before the setting existed included).
RECORDED_WHEN_GIVEN = ("batch_norm", "inner_steps")


def given_settings(settings: ModelSettings) -> dict:
    """The settings of RECORDED_WHEN_GIVEN that were given, as a record holds them."""
    values = {key: getattr(settings, key) for key in RECORDED_WHEN_GIVEN}
    return {key: value for key, value in values.items() if value is not None}


def method_label(config: dict) -> str:
    """How messages name a model's method: `--method NAME`, pretraining or a frozen backbone."""
    if config.get("stage") == "frozen":
        return "a frozen backbone"
    return f"--method {config['method']}" if "method" in config else "a pretrained model"


def shipped(checkpoint: Path) -> bool:
    """Whether a checkpoint is one of a checkout's shipped models: under its models/ folder
    (beside hubconf.py), wherever the installed package is."""
    return any(
        folder.name == "models" and (folder.parent / "hubconf.py").is_file()
        for folder in checkpoint.resolve().parents
    )


class ClassifierNames:
    """--classifier's names: every test-time classifier and pmf; `in` also finds a plug-in
    head (entry point group `fewshot.heads`), which classifies frozen features as any does."""

    def __iter__(self) -> Iterator[str]:
        return iter((*CLASSIFIERS, PMF))

    def __contains__(self, name: object) -> bool:
        return name == PMF or name in CLASSIFIERS or name in head_names()


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """How a trained model classifies: its precision and test-time classifier."""

    amp: str = amp_setting()
    classifier: str | None = setting(
        None,
        help="test-time classifier on the model's frozen features (embedding methods and "
        "pretrained models; default: the model's own head, nearest centroid for a pretrained "
        "one), or pmf: P>M>F's fine-tuning of the backbone on each episode's support",
        choices=lambda: ClassifierNames(),
    )
    classifier_options: dict = setting(
        help="the classifier's keyword options as JSON, e.g. '{\"cl2n\": true}' (centroid: "
        "SimpleShot's centring on the base-class mean and L2 normalisation), '{\"C\": 1}' or "
        '\'{"steps": 50, "lr": 1e-3}\' (pmf; without lr: chosen on validation episodes; '
        '"batched": a batch\'s episodes at once, default on a GPU)',
        default_factory=dict,
    )

    batch_norm: str | None = setting(
        None,
        help="BatchNorm's statistics: running (the trained ones; embedding methods' default), "
        "transductive (each episode's own: of its support, then of all its queries; the MAML "
        "family's default, and how Relation Networks' code evaluates) or per-query (fewshot "
        "predict, MAML family: the support and each query alone)",
        choices=BATCH_NORMS,
    )
    inner_steps: int | None = setting(
        None,
        help="MAML family: gradient steps on each test episode's support (default: the "
        "checkpoint's eval_inner_steps; the MAML paper tests Omniglot models with 3)",
        low=0,
    )
    backbone_options: dict = setting(
        help="a frozen backbone's keyword options as JSON; for timm: and torchvision: those "
        "of the library's constructor, and '{\"pretrained\": true}' for the library's weights "
        "(network access; without it, download them elsewhere and give --backbone-weights)",
        default_factory=dict,
    )
    backbone_weights: str | None = setting(
        None,
        help="a frozen backbone's weights: a state dict file (of the library's model for "
        "timm:/torchvision:, its classifier's entries ignored), loaded without running code",
    )
    normalization: str = setting(
        "auto",
        help="a frozen backbone's images normalised with the data's mean and std or with the "
        "timm:/torchvision: backbone's own (auto: the backbone's where it has them for the "
        "images' channels)",
        choices=NORMALIZATIONS,
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.backbones:
            refuse_unused(
                self,
                ["backbone_options", "backbone_weights", "normalization"],
                "a checkpoint (they describe a frozen backbone: --backbone)",
            )
        if self.backbone_weights and self.backbone_options.get("pretrained"):
            raise SettingError(
                "backbone_weights", "and pretrained both give the backbone's weights"
            )
        if self.batch_norm == "transductive" and self.classifier == PMF:
            raise SettingError(
                "batch_norm",
                "transductive does not apply with --classifier pmf: it fine-tunes the backbone "
                "on each episode with the trained statistics",
            )
        if self.classifier is None:
            if self.classifier_options:
                raise SettingError("classifier_options", "needs --classifier")
        elif self.classifier == PMF:
            check_options("classifier_options", self.classifier_options, PmfOptions, PMF)
            try:
                PmfOptions(**self.classifier_options)
            except FewshotError as e:
                raise SettingError("classifier_options", str(e)) from None
        else:
            check_options(
                "classifier_options", self.classifier_options, CLASSIFIERS[self.classifier]
            )
            # Its own checks, before any data: the values, then the shape it cannot take.
            for key, (way, shot) in (("classifier_options", (2, 1)), *self.classifier_shape()):
                try:
                    check_head(self.classifier, way, shot, self.classifier_options)
                except FewshotError as e:
                    raise SettingError(key, str(e)) from None

    def classifier_shape(self) -> list[tuple[str, tuple[int, int]]]:
        """The setting that sets the episodes' shape and that shape, where it is known."""
        return []

    @property
    def backbones(self) -> list[str]:
        """The frozen backbones these settings name (none: checkpoints only)."""
        return []

    def frozen(self, name: str) -> Backbone:
        """The frozen backbone `name` with these settings' options and weights, or the module
        given from Python under that name."""
        given = given_module(name)
        if given is not None:
            return given
        return Backbone(name, self.backbone_options, self.backbone_weights, self.normalization)

    def classifier_name(self, model: Model) -> str | None:
        """The test-time classifier a result records: --classifier, a frozen backbone's
        default, or None (the model's own head)."""
        return self.classifier or (DEFAULT_CLASSIFIER if model.frozen else None)

    @property
    def transductive(self) -> bool:
        """Whether the classifier also uses each episode's unlabelled queries, or BatchNorm
        their statistics."""
        return self.classifier in TRANSDUCTIVE or self.batch_norm == "transductive"

    def prepare(self, method: Method, config: dict) -> None:
        """Give a trained method (of checkpoint settings `config`) this evaluation's precision,
        whatever it was trained in, its --batch-norm and the --classifier (refused, before any
        data, for methods that do not classify embeddings)."""
        method.amp = self.amp
        self.prepare_batch_norm(method, config)
        if self.inner_steps is not None:
            if not isinstance(method, AdaptationMethod):
                raise FewshotError(
                    f"--inner-steps does not apply to {method_label(config)}: only the MAML "
                    "family adapts to a test episode by gradient steps"
                )
            method.eval_inner_steps = self.inner_steps
        if self.classifier is None:
            return
        if not isinstance(method, EmbeddingMethod):
            raise FewshotError(
                f"--classifier does not apply to {method_label(config)}: it adapts its whole "
                "network to every episode rather than classifying fixed features"
            )
        if self.classifier == PMF:
            method.use_adapter(PmfAdapter(method, PmfOptions(**self.classifier_options)))
        else:
            method.use_classifier(self.classifier, self.classifier_options)

    def prepare_batch_norm(self, method: Method, config: dict) -> None:
        """--batch-norm, refused where the method has no such statistics: running for the MAML
        family (it keeps none), per-query for embedding methods."""
        if self.batch_norm is None:
            return
        name = method_label(config)
        if isinstance(method, EmbeddingMethod) and method.episode_statistics:
            if self.batch_norm != "transductive":
                raise FewshotError(
                    f"--batch-norm {self.batch_norm} does not apply to {name} of a MAML-family "
                    "checkpoint: its backbone keeps no running statistics and reads each "
                    "episode's (transductive)"
                )
        elif isinstance(method, EmbeddingMethod):
            if self.batch_norm == "per-query":
                raise FewshotError(
                    f"--batch-norm per-query does not apply to {name}: with its trained "
                    "statistics (running, the default) each image's embedding is its own already"
                )
            if self.batch_norm == "transductive":
                method.use_episode_statistics()
        elif self.batch_norm == "running":
            raise FewshotError(
                f"--batch-norm running does not apply to {name}: it keeps no running statistics "
                "and normalises with those of the images it adapts to (transductive or per-query)"
            )
        else:
            method.transductive = self.batch_norm == "transductive"


@dataclass(frozen=True, kw_only=True)
class EpisodeSettings(ModelSettings):
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
    way: int = setting(5, help="classes per episode (with --varied: the fewest)", low=1)
    shot: int = setting(1, help="support images per class (with --varied: the most)", low=1)
    query: int = setting(15, help="query images per class", low=1)
    varied: bool = setting(False, help=VARIED_HELP)
    max_way: int | None = setting(None, help="--varied: the largest way (default: --way)", low=1)
    max_support: int = setting(
        MAX_SUPPORT, help="--varied: the most support images of an episode", low=1
    )
    episodes: int = setting(1000, help="number of seeded episodes (>= 2 for a CI)", low=2)
    episodes_per_batch: int | None = setting(
        None,
        help=f"episodes per head call (memory and speed; the episodes stay the same; default "
        f"{EPISODES_PER_BATCH}, {CACHED_EPISODES_PER_BATCH} with the evaluation cache)",
        low=1,
    )
    seed: int = seed_setting(0, help="seed of the test episodes")
    device: str = device_setting()
    cache: bool | None = setting(
        None,
        help="embed every image of the split once, where that is exact (embedding methods; "
        "by default where the split has fewer images than the episodes); --no-cache: embed "
        "every episode",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_data_options(self)
        check_varied_options(self)
        if self.varied and self.episodes_per_batch not in (None, 1):
            raise SettingError(
                "episodes_per_batch",
                f"must be 1 with --varied (each episode has its own way), got "
                f"{self.episodes_per_batch}",
            )
        if self.batch_norm == "per-query":
            raise SettingError(
                "batch_norm",
                "per-query applies to fewshot predict: the MAML family solves test episodes "
                "with each episode's queries in one batch",
            )
        if self.classifier == PMF and self.cache:
            raise SettingError(
                "cache",
                "does not apply to --classifier pmf: it fine-tunes the backbone on every "
                "episode, so no embedding serves two episodes",
            )

    def classifier_shape(self) -> list[tuple[str, tuple[int, int]]]:
        """--way, with the episodes' way and shot."""
        return [("way", (self.way, self.shot))]

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
        # Summed in float64: features of any finite float32 size have a finite mean.
        return method.embed_split(base, device).double().mean(dim=0).float()

    def training_root(self, config: dict) -> str | None:
        """Where the data a model (of checkpoint settings `config`) was trained on is:
        --data-root; for a folder data set the folder the checkpoint names, unless it is the
        one evaluated on (no --dataset) and --data-root says where it is now."""
        if config["dataset"] == FOLDER and (self.dataset is not None or not self.data_root):
            if not Path(config["data_root"]).is_dir():
                raise FewshotError(
                    f"{config['data_root']}, the folder data set the model was trained on, is "
                    "not there: if it moved, give --data-root where it is now"
                    + (" (and --dataset folder)" if self.dataset is not None else "")
                )
            return config["data_root"]
        return self.data_root

    def evaluated_root(self, config: dict) -> str | None:
        """The data root of the evaluated dataset: --data-root for the one --dataset names,
        the model's own data root for its own dataset (see `training_root`)."""
        return self.data_root if self.dataset else self.training_root(config)

    def frozen_model(
        self, backbone: Backbone, dataset: str, device: torch.device, beside: dict | None = None
    ) -> Model:
        """A frozen backbone for the evaluated data: read as the model of checkpoint settings
        `beside` reads it (compare), else at the data set's own geometry (a folder's at the
        side the backbone was made for, unless --resize)."""
        if beside is None:
            root = self.data_root
            geometry, _ = frozen_geometry(
                backbone, dataset, root, self.split, self.resize, self.channels
            )
        else:
            root, geometry = self.evaluated_root(beside), self.read_geometry(dataset, beside)
        return frozen_model(backbone, dataset, root, geometry, device, self.amp)

    def read_geometry(self, dataset: str, config: dict) -> tuple[int, int]:
        """(channels, side) the episodes' images are read at for the model of checkpoint
        settings `config`, from metadata: a built-in data set's own (it refuses --resize and
        --channels), a folder's at --resize and --channels, by default the model's."""
        channels, side = self.channels, self.resize
        if dataset == FOLDER:
            channels, side = channels or config["in_channels"], side or config["image_size"]
        return dataset_geometry(dataset, self.evaluated_root(config), self.split, side, channels)

    def episode_splits(
        self, dataset: str, trained: list[tuple[dict, str | Path]]
    ) -> list[ImageSplit]:
        """The split the episodes are drawn from, as each model (checkpoint settings, path)
        sees it; the geometry every model expects is checked against the data's from metadata,
        before any image is read. A folder data set is read at --resize and --channels, by
        default at the first model's geometry, said in one line where its first image has
        another (cross-domain evaluation); a built-in dataset has its own."""
        config, path = trained[0]
        root = self.evaluated_root(config)
        geometry = self.read_geometry(dataset, config)
        channels, side = geometry
        for model, checkpoint in trained:
            check_geometry(model, geometry, f"{dataset} split {self.split!r}", checkpoint)
        if dataset == FOLDER:
            own = describe_source(Path(root), self.split)
            if own != f"{channels}x{side}x{side}":
                print(
                    f"{root} {self.split}: its {own} images (the first's geometry) are read "
                    f"as {channels}x{side}x{side}, the geometry of {path}"
                )
        read = {"resize": side, "channels": channels} if dataset == FOLDER else {}
        split = load_split(dataset, self.split, root, **read, per_class=self.per_class)
        for model, checkpoint in trained:
            mismatch = polarity_mismatch(model, split, checkpoint)
            if mismatch:  # its accuracy would be noise; fewshot predict --invert reads them so
                raise FewshotError(
                    f"{root} {self.split}: {mismatch}: evaluate the images' negatives (255 - value)"
                )
        return [as_trained(model, split, checkpoint) for model, checkpoint in trained]

    @property
    def per_class(self) -> int:
        """The images every class of the split must have for these episodes."""
        return (1 if self.varied else self.shot) + self.query

    @property
    def shape(self) -> EpisodeShape | VariedShape:
        """The episode shape these settings ask for."""
        if self.varied:
            return varied_shape(self)
        batch = self.episodes_per_batch or EPISODES_PER_BATCH
        return EpisodeShape(self.way, self.shot, self.query, batch)

    def shape_for(self, cache: bool) -> EpisodeShape | VariedShape:
        """The episode shape, batched as asked or as suits the cache (varied: one a batch)."""
        if self.varied:
            return self.shape
        default = CACHED_EPISODES_PER_BATCH if cache else EPISODES_PER_BATCH
        return replace(self.shape, episodes_per_batch=self.episodes_per_batch or default)

    def check_method(self, method: Method) -> None:
        """Refuse episodes `method` cannot read: of its way and shot, or varied ones (their
        smallest and largest way, unequal shots)."""
        shape = self.shape
        if isinstance(shape, VariedShape):
            if method.episode_statistics:
                raise FewshotError(
                    "--varied does not apply with --batch-norm transductive for an embedding "
                    "method: its support and queries are normalised as one batch each, of one "
                    "shot"
                )
            method.check_way(shape.way)
            method.check_way(shape.max_way)
            method.check_shot(None)
        else:
            method.check_way(shape.way)
            method.check_shot(shape.shot)

    def check_cache(self, method: Method, name: str) -> None:
        """Refuse --cache for `method` (named `name` in messages) where it has none (call this
        before reading data)."""
        if self.cache and method.episode_statistics:
            raise FewshotError(
                f"--cache does not apply to {name} with --batch-norm transductive: each "
                "embedding depends on its episode's statistics"
            )
        if self.cache and not method.caches:
            raise FewshotError(f"--cache does not apply to {name}: it adapts to every episode")

    @property
    def episode_images(self) -> int:
        """The images of all the episodes: what an evaluation without the cache embeds."""
        return episodes_images(self.shape, self.episodes)

    def cache_for(self, method: Method, images: int) -> bool:
        """Whether `method` evaluates with the cache on a split of `images` images: --cache or
        --no-cache, else where it keeps a frozen backbone's features on disk (embedded once
        for every later command), or where it has a cache and the split has fewer images than
        the episodes (embedding it once costs less than embedding every episode)."""
        if self.cache is not None:
            return self.cache
        return kept_features(method) or cache_pays(method, images, self.shape, self.episodes)

    def cache_note(self, method: Method, images: int) -> str | None:
        """The line that says what the default chose for `method` on a split of `images`
        images (None: no choice, the method has no cache or --cache / --no-cache says)."""
        if self.cache is not None or not method.caches:
            return None
        split, episodes = f"split {self.split!r}", f"the {self.episodes} episodes"
        if kept_features(method):
            return (
                f"feature cache: the {images} images of {split} embedded once and kept for "
                "later commands (--no-cache: embed each episode)"
            )
        # Varied episodes' sizes are drawn: the count is their largest.
        count = f"up to {self.episode_images}" if self.varied else self.episode_images
        if self.cache_for(method, images):
            return (
                f"evaluation cache: the {images} images of {split} embedded once, fewer than "
                f"the {count} of {episodes} (--no-cache: embed each episode)"
            )
        return (
            f"no evaluation cache: the {count} images of {episodes} embedded, "
            f"fewer than the {images} of {split} (--cache: embed the split once)"
        )

    def check_evaluation(
        self, method: Method, split: ImageSplit, device: torch.device, cache: bool
    ) -> None:
        """Refuse, before any work, episodes that `split` cannot give (from its labels), then
        an evaluation whose memory cannot fit, estimated on the batches that will run (never
        more episodes than --episodes) with the cache on or off."""
        check_episode_shape(split.labels, self.shape, split.source)
        shape = self.shape_for(cache)
        terms = evaluation_terms(method, shape, self.episodes, len(split.labels), cache)
        if terms:
            check_memory(terms, device, "the evaluation")

    def choose_finetune_lr(self, method: Method, config: dict, device: torch.device) -> None:
        """--classifier pmf without an lr: each candidate tried on `val_episodes` seeded
        episodes (these settings' shape and seed) of the validation split of the data the model
        (of checkpoint settings `config`) was trained on, as P>M>F chooses it; the best kept
        and said in one line, naming the model."""
        adapter = getattr(method, "adapter", None)
        if not isinstance(adapter, PmfAdapter) or adapter.lr is not None:
            return
        dataset, split = config["dataset"], config["val_split"]
        geometry = {"resize": config["resize"], "channels": config["channels"]}
        root = self.training_root(config)
        val = load_split(dataset, split, root, **geometry, per_class=self.per_class)
        val = as_trained(config, val, dataset)
        check_episode_shape(val.labels, self.shape, val.source)
        episodes = adapter.options.val_episodes
        means = adapter.choose_lr(
            lambda: episode_accuracies(
                method, val, self.shape, episodes, self.seed, device, cache=False
            )
        )
        where = f"for {method.source} on {episodes} episodes of {dataset} split {split!r}"
        print(search_line(means, adapter.lr, where))

    def accuracies(
        self, method: Method, config: dict, split: ImageSplit, device: torch.device, cache: bool
    ) -> torch.Tensor:
        """Per-episode accuracies of a prepared method (of checkpoint settings `config`, see
        `prepare`) on these episodes, once `check_evaluation` has passed."""
        center = self.base_center(method, config, device)
        if center is not None:
            method.head_options["center"] = center
        self.choose_finetune_lr(method, config, device)
        shape = self.shape_for(cache)
        return episode_accuracies(
            method, split, shape, self.episodes, self.seed, device, cache, progress=True
        )


@dataclass(frozen=True, kw_only=True)
class EvalSettings(EpisodeSettings):
    """`fewshot eval`: a checkpoint, or a frozen backbone, on seeded episodes; JSON result."""

    checkpoint: str | None = setting(
        None, help="a .pt file written by fewshot train or pretrain (or its run folder)"
    )
    backbone: str | None = setting(
        None,
        help="instead of --checkpoint, a frozen backbone with no training: conv4, resnet12 "
        "(with --backbone-weights FILE), timm:NAME or torchvision:NAME, classified by "
        f"--classifier (default {DEFAULT_CLASSIFIER}); needs --dataset",
    )
    out: str | None = setting(None, help="JSON result path (default: next to the checkpoint)")
    per_episode: bool = setting(False, help="also write every episode's accuracy to the JSON")
    save_episodes: str | None = setting(
        None,
        help="also write every episode's images (split indices; files for a folder data set), "
        "predictions and accuracy to this JSON file, for fewshot show",
    )
    overwrite: bool = setting(False, help="replace a result of other settings at the --out path")

    def __post_init__(self) -> None:
        if self.checkpoint is None and self.backbone is None:
            raise SettingError("checkpoint", "is required, or --backbone for a frozen backbone")
        if self.checkpoint is not None and self.backbone is not None:
            raise SettingError("backbone", "and --checkpoint both name the model: give one")
        if self.backbone is not None and self.dataset is None:
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
    if settings.varied:  # only then: the records of fixed episodes keep their identity
        record.update(varied=True, max_way=settings.shape.max_way)
        record.update(max_support=settings.max_support)
    # Before the work: a result of other settings is kept unless --overwrite.
    path = settings.result_path(model, label, record)
    out = prepare_output(path, settings.overwrite, json_differences(result_identity(record)))
    saved = settings.save_episodes and prepare_output(settings.save_episodes, settings.overwrite)
    if saved and saved.resolve() == out.resolve():
        raise FewshotError(
            f"--save-episodes {settings.save_episodes} is the result's path too: name another "
            "file (one would replace the other)"
        )
    settings.check_method(method)
    [split] = settings.episode_splits(dataset, [(config, model.label)])
    record["cache"] = cache = settings.cache_for(method, len(split.labels))
    note = settings.cache_note(method, len(split.labels))
    if note:
        print(note)
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
    atomic_write_json(record, out)
    print(f"result in {path}")
    if saved:
        write_episodes(settings, method, split, device, record, saved)
        print(f"episodes in {settings.save_episodes} (draw them with fewshot show)")
    print(result.line())
    return result


def kept_features(method: Method) -> bool:
    """Whether `method` keeps its frozen backbone's features on disk (a feature cache)."""
    return method.caches and getattr(method, "feature_cache", None) is not None


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
    episodes = episode_records(
        method, split, settings.shape, settings.episodes, settings.seed, device, files
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
