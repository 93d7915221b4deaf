"""MetaOptNet's training augmentation, batched on the images' device (no per-image Python loop).

MetaOptNet applies, per image: RandomCrop(size, padding) -> ColorJitter(0.4, 0.4, 0.4) ->
RandomHorizontalFlip -> ToTensor -> Normalize. Here the whole batch goes through each step at
once, and every random draw comes from a torch.Generator the caller owns, so a run is
reproducible and resumable. Colour jitter works in float on [0, 1] (torchvision's tensor
semantics) rather than PIL's 8-bit rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from fewshot.runtime.errors import FewshotError
from fewshot.runtime.shapes import shape_fault

# torchvision's rgb_to_grayscale weights (ITU-R 601-2 luma).
GRAY_WEIGHTS = (0.2989, 0.587, 0.114)
# Crop padding MetaOptNet uses per image size: 84 (mini/tiered) and 32 (CIFAR-FS/FC100).
PAPER_PADDING = {84: 8, 32: 4}
CONTRAST, SATURATION = 1, 2  # 0 is brightness


def _channel_view(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    """Per-channel constants as a [1, C, 1, 1] float32 tensor on `like`'s device."""
    return torch.tensor(values, dtype=torch.float32, device=like.device).view(1, -1, 1, 1)


def normalize_float(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """(x - mean) / std per channel, for float images in [0, 1]."""
    return (x - _channel_view(mean, x)) / _channel_view(std, x)


def normalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 [N, C, H, W] -> float32 (images / 255 - mean) / std: the evaluation transform."""
    if images.dtype != torch.uint8:
        raise FewshotError(f"normalize expects uint8 images, got {images.dtype}")
    return normalize_float(images.float().div(255), mean, std)


def crop_flip(
    images: torch.Tensor, padding: int, offsets: torch.Tensor, flip: torch.Tensor
) -> torch.Tensor:
    """Zero-pad by `padding`, crop back to H x W at offsets [N, 2] (top, left), mirror where flip.

    One gather does both: output column j reads padded column left + j, or left + W-1-j when
    the image is flipped.
    """
    n, _, h, w = images.shape
    padded = F.pad(images, (padding,) * 4) if padding else images
    rows = offsets[:, :1] + torch.arange(h, device=images.device)
    cols = torch.arange(w, device=images.device).expand(n, w)
    cols = torch.where(flip[:, None], w - 1 - cols, cols) + offsets[:, 1:]
    batch = torch.arange(n, device=images.device)[:, None, None]
    # Advanced indices around the channel slice put the indexed dims first: [N, H, W, C].
    # The copy back to NCHW is cheap in uint8 and makes the float steps after it faster.
    return padded[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()


def _grayscale(x: torch.Tensor) -> torch.Tensor:
    """Luma of RGB float images [N, 3, H, W] -> [N, 1, H, W]."""
    r, g, b = x.unbind(1)
    wr, wg, wb = GRAY_WEIGHTS
    return (wr * r + wg * g + wb * b).unsqueeze(1)


def color_jitter(x: torch.Tensor, factors: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Brightness, contrast and saturation on float RGB [N, 3, H, W] in [0, 1].

    factors [N, 3]: each image's brightness, contrast and saturation factor. order [N, 3]: the
    permutation of (0=brightness, 1=contrast, 2=saturation) applied to each image, as
    torchvision's ColorJitter shuffles them. Every step blends the image with a base (black,
    the mean grey level, or the grey image) and clamps to [0, 1].
    """
    if x.shape[1] != 3:
        raise FewshotError(f"colour jitter needs RGB images, got {x.shape[1]} channels")
    n = len(x)
    for step in range(3):
        op = order[:, step].view(n, 1, 1, 1)
        f = factors.gather(1, order[:, step : step + 1]).view(n, 1, 1, 1)
        gray = _grayscale(x)
        mean_gray = gray.mean(dim=(1, 2, 3), keepdim=True)
        # Brightness blends with black: the mean term vanishes unless the step is contrast.
        base = torch.where(op == SATURATION, gray, mean_gray * (op == CONTRAST))
        x = (f * x + (1.0 - f) * base).clamp_(0.0, 1.0)
    return x


class TrainAugment:
    """MetaOptNet training augmentation for uint8 [N, C, H, W] batches -> normalised float32.

    Per call it draws, in this order from `generator`: crop offsets, flips, jitter factors,
    jitter orders. Draws happen on the generator's device and move to the images' device, so a
    CPU generator gives the same augmentation on CPU and GPU.
    """

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        image_size: int,
        padding: int,
        jitter: float = 0.4,
        flip: bool = True,
    ):
        if padding < 0 or jitter < 0:
            raise FewshotError(f"padding and jitter must be >= 0, got {padding} and {jitter}")
        self.mean, self.std = tuple(mean), tuple(std)
        self.image_size, self.padding, self.jitter, self.flip = image_size, padding, jitter, flip

    @classmethod
    def paper(cls, mean: Sequence[float], std: Sequence[float], image_size: int) -> TrainAugment:
        """The MetaOptNet setting: padding 8 at 84x84, 4 at 32x32, jitter 0.4, flips."""
        if image_size not in PAPER_PADDING:
            raise FewshotError(f"no paper augmentation for {image_size}x{image_size} images")
        return cls(mean, std, image_size, PAPER_PADDING[image_size])

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Augment and normalise one batch."""
        side = self.image_size
        if images.dtype != torch.uint8:
            raise FewshotError(
                f"augmentation expects uint8 images [N, C, {side}, {side}], got {images.dtype}"
            )
        fault = shape_fault(images.shape, ("N", "C", "H", "W"), {"H": side, "W": side})
        if fault:
            raise FewshotError(f"augmentation {fault}")
        n = len(images)
        device, gen_device = images.device, generator.device
        offsets = torch.randint(
            0, 2 * self.padding + 1, (n, 2), generator=generator, device=gen_device
        )
        flips = torch.rand(n, generator=generator, device=gen_device) < (0.5 if self.flip else 0)
        if self.padding or self.flip:
            images = crop_flip(images, self.padding, offsets.to(device), flips.to(device))
        x = images.float().div(255)
        if self.jitter:
            low = max(0.0, 1.0 - self.jitter)
            u = torch.rand(n, 3, generator=generator, device=gen_device)
            factors = low + (1.0 + self.jitter - low) * u
            order = torch.rand(n, 3, generator=generator, device=gen_device).argsort(dim=1)
            x = color_jitter(x, factors.to(device), order.to(device))
        return normalize_float(x, self.mean, self.std)
