"""--compile: the compiled backbone trains as the eager one does (to float32 rounding), in the
training step only; the MAML family refuses it."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from trainers import make_trainer

import fewshot.training.trainer
from fewshot.methods.maml_family import VARIANTS
from fewshot.runtime.settings import SettingError
from fewshot.training.compiled import CompiledBackbone
from fewshot.training.settings import TrainSettings


@pytest.fixture(autouse=True)
def tiny_data(tiny_omniglot_root, monkeypatch):
    """Every run here reads Omniglot cut to 24 classes per split."""
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))


def tiny_settings(tmp_path, compile: str) -> TrainSettings:
    """Three steps of two 5-way 1-shot episodes, float32 (bf16 would round the comparison)."""
    return TrainSettings(
        way=5,
        shot=1,
        query=2,
        episodes_per_epoch=6,
        episodes_per_batch=2,
        epochs=1,
        val_episodes=8,
        amp="off",
        compile=compile,
        out=str(tmp_path / compile),
        device="cpu",
    )


def graphs() -> int:
    """Graphs Dynamo has compiled in this process."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.mark.slow
def test_a_compiled_run_trains_as_the_float64_one_and_validates_eagerly(tmp_path, monkeypatch):
    compiled = make_trainer(tiny_settings(tmp_path, "default"))
    # The same first step in float64, eager: the same seed, the same weights and episodes.
    float64 = make_trainer(tiny_settings(tmp_path, "off"))
    float64.method.double()
    start = {k: v.clone() for k, v in float64.method.state_dict().items()}
    for key, value in compiled.method.state_dict().items():
        assert torch.equal(value.double(), start[key]), key
    images = fewshot.training.trainer.episode_images
    monkeypatch.setattr(fewshot.training.trainer, "episode_images", lambda *a: images(*a).double())
    want_loss, _ = float64.train_step()
    monkeypatch.undo()
    torch._dynamo.reset()
    before = graphs()
    loss, _ = compiled.train_step()
    assert graphs() > before  # the step ran compiled, not eager by a silent fallback
    # Within float32 rounding (about 1e-6 here; eager float32 in channels_last: 2e-4).
    assert loss == pytest.approx(want_loss, rel=1e-5)
    got, want = compiled.method.state_dict(), float64.method.state_dict()
    assert got.keys() == want.keys()  # the eager module's keys, no torch.compile wrapper
    # The step it took (weights and BatchNorm statistics), all tensors together: a convolution's
    # bias in front of BatchNorm has no gradient, its step is weight decay and rounding.
    floats = [k for k, v in want.items() if v.is_floating_point()]
    step = torch.cat([(want[k] - start[k]).flatten() for k in floats])
    error = torch.cat([(got[k].double() - want[k]).flatten() for k in floats])
    assert error.norm() <= 1e-4 * step.norm()
    compiled_graphs = graphs()
    compiled.validate()
    assert graphs() == compiled_graphs  # validation runs the eager backbone
    assert not isinstance(compiled.method.backbone, torch._dynamo.eval_frame.OptimizedModule)
    run = compiled.fit()  # the remaining steps and the checkpoints
    assert torch.load(run / "last.pt", weights_only=True)["model"].keys() == want.keys()


def test_the_compiled_backbone_is_in_place_for_the_step_only():
    method = nn.Module()
    method.backbone = eager = nn.Linear(2, 2)
    swap = CompiledBackbone(method, "default")  # compiles lazily: at its first call
    with pytest.raises(RuntimeError), swap.active():
        assert method.backbone is swap.compiled
        raise RuntimeError("a step that fails")
    assert method.backbone is eager
    assert CompiledBackbone(method, "off").compiled is None


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_maml_family_refuses_compile(variant):
    with pytest.raises(SettingError, match="compile"):
        TrainSettings(method=variant, compile="default")
