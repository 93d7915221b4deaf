"""Backbones by name from timm and torchvision (`--backbone timm:NAME`, `torchvision:NAME`):
features without the classifier, the model's own input size and normalisation, weights from a
state dict file, a learning rate of their own or frozen, and one-line refusals before any data
is read. Small models without weights on tiny images; nothing is downloaded."""

from __future__ import annotations

import io
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import huggingface_hub.constants
import pytest
import timm
import torch
import torchvision
from PIL import Image
from test_folder import split_folders
from trainers import make_trainer

from fewshot.backbones import build_backbone
from fewshot.cli.main import main
from fewshot.datasets import load_split
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.settings import SettingError
from fewshot.training.checkpoint import load_trained
from fewshot.training.settings import TrainSettings

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


@pytest.fixture(autouse=True)
def tiny_data(tiny_omniglot_root, monkeypatch):
    """Every Omniglot run here reads it cut to 24 classes per split."""
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))


def tiny_settings(tmp_path, **changes) -> TrainSettings:
    """Two training episodes and two validation episodes of 3-way 1-shot Omniglot."""
    values = dict(
        dataset="omniglot", way=3, shot=1, query=2, val_query=2, epochs=1,
        episodes_per_epoch=2, episodes_per_batch=1, val_episodes=2, backbone="timm:resnet10t",
        device="cpu", amp="off", out=str(tmp_path / "run"),
    )  # fmt: skip
    return TrainSettings(**{**values, **changes})


# ---------------------------------------------------------------- the modules


def test_a_timm_backbone_returns_features_without_its_classifier():
    backbone = build_backbone("timm:resnet10t", 1, 28)
    assert backbone(torch.rand(2, 1, 28, 28)).shape == (2, backbone.out_dim) == (2, 512)
    assert not any(key.startswith("model.fc.") for key in backbone.state_dict())
    assert backbone.classifier == ("fc",)
    # The input size and normalisation of timm's pretrained config for the model.
    given = backbone.model_input
    assert (given.side, given.mean, given.std) == (176, *IMAGENET)


def test_a_torchvision_backbone_repeats_a_gray_channel_and_drops_its_last_linear_layer():
    torch.manual_seed(0)
    backbone = build_backbone("torchvision:resnet18", 1, 32).eval()
    gray = torch.rand(2, 1, 32, 32)
    features = backbone(gray)
    assert isinstance(backbone.model.fc, torch.nn.Identity) and backbone.out_dim == 512
    torch.testing.assert_close(features, backbone.model(gray.repeat(1, 3, 1, 1)))
    given = backbone.model_input  # from the default weights' transforms, nothing fetched
    assert (given.side, given.mean, given.std) == (224, *IMAGENET)


def test_a_vit_takes_the_size_it_is_built_for_and_refuses_another():
    backbone = build_backbone("timm:vit_tiny_patch16_224", 3, 32, img_size=32)
    assert backbone(torch.rand(1, 3, 32, 32)).shape == (1, 192)
    assert backbone.model_input.side == 32
    with pytest.raises(ValueError, match=r"cannot take 3x32x32 images: Input height \(32\)"):
        build_backbone("timm:vit_tiny_patch16_224", 3, 32)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("timm:resnt10t", "'timm:resnt10t' is not a timm model; close names: resnet10t"),
        ("timm:resnet18.bogus", "is not a timm model; close names: resnet18."),
        ("torchvision:resnet19", "is not a torchvision model; close names: resnet18"),
        ("torchvision:fasterrcnn_resnet50_fpn", "is not a torchvision model"),  # a detector
    ],
)
def test_unknown_models_are_refused_with_the_closest_names(name, message):
    with pytest.raises(ValueError, match=message):
        build_backbone(name, 3, 32)


def test_a_missing_library_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm now raises ImportError
    with pytest.raises(ValueError, match=r"needs timm, which is not installed: pip install"):
        build_backbone("timm:resnet10t", 3, 32)


def test_pretrained_weights_are_asked_for_only_by_a_real_build(monkeypatch):
    asked = []
    create = timm.create_model

    def fake_create(name, pretrained=False, **options):
        asked.append(pretrained)
        return create(name, pretrained=False, **options)  # nothing fetched here

    monkeypatch.setattr(timm, "create_model", fake_create)
    with torch.device("meta"):
        build_backbone("timm:resnet10t", 3, 32, pretrained=True)
    build_backbone("timm:resnet10t", 3, 32, pretrained=True)
    assert asked == [False, True]


# ---------------------------------------------------------------- the command line


PRETRAINED = ["--backbone", "timm:resnet10t", "--backbone-options", '{"pretrained": true}']


