"""MetaOptNet checkpoint import: exact forward equality with MetaOptNet's own layer definitions."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fewshot.cli.main import main
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import load_checkpoint
from fewshot.training.checkpoint import load_trained
from fewshot.training.metaoptnet_import import import_metaoptnet


def bn_entries(prefix: str, channels: int) -> list[tuple[str, tuple[int, ...]]]:
    """A BatchNorm2d's state_dict names and shapes."""
    return [
        (f"{prefix}.{n}", (channels,)) for n in ("weight", "bias", "running_mean", "running_var")
    ]


def metaoptnet_conv4_names() -> list[tuple[str, tuple[int, ...]]]:
    """ProtoNetEmbedding's parameter names (models/protonet_embedding.py), written out by hand."""
    names = []
    for i, c_in in enumerate((3, 64, 64, 64)):
        names.append((f"encoder.{i}.block.0.weight", (64, c_in, 3, 3)))  # conv, bias=False
        names += bn_entries(f"encoder.{i}.block.1", 64)
    return names


def metaoptnet_resnet12_names() -> list[tuple[str, tuple[int, ...]]]:
    """ResNet12_embedding's parameter names (layerN.0.{conv,bn}{1,2,3}, downsample.{0,1})."""
    names = []
    for n, (c_in, c_out) in enumerate(((3, 64), (64, 160), (160, 320), (320, 640)), 1):
        for j in (1, 2, 3):
            names.append((f"layer{n}.0.conv{j}.weight", (c_out, c_in if j == 1 else c_out, 3, 3)))
            names += bn_entries(f"layer{n}.0.bn{j}", c_out)
        names.append((f"layer{n}.0.downsample.0.weight", (c_out, c_in, 1, 1)))
        names += bn_entries(f"layer{n}.0.downsample.1", c_out)
    return names


