"""torch.hub entry points load offline from the repository (source='local')."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fewshot.benchmark.results import STORED, read_results
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import evaluate
from fewshot.runtime.io import load_checkpoint

REPO = Path(__file__).resolve().parents[1]


def test_backbones_build_through_the_hub():
    conv = torch.hub.load(str(REPO), "conv4", source="local", image_size=84)
    assert conv.out_dim == 1600
    assert conv(torch.zeros(2, 3, 84, 84)).shape == (2, 1600)
    net = torch.hub.load(str(REPO), "resnet12", source="local", avg_pool=True)
    assert net.out_dim == 640
    assert 12.3e6 < sum(p.numel() for p in net.parameters()) < 12.5e6


def test_the_zoo_model_is_the_trained_checkpoint_and_classifies(omniglot_test):
    model = torch.hub.load(str(REPO), "protonet_conv4_omniglot", source="local")
    saved = load_checkpoint(REPO / "models" / "omniglot" / "protonet_conv4_trainval.pt")
    for key, value in model.state_dict().items():
        assert torch.equal(value, saved["model"][key]), key
    assert not model.training
    result = evaluate(model, omniglot_test, EpisodeShape(5, 1, 15, 8), 100, 0, torch.device("cpu"))
    assert result.accuracy > 97.0  # 98.75 % over 2000 such episodes
    untrained = torch.hub.load(
        str(REPO), "protonet_conv4_omniglot", source="local", pretrained=False
    )
    assert not torch.equal(
        untrained.backbone.encoder[0][0].weight, model.backbone.encoder[0][0].weight
    )


@pytest.mark.parametrize("variant", ["maml", "fomaml", "anil", "imaml"])
def test_the_maml_family_zoo_models_adapt_to_real_episodes(omniglot_test, variant):
    entry = f"{variant}_conv4_omniglot"
    model = torch.hub.load(str(REPO), entry, source="local")
    saved = load_checkpoint(REPO / "models" / "omniglot" / f"{variant}_conv4_5way1shot_cpu.pt")
    for key, value in model.state_dict().items():
        assert torch.equal(value, saved["model"][key]), key
    assert not model.training and model.variant == variant
    result = evaluate(model, omniglot_test, EpisodeShape(5, 1, 15, 8), 100, 0, torch.device("cpu"))
    # The first 100 of the table's 2000 episodes: within sampling noise of its number.
    assert result.accuracy > reproduced(f"{variant}_conv4_5way1shot_cpu", 5, 1) - 2.0
    untrained = torch.hub.load(str(REPO), entry, source="local", pretrained=False)
    # 50 episodes: an untrained model stands 30-50 points under the trained one (31-52 %).
    untrained_result = evaluate(
        untrained, omniglot_test, EpisodeShape(5, 1, 15, 8), 50, 0, torch.device("cpu")
    )
    assert untrained_result.accuracy < result.accuracy - 10


def reproduced(config: str, way: int, shot: int) -> float:
    """A shipped model's accuracy over 2000 seeded test episodes at one shape, as the zoo's
    stored omniglot-v1 results (the reproduction table's) record it."""
    (result,) = [
        r
        for r in read_results(STORED / "omniglot-v1", "omniglot-v1", True)
        if r.record.get("checkpoint") == f"models/omniglot/{config}.pt"
        and r.cell == f"{way}w{shot}s"
    ]
    return result.record["accuracy"]


@pytest.mark.parametrize("name", ["matching", "relation"])
def test_the_metric_zoo_models_classify_real_episodes(name, omniglot_test):
    model = torch.hub.load(str(REPO), f"{name}_conv4_omniglot", source="local")
    saved = load_checkpoint(REPO / "models" / "omniglot" / f"{name}_conv4_5way1shot.pt")
    for key, value in model.state_dict().items():
        assert torch.equal(value, saved["model"][key]), key
    assert not model.training and model.head_name == name
    result = evaluate(model, omniglot_test, EpisodeShape(5, 1, 15, 8), 100, 0, torch.device("cpu"))
    # The first 100 of the table's 2000 episodes: within sampling noise of its number.
    assert result.accuracy > reproduced(f"{name}_conv4_5way1shot", 5, 1) - 2.0


@pytest.mark.parametrize("name", ["matching", "relation"])
def test_the_metric_zoo_models_come_in_every_shipped_shape(name):
    shipped = sorted((REPO / "models" / "omniglot").glob(f"{name}_conv4_*way*shot.pt"))
    for path in shipped:
        shape = path.stem.split("_")[-1]
        model = torch.hub.load(str(REPO), f"{name}_conv4_omniglot", source="local", shape=shape)
        saved = load_checkpoint(path)
        assert saved["config"]["way"] == int(shape.split("way")[0])
        for key, value in model.state_dict().items():
            assert torch.equal(value, saved["model"][key]), key
    message = rf"{name}_conv4_omniglot shape must be one of .*5way1shot.*, got '3way1shot'"
    with pytest.raises(ValueError, match=message):
        torch.hub.load(str(REPO), f"{name}_conv4_omniglot", source="local", shape="3way1shot")


def test_hub_keyword_arguments_are_checked_by_name():
    with pytest.raises(ValueError, match="ResNet12 drop_block_size must be an integer >= 1"):
        torch.hub.load(str(REPO), "resnet12", source="local", drop_block_size=-1)
    with pytest.raises(ValueError, match="Conv4 in_channels must be an integer >= 1, got 'x'"):
        torch.hub.load(str(REPO), "conv4", source="local", in_channels="x")


@pytest.mark.parametrize(
    "entry",
    [
        "protonet_conv4_omniglot",
        "maml_conv4_omniglot",
        "fomaml_conv4_omniglot",
        "anil_conv4_omniglot",
        "imaml_conv4_omniglot",
        "matching_conv4_omniglot",
        "relation_conv4_omniglot",
    ],
)
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        # A string is no boolean: "False" returned the trained model before.
        ({"pretrained": "False"}, "pretrained must be True or False, got 'False'"),
        ({"pretrained": 0}, "pretrained must be True or False, got 0"),
        ({"device": "gpu"}, "device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
        ({"device": 3.5}, "device must be 'cpu', 'cuda' or 'cuda:N', got 3.5"),
        ({"device": "meta"}, "device must be 'cpu', 'cuda' or 'cuda:N', got 'meta'"),
        ({"device": "cuda:99"}, "device 'cuda:99': this machine has"),
    ],
)
def test_zoo_entry_points_check_their_arguments_by_name(entry, arguments, message):
    with pytest.raises(ValueError) as error:
        torch.hub.load(str(REPO), entry, source="local", **arguments)
    assert str(error.value).startswith(f"{entry} {message}")