def refused(argv: list[str], capsys) -> str:
    """The one-line error of `fewshot train` that must exit 2."""
    assert main(["train", *argv, "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backbone", "timm:resnt10t"], "--backbone 'timm:resnt10t' is not a timm model"),
        (["--backbone", "torchvision:resnet19"], "close names: resnet18"),
        (["--backbone", "conv5"], "--backbone must be one of conv4, resnet12, timm:NAME"),
        (
            ["--backbone", "timm:vit_tiny_patch16_224"],
            "--backbone 'timm:vit_tiny_patch16_224' cannot take 1x28x28 images",
        ),
        (
            ["--backbone", "torchvision:vit_b_16"],
            "--backbone 'torchvision:vit_b_16' cannot take 1x28x28 images: Input shape "
            "indivisible by patch size!",
        ),
        (
            ["--backbone", "timm:resnet10t", "--backbone-options", '{"depth": 3}'],
            "--backbone-options 'timm:resnet10t' options ['depth']: ResNet.__init__() got an "
            "unexpected keyword argument 'depth'",
        ),
        (
            ["--backbone", "torchvision:resnet18", "--backbone-options", '{"image_size": 64}'],
            "--backbone-options cannot set image_size: the images' geometry does",
        ),
        (
            ["--backbone", "timm:resnet10t", "--freeze-backbone", "--backbone-lr", "0.01"],
            "--backbone-lr does not apply to --freeze-backbone",
        ),
        (
            ["--backbone", "timm:resnet10t", "--normalization", "backbone"],
            "--normalization backbone needs a timm: or torchvision: backbone whose library gives "
            "a mean and std for 1-channel images",
        ),
        (["--method", "maml", "--freeze-backbone"], "--freeze-backbone does not apply to"),
        (
            [*PRETRAINED, "--backbone-weights", "w.pt"],
            "--backbone-weights and pretrained both give the backbone's weights",
        ),
        (
            ["--init", "p.pt", "--backbone", "timm:resnet10t", "--backbone-weights", "w.pt"],
            "--init and --backbone-weights or pretrained both give the backbone's weights",
        ),
    ],
)
def test_bad_backbones_are_refused_in_one_line_before_any_data(argv, message, tmp_path, capsys):
    # An empty data root: the refusal comes before any data is looked for.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert message in refused([*argv, "--data-root", str(empty)], capsys)


def test_weights_of_another_architecture_are_refused_naming_the_file_and_key(tmp_path, capsys):
    other = tmp_path / "resnet14t.pt"
    torch.save(timm.create_model("resnet14t", in_chans=1).state_dict(), other)
    err = refused(["--backbone", "timm:resnet10t", "--backbone-weights", str(other)], capsys)
    assert err == (
        f"fewshot train: error: --backbone-weights {other} does not fit --backbone "
        "timm:resnet10t: first mismatching key 'layer1.0.conv1.weight' (64x64x1x1 in the "
        "file, 64x64x3x3 here)"
    )
    loose = tmp_path / "loose.pt"
    torch.save({"model": {"w": torch.zeros(1)}}, loose)
    err = refused(["--backbone", "timm:resnet10t", "--backbone-weights", str(loose)], capsys)
    assert err.endswith(
        f"--backbone-weights {loose} is not a state dict: its entry 'model' is not a tensor"
    )


def test_a_file_that_would_run_code_is_not_loaded(tmp_path, capsys):
    hostile = tmp_path / "hostile.pt"
    torch.save({"w": torch.nn.Linear(1, 1)}, hostile)  # a pickled module, not plain tensors
    err = refused(["--backbone", "timm:resnet10t", "--backbone-weights", str(hostile)], capsys)
    assert "--backbone-weights: cannot read checkpoint" in err and "could run code" in err


@pytest.fixture
def no_network(tmp_path, monkeypatch) -> list:
    """No host answers (what this machine has anyway: the probe is stubbed so that no test
    touches a network); the libraries' caches empty. The hosts probed, in order."""
    probed = []

    def unreachable(address, *args, **kwargs):
        probed.append(address[0])
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.setattr(urllib.request, "getproxies", dict)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    return probed


@pytest.mark.parametrize(
    ("backbone", "host"),
    [("timm:resnet10t", "huggingface.co"), ("torchvision:resnet18", "download.pytorch.org")],
)
def test_pretrained_weights_without_a_network_are_one_line_naming_backbone_weights(
    backbone, host, no_network, tmp_path, capsys
):
    argv = ["--backbone", backbone, "--backbone-options", '{"pretrained": true}']
    argv += ["--way", "3", "--shot", "1", "--query", "2", "--val-query", "2", "--epochs", "1"]
    started = time.monotonic()
    err = refused([*argv, "--out", str(tmp_path / "run")], capsys)
    assert err.endswith(
        f"'{backbone}' with pretrained: true cannot fetch the library's weights (no connection "
        f"to {host}): download them where there is a network and pass the file with "
        "--backbone-weights FILE"
    )
    assert no_network == [host]  # asked once, before the library's retries
    assert time.monotonic() - started < 30  # timm's hub retried for about a minute
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False  # put back


