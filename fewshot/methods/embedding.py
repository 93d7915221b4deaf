"""A few-shot classifier: backbone + head function + learnable logit scale."""

from __future__ import annotations

import torch
from torch import nn

from fewshot.backbones import build_backbone
from fewshot.errors import FewshotError, summary
from fewshot.heads import get_head
from fewshot.precision import AMP_CHOICES, autocast_dtype


class FewShotModel(nn.Module):
    """Embeds images with `backbone` and classifies episodes with a head function."""

    def __init__(
        self, backbone: nn.Module, head: str, head_options: dict | None = None, amp: str = "auto"
    ):
        super().__init__()
        if amp not in AMP_CHOICES:
            raise FewshotError(f"--amp must be one of {', '.join(AMP_CHOICES)}, not {amp!r}")
        self.amp = amp  # resolved on the device of each call ('auto': bf16 where native)
        self.backbone = backbone
        self.head_name = head
        self.head_fn = get_head(head)
        self.head_options = dict(head_options or {})
        self.scale = nn.Parameter(torch.tensor(1.0))

    def head(self, query, support, support_labels, way: int, shot: int, **overrides):
        """The unscaled head logits, with the model's head options (overridable per call)."""
        options = {**self.head_options, **overrides}
        return self.head_fn(query, support, support_labels, way, shot, **options)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Flat float32 features [N, d] of normalised images [N, C, H, W] (autocast if amp)."""
        dtype = autocast_dtype(self.amp, images.device.type)
        if dtype is None:
            return self.backbone(images)
        with torch.autocast(images.device.type, dtype=dtype):
            features = self.backbone(images)
        return features.float()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Same as `embed`; the entry point DistributedDataParallel wraps."""
        return self.embed(images)


def non_finite(state: dict[str, torch.Tensor]) -> list[str]:
    """The names of the floating-point tensors of a state dict that hold a NaN or an infinity."""
    return [k for k, v in state.items() if v.is_floating_point() and not v.isfinite().all()]


def build_model(config: dict) -> FewShotModel:
    """Build the model a config describes (keys backbone, backbone_options, head, head_options,
    in_channels, image_size)."""
    backbone = build_backbone(
        config["backbone"],
        config["in_channels"],
        config["image_size"],
        **config.get("backbone_options", {}),
    )
    return FewShotModel(
        backbone, config["head"], config.get("head_options", {}), config.get("amp", "auto")
    )


def load_model(ckpt: dict, path, device: torch.device) -> tuple[FewShotModel, dict]:
    """Rebuild a trained model from a checkpoint written by `fewshot train`."""
    config = ckpt.get("config")
    if not isinstance(config, dict) or "model" not in ckpt:
        raise FewshotError(f"{path} is not a fewshot training checkpoint (no config/model)")
    model = build_model(config)
    bad = non_finite(ckpt["model"])
    if bad:
        raise FewshotError(f"{path} holds non-finite weights ({', '.join(bad[:3])}); not using it")
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise FewshotError(
            f"{path} does not fit a {config['backbone']} backbone with the {config['head']} head: "
            f"{summary(e)}"
        ) from None
    return model.to(device).eval(), config
