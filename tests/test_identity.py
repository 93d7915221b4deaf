"""One identity for everything that decides a frozen backbone's features and a result: each
option that changes the features names another feature-cache entry and another result, in eval
and compare alike; a module from Python keeps no features on disk."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch import nn

import fewshot
from fewshot.backbones.conv4 import Conv4
from fewshot.cli.main import main


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A feature cache of this test's own (the features every command keeps)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("FEWSHOT_CACHE", str(folder))
    return folder / "features"


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """A folder data set of 6 classes of 8 RGB 20x20 images, each class its own colours."""
    root = tmp_path_factory.mktemp("images")
    generator = torch.Generator().manual_seed(0)
    for c in range(6):
        folder = root / "test" / f"class{c}"
        folder.mkdir(parents=True)
        base = torch.randint(0, 256, (3,), generator=generator)
        for i in range(8):
            noise = torch.randint(-40, 41, (20, 20, 3), generator=generator)
            pixels = (base + noise).clamp(0, 255).to(torch.uint8).numpy()
            Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def evaluate(images: Path, out: Path, *flags: str) -> dict:
    """`fewshot eval` of a frozen conv4 on the folder, 5-way 1-shot, 10 episodes; its record."""
    argv = ["eval", "--backbone", "conv4", "--dataset", "folder", "--data-root", str(images)]
    argv += ["--way", "5", "--query", "3", "--episodes", "10", "--device", "cpu", "--per-episode"]
    assert main([*argv, "--out", str(out), *flags]) == 0
    return json.loads(out.read_text())


def entries(cache: Path) -> set[str]:
    """The feature cache's entries."""
    return {p.name for p in cache.glob("*.npy")} if cache.is_dir() else set()


# Each option that changes what a frozen backbone computes from the same folder.
CHANGES = {
    "pooled_blocks": ("--backbone-options", '{"pooled_blocks": 3}'),
    "downsample": ("--backbone-options", '{"downsample": "stride"}'),
    "resize": ("--resize", "16"),
    "channels": ("--channels", "1"),
    "precision": ("--amp", "bf16"),
    "normalization": ("--normalization", "dataset"),
}


@pytest.mark.parametrize("option", list(CHANGES))
def test_every_option_that_changes_features_names_another_entry_and_result(
    option, images, cache, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    plain = evaluate(images, tmp_path / "plain.json", "--amp", "off")
    first = entries(cache)
    assert len(first) == 1
    flags = CHANGES[option]
    flags = flags if option == "precision" else (*flags, "--amp", "off")
    changed = evaluate(images, tmp_path / "changed.json", *flags)
    assert len(entries(cache)) == 2, f"{option} read the plain backbone's features"
    # The default result names differ too: the two never replace each other.
    argv = ["eval", "--backbone", "conv4", "--dataset", "folder", "--data-root", str(images)]
    argv += ["--way", "5", "--query", "3", "--episodes", "10", "--device", "cpu"]
    assert main([*argv, "--amp", "off"]) == 0
    assert main([*argv, *flags]) == 0
    named = list((tmp_path / "results" / "backbones" / "conv4").glob("*.json"))
    assert len(named) == 2
    assert {k: v for k, v in plain.items() if k != "accuracies"} != {
        k: v for k, v in changed.items() if k != "accuracies"
    }


def test_options_that_change_the_network_change_its_accuracy(images, cache, tmp_path):
    # The bug this guards against: the pooled network read the plain one's features, exit 0.
    plain = evaluate(images, tmp_path / "plain.json", "--amp", "off")
    pooled = evaluate(
        images, tmp_path / "pooled.json", "--amp", "off", "--backbone-options",
        '{"pooled_blocks": 3}',
    )  # fmt: skip
    assert plain["accuracies"] != pooled["accuracies"]


class Scaled(nn.Module):
    """A conv4 whose forward multiplies its features by `scale`, a plain attribute: two of
    them share class, structure and weights and still compute otherwise."""

    def __init__(self, net: Conv4, scale: float):
        super().__init__()
        self.net, self.scale = net, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.net(x)
        return features + self.scale * features.abs().mean(dim=1, keepdim=True) * torch.arange(
            features.shape[1], dtype=features.dtype
        )


def test_modules_that_share_weights_are_never_each_others_features(
    tiny_omniglot_root, cache, tmp_path
):
    torch.manual_seed(0)
    net = Conv4(in_channels=1, image_size=28)
    a, b = Scaled(net, 0.0), Scaled(net, 5.0)
    flags = dict(data_root=str(tiny_omniglot_root), episodes=40, amp="off", device="cpu")
    flags.update(dataset="omniglot")
    first = fewshot.evaluate(backbone=a, out=str(tmp_path / "a.json"), **flags)
    second = fewshot.evaluate(backbone=b, out=str(tmp_path / "b.json"), **flags)
    assert entries(cache) == set()  # a module's features are not kept on disk
    assert first.accuracy != second.accuracy
    difference = fewshot.compare(a, b, **flags)
    assert difference.mean != 0
    # Their results record what tells them apart only as far as it can be read: the same
    # class and structure, so the results are kept apart by their names, not confused.
    records = [json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab"]
    assert records[0]["module_class"] == records[1]["module_class"] == f"{__name__}.Scaled"


def test_a_module_of_other_weights_is_another_comparison(tiny_omniglot_root, tmp_path):
    torch.manual_seed(0)
    nets = [Conv4(in_channels=1, image_size=28) for _ in range(3)]
    flags = dict(data_root=str(tiny_omniglot_root), episodes=20, amp="off", device="cpu")
    flags.update(dataset="omniglot", classifier="centroid", out=str(tmp_path / "c.json"))
    fewshot.compare(nets[0], nets[1], **flags)
    # The same file for other weights: refused, where it used to be replaced, exit 0.
    with pytest.raises(fewshot.FewshotError, match="already holds another result"):
        fewshot.compare(nets[0], nets[2], **flags)
    fewshot.compare(nets[0], nets[1], **flags)  # the same comparison may be written again
    assert os.path.getsize(tmp_path / "c.json") > 0


def test_compare_names_its_data_root_and_geometry(images, tmp_path):
    out = tmp_path / "c.json"
    argv = ["compare", "conv4", "resnet12", "--dataset", "folder", "--data-root", str(images)]
    argv += ["--way", "5", "--query", "3", "--episodes", "10", "--device", "cpu"]
    argv += ["--classifier", "centroid", "--backbone-options", "{}", "--out", str(out)]
    assert main(argv) == 0
    record = json.loads(out.read_text())
    assert record["data_root"] == str(images.resolve())
    assert main([*argv, "--resize", "16"]) == 2  # another geometry is another comparison