def test_weights_the_library_holds_are_read_without_a_network(no_network, tmp_path):
    torch.manual_seed(0)
    held = torchvision.models.resnet18().state_dict()
    name = Path(urlsplit(torchvision.models.ResNet18_Weights.DEFAULT.url).path).name
    (tmp_path / "torch" / "hub" / "checkpoints").mkdir(parents=True)
    torch.save(held, tmp_path / "torch" / "hub" / "checkpoints" / name)
    backbone = build_backbone("torchvision:resnet18", 3, 32, pretrained=True)
    assert torch.equal(backbone.model.conv1.weight, held["conv1.weight"])


def test_a_fetch_that_fails_online_is_one_line_with_its_cause(monkeypatch, tmp_path):
    # The host answers (a connection that is closed at once), the download then fails.
    monkeypatch.setattr(socket, "create_connection", lambda *args, **kwargs: io.BytesIO())
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))

    def refused_download(*args, **kwargs):
        raise urllib.error.URLError("the proxy refused it")

    monkeypatch.setattr(torch.hub, "urlopen", refused_download)
    with pytest.raises(FewshotError, match=r"weights \(<urlopen error the proxy refused it>\)"):
        build_backbone("torchvision:resnet18", 3, 32, pretrained=True)


# ---------------------------------------------------------------- training


def test_their_protonet_divides_distances_by_the_dimension_as_resnet12s(tmp_path):
    assert tiny_settings(tmp_path).head_options == {"normalize_by_dim": True}
    assert tiny_settings(tmp_path, backbone="torchvision:resnet18").head_options == {
        "normalize_by_dim": True
    }
    assert tiny_settings(tmp_path, head="ridge").head_options == {}
    given = tiny_settings(tmp_path, head_options={"normalize_by_dim": False})
    assert given.head_options == {"normalize_by_dim": False}


def test_weights_from_a_file_start_the_run_without_the_classifier(tmp_path):
    torch.manual_seed(1)
    library = timm.create_model("resnet10t", in_chans=1, num_classes=7)  # with its classifier
    path = tmp_path / "weights.pt"
    torch.save(library.state_dict(), path)
    trainer = make_trainer(tiny_settings(tmp_path, backbone_weights=str(path)))
    loaded = trainer.method.backbone.model.state_dict()
    assert loaded.keys() == {k for k in library.state_dict() if not k.startswith("fc.")}
    for key, value in loaded.items():
        assert torch.equal(value, library.state_dict()[key]), key


def test_a_frozen_backbone_is_not_trained_and_stays_in_eval_mode(tmp_path):
    fce = dict(method="matching", method_options={"fce": True})
    trainer = make_trainer(tiny_settings(tmp_path, freeze_backbone=True, **fce))
    before = {k: v.clone() for k, v in trainer.method.backbone.state_dict().items()}
    head = [p.detach().clone() for p in trainer.method.comparator.parameters()]
    trained = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert trained == {id(p) for p in trainer.method.comparator.parameters()}
    trainer._train_epoch()
    assert not trainer.method.backbone.training and trainer.method.training
    after = trainer.method.backbone.state_dict()  # weights and BatchNorm statistics
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in trainer.method.backbone.parameters())
    assert not all(map(torch.equal, head, trainer.method.comparator.parameters()))


def test_a_frozen_backbone_under_a_head_of_no_weights_is_refused_naming_eval(tmp_path):
    with pytest.raises(SettingError, match="fewshot eval --backbone timm:resnet10t") as error:
        tiny_settings(tmp_path, freeze_backbone=True)
    assert "--method embedding (--head protonet) has no weight besides it" in str(error.value)


def test_the_backbone_learning_rate_is_its_own_on_the_schedule(tmp_path):
    settings = tiny_settings(tmp_path, lr=0.1, backbone_lr=0.01, lr_schedule=[[0, 0.5]])
    trainer = make_trainer(settings)
    head, backbone = trainer.optimizer.param_groups
    assert {id(p) for p in backbone["params"]} == {
        id(p) for p in trainer.method.backbone.parameters()
    }
    assert [id(p) for p in head["params"]] == [id(trainer.method.scale)]
    trainer._train_epoch()
    assert (head["lr"], backbone["lr"]) == (0.05, 0.005)


