"""CUDA smoke path: runs whenever a GPU is present (skipped on CPU-only machines)."""

from __future__ import annotations

import pytest
import torch
from trainers import make_trainer

from fewshot.datasets import REPO_DATA
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import episode_accuracies
from fewshot.methods.pmf import PmfAdapter, PmfOptions
from fewshot.training.checkpoint import load_trained
from fewshot.training.settings import TrainSettings

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize(("head", "amp"), [("protonet", "bf16"), ("ridge", "off"), ("svm", "fp16")])
def test_train_and_evaluate_on_cuda(tmp_path, tiny_omniglot_root, monkeypatch, head, amp):
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))
    config = TrainSettings(
        head=head,
        way=5,
        shot=1,
        query=3,
        episodes_per_epoch=4,
        episodes_per_batch=2,
        epochs=1,
        val_episodes=8,
        resplits=3,
        amp=amp,
        device="cuda",
        out=str(tmp_path / "run"),
    )
    trainer = make_trainer(config)
    losses = [trainer.train_step()[0] for _ in range(3)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert next(trainer.method.parameters()).device.type == "cuda"
    shape = EpisodeShape(5, 1, 3, 4)
    cuda_device = torch.device("cuda")
    cached = episode_accuracies(trainer.method, trainer.val_data, shape, 8, 0, cuda_device, True)
    direct = episode_accuracies(trainer.method, trainer.val_data, shape, 8, 0, cuda_device, False)
    assert torch.allclose(cached, direct, atol=0.1)  # autocast may flip a rare close call
    trainer.fit()
    assert (tmp_path / "run" / "best.pt").is_file()


def test_pmf_batched_on_cuda_matches_one_episode_at_a_time_on_the_cpu(omniglot_test):
    """P>M>F's fine-tuning batched on the GPU (its default there) classifies the seeded
    episodes as one episode at a time on the CPU does, to a rare close call."""
    zoo = REPO_DATA.parent / "models" / "omniglot" / "protonet_conv4_1shot.pt"
    shape, options = EpisodeShape(5, 1, 5, 8), {"steps": 5, "lr": 1e-3}
    results = {}
    for device in ("cpu", "cuda"):
        model, _ = load_trained(zoo, torch.device(device))
        model.amp = "off"
        adapter = PmfAdapter(model, PmfOptions(**options))
        model.use_adapter(adapter)
        assert adapter.batches(torch.device(device)) == (device == "cuda")
        results[device] = episode_accuracies(
            model, omniglot_test, shape, 16, 0, torch.device(device)
        ).cpu()
    assert (results["cpu"] - results["cuda"]).abs().max() <= 0.1
