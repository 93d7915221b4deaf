"""Embedding methods (ProtoNet, ridge, SVM): a backbone embeds every image once, a head function
classifies each episode's queries from its support embeddings, times a learnable scale.

Their fast paths live here: EHG re-splits index the embeddings of one forward pass, and test
episodes index the embeddings of every image computed once (exact with BatchNorm in eval mode).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from fewshot.backbones import build_backbone
from fewshot.backbones.footprint import activation_elements
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.batches import episode_images, images_to_device
from fewshot.datasets.varied import VariedShape, index_shot
from fewshot.heads import CLASSIFIERS, HEADS, REGULARISATION, TRANSDUCTIVE
from fewshot.methods.adapters import Adapter, episode_seeds, own_statistics
from fewshot.methods.base import (
    EpisodeSolver,
    Method,
    check_episodes,
    class_labels,
    describe_scales,
    scale_cause,
)
from fewshot.methods.feature_cache import FeatureCache, FeatureMemory, backbone_digest
from fewshot.methods.resplit import Shot, embed_varied, episode_logits, episode_loss, query_accuracy
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.memory import MemoryTerm
from fewshot.runtime.precision import autocast_dtype, precision_name
from fewshot.runtime.signals import Stop, check_stop

# Images per backbone call when the evaluation cache embeds a whole split.
EMBED_BATCH = 512
# The learned scale's starting value per head: Meta-Baseline's cosine logits start at 10
# (cosines alone are too flat for a softmax); the distance heads start at 1.
INITIAL_SCALES = {"cosine": 10.0}
# Why a test classifier's scores are non-finite when the features' scale is not the cause.
CLASSIFIER_DIVERGED = "the classifier diverged on them (its options: --classifier-options)"


class EmbeddingMethod(Method):
    """Embeds images with `backbone` and classifies episodes with a head function."""

    caches = True
    loss = "cross_entropy"  # of the query logits (see episode_loss)
    # Logistic regression fits in float64 (fewshot.heads.logistic): any float32 features' squares
    # and products fit there (tests/test_nonfinite_scores.py: the unscaled model's accuracy).
    scale_remedy = "rescale or retrain it; --classifier logistic, fitted in float64, reads them"
    # A test-time classifier that fine-tunes the backbone on every episode (P>M>F, see
    # fewshot.methods.pmf): (split, shot, device, stop) -> the episodes' solver.
    adapter: Adapter | None = None
    # A frozen backbone's features on disk (`use_feature_cache`), else None: embedded anew.
    feature_cache: FeatureCache | FeatureMemory | None = None
    # What else decides the features besides the backbone's class, weights and precision (a
    # frozen backbone's name and options: fewshot.training.model_source.features_identity).
    feature_identity: str = ""
    # With `episode_statistics` (`use_episode_statistics`): the backbone's BatchNorm layers
    # alone read each episode's statistics, or the whole model's.
    backbone_statistics_only = False

    def __init__(
        self,
        backbone: nn.Module,
        head: str,
        head_options: dict | None = None,
        eval_head_options: dict | None = None,
        amp: str = "auto",
        label_smoothing: float = 0.0,
    ):
        super().__init__()
        self.amp = amp  # resolved on the device of each call ('auto': bf16 where native)
        self.backbone = backbone
        self.head_name = head
        self.head_fn = HEADS[head]
        self.head_options = dict(head_options or {})
        # Options that apply in eval mode only (e.g. fewer SVM iterations in testing).
        self.eval_head_options = dict(eval_head_options or {})
        self.label_smoothing = label_smoothing
        self.scale = nn.Parameter(torch.tensor(INITIAL_SCALES.get(head, 1.0)))

    def head(self, query, support, support_labels, way: int, shot: int, **overrides):
        """The unscaled head logits with the model's head options (eval-mode ones in eval)."""
        options = {**self.head_options, **({} if self.training else self.eval_head_options)}
        return self.head_fn(query, support, support_labels, way, shot, **options | overrides)

    def episode_head(self, index: torch.Tensor) -> Callable[..., torch.Tensor]:
        """`head` for the episodes of `index` [B, way, pool]: a classifier that draws random
        numbers (a `seed` option: fine-tuning's initial weights) gets one seed per episode
        (`episode_seeds`), so that an episode's result does not depend on its batch."""
        parameters = inspect.signature(self.head_fn).parameters
        if "seed" not in parameters:
            return self.head
        seed = self.head_options.get("seed", parameters["seed"].default)
        return functools.partial(self.head, seed=episode_seeds(index, seed))

    def use_classifier(self, name: str, options: dict) -> None:
        """Classify episodes with the test-time classifier `name` (fewshot.heads.CLASSIFIERS)
        and its options instead of the trained head."""
        self.head_name, self.head_fn = name, CLASSIFIERS[name]
        self.head_options, self.eval_head_options = dict(options), {}

    def use_adapter(self, adapter: Adapter) -> None:
        """Solve test episodes with `adapter`, which adapts the backbone to each episode: no
        embedding is the same in two episodes, so there is no cache."""
        self.adapter, self.caches = adapter, False

    def use_episode_statistics(self, backbone_only: bool = False) -> None:
        """Normalise each test episode with BatchNorm statistics of its own, as Relation
        Networks' code evaluates: the backbone's of its support images, then of its queries,
        and a relation module's of the episode's pairs (`backbone_only`: the head keeps its
        trained ones, to tell which part's statistics move a result). Transductive (a query's
        scores depend on the other queries), and no evaluation cache: no embedding serves two
        episodes."""
        self.episode_statistics, self.caches = True, False
        self.backbone_statistics_only = backbone_only

    def statistics_scope(self) -> nn.Module:
        """The part whose BatchNorm layers read each episode's statistics."""
        return self.backbone if self.backbone_statistics_only else self

    def embed(self, images: torch.Tensor, checked: bool = True) -> torch.Tensor:
        """Flat float32 features [N, d] of normalised images [N, C, H, W] (autocast if amp);
        those of a model loaded from a checkpoint (`source`) are checked finite unless not
        `checked` (test-time fine-tuning checks its loss instead)."""
        dtype = autocast_dtype(self.amp, images.device.type)
        if dtype is None:
            features = self.backbone(images)
        else:
            with torch.autocast(images.device.type, dtype=dtype):
                features = self.backbone(images).float()
        if checked and self.source is not None:
            self.check_finite(features, images.device.type)
        return features

    def check_finite(self, features: torch.Tensor, device_type: str) -> None:
        """Refuse a batch's features that hold inf or nan (weights that overflow on its
        images: classifiers would score them without a word), naming the checkpoint; one
        reduction per batch."""
        if bool(torch.isfinite(features).all()):
            return
        bad = int((~torch.isfinite(features).flatten(1).all(dim=1)).sum())
        precision = precision_name(self.amp, device_type)
        hint = "" if precision == "float32" else f" in {precision} (--amp off: float32)"
        raise FewshotError(
            f"{self.source} gives non-finite features (inf or nan) for {bad} of the "
            f"{len(features)} images of a batch: its weights overflow on them{hint}; not "
            "classifying them"
        )

    def embed_episodes(self, images: torch.Tensor, shot: Shot) -> torch.Tensor:
        """Embeddings [B, way, pool, d] of episodes' images [B, way, pool, C, H, W]; a varied
        episode's padding is not embedded (zeros): BatchNorm sees its images alone."""
        if not isinstance(shot, int):
            return embed_varied(self.embed, images, shot)
        b, way, pool = images.shape[:3]
        return self.embed(images.flatten(0, 2)).view(b, way, pool, -1)

    def forward(
        self, images: torch.Tensor, resplits: torch.Tensor | None, shot: Shot
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Embed the pool once, then the U*B head problems of the re-splits in one head call."""
        return self.embedded_loss(self.embed_episodes(images, shot), resplits, shot)

    def embedded_loss(
        self, embeddings: torch.Tensor, resplits: torch.Tensor | None, shot: Shot
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` from the episodes' embeddings [B, way, pool, d] (a varied episode's
        padding is not read)."""
        return episode_loss(
            embeddings, self.head, self.scale, shot, resplits, self.label_smoothing, self.loss
        )

    @torch.no_grad()
    def accuracy(self, images: torch.Tensor, shot: Shot) -> torch.Tensor:
        """Query accuracy of each test episode, embedding its images."""
        check_episodes("EmbeddingMethod.accuracy", images, shot, self.backbone)
        embeddings = self.embed_episodes(images, shot)
        return self.test_accuracy(embeddings, self.head, shot)

    def checked(self, head: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        """`head` for test queries, its logits checked (`check_scores`); for a loaded model
        (`source`) a solver's failure on features of overflowing scale (ridge's factorisation,
        the SVM's kernel) is refused in one line naming it and their scale too."""

        def classify(query: torch.Tensor, support: torch.Tensor, *rest, **options) -> torch.Tensor:
            def features() -> torch.Tensor:
                return torch.cat([query.flatten(0, -2), support.flatten(0, -2)])

            try:
                logits = head(query, support, *rest, **options)
            except (FewshotError, torch.linalg.LinAlgError):
                if self.source is None:
                    raise
                cause = scale_cause(features(), self.scale_remedy, None)
                if cause is None:
                    raise  # not the features' scale: the solver's own refusal says more
                raise FewshotError(f"{self.source} cannot classify a batch: {cause}") from None
            self.check_scores(logits, features, CLASSIFIER_DIVERGED)
            return logits

        return classify

    def test_accuracy(
        self, embeddings: torch.Tensor, head: Callable[..., torch.Tensor], shot: Shot
    ) -> torch.Tensor:
        """Query accuracy of each test episode from its embeddings [B, way, pool, d] by
        `head`, its logits checked (`checked`)."""
        return query_accuracy(*episode_logits(embeddings, self.checked(head), self.scale, shot))

    @property
    def transductive(self) -> bool:
        """Whether a query's scores depend on the other queries: a classifier that reads them
        (BD-CSPN, TIM, PT-MAP), or BatchNorm on each episode's statistics."""
        return self.head_name in TRANSDUCTIVE or self.episode_statistics

    def to_scores(self, logits: torch.Tensor) -> torch.Tensor:
        """Class probabilities of the scaled logits."""
        return torch.softmax(logits, dim=-1)

    def scores(
        self,
        support: torch.Tensor,
        shots: list[int],
        query: torch.Tensor,
        batch: int,
        episode: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Embed the support once (`support_features`) and classify the queries
        (`scores_of`)."""
        return self.scores_of(self.support_features(support), shots, query, batch, episode)

    def support_features(self, support: torch.Tensor) -> torch.Tensor:
        """The support's features [1, N, d] (with `episode_statistics`: of its own batch's
        statistics), which `scores_of` classifies queries against however often."""
        own = self.episode_statistics
        with own_statistics(self.statistics_scope()) if own else contextlib.nullcontext():
            return self.embed(support)[None]

    def scores_of(
        self,
        features: torch.Tensor,
        shots: list[int],
        query: torch.Tensor,
        batch: int,
        episode: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`scores` from the support's features: the queries embedded `batch` at a time
        (BatchNorm in eval mode: an image's embedding is its own; with `episode_statistics`,
        all of them as one batch), then classified (`classify`)."""
        own = self.episode_statistics
        with own_statistics(self.statistics_scope()) if own else contextlib.nullcontext():
            queries = torch.cat(
                [self.embed(chunk) for chunk in query.split(len(query) if own else batch)]
            )
        return self.classify(features, shots, queries, batch, episode)

    def classify(
        self,
        features: torch.Tensor,
        shots: list[int],
        queries: torch.Tensor,
        batch: int,
        episode: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Scores of query features [n, d] against the support's [1, N, d] (class by class,
        `shots[c]` of class c): `batch` queries a head call, or all at once for a transductive
        classifier; with the seeds of `episode` where it is given. Classes of unequal counts
        are read as a varied episode's (the head's shot is None)."""
        way, shot = len(shots), (shots[0] if len(set(shots)) == 1 else None)
        labels = class_labels(shots, features.device)[None]
        head = self.checked(self.head if episode is None else self.episode_head(episode[None]))
        chunks = [queries] if self.transductive else queries.split(batch)
        own = self.episode_statistics  # a relation module's BatchNorm reads the episode's too
        with own_statistics(self.statistics_scope()) if own else contextlib.nullcontext():
            logits = [self.scale * head(q[None], features, labels, way, shot)[0] for q in chunks]
        return self.to_scores(torch.cat(logits).float())

    def divergence_advice(self) -> str:
        """The meta-training, naming the options that regularise the head's problem (ridge,
        SVM) with their values, and those outside their usual range."""
        usual = REGULARISATION.get(self.head_name)
        if usual is None:
            return super().divergence_advice()
        defaults = inspect.signature(self.head_fn).parameters
        values = {name: self.head_options.get(name, defaults[name].default) for name in usual}
        scales, unusual = describe_scales("--head-options", values, usual)
        if unusual:
            return (
                f"the meta-training diverged; the head's problem is scaled by {scales}: bring "
                f"{' and '.join(unusual)} into range, or lower --lr"
            )
        return f"the meta-training diverged: lower --lr (the head's problem is scaled by {scales})"

    def backbone_term(self, images: int, training: bool, lower: str) -> MemoryTerm:
        """The backbone's activations on `images` images (all its layers' outputs in
        training, the largest in inference), shrunk by the setting `lower`."""
        total, peak = activation_elements(self.backbone)
        device = next(self.parameters()).device
        element = 4 if autocast_dtype(self.amp, device.type) is None else 2
        size = images * (total if training else peak) * element
        return MemoryTerm(size, f"the backbone on {images} images", lower)

    def memory_terms(
        self, episodes: int, way: int, pool: int, shot: int, resplits: int, training: bool
    ) -> list[MemoryTerm]:
        """The backbone's activations of the batch's images, then the head's terms."""
        images = episodes * way * pool
        return [
            self.backbone_term(images, training, "--episodes-per-batch"),
            *self.head_terms(episodes, way, pool, shot, resplits),
        ]

    def head_terms(
        self, episodes: int, way: int, pool: int, shot: int, resplits: int
    ) -> list[MemoryTerm]:
        """What the head problems of a batch hold besides the backbone: the U re-splits'
        gathered embeddings (shrunk by --resplits where U > 1, else by the batch)."""
        gathered = 4 * resplits * episodes * way * pool * self.backbone.out_dim
        lower = "--resplits" if resplits > 1 else "--episodes-per-batch"
        return [MemoryTerm(gathered, f"{resplits} re-split(s) of their embeddings", lower)]

    def evaluation_terms(
        self, episodes: int, way: int, pool: int, shot: int, images: int, cache: bool
    ) -> list[MemoryTerm]:
        """With the cache: the backbone on one embedding batch of the split, the cached
        embeddings of its `images` images and the head's terms (no backbone per episode); with
        an adapter, its terms too."""
        if self.adapter is not None:
            device = next(self.parameters()).device
            adapting = self.adapter.memory_terms(episodes, way, shot, device)
            return super().evaluation_terms(episodes, way, pool, shot, images, False) + adapting
        if not cache:
            return super().evaluation_terms(episodes, way, pool, shot, images, cache)
        return [
            self.backbone_term(min(EMBED_BATCH, images), False, None),
            MemoryTerm(
                self.cache_bytes(images), f"the cached embeddings of {images} images", "--no-cache"
            ),
            *self.head_terms(episodes, way, pool, shot, 1),
        ]

    def cache_bytes(self, images: int) -> int:
        """The embeddings of `images` images, which the evaluation cache keeps (float32)."""
        return 4 * images * self.backbone.out_dim

    @torch.no_grad()
    def embed_split(
        self,
        split: ImageSplit,
        device: torch.device,
        batch: int = EMBED_BATCH,
        stop: Stop | None = None,
    ) -> torch.Tensor:
        """Embeddings [N, d] of every image of the split (computed once, batched)."""
        chunks = []
        for start in range(0, len(split.labels), batch):
            check_stop(stop)
            index = torch.arange(start, min(start + batch, len(split.labels)))
            chunks.append(self.embed(images_to_device(split, index, device)))
        return torch.cat(chunks)

    def use_feature_cache(self, folder: str | Path | FeatureMemory) -> bool:
        """Keep the frozen backbone's features of every split in `folder` (FeatureCache), or
        in memory (a FeatureMemory): the evaluation cache and `split_features` read them from
        there."""
        self.feature_cache = folder if isinstance(folder, FeatureMemory) else FeatureCache(folder)
        return True

    def split_features(
        self, split: ImageSplit, device: torch.device, stop: Stop | None = None
    ) -> torch.Tensor:
        """Embeddings [N, d] of every image of the split: from the feature cache where there
        is one (memory-mapped, on the CPU), else computed on `device`."""
        if self.feature_cache is None:
            return self.embed_split(split, device, stop=stop)
        digest = backbone_digest(self.backbone, precision_name(self.amp, device.type))
        digest += f":{self.feature_identity}" if self.feature_identity else ""
        return self.feature_cache.features(
            split, digest, lambda s: self.embed_split(s, device, stop=stop)
        )

    def solver(
        self,
        split: ImageSplit,
        shot: int | VariedShape,
        device: torch.device,
        cache: bool,
        stop: Stop | None,
    ) -> EpisodeSolver:
        """With `cache`, episodes index the embeddings of every image, computed once (or read
        from the feature cache); without, each batch's images are embedded. Either way the
        head is `episode_head`'s. An adapter (`use_adapter`) builds the solver instead."""
        if self.adapter is not None:
            return self.adapter(split, shot, device, stop)
        if self.episode_statistics:
            return self.own_statistics_solver(split, shot, device)
        features = self.split_features(split, device, stop).to(device) if cache else None

        @torch.no_grad()
        def solve(index: torch.Tensor) -> torch.Tensor:
            shots = index_shot(index, shot)
            if features is None:
                embeddings = self.embed_episodes(episode_images(split, index, device), shots)
            else:
                embeddings = features[index.clamp(min=0).to(device)]
            return self.test_accuracy(embeddings, self.episode_head(index), shots)

        return solve

    def own_statistics_solver(
        self, split: ImageSplit, shot: int | VariedShape, device: torch.device
    ) -> EpisodeSolver:
        """`solver` with `episode_statistics`: one episode at a time, its support embedded as
        one batch and its queries as another, the head on the episode alone."""
        if not isinstance(shot, int):
            raise FewshotError(
                "BatchNorm on each episode's statistics reads episodes of one shot, not varied "
                "episodes"
            )

        @torch.no_grad()
        def solve(index: torch.Tensor) -> torch.Tensor:
            accuracies = []
            for one in index.split(1):
                images = episode_images(split, one, device)[0]  # [way, pool, C, H, W]
                with own_statistics(self.statistics_scope()):
                    parts = [images[:, :shot], images[:, shot:]]
                    embedded = [
                        self.embed(p.flatten(0, 1)).unflatten(0, p.shape[:2]) for p in parts
                    ]
                    embeddings = torch.cat(embedded, dim=1)[None]
                    head = self.episode_head(one)
                    accuracies.append(self.test_accuracy(embeddings, head, shot))
            return torch.cat(accuracies)

        return solve


def settings_backbone(settings: dict) -> nn.Module:
    """The backbone of a run's settings, for the data's channels and image size."""
    return build_backbone(
        settings["backbone"],
        settings["in_channels"],
        settings["image_size"],
        **settings["backbone_options"],
    )


def build_embedding_method(settings: dict) -> EmbeddingMethod:
    """The embedding method of a run's settings (backbone, head and their options, amp)."""
    return EmbeddingMethod(
        settings_backbone(settings),
        settings["head"],
        settings["head_options"],
        settings["eval_head_options"],
        settings["amp"],
        settings["label_smoothing"],
    )