def test_a_folder_data_set_takes_the_models_input_size_and_normalisation(tmp_path):
    root = split_folders(tmp_path / "rgb")  # 16x16 RGB images
    common = dict(dataset="folder", data_root=str(root), val_way=3)
    vit = {"backbone": "timm:vit_tiny_patch16_224", "backbone_options": {"img_size": 32}}
    settings = tiny_settings(tmp_path, **common, **vit)
    assert settings.resize == 32 and settings.geometry == (3, 32)
    trainer = make_trainer(settings)
    assert (trainer.train_data.mean, trainer.train_data.std) == ((0.5,) * 3, (0.5,) * 3)
    assert (trainer.val_data.mean, trainer.val_data.std) == ((0.5,) * 3, (0.5,) * 3)
    trainer.fit()
    _, saved = load_trained(tmp_path / "run" / "last.pt", torch.device("cpu"))
    assert (saved["mean"], saved["std"], saved["image_size"]) == ([0.5] * 3, [0.5] * 3, 32)
    # Given: --resize stays, and --normalization dataset keeps the split's own.
    settings = tiny_settings(tmp_path, **common, resize=20, normalization="dataset")
    trainer = make_trainer(settings)
    own = load_split("folder", "train", root, resize=20)
    assert trainer.train_data.image_size == 20
    assert (trainer.train_data.mean, trainer.train_data.std) == (own.mean, own.std)


def test_a_pretrained_run_resumes_and_evaluates_without_fetching_the_weights_again(
    tmp_path, monkeypatch
):
    asked = []
    create = timm.create_model

    def fake_create(name, pretrained=False, **options):
        asked.append(pretrained)
        return create(name, pretrained=False, **options)

    monkeypatch.setattr(timm, "create_model", fake_create)
    settings = tiny_settings(tmp_path, backbone_options={"pretrained": True})
    make_trainer(settings).fit()
    assert asked[-1] is True  # the run's own backbone; its settings checks fetch nothing
    assert not any(asked[:-1])
    asked.clear()
    last = str(tmp_path / "run" / "last.pt")
    load_trained(last, torch.device("cpu"))
    make_trainer(replace(settings, epochs=2), resume=last).fit()
    assert asked and not any(asked)


def test_a_torchvision_backbone_trains_from_the_command_line(tmp_path):
    out = tmp_path / "tv"
    argv = ["train", "--backbone", "torchvision:resnet18", "--freeze-backbone", "--way", "3"]
    argv += ["--method", "matching", "--method-options", '{"fce": true}']
    argv += ["--shot", "1", "--query", "2", "--epochs", "1", "--episodes-per-epoch", "2"]
    argv += ["--episodes-per-batch", "1", "--val-episodes", "2", "--val-query", "2"]
    assert main([*argv, "--device", "cpu", "--amp", "off", "--out", str(out)]) == 0
    assert (out / "last.pt").is_file()


def test_anil_adapts_a_classifier_on_a_timm_backbone(tmp_path):
    # Its BatchNorm reads batch statistics: at 28x28 resnet10t's last map is 1x1, which the
    # memory estimate's forward must still take.
    settings = tiny_settings(tmp_path, method="anil", backbone_lr=1e-4)
    trainer = make_trainer(settings)
    before = trainer.method.backbone.model.conv1[0].weight.detach().clone()
    trainer.fit()
    assert not torch.equal(trainer.method.backbone.model.conv1[0].weight, before)


@pytest.mark.parametrize("name", ["timm:resnet18x", "torchvision:resnet18x"])
@pytest.mark.parametrize("command", ["eval", "compare", "predict"])
def test_a_misspelt_library_name_is_one_line_in_every_command(name, command, tmp_path, capsys):
    # A folder data set and predict read the backbone's own input size first: they used to end
    # in a traceback where Omniglot gave one line.
    for label in ("a", "b"):
        (tmp_path / "images" / "test" / label).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (20, 20)).save(tmp_path / "images" / "test" / label / f"{i}.png")
    folder = ["--dataset", "folder", "--data-root", str(tmp_path / "images"), "--way", "2"]
    folder += ["--query", "1", "--episodes", "2"]
    argv = {
        "eval": ["eval", "--backbone", name, *folder],
        "compare": ["compare", name, "conv4", *folder],
        "predict": ["predict", "--backbone", name, "--support", str(tmp_path / "images" / "test")],
    }[command]
    argv += ["--query", str(tmp_path / "images" / "test" / "a")] if command == "predict" else []
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"'{name}' is not a {name.partition(':')[0]} model; close names: resnet18" in err
