"""Memory is checked before work: a training step, a validation or an evaluation whose estimate
cannot fit is refused in one line naming the setting to lower, before its first step; the
training validation drops its embedding cache where only the cache does not fit."""

from __future__ import annotations

import pytest
import torch
from trainers import make_trainer

import fewshot.runtime.memory
from fewshot.backbones import Conv4, ResNet12
from fewshot.backbones.footprint import activation_elements
from fewshot.cli.eval import EvalSettings
from fewshot.cli.main import main
from fewshot.datasets import REPO_DATA, load_split
from fewshot.evaluation.episodes import evaluation_terms
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.runtime.errors import FewshotError
from fewshot.training.settings import make_config

GiB = 2**30


def test_activation_elements_count_every_layer_output_and_change_nothing():
    """Conv-4 at 28x28 by hand: per block conv and BatchNorm at the block's side, max-pool and
    ReLU at half of it; the forward leaves the statistics, the mode and the ramp as they were."""
    expected, side = 0, 28
    for _ in range(4):
        expected += 2 * 64 * side**2 + 2 * 64 * (side // 2) ** 2
        side //= 2
    conv4 = Conv4(1, image_size=28).train()
    stats = [b.clone() for b in conv4.buffers()]
    assert activation_elements(conv4) == (expected, 64 * 28 * 28)
    assert conv4.training and all(
        torch.equal(a, b) for a, b in zip(stats, conv4.buffers(), strict=True)
    )
    resnet = ResNet12(image_size=84).train()
    activation_elements(resnet)
    assert resnet.training and int(resnet.drop_steps) == 0


@pytest.fixture
def memory_of(monkeypatch):
    """Pretend the machine has `size` bytes available."""

    def set_available(size: int) -> None:
        monkeypatch.setattr(fewshot.runtime.memory, "available_bytes", lambda device: size)

    return set_available


@pytest.mark.parametrize(
    ("args", "lower"),
    [
        (["--resplits", "1000000", "--query", "15"], "lower --resplits"),
        (["--episodes-per-batch", "2000", "--episodes-per-epoch", "2000"], "--episodes-per-batch"),
        (
            ["--method", "maml", "--method-options", '{"inner_steps": 2000}'],
            "lower --method-options inner_steps",
        ),
    ],
)
def test_a_training_step_that_cannot_fit_is_refused_before_the_first(
    args, lower, memory_of, tiny_omniglot_root, tmp_path, capsys
):
    memory_of(4 * GiB)
    out = tmp_path / "run"
    argv = ["train", *args, "--data-root", str(tiny_omniglot_root), "--out", str(out)]
    assert main([*argv, "--device", "cpu", "--amp", "off"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "one training step needs about" in err and "4.0 GiB are available" in err
    assert lower in err
    assert not (out / "last.pt").exists()


def test_validation_drops_a_cache_that_does_not_fit_with_the_same_accuracy(
    memory_of, tiny_omniglot_root, tmp_path
):
    # 60 validation episodes of 5 x 2 images: more than the 480 of the tiny validation split,
    # so the cache pays.
    base = {"data_root": str(tiny_omniglot_root), "val_episodes": 60, "amp": "off"}
    # Small episodes: the cache path's backbone on a whole embedding batch is what is largest.
    base.update(query=1, episodes_per_batch=1)
    settings = make_config(None, {**base, "device": "cpu", "out": str(tmp_path / "a")})
    cached = make_trainer(settings)
    assert cached.val_cache
    # Room for a training step and a validation batch (of at most 60 episodes), not for the
    # cached embeddings of the validation split with the backbone that embeds them.
    shape, images = cached.val_shape, len(cached.val_data.labels)
    need = {
        cache: sum(t.size for t in evaluation_terms(cached.method, shape, 60, images, cache))
        for cache in (False, True)
    }
    step = sum(t.size for t in cached.batches.memory_terms(cached.method, 1))
    room = max(step, need[False])
    assert need[True] > room
    memory_of(room)
    torch.manual_seed(0)
    uncached = make_trainer(settings)
    assert not uncached.val_cache
    uncached.method.load_state_dict(cached.method.state_dict())
    assert uncached.validate() == cached.validate()


def test_validation_embeds_its_episodes_where_they_hold_fewer_images_than_the_split(
    tiny_omniglot_root, tmp_path
):
    """The cache embeds the whole validation split once per validation: with fewer episode
    images than the split's (5 episodes of 5 x 16 against 480) validation embeds the episodes,
    with the same accuracy; a frozen backbone keeps its features on disk: cached anyway."""
    base = {"data_root": str(tiny_omniglot_root), "amp": "off", "device": "cpu"}
    few = make_config(None, {**base, "val_episodes": 5, "out": str(tmp_path / "a")})
    many = make_config(None, {**base, "val_episodes": 7, "out": str(tmp_path / "b")})
    torch.manual_seed(0)
    uncached = make_trainer(few)
    assert len(uncached.val_data.labels) == 480 and not uncached.val_cache
    cached = make_trainer(many)  # 7 x 80 = 560 images: the cache pays
    assert cached.val_cache
    cached.method.load_state_dict(uncached.method.state_dict())
    cached.settings = few  # the same 5 episodes
    assert uncached.validate() == cached.validate()
    frozen = make_config(
        None,
        {**base, "val_episodes": 5, "freeze_backbone": True, "out": str(tmp_path / "c")}
        | {"method": "matching", "method_options": {"fce": True}},
    )
    assert make_trainer(frozen).val_cache


def test_an_evaluation_whose_cache_cannot_fit_is_refused_naming_no_cache(memory_of):
    split = load_split("omniglot", "test", REPO_DATA)
    method = EmbeddingMethod(ResNet12(1, image_size=28), "protonet", amp="off")
    settings = EvalSettings(checkpoint="unused.pt", episodes_per_batch=1)
    cache = 4 * len(split.labels) * method.backbone.out_dim
    memory_of(cache // 2)
    with pytest.raises(FewshotError, match="lower --no-cache") as error:
        settings.check_evaluation(method, split, torch.device("cpu"), cache=True)
    assert "the evaluation needs about" in str(error.value)


def test_a_pretraining_step_that_cannot_fit_is_refused_naming_the_batch_size(
    memory_of, tiny_omniglot_root, tmp_path, capsys
):
    memory_of(64 * 2**20)
    out = tmp_path / "pre"
    argv = ["pretrain", "--batch-size", "400", "--data-root", str(tiny_omniglot_root)]
    assert main([*argv, "--out", str(out), "--device", "cpu", "--amp", "off"]) == 2
    err = capsys.readouterr().err.strip()
    assert "one training step needs about" in err and "the backbone on 400 images" in err
    assert "lower --batch-size" in err and len(err.splitlines()) == 1, err
    assert not (out / "last.pt").exists()
