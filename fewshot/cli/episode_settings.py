"""`EpisodeSettings`: which seeded test episodes, from which data and device, and running them."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from fewshot.cli.model_settings import ModelSettings
from fewshot.datasets import (
    FOLDER,
    channels_setting,
    check_data_options,
    dataset_geometry,
    dataset_names,
    load_split,
    resize_setting,
)
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.folder import describe_source
from fewshot.datasets.sampler import EpisodeShape
from fewshot.datasets.varied import (
    MAX_SUPPORT,
    VARIED_HELP,
    VariedShape,
    check_episode_shape,
    check_varied_options,
    varied_shape,
)
from fewshot.evaluation.episodes import (
    cache_pays,
    episode_accuracies,
    episodes_images,
    evaluation_terms,
)
from fewshot.evaluation.manifests import Manifest, read_manifest
from fewshot.methods.base import Method
from fewshot.methods.pmf import PMF, PmfAdapter, search_line
from fewshot.runtime.device import device_setting
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.memory import check_memory
from fewshot.runtime.settings import SettingError, seed_setting, setting
from fewshot.training.checkpoint import as_trained, check_geometry, polarity_mismatch
from fewshot.training.model_source import Backbone, Model, frozen_geometry, frozen_model

# Episodes per head call by default: without the cache each batch runs the backbone; with it
# the head reads stored features, and larger calls save the iterative classifiers' fixed cost
# per call (PT-MAP: 2000 five-way episodes in 181 s at 8 per call, 18 s at 200, on 2 cores).
EPISODES_PER_BATCH = 8
CACHED_EPISODES_PER_BATCH = 200
# The episodes' settings where neither a flag nor --episodes-file gives them.
EPISODE_DEFAULTS = {"way": 5, "shot": 1, "query": 15, "episodes": 1000, "seed": 0}


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
    way: int | None = setting(
        None, help="classes per episode (with --varied: the fewest; default 5)", low=1
    )
    shot: int | None = setting(
        None, help="support images per class (with --varied: the most; default 1)", low=1
    )
    query: int | None = setting(None, help="query images per class (default 15)", low=1)
    varied: bool = setting(False, help=VARIED_HELP)
    max_way: int | None = setting(None, help="--varied: the largest way (default: --way)", low=1)
    max_support: int = setting(
        MAX_SUPPORT, help="--varied: the most support images of an episode", low=1
    )
    episodes: int | None = setting(
        None,
        help="number of seeded episodes (>= 2 for a CI; default 1000, with --episodes-file all "
        "of its)",
        low=2,
    )
    episodes_per_batch: int | None = setting(
        None,
        help=f"episodes per head call (memory and speed; the episodes stay the same; default "
        f"{EPISODES_PER_BATCH}, {CACHED_EPISODES_PER_BATCH} with the evaluation cache)",
        low=1,
    )
    seed: int | None = seed_setting(None, help="seed of the test episodes (default 0)")
    device: str = device_setting()
    cache: bool | None = setting(
        None,
        help="embed every image of the split once, where that is exact (embedding methods; "
        "by default where the split has fewer images than the episodes); --no-cache: embed "
        "every episode",
    )
    episodes_file: str | None = setting(
        None,
        help="a manifest of episodes (.npz, written by fewshot bench) to evaluate in place of "
        "seeded ones: its data set, split, way, shot, query and seed (--episodes: its first N; "
        "default all)",
    )

    def __post_init__(self) -> None:
        # The episodes' settings first: the model's settings check a classifier on them.
        if self.episodes_file is not None:
            self.take_manifest()
        for key, value in EPISODE_DEFAULTS.items():  # what was not given, nor by a manifest
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
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

    @functools.cached_property
    def manifest(self) -> Manifest | None:
        """The episodes of --episodes-file, read and checked (None without it)."""
        return read_manifest(self.episodes_file) if self.episodes_file else None

    def take_manifest(self) -> None:
        """Take the episodes' settings from --episodes-file: a flag that says otherwise is
        refused; --episodes N takes its first N."""
        info = self.manifest.info
        if self.varied:
            raise SettingError("varied", "does not apply with --episodes-file: its episodes are")
        for key in ("dataset", "split", "way", "shot", "query", "seed"):
            value, wanted = getattr(self, key), getattr(info, key)
            given = value is not None and not (key == "split" and value == "test")
            if given and value != wanted:
                raise SettingError(
                    key,
                    f"is {wanted!r} in --episodes-file {self.episodes_file} (its episodes decide "
                    f"it), got {value!r}: leave it out",
                )
            object.__setattr__(self, key, wanted)
        if self.episodes is None:
            object.__setattr__(self, "episodes", info.episodes)
        elif self.episodes > info.episodes:
            raise SettingError(
                "episodes",
                f"is at most {info.episodes}, the episodes of --episodes-file "
                f"{self.episodes_file}, got {self.episodes}",
            )

    def episode_batches(self, batch: int) -> Iterator[torch.Tensor] | None:
        """The episodes of --episodes-file in batches of `batch` (None: the seeded ones)."""
        return self.manifest.batches(batch, self.episodes) if self.manifest else None

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
            geometry = frozen_geometry(
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
        if self.manifest:
            self.manifest.check_split(split, f"--episodes-file {self.episodes_file}")
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
        batches = self.episode_batches(shape.episodes_per_batch)
        return episode_accuracies(
            method, split, shape, self.episodes, self.seed, device, cache, True, None, batches
        )


def kept_features(method: Method) -> bool:
    """Whether `method` keeps its frozen backbone's features on disk (a feature cache)."""
    return method.caches and getattr(method, "feature_cache", None) is not None
