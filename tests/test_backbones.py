"""Backbones: output sizes, parameter counts by hand, the DropBlock ramp in the state_dict."""

from __future__ import annotations

import pytest
import torch

from fewshot.backbones import Conv4, ResNet12, build_backbone
from fewshot.runtime.errors import FewshotError


def conv4_params(in_ch: int, ch: int = 64) -> int:
    """Hand count: 4 x (3x3 conv weights + bias + BN gamma/beta)."""
    first = in_ch * ch * 9 + ch + 2 * ch
    rest = ch * ch * 9 + ch + 2 * ch
    return first + 3 * rest


def resnet12_params(in_ch: int, widths=(64, 160, 320, 640)) -> int:
    """Hand count: per block three bias-free 3x3 convs + BNs and a 1x1 shortcut conv + BN."""
    total, c_in = 0, in_ch
    for c in widths:
        total += 9 * (c_in * c + 2 * c * c) + 3 * 2 * c + c_in * c + 2 * c
        c_in = c
    return total


@pytest.mark.parametrize(("size", "dim"), [(84, 1600), (28, 64), (32, 256)])
def test_conv4_feature_size(size, dim):
    net = Conv4(in_channels=3, image_size=size)
    assert net.out_dim == dim
    assert net(torch.randn(2, 3, size, size)).shape == (2, dim)


def test_conv4_parameter_count():
    assert sum(p.numel() for p in Conv4(3).parameters()) == conv4_params(3) == 113_088
    assert sum(p.numel() for p in Conv4(1).parameters()) == conv4_params(1)


def test_resnet12_shapes_and_parameters():
    net = ResNet12()
    count = sum(p.numel() for p in net.parameters())
    assert count == resnet12_params(3)
    assert 12.3e6 < count < 12.5e6  # "about 12.4M"
    assert net.out_dim == 16000
    assert net.eval()(torch.randn(1, 3, 84, 84)).shape == (1, 16000)
    pooled = ResNet12(image_size=32, avg_pool=True, drop_block_size=2)
    assert pooled.out_dim == 640
    assert pooled.eval()(torch.randn(2, 3, 32, 32)).shape == (2, 640)


def test_dropblock_ramp_lives_in_state_dict():
    net = ResNet12(channels=(4, 4, 4, 4), image_size=32, drop_rate=0.1, drop_ramp_steps=10)
    assert "drop_steps" in net.state_dict()
    x = torch.randn(2, 3, 32, 32)
    net.train()
    for _ in range(4):
        net(x)
    assert net.current_drop_block_rate() == pytest.approx(0.1 * 4 / 10)
    copy = ResNet12(channels=(4, 4, 4, 4), image_size=32, drop_rate=0.1, drop_ramp_steps=10)
    copy.load_state_dict(net.state_dict())
    assert copy.current_drop_block_rate() == net.current_drop_block_rate()
    net.eval()
    net(x)  # evaluation does not advance the ramp
    assert int(net.drop_steps) == 4


def test_dropblock_drops_about_the_asked_fraction():
    from fewshot.backbones.resnet12 import DropBlock

    torch.manual_seed(0)
    block = DropBlock(3).train()
    out = block(torch.ones(64, 16, 11, 11), 0.2)
    dropped = float((out == 0).float().mean())
    assert 0.15 < dropped < 0.25
    kept = out[out != 0]
    assert torch.allclose(kept, kept[0].expand_as(kept))  # survivors all rescaled alike
    assert float(out.mean()) == pytest.approx(1.0, rel=1e-5)  # rescaling keeps the mean
    assert torch.equal(block.eval()(torch.ones(2, 2, 5, 5), 0.5), torch.ones(2, 2, 5, 5))


def test_unknown_backbone_is_a_user_error():
    with pytest.raises(FewshotError, match="conv4, resnet12"):
        build_backbone("vgg", 3, 84)


