"""MetaOptNet augmentation on batches: normalisation, crop/flip, colour jitter, reproducibility."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms.functional as TF

from fewshot.datasets.augment import TrainAugment, color_jitter, crop_flip, normalize
from fewshot.datasets.miniimagenet import MEAN, STD
from fewshot.runtime.errors import FewshotError


def batch(n: int, size: int = 84, seed: int = 0) -> torch.Tensor:
    """Random uint8 [n, 3, size, size] images."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)


def test_normalize_is_totensor_then_normalize() -> None:
    images = batch(4)
    expected = TF.normalize(images.float() / 255, list(MEAN), list(STD))
    assert torch.equal(normalize(images, MEAN, STD), expected)
    as_float64 = (images.double() / 255 - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(
        STD
    ).view(1, 3, 1, 1)
    assert torch.allclose(normalize(images, MEAN, STD).double(), as_float64, atol=1e-5)


def test_normalize_refuses_float_input() -> None:
    with pytest.raises(FewshotError, match="uint8"):
        normalize(batch(1).float(), MEAN, STD)


def test_crop_flip_hand_made_case() -> None:
    image = torch.arange(1, 10, dtype=torch.uint8).view(1, 1, 3, 3)
    two = image.expand(2, 1, 3, 3)
    out = crop_flip(two, 1, torch.tensor([[0, 0], [2, 1]]), torch.tensor([False, True]))
    assert out.dtype == torch.uint8 and out.shape == (2, 1, 3, 3)
    assert out[0, 0].tolist() == [[0, 0, 0], [0, 1, 2], [0, 4, 5]]
    # Rows 2..4, columns 1..3 of the padded image are [[4,5,6],[7,8,9],[0,0,0]]; then mirrored.
    assert out[1, 0].tolist() == [[6, 5, 4], [9, 8, 7], [0, 0, 0]]


def test_crop_flip_matches_per_image_pad_slice_flip() -> None:
    images = batch(16, 32)
    g = torch.Generator().manual_seed(1)
    offsets = torch.randint(0, 9, (16, 2), generator=g)
    flips = torch.rand(16, generator=g) < 0.5
    out = crop_flip(images, 4, offsets, flips)
    for i in range(16):
        padded = F.pad(images[i], (4, 4, 4, 4))
        top, left = offsets[i].tolist()
        crop = padded[:, top : top + 32, left : left + 32]
        expected = crop.flip(-1) if flips[i] else crop
        assert torch.equal(out[i], expected)


def test_color_jitter_matches_torchvision_step_by_step() -> None:
    x = batch(6, 16).float() / 255
    g = torch.Generator().manual_seed(2)
    factors = 0.6 + 0.8 * torch.rand(6, 3, generator=g)
    order = torch.stack([torch.randperm(3, generator=g) for _ in range(6)])
    adjust = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation)
    out = color_jitter(x, factors, order)
    for i in range(6):
        expected = x[i]
        for op in order[i].tolist():
            expected = adjust[op](expected, float(factors[i, op]))
        assert torch.allclose(out[i], expected, atol=1e-6)


def test_no_jitter_no_crop_no_flip_is_pure_normalisation() -> None:
    images = batch(8)
    aug = TrainAugment(MEAN, STD, 84, padding=0, jitter=0.0, flip=False)
    out = aug(images, torch.Generator().manual_seed(0))
    assert torch.equal(out, normalize(images, MEAN, STD))


def test_crop_and_flip_follow_the_documented_draw_order() -> None:
    images = batch(32)
    aug = TrainAugment(MEAN, STD, 84, padding=8, jitter=0.0, flip=True)
    out = aug(images, torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    offsets = torch.randint(0, 17, (32, 2), generator=g)
    flips = torch.rand(32, generator=g) < 0.5
    assert 0 < int(flips.sum()) < 32
    assert torch.equal(out, normalize(crop_flip(images, 8, offsets, flips), MEAN, STD))


def test_flip_only_gives_each_image_or_its_mirror() -> None:
    images = batch(64, 32)
    aug = TrainAugment(MEAN, STD, 32, padding=0, jitter=0.0, flip=True)
    out = aug(images, torch.Generator().manual_seed(3))
    plain, mirrored = normalize(images, MEAN, STD), normalize(images.flip(-1), MEAN, STD)
    same = (out == plain).flatten(1).all(1)
    flipped = (out == mirrored).flatten(1).all(1)
    assert bool((same | flipped).all()) and 10 < int(flipped.sum()) < 54


def test_same_seed_same_output_and_state_resumes() -> None:
    images = batch(10)
    aug = TrainAugment.paper(MEAN, STD, 84)
    a = aug(images, torch.Generator().manual_seed(7))
    b = aug(images, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)
    assert not torch.equal(a, aug(images, torch.Generator().manual_seed(8)))
    g = torch.Generator().manual_seed(7)
    aug(images, g)
    state = g.get_state()
    second = aug(images, g)
    assert not torch.equal(second, a)
    g.set_state(state)
    assert torch.equal(aug(images, g), second)


def test_jittered_values_stay_in_the_image_range() -> None:
    out = TrainAugment.paper(MEAN, STD, 32)(batch(20, 32), torch.Generator().manual_seed(0))
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    pixels = out * std + mean
    assert pixels.min() >= -1e-5 and pixels.max() <= 1 + 1e-5
    assert out.dtype == torch.float32 and out.shape == (20, 3, 32, 32)


def test_paper_settings_and_bad_input() -> None:
    assert TrainAugment.paper(MEAN, STD, 84).padding == 8
    assert TrainAugment.paper(MEAN, STD, 32).padding == 4
    with pytest.raises(FewshotError, match="no paper augmentation"):
        TrainAugment.paper(MEAN, STD, 28)
    augment = TrainAugment.paper(MEAN, STD, 84)
    with pytest.raises(FewshotError, match=r"expects height 84, got 32 \(shape \(2, 3, 32, 32\)"):
        augment(batch(2, 32), torch.Generator())
    with pytest.raises(FewshotError, match="expects uint8 images"):
        augment(batch(2).float(), torch.Generator())


def test_a_training_batch_is_fast() -> None:
    images = batch(160)
    aug = TrainAugment.paper(MEAN, STD, 84)
    g = torch.Generator().manual_seed(0)
    aug(images, g)
    start = time.perf_counter()
    for _ in range(3):
        out = aug(images, g)
    seconds = (time.perf_counter() - start) / 3
    print(f"TrainAugment on [160, 3, 84, 84]: {seconds * 1000:.0f} ms per batch")
    assert out.shape == (160, 3, 84, 84)
    assert seconds < 2.0  # generous: the machine running the tests may be busy


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cpu_generator_gives_the_same_augmentation_on_the_gpu() -> None:
    images = batch(160)
    aug = TrainAugment.paper(MEAN, STD, 84)
    on_cpu = aug(images, torch.Generator().manual_seed(4))
    on_gpu = aug(images.cuda(), torch.Generator().manual_seed(4))
    assert on_gpu.is_cuda
    assert torch.allclose(on_gpu.cpu(), on_cpu, atol=1e-5)
