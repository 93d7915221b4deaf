"""The method interface: what turns a batch of episodes into a loss and a test episode into
accuracies. The trainer, the evaluator and the command line know only this interface."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fewshot.datasets.base import ImageSplit
from fewshot.datasets.batches import episode_images
from fewshot.datasets.varied import VariedShape, index_shot
from fewshot.methods.feature_cache import FeatureMemory
from fewshot.methods.resplit import Shot
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.memory import MemoryTerm
from fewshot.runtime.shapes import describe_tensor, shape_fault
from fewshot.runtime.signals import Stop

# index [B, way, pool] of a split's images -> query accuracy of each episode [B]
EpisodeSolver = Callable[[torch.Tensor], torch.Tensor]


def check_episodes(owner: str, images: Any, shot: Any, backbone: nn.Module) -> None:
    """Refuse test episodes other than float images [B, way, pool, C, H, W] of the backbone's
    channels and size with 1 <= shot < pool, in one line naming the argument and the wrong
    dimension in words (a library call's ValueError: the command line checks its settings
    before any data is read)."""
    c, size = backbone.in_channels, backbone.image_size
    if not (isinstance(images, torch.Tensor) and images.is_floating_point()):
        raise ValueError(
            f"{owner} images must be a float tensor [B, way, pool, {c}, {size}, {size}] "
            f"(support first in each class's pool), got {describe_tensor(images)}"
        )
    layout = ("B", "way", "pool", "C", "H", "W")
    fault = shape_fault(
        images.shape, layout, {"C": c, "H": size, "W": size}, dict.fromkeys(layout[:3], 1)
    )
    if fault:
        raise ValueError(f"{owner} images {fault}")
    pool = images.shape[2]
    if isinstance(shot, torch.Tensor):  # a varied episode's shots per class
        if (
            shot.shape != images.shape[:2]
            or shot.is_floating_point()
            or not bool(((shot >= 1) & (shot < pool)).all())
        ):
            raise ValueError(
                f"{owner} shot of varied episodes must be integers [B, way] = "
                f"{list(images.shape[:2])}, each 1 <= shot < pool = {pool}, got "
                f"{describe_tensor(shot)}"
            )
        return
    if not isinstance(shot, int) or isinstance(shot, bool) or not 1 <= shot < pool:
        raise ValueError(
            f"{owner} shot must be an integer with 1 <= shot < pool = {pool} (the rest of each "
            f"class's pool are its queries), got {shot!r}"
        )


def check_step(output: Any, owner: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A training step's (loss, accuracies) as `Method.forward` returns them, a float scalar
    loss with its gradient and float accuracies [problems], checked by their metadata alone
    (no synchronisation); anything else is refused in one line naming `owner` (a plug-in
    method with its package) and what it returned."""
    loss, accuracies = output if isinstance(output, tuple) and len(output) == 2 else (output, None)
    if (
        isinstance(loss, torch.Tensor)
        and loss.is_floating_point()
        and loss.dim() == 0
        and loss.requires_grad
        and isinstance(accuracies, torch.Tensor)
        and accuracies.is_floating_point()
        and accuracies.dim() == 1
    ):
        return loss, accuracies
    parts = output if isinstance(output, tuple) else (output,)
    got = ", ".join(describe_tensor(part) for part in parts)
    if isinstance(loss, torch.Tensor) and not loss.requires_grad:
        got += " (a loss without a gradient)"
    raise FewshotError(
        f"{owner} returned ({got}) from a training step; a method returns (loss, accuracies): "
        "a float scalar loss with its gradient and float accuracies [problems]"
    )


def describe_scales(
    flag: str, values: dict[str, float], usual: dict[str, tuple[float, float]]
) -> tuple[str, list[str]]:
    """('--flag a 0.1, b 1e+30 (outside its usual range 0.01 to 100)', ['b']): every setting
    that scales a problem with its value, and those outside their usual range (`usual`)."""
    parts, unusual = [], []
    for name, value in values.items():
        low, high = usual[name]
        if low <= value <= high:
            parts.append(f"{name} {value:g}")
        else:
            unusual.append(name)
            parts.append(f"{name} {value:g} (outside its usual range {low:g} to {high:g})")
    return f"{flag} {', '.join(parts)}", unusual


