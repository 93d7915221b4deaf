"""--amp: what 'auto' picks on each device, and that the backbone then really runs in it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trainers import make_trainer

import fewshot.runtime.precision
from fewshot.backbones import Conv4
from fewshot.cli.main import main
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.runtime.precision import cpu_has_native_bf16, precision_name, resolve_amp
from fewshot.training.settings import TrainSettings

CPUINFO = Path("/proc/cpuinfo")
NATIVE = cpu_has_native_bf16()


@pytest.fixture
def fresh_resolution():
    """resolve_amp caches its answers; clear them around a test that fakes the CPU."""
    resolve_amp.cache_clear()
    yield
    resolve_amp.cache_clear()


def test_native_bf16_agrees_with_the_kernels_cpu_flags():
    if not CPUINFO.is_file():
        pytest.skip("no /proc/cpuinfo on this system")
    flags = set()
    for line in CPUINFO.read_text().splitlines():
        if line.startswith("flags"):
            flags |= set(line.split(":", 1)[1].split())
    assert bool(flags & {"avx512_bf16", "amx_bf16"}) == NATIVE


@pytest.mark.parametrize("native", [True, False])
def test_auto_is_bf16_only_on_a_cpu_with_native_bf16(monkeypatch, fresh_resolution, native):
    monkeypatch.setattr(fewshot.runtime.precision, "cpu_has_native_bf16", lambda: native)
    assert resolve_amp("auto", "cpu") == ("bf16" if native else "off")
    for explicit in ("off", "bf16", "fp16"):
        assert resolve_amp(explicit, "cpu") == resolve_amp(explicit, "cuda") == explicit
    assert precision_name("off", "cpu") == "float32"
    with pytest.raises(ValueError, match="amp must be one of auto, off, bf16, fp16"):
        resolve_amp("bfloat16", "cpu")


@pytest.mark.parametrize(
    ("gpu", "capability", "expected"),
    [
        ("H200", (9, 0), "bf16"),
        ("A100", (8, 0), "bf16"),
        ("V100", (7, 0), "off"),
        (None, None, "off"),
    ],
)
def test_auto_is_bf16_on_a_gpu_with_native_bf16_and_float32_on_older_ones(
    monkeypatch, fresh_resolution, gpu, capability, expected
):
    """Faked GPUs: Hopper and Ampere compute bf16 natively (on an H200 it took ResNet-12 steps
    to 0.66-0.80x float32), Volta would emulate it; no GPU at all resolves to float32."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu is not None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: capability)
    assert resolve_amp("auto", "cuda") == expected
    assert precision_name("auto", "cuda") == ("bf16" if expected == "bf16" else "float32")
    assert resolve_amp("off", "cuda") == "off"


@pytest.mark.skipif(not NATIVE, reason="this CPU has no native bf16")
def test_auto_runs_the_backbone_in_bf16_and_returns_float32():
    torch.manual_seed(0)
    model = EmbeddingMethod(Conv4(1, image_size=28), "protonet").eval()
    images = torch.rand(12, 1, 28, 28)
    with torch.no_grad():
        auto = model.embed(images)
        model.amp = "off"
        full = model.embed(images)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            by_hand = model.backbone(images).float()
    assert auto.dtype == torch.float32
    assert torch.equal(auto, by_hand)
    # bf16 keeps 8 significant bits: close to float32, but not equal to it.
    assert not torch.equal(auto, full)
    torch.testing.assert_close(auto, full, rtol=0.05, atol=0.05)


def test_training_records_its_precision_and_eval_can_opt_out(
    tmp_path, tiny_omniglot_root, monkeypatch
):
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))
    config = TrainSettings(
        dataset="omniglot",
        way=5,
        shot=1,
        query=2,
        episodes_per_epoch=4,
        episodes_per_batch=2,
        epochs=1,
        val_episodes=8,
        out=str(tmp_path / "run"),
        device="cpu",
    )
    assert config.amp == "auto"
    run = make_trainer(config).fit()
    row = json.loads((run / "metrics.jsonl").read_text())
    assert row["precision"] == ("bf16" if NATIVE else "float32")

    checkpoint = str(run / "last.pt")
    common = ["--checkpoint", checkpoint, "--episodes", "10", "--device", "cpu", "--query", "3"]
    for amp, precision in (("off", "float32"), ("auto", row["precision"])):
        out = tmp_path / f"{amp}.json"
        assert main(["eval", *common, "--amp", amp, "--out", str(out)]) == 0
        assert json.loads(out.read_text())["precision"] == precision
