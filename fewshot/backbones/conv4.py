"""Conv-4: the four-block convolutional embedding of Vinyals et al. and Snell et al."""

from __future__ import annotations

import torch
from torch import nn

from fewshot.backbones.arguments import require_images, require_int


def conv_block(
    in_channels: int, out_channels: int, stride: bool = False, pool: bool = True
) -> nn.Sequential:
    """conv3x3 -> BatchNorm -> ReLU -> maxpool 2 (computed as maxpool then ReLU; without the
    pool when `pool` is false), or with `stride` a stride-2 conv3x3 -> BatchNorm -> ReLU (the
    MAML paper's Omniglot network)."""
    if stride:
        return nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 3, stride=2, padding=1),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(),
        )
    # ReLU commutes with max-pooling, so pooling first gives identical outputs with the ReLU
    # (and its backward) on a quarter of the activations.
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1),
        nn.BatchNorm2d(out_channels),
        nn.MaxPool2d(2) if pool else nn.Identity(),
        nn.ReLU(inplace=True),
    )


class Conv4(nn.Module):
    """4 x [conv3x3(channels) -> BN -> ReLU -> maxpool2]; returns flat features [B, out_dim].

    1600-d at 84x84, 64-d at 28x28 with the default 64 channels. `downsample="stride"` is the
    MAML paper's Omniglot network: stride-2 convolutions instead of max-pooling, then the mean
    over the last feature map (`channels`-d). `pooled_blocks` < 4 leaves the max-pool out of
    the last blocks (Relation Networks compare the larger maps). `feature_map` is the
    (channels, side, side) shape the flat features come from (None after the mean).
    """

    def __init__(
        self,
        in_channels: int = 3,
        channels: int = 64,
        image_size: int = 84,
        downsample: str = "pool",
        pooled_blocks: int = 4,
    ):
        super().__init__()
        require_int("Conv4", "in_channels", in_channels, 1)
        require_int("Conv4", "channels", channels, 1)
        require_int("Conv4", "image_size", image_size, 1)
        if downsample not in ("pool", "stride"):
            raise ValueError(f"Conv4 downsample must be 'pool' or 'stride', got {downsample!r}")
        require_int("Conv4", "pooled_blocks", pooled_blocks, 0)
        if pooled_blocks > 4 or (downsample == "stride" and pooled_blocks != 4):
            raise ValueError(
                f"Conv4 pooled_blocks must be 0 to 4 (with downsample 'pool'), got {pooled_blocks}"
            )
        self.channels, self.stride = channels, downsample == "stride"
        self.pooled_blocks = pooled_blocks
        self.in_channels, self.image_size = in_channels, image_size
        # Four 2x2 max-pools leave nothing of an image under 16 pixels; stride-2 convolutions
        # (padded) take any size.
        self.smallest = 1 if self.stride else 2**pooled_blocks
        self.encoder = nn.Sequential(
            *(
                conv_block(channels if i else in_channels, channels, self.stride, i < pooled_blocks)
                for i in range(4)
            )
        )
        self.out_dim = self.feature_dim(image_size)
        side = image_size // 2**pooled_blocks
        self.feature_map = None if self.stride else (channels, side, side)

    def feature_dim(self, image_size: int) -> int:
        """Length of the flat feature vector for square inputs of `image_size` pixels."""
        if image_size < self.smallest:
            raise ValueError(
                f"Conv4 needs images of at least {self.smallest} pixels, got {image_size}"
            )
        if self.stride:
            return self.channels
        side = image_size // 2**self.pooled_blocks
        return self.channels * side * side

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Embed images [B, C, H, W] into [B, out_dim]."""
        require_images("Conv4", x, self.in_channels, self.smallest)
        features = self.encoder(x)
        return features.mean((2, 3)) if self.stride else features.flatten(1)
