"""The MAML family's variants, inner loops and training defaults, and the network they adapt."""

from __future__ import annotations

import torch
from torch import nn

from fewshot.methods.resplit import Shot, resplit_episodes

VARIANTS = ("maml", "fomaml", "anil", "imaml")
# iMAML's inner loops: every step on the support loss + proximal/2 |theta - init|^2 (the
# paper's), or the steps on the support loss alone, then in training one step on the proximal
# term, and at test time none (its authors' code, imaml_dev, which tests at lambda = 0).
INNER_LOOPS = ("proximal", "pull_back")
# The MAML paper's meta-optimisation, which these methods train with unless told otherwise;
# contiguous tensors, since BatchNorm under vmap refuses channels_last on CUDA.
MAML_TRAINING = {
    "optimizer": "adam",
    "lr": 1e-3,
    "weight_decay": 0.0,
    "lr_schedule": [],
    "channels_last": False,
}


# The ranges the settings of the inner problem usually take (MAML: inner_lr 0.01 to 0.4, 1
# to 10 steps; iMAML: proximal 0.5 to 2, up to 25 steps), widened: outside them, a value is
# named as the likely cause of a diverged adaptation.
USUAL_INNER = {"inner_lr": (1e-4, 1.0), "inner_steps": (1, 100), "proximal": (1e-2, 100.0)}


def check_inner_loop(inner_loop: str) -> None:
    """Refuse an iMAML inner loop that is not one of INNER_LOOPS."""
    if inner_loop not in INNER_LOOPS:
        raise ValueError(f"inner_loop must be one of {', '.join(INNER_LOOPS)}, got {inner_loop!r}")


def unused_settings(variant: str) -> frozenset[str]:
    """The training settings a variant never reads: the embedding heads', compile (the
    variants differentiate through adapted weights, ANIL's backbone runs in threads on a CPU)
    and, for the variants that adapt every layer under vmap, channels_last (BatchNorm inside
    vmap cannot query a channels_last tensor on CUDA; ANIL runs its backbone outside vmap)."""
    unused = {"head", "head_options", "eval_head_options", "label_smoothing", "compile"}
    return frozenset(unused if variant == "anil" else unused | {"channels_last"})


class Network(nn.Module):
    """The adapted network: a backbone and a linear classifier with one output per class."""

    def __init__(self, backbone: nn.Module, way: int):
        super().__init__()
        self.backbone = backbone
        self.classifier = nn.Linear(backbone.out_dim, way)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits [N, way] of images [N, C, H, W]."""
        return self.classifier(self.backbone(images))


def split_problems(inputs: torch.Tensor, resplits: torch.Tensor | None, shot: Shot):
    """Support [E, way*shot, ...] and query [E, way*Q, ...] of the U*B problems of inputs
    [B, way, pool, ...], with their labels [way*shot] and [way*Q]; a varied episode's (B = 1)
    support [U, sum of shots, ...], its real entries alone, the same length in every problem."""
    b, way, pool = inputs.shape[:3]
    rest = inputs.shape[3:]
    query, support, support_labels, query_labels = resplit_episodes(
        inputs.reshape(b, way, pool, -1), resplits, shot
    )
    return (
        support.reshape(*support.shape[:2], *rest),
        query.reshape(*query.shape[:2], *rest),
        support_labels[0],
        query_labels[0],
    )