def support_by_class(
    support: Any, labels: Any, query: Any, backbone: nn.Module
) -> tuple[torch.Tensor, list[int]]:
    """Labelled support images [N, C, H, W] (labels [N], classes 0 .. way - 1, one image or
    more each) in class order, with each class's count; refused in one line (ValueError) when
    they or the query images [n, C, H, W] are not images of the backbone's geometry, or the
    classes are fewer than two or not numbered from 0 without a gap."""
    c, size = backbone.in_channels, backbone.image_size
    layout = ("N", "C", "H", "W")
    for name, images in (("support", support), ("query", query)):
        if not (isinstance(images, torch.Tensor) and images.is_floating_point()):
            raise ValueError(
                f"predict {name} must be a float tensor [N, {c}, {size}, {size}] of normalised "
                f"images, got {describe_tensor(images)}"
            )
        fault = shape_fault(images.shape, layout, {"C": c, "H": size, "W": size}, {"N": 1})
        if fault:
            raise ValueError(f"predict {name} {fault}")
    if not isinstance(labels, torch.Tensor) or labels.shape != support.shape[:1]:
        raise ValueError(
            f"predict support_labels must be a tensor [{len(support)}] of class ids, one per "
            f"support image, got {describe_tensor(labels)}"
        )
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise ValueError(f"predict support_labels must be integer class ids, got {labels.dtype}")
    counts = torch.bincount(labels.cpu()) if labels.min() >= 0 else torch.zeros(0)
    if len(counts) < 2 or counts.min() < 1:
        raise ValueError(
            "predict support_labels must number at least two classes 0 .. way - 1 with an "
            f"image or more each, got counts {torch.bincount(labels.cpu().clamp(min=0)).tolist()}"
        )
    order = torch.argsort(labels, stable=True).to(support.device)
    return support[order], counts.tolist()


def class_labels(shots: list[int], device: torch.device) -> torch.Tensor:
    """The labels [sum(shots)] of images in class order, `shots[c]` of class c."""
    counts = torch.tensor(shots, device=device)
    return torch.arange(len(shots), device=device).repeat_interleave(counts)


def scale_cause(features: torch.Tensor, remedy: str, diverged: str | None) -> str | None:
    """The likely cause of non-finite scores from `features` [..., d]: their scale where it
    overflows float32 in a squared distance or product of d dimensions (with `remedy`), else
    `diverged` (None: none to name)."""
    largest = float(features.detach().abs().amax())
    dim = features.shape[-1]
    limit = math.sqrt(torch.finfo(torch.float32).max / dim)
    if largest > limit:
        return (
            f"its features reach {largest:.3g} in magnitude, beyond {limit:.3g}, where squared "
            f"distances and products over their {dim} dimensions overflow float32: its weights "
            f"are out of scale ({remedy})"
        )
    if diverged is None:
        return None
    return f"its features are at most {largest:.3g} in magnitude (no overflow): {diverged}"