def test_conv4_equals_the_textbook_block_order():
    # Our blocks pool before the ReLU (cheaper); the result must be conv-BN-ReLU-pool's.
    torch.manual_seed(0)
    net = Conv4(3, channels=8, image_size=32).train()
    reference = torch.nn.Sequential(
        *(
            torch.nn.Sequential(block[0], block[1], torch.nn.ReLU(), torch.nn.MaxPool2d(2))
            for block in net.encoder
        )
    )
    x = torch.randn(4, 3, 32, 32)
    ours = net(x)
    ours.square().sum().backward()
    ours_grad = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    theirs = reference(x).flatten(1)
    theirs.square().sum().backward()
    assert torch.allclose(ours, theirs, atol=1e-6)
    for g, p in zip(ours_grad, net.parameters(), strict=True):
        assert torch.allclose(g, p.grad, atol=1e-5)


@pytest.mark.parametrize(
    ("cls", "options", "message"),
    [
        (Conv4, {"channels": 0}, "Conv4 channels must be an integer >= 1, got 0"),
        (Conv4, {"in_channels": "x"}, "Conv4 in_channels must be an integer >= 1, got 'x'"),
        (ResNet12, {"channels": (64, 0, 1, 1)}, "ResNet12 channels must be an integer >= 1"),
        (ResNet12, {"channels": (64, 64)}, "ResNet12 channels must be 4 integers, got (64, 64)"),
        (ResNet12, {"drop_block_size": -1}, "ResNet12 drop_block_size must be an integer >= 1"),
        (ResNet12, {"drop_rate": 1.0}, "ResNet12 drop_rate must be a number in [0, 1), got 1.0"),
        (ResNet12, {"drop_ramp_steps": -5}, "ResNet12 drop_ramp_steps must be an integer >= 0"),
        (ResNet12, {"avg_pool": "False"}, "ResNet12 avg_pool must be True or False, got 'False'"),
        # The max-pools come before the average: 8 pixels cannot be embedded either way.
        (ResNet12, {"image_size": 8, "avg_pool": True}, "ResNet12 needs images of at least 16"),
    ],
)
def test_constructor_arguments_are_checked_by_name(cls, options, message):
    with pytest.raises(ValueError) as error:
        cls(**options)
    assert str(error.value).startswith(message)


@pytest.mark.parametrize(
    ("net", "images", "message"),
    [
        (Conv4(1, image_size=28), torch.zeros(2, 3, 28, 28), "Conv4 input expects 1 channel, "
         "got 3 (shape (2, 3, 28, 28) is [N, C, H, W])"),
        (Conv4(1, image_size=28), torch.zeros(2, 1, 8, 28), "Conv4 input expects a height of "
         "at least 16, got 8 (shape (2, 1, 8, 28) is [N, C, H, W])"),
        (Conv4(1, image_size=28), torch.zeros(2, 1, 28, 8), "Conv4 input expects a width of "
         "at least 16, got 8 (shape (2, 1, 28, 8) is [N, C, H, W])"),
        (Conv4(1, image_size=28), torch.zeros(1, 28, 28), "Conv4 input expects 4 dimensions "
         "[N, C, H, W], got 3: shape (1, 28, 28)"),
        (Conv4(1, image_size=28), torch.zeros(2, 1, 28, 28, dtype=torch.uint8), "Conv4 input "
         "must be float images [N, 1, H, W] with H, W >= 16, got a torch.uint8 tensor"),
        (ResNet12(image_size=32, drop_block_size=2), torch.zeros(2, 1, 32, 32), "ResNet12 "
         "input expects 3 channels, got 1 (shape (2, 1, 32, 32) is [N, C, H, W])"),
        (ResNet12(image_size=32, drop_block_size=2), torch.zeros(2, 3, 12, 32), "ResNet12 "
         "input expects a height of at least 16, got 12"),
    ],
)  # fmt: skip
def test_forward_refuses_other_channels_or_too_small_images_in_one_line(net, images, message):
    with pytest.raises(ValueError) as error:
        net(images)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_the_strided_conv4_embeds_small_images():
    net = Conv4(1, image_size=28, downsample="stride")
    assert net(torch.zeros(2, 1, 8, 8)).shape == (2, 64)
