"""P>M>F's test-time fine-tuning (Hu et al., CVPR 2022, "Pushing the limits of simple pipelines
for few-shot learning"), `--classifier pmf`.

Before an episode's queries are classified, the backbone of an embedding model with a prototype
head takes `steps` SGD steps (momentum 0.9) on the episode's own support: the prototypes are
the support's embeddings, the pseudo-queries augmented copies of the support images, the loss
the head's cross-entropy. The queries are then classified by the fine-tuned backbone's
prototypes, and the weights restored exactly (parameters and buffers) for the next episode.
Each episode's augmentation is seeded by the episode itself (its images' indices in the split,
`episode_seeds`), so a result does not depend on how the episodes are batched.

Episodes of equal shots may be fine-tuned at once (`batched`): each its own copy of the
backbone's weights, one vmapped forward of all of them (torch.func), the module itself never
changed. It is meant for a GPU, launch-bound on one small episode (benchmarks/bench_pmf.py);
a CPU loses (grouped convolutions: 1.1-1.8x the time of one episode after another for the
Omniglot Conv-4), so it is on by default on a GPU only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

from fewshot.datasets.augment import TrainAugment, normalize
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.varied import VariedShape, index_shot
from fewshot.methods.adapters import episode_seeds
from fewshot.methods.base import EpisodeSolver
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.methods.resplit import Shot
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.memory import MemoryTerm
from fewshot.runtime.precision import autocast_dtype, precision_name
from fewshot.runtime.signals import Stop, check_stop

PMF = "pmf"
# The heads whose classes are the means of the support embeddings: the prototypes P>M>F tunes.
PROTOTYPE_HEADS = ("protonet", "cosine")
# The paper's grid of learning rates, searched on validation episodes (0: no fine-tuning).
PAPER_LRS = (0.0, 1e-4, 1e-3, 1e-2)
MOMENTUM = 0.9
# Pseudo-queries are shifted by up to 1/8 of the side: DiffAugment's translation, which the
# paper's code applies to the support.
SHIFT_FRACTION = 8
# Colour jitter of RGB pseudo-queries (MetaOptNet's strength; grey images get none).
JITTER = 0.4


@dataclass(frozen=True)
class PmfOptions:
    """`--classifier-options` of pmf: SGD steps per episode, the learning rate or the
    candidates it is chosen among on `val_episodes` seeded validation episodes, the seed of
    the augmentation (mixed with each episode's images), and whether a batch's episodes of
    equal shots are fine-tuned at once (None: on a GPU, not in fp16)."""

    steps: int = 50
    lr: float | None = None
    lrs: list[float] = field(default_factory=lambda: list(PAPER_LRS))
    val_episodes: int = 20
    seed: int = 0
    batched: bool | None = None

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise FewshotError(f"pmf steps must be at least 1, got {self.steps}")
        if self.lr is not None:
            if self.lr < 0:
                raise FewshotError(f"pmf lr must be >= 0, got {self.lr}")
            if self.lrs != list(PAPER_LRS) or self.val_episodes != PmfOptions.val_episodes:
                raise FewshotError(
                    "pmf lrs and val_episodes choose the lr on validation episodes: they do "
                    "not apply with lr given"
                )
        if not self.lrs or min(self.lrs) < 0 or len(set(self.lrs)) < len(self.lrs):
            raise FewshotError(
                f"pmf lrs must be distinct learning rates >= 0, at least one, got {self.lrs}"
            )
        if self.val_episodes < 1:
            raise FewshotError(f"pmf val_episodes must be at least 1, got {self.val_episodes}")
        if self.batched not in (None, True, False):
            raise FewshotError(f"pmf batched must be true or false, got {self.batched!r}")


class FinetuneDiverged(FewshotError):
    """The fine-tuning loss of an episode became non-finite at the learning rate in use."""


class PmfAdapter:
    """P>M>F's per-episode fine-tuning of `model`'s backbone; called as the model's episode
    adapter (`EmbeddingMethod.use_adapter`), it builds the solver of a split's episodes."""

    def __init__(self, model: EmbeddingMethod, options: PmfOptions):
        if model.head_name not in PROTOTYPE_HEADS:
            raise FewshotError(
                "--classifier pmf fine-tunes through a prototype head "
                f"({', '.join(PROTOTYPE_HEADS)}); this model's head is {model.head_name}"
            )
        self.model, self.options = model, options
        self.lr = options.lr  # None until chosen on validation episodes
        # The mean validation accuracy of each candidate lr (None: diverged), once chosen.
        self.validation: dict[float, float | None] = {}

    def batches(self, device: torch.device) -> bool:
        """Whether episodes of equal shots are fine-tuned at once on `device`: as asked, else
        on a GPU; never in fp16, whose loss scaling skips the steps of one episode only."""
        fp16 = precision_name(self.model.amp, device.type) == "fp16"
        if self.options.batched and fp16:
            raise FewshotError(
                "pmf batched fine-tuning does not take fp16 (its loss scale is one episode's): "
                "--amp off, or batched false"
            )
        wanted = device.type == "cuda" if self.options.batched is None else self.options.batched
        return wanted and not fp16

    def memory_terms(
        self, episodes: int, way: int, shot: int, device: torch.device
    ) -> list[MemoryTerm]:
        """What fine-tuning holds at once: the backbone's training activations on the support
        and its augmented copies, and the weights, gradients and momenta, for every episode
        of a batch where they are fine-tuned at once (`batches`), else for one."""
        at_once = episodes if self.batches(device) else 1
        lower = "--episodes-per-batch" if at_once > 1 else None
        backbone = self.model.backbone
        weights = sum(p.numel() * p.element_size() for p in backbone.parameters())
        images = at_once * 2 * way * shot
        activations = self.model.backbone_term(images, True, lower).size
        return [
            MemoryTerm(activations, f"fine-tuning on {images} images", lower),
            MemoryTerm(3 * at_once * weights, "the fine-tuned weights", lower),
        ]

    def __call__(
        self, split: ImageSplit, shot: int | VariedShape, device: torch.device, stop: Stop | None
    ) -> EpisodeSolver:
        """The solver of `split`'s episodes (of this shot, or varied ones): each fine-tuned on
        its support, a batch at once where `batches` says so, else one at a time."""
        if self.lr is None:
            raise FewshotError("--classifier pmf has no learning rate yet: choose it first")
        jitter = JITTER if split.channels == 3 else 0.0
        padding = split.image_size // SHIFT_FRACTION
        augment = TrainAugment(split.mean, split.std, split.image_size, padding, jitter)
        at_once = isinstance(shot, int) and self.batches(device)

        def solve(index: torch.Tensor) -> torch.Tensor:
            seeds = episode_seeds(index, self.options.seed).tolist()
            # A varied episode's padding (-1) reads the first image, never used after.
            raw = split.images[index.flatten().clamp(min=0).cpu()].to(device)
            raw = raw.view(*index.shape, *raw.shape[1:])
            if at_once:
                check_stop(stop)
                return self.batch_accuracies(raw, split, shot, augment, seeds)
            accuracies = []
            for episode, images, seed in zip(index, raw, seeds, strict=True):
                check_stop(stop)  # an episode's fine-tuning is the unit of work here
                shots = index_shot(episode[None], shot)
                accuracies.append(self.episode_accuracy(images, split, shots, augment, seed))
            return torch.stack(accuracies)

        return solve

    def episode_accuracy(
        self,
        raw: torch.Tensor,
        split: ImageSplit,
        shot: Shot,
        augment: TrainAugment,
        seed: int,
    ) -> torch.Tensor:
        """Query accuracy of an episode of uint8 images [way, pool, C, H, W] (the first
        `shot` of each class its support; a varied episode's shots [1, way], padded as
        fewshot.methods.resplit lays it out) after fine-tuning on its support, augmented with
        `seed`; the backbone's weights are back as they were after it."""
        images = normalize(raw.flatten(0, 1), split.mean, split.std).view(1, *raw.shape)
        backbone = self.model.backbone
        saved = {key: value.clone() for key, value in backbone.state_dict().items()}
        try:
            if self.lr > 0:  # lr 0 leaves the weights as they are: the model's own accuracy
                limit = shot if isinstance(shot, int) else shot[0, :, None].to(raw.device)
                in_pool = torch.arange(raw.shape[1], device=raw.device)
                in_support = (in_pool < limit).expand(raw.shape[:2])  # [way, pool]
                generator = torch.Generator().manual_seed(seed)
                self.fit(raw[in_support], images[0][in_support], shot, augment, generator)
            return self.model.accuracy(images, shot)[0]
        finally:
            backbone.load_state_dict(saved)  # copies in place: bit for bit, buffers included

    def batch_accuracies(
        self,
        raw: torch.Tensor,
        split: ImageSplit,
        shot: int,
        augment: TrainAugment,
        seeds: list[int],
    ) -> torch.Tensor:
        """Query accuracy of each episode of uint8 images [E, way, pool, C, H, W] (the first
        `shot` of each class its support) after fine-tuning all at once, each on its own
        support augmented with its seed; the model's weights are not touched."""
        images = normalize(raw.flatten(0, 2), split.mean, split.std).view(raw.shape)
        if self.lr == 0:
            return self.model.accuracy(images, shot)
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        weights = self.fit_batched(
            raw[:, :, :shot].flatten(1, 2),
            images[:, :, :shot].flatten(1, 2),
            shot,
            augment,
            generators,
        )
        with torch.no_grad():
            features = self.embedder(weights)(images.flatten(1, 2))
            embeddings = features.view(*images.shape[:3], -1)
            return self.model.test_accuracy(embeddings, self.model.head, shot)

    def fit(
        self,
        raw_support: torch.Tensor,
        support: torch.Tensor,
        shot: Shot,
        augment: TrainAugment,
        generator: torch.Generator,
    ) -> None:
        """`steps` SGD steps of the head's loss on the backbone itself: prototypes of the
        support images, class by class (normalised; `raw_support` the same as uint8; `shot`
        per class, or a varied episode's shots [1, way]), against copies augmented by
        `augment` with `generator`."""

        def embed(images: torch.Tensor) -> torch.Tensor:
            return self.model.embed(images[0], checked=False)[None]

        parameters = list(self.model.backbone.parameters())
        self.tune(parameters, embed, raw_support[None], support[None], shot, augment, [generator])

    def fit_batched(
        self,
        raw_support: torch.Tensor,
        support: torch.Tensor,
        shot: int,
        augment: TrainAugment,
        generators: list[torch.Generator],
    ) -> dict[str, torch.Tensor]:
        """`fit` of E episodes at once (support [E, way * shot, ...], a generator each), each
        on its own copy of the backbone's trainable weights; those copies, stacked [E, ...]."""
        weights = {
            name: p.detach().expand(len(support), *p.shape).clone().requires_grad_()
            for name, p in self.model.backbone.named_parameters()
            if p.requires_grad
        }
        embed = self.embedder(weights)
        self.tune(list(weights.values()), embed, raw_support, support, shot, augment, generators)
        return {name: w.detach() for name, w in weights.items()}

    def embedder(self, weights: dict[str, torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        """Images [E, N, C, H, W] (normalised) -> float32 features [E, N, d], episode e's by
        the backbone with the e-th of the stacked `weights` (its other tensors shared),
        autocast as the model's `embed`."""
        backbone = self.model.backbone
        shared = {k: v for k, v in backbone.named_parameters() if k not in weights}
        shared |= dict(backbone.named_buffers())

        def one(own: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
            return functional_call(backbone, (own, shared), (x,))

        def embed(images: torch.Tensor) -> torch.Tensor:
            dtype = autocast_dtype(self.model.amp, images.device.type)
            with torch.autocast(images.device.type, dtype=dtype, enabled=dtype is not None):
                return vmap(one)(weights, images).float()

        return embed

    def tune(
        self,
        parameters: list[torch.Tensor],
        embed: Callable[[torch.Tensor], torch.Tensor],
        raw_support: torch.Tensor,
        support: torch.Tensor,
        shot: Shot,
        augment: TrainAugment,
        generators: list[torch.Generator],
    ) -> None:
        """The SGD steps of `fit` on E episodes' supports [E, n, ...] (uint8 `raw_support`),
        embedded by `embed` ([E, n', C, H, W] -> [E, n', d]) through `parameters`; the sum of
        the episodes' losses, so each episode's weights get its own gradient."""
        model = self.model
        if isinstance(shot, int):
            way, counts, head_shot = support.shape[1] // shot, shot, shot
        else:  # unequal shots: the head counts each class's from the labels
            way, counts, head_shot = shot.shape[-1], shot.flatten().to(support.device), None
        labels = torch.arange(way, device=support.device).repeat_interleave(counts)
        batch_labels = labels.expand(len(support), -1)
        optimizer = torch.optim.SGD(parameters, lr=self.lr, momentum=MOMENTUM)
        scale = model.scale.detach()  # the head's learned scale stays as trained
        finite = torch.ones((), dtype=torch.bool, device=support.device)
        # fp16 gradients underflow without loss scaling (bf16 and float32 need none).
        device = support.device.type
        scaler = torch.amp.GradScaler(device, enabled=precision_name(model.amp, device) == "fp16")
        # The model stays in eval mode: BatchNorm normalises with its running statistics and
        # does not update them, so a handful of support images neither shifts the statistics
        # the backbone was trained with nor makes an image's embedding depend on its batch.
        with torch.enable_grad():
            for _ in range(self.options.steps):
                pseudo = torch.stack(
                    [augment(r, g) for r, g in zip(raw_support, generators, strict=True)]
                )
                # One forward for both: in eval mode an image's embedding is its own.
                prototypes, queries = embed(torch.cat([support, pseudo], dim=1)).chunk(2, dim=1)
                logits = scale * model.head(queries, prototypes, batch_labels, way, head_shot)
                losses = F.cross_entropy(logits.transpose(1, 2), batch_labels, reduction="none")
                loss = losses.mean(dim=1).sum()
                finite &= torch.isfinite(loss)  # on the device: no sync per step
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
        optimizer.zero_grad(set_to_none=True)  # no gradients left on the restored model
        if not bool(finite):
            raise FinetuneDiverged(
                f"--classifier pmf: the fine-tuning diverged (non-finite loss) at lr "
                f"{self.lr:g}: lower lr"
            )

    def choose_lr(self, accuracies: Callable[[], torch.Tensor]) -> dict[float, float | None]:
        """Try each candidate lr on the validation episodes that `accuracies` evaluates (their
        per-episode accuracies with the current lr) and keep the best, the first of equals;
        the mean accuracy of each (None: it diverged, skipped)."""
        means: dict[float, float | None] = {}
        for lr in self.options.lrs:
            self.lr = lr
            try:
                means[lr] = float(accuracies().double().mean())
            except FinetuneDiverged:
                means[lr] = None
        usable = {lr: mean for lr, mean in means.items() if mean is not None}
        if not usable:
            raise FewshotError(
                f"--classifier pmf: the fine-tuning diverged at every lr of {self.options.lrs} "
                "on the validation episodes: give smaller lrs"
            )
        self.lr = max(usable, key=usable.__getitem__)  # max keeps the first of equals
        self.validation = means
        return means

    def record(self) -> dict:
        """What a result records of the fine-tuning: the lr used and, where it was chosen,
        each candidate's validation accuracy in percent (None: diverged)."""
        record: dict = {"pmf_lr": self.lr}
        if self.validation:
            record["pmf_validation"] = {
                f"{lr:g}": None if mean is None else 100 * mean
                for lr, mean in self.validation.items()
            }
        return record


def search_line(means: dict[float, float | None], chosen: float, where: str) -> str:
    """'pmf: lr 0.001 chosen WHERE (validation accuracy: lr 0 93.00 %, ...)'."""
    tried = ", ".join(
        f"lr {lr:g} " + ("diverged" if mean is None else f"{100 * mean:.2f} %")
        for lr, mean in means.items()
    )
    return f"pmf: lr {chosen:g} chosen {where} (validation accuracy: {tried})"