class Method(nn.Module):
    """A few-shot method: `forward` is the training loss, `solver` evaluates test episodes.

    Images arrive as [B, way, pool, C, H, W] with the first `shot` of every class as the
    original support; `resplits` [U, B, way, pool] reorders each class's pool (first `shot`
    entries = support) or is None for the original split alone. A varied episode (B = 1) has
    a shot per class, `shot` [1, way], and padding after each class's queries
    (fewshot.methods.resplit's layout).
    """

    amp: str = "auto"  # the backbone's autocast (fewshot.runtime.precision), resolved per call
    caches: bool = False  # whether `solver(cache=True)` reuses work across test episodes
    # The checkpoint a trained model was loaded from (load_trained), named in its refusals.
    source: str | None = None
    # What reads features whose scale overflows float32 (`scale_cause`).
    scale_remedy = "rescale or retrain it"

    def forward(
        self, images: torch.Tensor, resplits: torch.Tensor | None, shot: Shot
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean query loss over the U*B problems and the query accuracy of each."""
        raise NotImplementedError

    def memory_terms(
        self, episodes: int, way: int, pool: int, shot: int, resplits: int, training: bool
    ) -> list[MemoryTerm]:
        """Lower bounds of what one batch of `episodes` holds on the method's device, part by
        part, each with the setting that shrinks it ([]: no estimate, nothing is checked).
        Varied episodes are sized as their largest: the largest way and shot, pool = that
        shot + query (every term grows with each)."""
        return []

    def evaluation_terms(
        self, episodes: int, way: int, pool: int, shot: int, images: int, cache: bool
    ) -> list[MemoryTerm]:
        """Lower bounds of evaluating batches of `episodes` test episodes drawn from a split of
        `images` images, with the method's cache (`cache`) or without: by default those of
        one batch in inference."""
        return self.memory_terms(episodes, way, pool, shot, 1, False)

    def cache_bytes(self, images: int) -> int:
        """What the evaluation cache keeps for a split of `images` images (0: no cache)."""
        return 0

    def head_parameters(self) -> list[nn.Parameter]:
        """The trainable parameters outside the backbone (a head's scale, a classifier, ...),
        trained on their own when the backbone has its own learning rate or is frozen."""
        inside = {id(p) for p in self.backbone.parameters()}
        return [p for p in self.parameters() if id(p) not in inside and p.requires_grad]

    def use_feature_cache(self, folder: str | Path | FeatureMemory) -> bool:
        """Keep a frozen backbone's features of each split in `folder`, embedded once, and say
        whether the method does (by default not: it reads more than one feature vector per
        image, or adapts its backbone)."""
        return False

    def divergence_advice(self) -> str:
        """What diverged in the last training step that gave a non-finite loss, and the
        setting to lower."""
        return "the meta-training diverged: lower --lr"

    def check_way(self, way: int) -> None:
        """Refuse episodes of a way the method cannot solve (any way, unless overridden)."""

    def check_shot(self, shot: int | None) -> None:
        """Refuse episodes of a shot the method cannot read (None: varied episodes, of unequal
        shots; any, unless overridden)."""

    def accuracy(self, images: torch.Tensor, shot: Shot) -> torch.Tensor:
        """Query accuracy of each test episode [B] (images [B, way, pool, C, H, W])."""
        raise NotImplementedError

    # What `predict` returns per class: a probability, unless the method says otherwise.
    score_name = "probability"
    # Whether a query's scores depend on the other queries (a transductive classifier).
    transductive = False
    # Whether test episodes are normalised with BatchNorm statistics of their own (embedding
    # methods' `use_episode_statistics`; the MAML family's `transductive` says its own).
    episode_statistics = False

    def predict(
        self,
        support: torch.Tensor,
        support_labels: torch.Tensor,
        query: torch.Tensor,
        batch: int = 256,
        episode: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Scores [n, way] (`score_name`) of each query image [n, C, H, W] for the classes of
        the labelled support images [N, C, H, W] (labels 0 .. way - 1, one or more each),
        all normalised as the model's training images; `batch` queries per forward pass
        (the scores do not depend on it). `episode`: the split indices [way, pool] of a
        seeded test episode these images are, so that a classifier drawing random numbers
        draws them as the evaluation of that episode does. Float64 images are cast to the
        weights' precision; a `batch` that is not a positive integer is refused."""
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"predict batch must be an integer >= 1, got {batch!r}")
        weights = next(self.parameters()).dtype
        support, query = (
            x.to(weights) if isinstance(x, torch.Tensor) and x.dtype == torch.float64 else x
            for x in (support, query)
        )
        ordered, shots = support_by_class(support, support_labels, query, self.backbone)
        self.check_way(len(shots))
        self.check_shot(shots[0] if len(set(shots)) == 1 else None)
        with torch.no_grad():
            return self.scores(ordered, shots, query, batch, episode)

    def scores(
        self,
        support: torch.Tensor,
        shots: list[int],
        query: torch.Tensor,
        batch: int,
        episode: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`predict`'s scores from the support [N, C, H, W] in class order, `shots[c]` images
        of class c."""
        raise NotImplementedError

    def check_scores(
        self, logits: torch.Tensor, features: Callable[[], torch.Tensor], diverged: str
    ) -> None:
        """Refuse test queries' logits [..., way] that hold inf or nan (argmax would rank them
        without a word) in one line naming the model and the likely cause (`scale_cause` of
        `features()`, computed then alone); one reduction. Only for a model loaded to be
        evaluated or to predict (`source`): one in training is left to its loss's own check
        (fewshot.training.trainer)."""
        if self.source is None or bool(torch.isfinite(logits).all()):
            return
        bad = int((~torch.isfinite(logits)).flatten(0, -2).any(-1).sum())
        cause = scale_cause(features(), self.scale_remedy, diverged)
        raise FewshotError(
            f"{self.source} gives non-finite scores (inf or nan) for {bad} of the "
            f"{logits[..., 0].numel()} queries of a batch: {cause}; not classifying them"
        )

    def solver(
        self,
        split: ImageSplit,
        shot: int | VariedShape,
        device: torch.device,
        cache: bool,
        stop: Stop | None,
    ) -> EpisodeSolver:
        """How test episodes of `split` (of this shot, or varied ones) are solved; `cache`
        lets a method reuse work across episodes where that is exact (embedding methods embed
        every image once)."""

        def solve(index: torch.Tensor) -> torch.Tensor:
            return self.accuracy(episode_images(split, index, device), index_shot(index, shot))

        return solve
