"""P>M>F's test-time fine-tuning (Hu et al., CVPR 2022, "Pushing the limits of simple pipelines
for few-shot learning"), `--classifier pmf`.

Before an episode's queries are classified, the backbone of an embedding model with a prototype
head takes `steps` SGD steps (momentum 0.9) on the episode's own support: the prototypes are
the support's embeddings, the pseudo-queries augmented copies of the support images, the loss
the head's cross-entropy. The queries are then classified by the fine-tuned backbone's
prototypes, and the weights restored exactly (parameters and buffers) for the next episode.
Each episode's augmentation is seeded by the episode itself (its images' indices in the split,
`episode_seeds`), so a result does not depend on how the episodes are batched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from fewshot.datasets.augment import TrainAugment, normalize
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.varied import VariedShape, index_shot
from fewshot.methods.base import EpisodeSolver
from fewshot.methods.embedding import EmbeddingMethod, episode_seeds
from fewshot.methods.resplit import Shot
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.precision import precision_name
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
    candidates it is chosen among on `val_episodes` seeded validation episodes, and the seed
    of the augmentation (mixed with each episode's images)."""

    steps: int = 50
    lr: float | None = None
    lrs: list[float] = field(default_factory=lambda: list(PAPER_LRS))
    val_episodes: int = 20
    seed: int = 0

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

    def __call__(
        self, split: ImageSplit, shot: int | VariedShape, device: torch.device, stop: Stop | None
    ) -> EpisodeSolver:
        """The solver of `split`'s episodes (of this shot, or varied ones): each fine-tuned on
        its support, one at a time."""
        if self.lr is None:
            raise FewshotError("--classifier pmf has no learning rate yet: choose it first")
        jitter = JITTER if split.channels == 3 else 0.0
        padding = split.image_size // SHIFT_FRACTION
        augment = TrainAugment(split.mean, split.std, split.image_size, padding, jitter)

        def solve(index: torch.Tensor) -> torch.Tensor:
            accuracies = []
            seeds = episode_seeds(index, self.options.seed).tolist()
            for episode, seed in zip(index, seeds, strict=True):
                check_stop(stop)  # an episode's fine-tuning is the unit of work here
                # A varied episode's padding (-1) reads the first image, never used after.
                raw = split.images[episode.flatten().clamp(min=0).cpu()].to(device)
                raw = raw.view(*episode.shape, *raw.shape[1:])
                shots = index_shot(episode[None], shot)
                accuracies.append(self.episode_accuracy(raw, split, shots, augment, seed))
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

    def fit(
        self,
        raw_support: torch.Tensor,
        support: torch.Tensor,
        shot: Shot,
        augment: TrainAugment,
        generator: torch.Generator,
    ) -> None:
        """`steps` SGD steps of the head's loss: prototypes of the support images, class by
        class (normalised; `raw_support` the same as uint8; `shot` per class, or a varied
        episode's shots [1, way]), against copies augmented by `augment` with `generator`."""
        model = self.model
        if isinstance(shot, int):
            way, counts, head_shot = len(support) // shot, shot, shot
        else:  # unequal shots: the head counts each class's from the labels
            way, counts, head_shot = shot.shape[-1], shot.flatten().to(support.device), None
        labels = torch.arange(way, device=support.device).repeat_interleave(counts)
        optimizer = torch.optim.SGD(model.backbone.parameters(), lr=self.lr, momentum=MOMENTUM)
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
                pseudo = augment(raw_support, generator)
                # One forward for both: in eval mode an image's embedding is its own.
                features = model.embed(torch.cat([support, pseudo]), checked=False)
                prototypes, queries = features[None].split(len(support), dim=1)
                logits = scale * model.head(queries, prototypes, labels[None], way, head_shot)[0]
                loss = F.cross_entropy(logits, labels)
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
