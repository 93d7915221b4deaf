"""ResNet-12 of MetaOptNet (64-160-320-640) with DropBlock in the last two stages."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fewshot.backbones.arguments import require_bool, require_images, require_int, require_rate

SMALLEST = 2**4  # four 2x2 max-pools leave nothing of an image under 16 pixels


class DropBlock(nn.Module):
    """DropBlock (Ghiasi et al. 2018): zeroes square blocks of a feature map during training."""

    def __init__(self, block_size: int):
        super().__init__()
        self.block_size = block_size

    def forward(self, x: torch.Tensor, drop_rate: float) -> torch.Tensor:
        """Drop blocks so that about `drop_rate` of the activations are zeroed, then rescale."""
        if not self.training or drop_rate <= 0:
            return x
        b, c, h, w = x.shape
        bs = min(self.block_size, h, w)
        # Seed rate so that about drop_rate of the activations end up dropped (Ghiasi et al.).
        gamma = drop_rate / (bs * bs) * (h * w) / ((h - bs + 1) * (w - bs + 1))
        seeds = torch.bernoulli(torch.full((b, c, h - bs + 1, w - bs + 1), gamma, device=x.device))
        pad = bs - 1
        # Max-pooling the padded seed map grows each seed into a bs x bs block.
        blocks = F.max_pool2d(F.pad(seeds, (pad, pad, pad, pad)), bs, stride=1)
        keep = 1.0 - blocks[:, :, :h, :w].to(x.dtype)
        return x * keep * (keep.numel() / keep.sum().clamp_min(1.0))


class ResidualBlock(nn.Module):
    """Three conv3x3-BN-LeakyReLU(0.1), a 1x1 shortcut, maxpool 2, then dropout or DropBlock."""

    def __init__(self, in_channels: int, out_channels: int, drop_block_size: int | None):
        super().__init__()
        layers = []
        for i in range(3):
            layers += [
                nn.Conv2d(
                    in_channels if i == 0 else out_channels, out_channels, 3, 1, 1, bias=False
                ),
                nn.BatchNorm2d(out_channels),
            ]
            if i < 2:
                layers.append(nn.LeakyReLU(0.1))
        self.body = nn.Sequential(*layers)
        self.shortcut = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels)
        )
        self.drop_block = DropBlock(drop_block_size) if drop_block_size else None

    def forward(self, x: torch.Tensor, drop_rate: float) -> torch.Tensor:
        """Apply the block; `drop_rate` is the current DropBlock/dropout rate."""
        out = F.max_pool2d(F.leaky_relu(self.body(x) + self.shortcut(x), 0.1), 2)
        if self.drop_block is not None:
            return self.drop_block(out, drop_rate)
        return F.dropout(out, drop_rate, self.training)


class ResNet12(nn.Module):
    """ResNet-12 embedding; flat features [B, out_dim] (16000-d at 84x84, 640-d with avg_pool).

    As in MetaOptNet, blocks 1-2 use dropout and blocks 3-4 use DropBlock. The DropBlock rate
    ramps linearly from 0 to `drop_rate` over `drop_ramp_steps` training forwards; the step
    count is a buffer, so it is saved in the state_dict and resumes correctly.
    """

    def __init__(
        self,
        in_channels: int = 3,
        channels: tuple[int, int, int, int] = (64, 160, 320, 640),
        image_size: int = 84,
        avg_pool: bool = False,
        drop_rate: float = 0.1,
        drop_block_size: int = 5,
        drop_ramp_steps: int = 40_000,
    ):
        super().__init__()
        require_int("ResNet12", "in_channels", in_channels, 1)
        require_int("ResNet12", "image_size", image_size, 1)
        require_bool("ResNet12", "avg_pool", avg_pool)
        if not isinstance(channels, list | tuple) or len(channels) != 4:
            raise ValueError(f"ResNet12 channels must be 4 integers, got {channels!r}")
        for width in channels:
            require_int("ResNet12", "channels", width, 1)
        require_rate("ResNet12", "drop_rate", drop_rate)
        require_int("ResNet12", "drop_block_size", drop_block_size, 1)
        require_int("ResNet12", "drop_ramp_steps", drop_ramp_steps, 0)
        self.channels, self.avg_pool = tuple(channels), avg_pool
        self.in_channels, self.image_size = in_channels, image_size
        self.drop_rate, self.drop_ramp_steps = drop_rate, drop_ramp_steps
        widths = (in_channels, *channels)
        self.blocks = nn.ModuleList(
            ResidualBlock(widths[i], widths[i + 1], drop_block_size if i >= 2 else None)
            for i in range(4)
        )
        self.register_buffer("drop_steps", torch.zeros((), dtype=torch.long))
        self.out_dim = self.feature_dim(image_size)
        side = image_size // SMALLEST
        # The (channels, side, side) map the flat features come from (None after avg_pool).
        self.feature_map = None if avg_pool else (self.channels[-1], side, side)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="leaky_relu")

    def feature_dim(self, image_size: int) -> int:
        """Length of the flat feature vector for square inputs of `image_size` pixels."""
        if image_size < SMALLEST:  # with avg_pool too: the pools come first
            raise ValueError(
                f"ResNet12 needs images of at least {SMALLEST} pixels, got {image_size}"
            )
        if self.avg_pool:
            return self.channels[-1]
        side = image_size // SMALLEST
        return self.channels[-1] * side * side

    def current_drop_block_rate(self) -> float:
        """The DropBlock rate at the current point of the keep-rate ramp."""
        ramp = min(1.0, float(self.drop_steps) / max(1, self.drop_ramp_steps))
        return self.drop_rate * ramp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Embed images [B, C, H, W] into [B, out_dim]."""
        require_images("ResNet12", x, self.in_channels, SMALLEST)
        block_rate = self.current_drop_block_rate()
        if self.training:
            self.drop_steps += 1
        for i, block in enumerate(self.blocks):
            x = block(x, block_rate if i >= 2 else self.drop_rate)
        if self.avg_pool:
            return x.mean(dim=(2, 3))
        return x.flatten(1)