def random_state(names, seed: int, batches_tracked: int | None = 7) -> dict[str, torch.Tensor]:
    """Random tensors for `names` (positive running variances), plus BN counters if given."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in names:
        value = torch.randn(shape, generator=gen) * 0.2
        if name.endswith("running_var"):
            value = value.abs() + 0.5
        state[name] = value
        if batches_tracked is not None and name.endswith("running_var"):
            counter = name.replace("running_var", "num_batches_tracked")
            state[counter] = torch.tensor(batches_tracked)
    return state


def bn(x: torch.Tensor, state: dict, prefix: str) -> torch.Tensor:
    """BatchNorm in eval mode from MetaOptNet-named tensors."""
    return F.batch_norm(
        x,
        state[f"{prefix}.running_mean"],
        state[f"{prefix}.running_var"],
        state[f"{prefix}.weight"],
        state[f"{prefix}.bias"],
    )


def metaoptnet_conv4_forward(state: dict, x: torch.Tensor) -> torch.Tensor:
    """ProtoNetEmbedding.forward in eval mode, straight from its layer definitions."""
    for i in range(4):
        x = F.conv2d(x, state[f"encoder.{i}.block.0.weight"], padding=1)
        x = F.max_pool2d(F.relu(bn(x, state, f"encoder.{i}.block.1")), 2)
    return x.flatten(1)


def metaoptnet_resnet12_forward(state: dict, x: torch.Tensor) -> torch.Tensor:
    """ResNet12 BasicBlock.forward x 4 in eval mode (dropout and DropBlock off)."""
    for n in range(1, 5):
        p = f"layer{n}.0"
        out = x
        for j in (1, 2, 3):
            out = bn(F.conv2d(out, state[f"{p}.conv{j}.weight"], padding=1), state, f"{p}.bn{j}")
            if j < 3:
                out = F.leaky_relu(out, 0.1)
        residual = bn(F.conv2d(x, state[f"{p}.downsample.0.weight"]), state, f"{p}.downsample.1")
        x = F.max_pool2d(F.leaky_relu(out + residual, 0.1), 2)
    return x.flatten(1)


CASES = {
    "conv4": (metaoptnet_conv4_names, metaoptnet_conv4_forward),
    "resnet12": (metaoptnet_resnet12_names, metaoptnet_resnet12_forward),
}


@pytest.mark.parametrize("prefix", ["", "module."])
@pytest.mark.parametrize("backbone", ["conv4", "resnet12"])
def test_imported_model_computes_metaoptnet_forward(tmp_path, backbone, prefix):
    names, forward = CASES[backbone]
    embedding = random_state(names(), seed=1)
    ckpt = {
        "embedding": {prefix + k: v for k, v in embedding.items()},
        "head": {"scale": torch.tensor([3.5])},
    }
    path = tmp_path / "best_model.pth"
    torch.save(ckpt, path)
    out = tmp_path / "imported.pt"
    # Through the CLI, and back through the loader `fewshot eval` uses.
    assert main(["import-metaoptnet", "--checkpoint", str(path), "--backbone", backbone,
                 "--head", "svm", "--dataset", "cifar-fs", "--out", str(out)]) == 0  # fmt: skip
    model, config = load_trained(out, torch.device("cpu"))
    image_size = load_checkpoint(out)["config"]["image_size"]
    assert (config["backbone"], config["head"], image_size) == (backbone, "svm", 32)
    assert config["eval_head_options"] == {}
    images = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    model.amp = "off"  # the reference forward is float32
    with torch.no_grad():
        assert torch.equal(model.embed(images), forward(embedding, images))
    assert model.scale.item() == 3.5
    if backbone == "resnet12":
        # The DropBlock ramp resumes where BatchNorm's training-forward count stood.
        assert int(model.backbone.drop_steps) == 7
        assert model.backbone.blocks[3].drop_block.block_size == 2


def test_missing_bn_counters_mean_a_finished_ramp():
    embedding = random_state(metaoptnet_resnet12_names(), seed=3, batches_tracked=None)
    ckpt = {"embedding": embedding, "head": {"scale": torch.tensor([1.0])}}
    converted = import_metaoptnet(ckpt, "resnet12", "protonet", "miniimagenet", "old.pth")
    assert int(converted["model"]["backbone.drop_steps"]) == 40_000
    assert converted["config"]["image_size"] == 84
    assert converted["config"]["backbone_options"] == {"drop_block_size": 5}
    assert converted["config"]["head_options"] == {"normalize_by_dim": True}


@pytest.mark.parametrize(("head", "factor"), [("ridge", 2.0), ("r2d2", 1.0), ("protonet", 1.0)])
def test_head_scale_gives_metaoptnet_logits(head, factor):
    # MetaOptNet's Ridge head returns twice the ridge solution's scores (its QP's linear term
    # is -2y); R2D2's and ProtoNet's match ours.
    ckpt = {
        "embedding": random_state(metaoptnet_conv4_names(), seed=4),
        "head": {"scale": torch.tensor([0.75])},
    }
    converted = import_metaoptnet(ckpt, "conv4", head, "miniimagenet", "ckpt.pth")
    assert float(converted["model"]["scale"]) == 0.75 * factor


def test_wrong_backbone_is_named():
    ckpt = {
        "embedding": random_state(metaoptnet_conv4_names(), seed=5),
        "head": {"scale": torch.tensor([1.0])},
    }
    with pytest.raises(FewshotError, match=r"not a MetaOptNet resnet12.*holds a conv4 embedding"):
        import_metaoptnet(ckpt, "resnet12", "svm", "miniimagenet", "ckpt.pth")


def test_wrong_dataset_size_and_bad_layout_are_named():
    ckpt = {
        "embedding": random_state(metaoptnet_conv4_names(), seed=6),
        "head": {"scale": torch.tensor([1.0])},
    }
    ckpt["embedding"]["encoder.0.block.0.weight"] = torch.zeros(64, 1, 3, 3)  # grey input
    with pytest.raises(FewshotError, match=r"does not fit our conv4.*size mismatch"):
        import_metaoptnet(ckpt, "conv4", "svm", "miniimagenet", "ckpt.pth")
    with pytest.raises(FewshotError, match="expected MetaOptNet keys 'embedding' and 'head'"):
        import_metaoptnet({"state_dict": {}}, "conv4", "svm", "miniimagenet", "ckpt.pth")


def test_fewshot_eval_runs_on_an_imported_checkpoint(tmp_path, capsys):
    embedding = random_state(metaoptnet_conv4_names(), seed=7)
    path = tmp_path / "moon.pth"
    torch.save({"embedding": embedding, "head": {"scale": torch.tensor([1.0])}}, path)
    out = tmp_path / "imported.pt"
    args = ["--backbone", "conv4", "--head", "protonet", "--dataset", "cifar-fs"]
    assert main(["import-metaoptnet", "--checkpoint", str(path), *args, "--out", str(out)]) == 0
    # A tiny CIFAR-FS test split in MetaOptNet's pickle format: 5 classes x 8 images.
    rng = np.random.default_rng(0)
    root = tmp_path / "data" / "cifar-fs"
    root.mkdir(parents=True)
    data = {
        "data": rng.integers(0, 256, (40, 32, 32, 3), dtype=np.uint8),
        "labels": np.repeat(np.arange(5), 8),
    }
    (root / "CIFAR_FS_test.pickle").write_bytes(pickle.dumps(data))
    result = tmp_path / "result.json"
    data_root = str(tmp_path / "data")
    episodes = ["--episodes", "4", "--shot", "1", "--query", "3"]
    assert main(["eval", "--checkpoint", str(out), "--data-root", data_root, *episodes,
                 "--out", str(result)]) == 0  # fmt: skip
    assert "accuracy:" in capsys.readouterr().out
    assert result.is_file()
