"""What a backbone's forward pass holds per image, for memory estimates made before any work."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def activation_elements(backbone: nn.Module) -> tuple[int, int]:
    """Per image of the backbone's geometry: the elements of all its layers' outputs (about
    what a training forward keeps for the backward) and of the largest one (the peak of an
    inference forward). Measured by one eval-mode forward of two blank images (BatchNorm on
    batch statistics, as the MAML family's, needs more than one value per channel), which
    changes no state (no statistics, no DropBlock ramp)."""
    sizes: list[int] = []
    leaves = [m for m in backbone.modules() if not any(m.children())]
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: sizes.append(out.numel() // 2)) for m in leaves
    ]
    was_training = backbone.training
    # A backbone of no weights (a module given from Python) runs in float32 on the CPU.
    parameter = next(backbone.parameters(), torch.zeros(0))
    side = backbone.image_size
    blank = torch.zeros(2, backbone.in_channels, side, side, dtype=parameter.dtype)
    try:
        backbone.eval()
        backbone(blank.to(parameter.device))
    finally:
        backbone.train(was_training)
        for hook in hooks:
            hook.remove()
    return sum(sizes), max(sizes)
