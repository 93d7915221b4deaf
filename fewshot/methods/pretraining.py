"""Supervised pretraining, the field's control (Chen et al. 2019 Baseline / Baseline++; Tian et
al. 2020 RFS): a backbone and one classifier over every train class, trained on batches of
images. The model validates and tests as an embedding method, nearest centroid by default; its
classifier layer is used in training only."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fewshot.methods.embedding import EmbeddingMethod, settings_backbone
from fewshot.runtime.memory import MemoryTerm

PRETRAIN_CLASSIFIERS = ("linear", "cosine")


class CosineClassifier(nn.Module):
    """Baseline++'s classifier: logits = scale * cos(feature, weight of each class)."""

    def __init__(self, dim: int, classes: int, scale: float = 10.0, learn_scale: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(classes, dim))
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)  # nn.Linear's initialisation
        self.scale = nn.Parameter(torch.tensor(float(scale)), requires_grad=learn_scale)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Logits [N, classes] of features [N, dim]."""
        return self.scale * F.normalize(features, dim=1) @ F.normalize(self.weight, dim=1).T


class PretrainMethod(EmbeddingMethod):
    """A backbone with a linear or cosine classifier over `classes` train classes; as an
    embedding method (validation, `fewshot eval`) it classifies episodes by nearest centroid."""

    def __init__(
        self,
        backbone: nn.Module,
        classes: int,
        classifier: str = "linear",
        scale: float = 10.0,
        learn_scale: bool = True,
        amp: str = "auto",
        label_smoothing: float = 0.0,
    ):
        super().__init__(backbone, "protonet", amp=amp, label_smoothing=label_smoothing)
        self.scale.requires_grad_(False)  # the episodes' head is not trained in this stage
        if classifier not in PRETRAIN_CLASSIFIERS:
            raise ValueError(f"classifier must be in {PRETRAIN_CLASSIFIERS}, got {classifier!r}")
        dim = backbone.out_dim
        self.classifier = (
            nn.Linear(dim, classes)
            if classifier == "linear"
            else CosineClassifier(dim, classes, scale, learn_scale)
        )

    def forward(
        self, images: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-entropy of images [N, C, H, W] against their classes [N], and whether each
        image was classified right [N]."""
        return self.embedded_loss(self.embed(images), labels)

    def embedded_loss(
        self, features: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` from the images' features [N, d]."""
        logits = self.classifier(features)
        loss = F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing)
        return loss, (logits.argmax(dim=1) == labels).float()

    def divergence_advice(self) -> str:
        """What diverged in a pretraining step, and the setting to lower."""
        return "the pretraining diverged: lower --lr"

    def batch_memory_terms(self, images: int) -> list[MemoryTerm]:
        """Lower bounds of what a training step on `images` images holds."""
        return [self.backbone_term(images, True, "--batch-size")]


def build_pretrain_method(settings: dict) -> PretrainMethod:
    """The pretraining model of a run's settings (with the data's geometry and `classes`)."""
    return PretrainMethod(
        settings_backbone(settings),
        settings["classes"],
        settings["classifier"],
        settings["scale"],
        settings["learn_scale"],
        settings["amp"],
        settings["label_smoothing"],
    )
