"""The method layer: a method registered in one place trains, resumes and evaluates through the
ordinary commands, without touching the trainer, the evaluator or the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fewshot.backbones import build_backbone
from fewshot.cli.main import main
from fewshot.methods import METHODS, Method
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.methods.resplit import resplit_episodes
from fewshot.runtime.io import load_checkpoint
from fewshot.training.checkpoint import load_trained


class LinearFinetune(Method):
    """A throwaway method: a zero-initialised linear head fitted to each episode's support
    embeddings by a few SGD steps, differentiated through (the backbone learns from the
    query loss after adaptation)."""

    def __init__(self, backbone: torch.nn.Module, steps: int, lr: float):
        super().__init__()
        self.backbone, self.steps, self.lr = backbone, steps, lr

    def _solve(self, images, resplits, shot):
        """Query logits and labels of every re-split problem after the head's adaptation."""
        b, way, pool = images.shape[:3]
        embeddings = self.backbone(images.flatten(0, 2)).view(b, way, pool, -1)
        query, support, support_labels, query_labels = resplit_episodes(embeddings, resplits, shot)
        weights = torch.zeros(len(support), way, support.shape[-1], requires_grad=True)
        with torch.enable_grad():  # the adaptation needs gradients, in evaluation too
            for _ in range(self.steps):
                logits = torch.bmm(support, weights.transpose(1, 2))
                loss = F.cross_entropy(logits.flatten(0, 1), support_labels.flatten())
                (grad,) = torch.autograd.grad(loss, weights, create_graph=self.training)
                weights = weights - self.lr * grad
        return torch.bmm(query, weights.transpose(1, 2)), query_labels

    def forward(self, images, resplits, shot):
        """Mean query loss after adaptation, and each problem's accuracy."""
        logits, labels = self._solve(images, resplits, shot)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return loss, (logits.argmax(-1) == labels).float().mean(-1)

    def accuracy(self, images, shot):
        """Query accuracy of each test episode."""
        logits, labels = self._solve(images, None, shot)
        return (logits.argmax(-1) == labels).float().mean(-1).detach()


def build_finetune(settings: dict, steps: int = 3, lr: float = 0.5) -> LinearFinetune:
    """The throwaway method from a run's settings and its two options."""
    backbone = build_backbone(
        settings["backbone"],
        settings["in_channels"],
        settings["image_size"],
        **settings["backbone_options"],
    )
    return LinearFinetune(backbone, steps, lr)


@pytest.fixture
def finetune(monkeypatch, tiny_omniglot_root):
    """The throwaway method registered (for this test only) and the tiny data as data root."""
    monkeypatch.setitem(METHODS, "finetune", build_finetune)
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))


TRAIN = ["train", "--method", "finetune", "--method-options", '{"steps": 2, "lr": 0.3}']
TRAIN += ["--way", "5", "--shot", "1", "--query", "2", "--episodes-per-epoch", "4"]
TRAIN += ["--val-episodes", "8", "--lr", "0.01", "--resplits", "2", "--device", "cpu"]


def test_a_registered_method_trains_resumes_and_evaluates(finetune, tmp_path, capsys):
    assert main([*TRAIN, "--epochs", "2", "--out", str(tmp_path / "straight")]) == 0
    assert main([*TRAIN, "--epochs", "1", "--out", str(tmp_path / "resumed")]) == 0
    assert main(["train", "--resume", str(tmp_path / "resumed" / "last.pt"), "--epochs", "2"]) == 0
    straight = load_checkpoint(tmp_path / "straight" / "last.pt")
    resumed = load_checkpoint(tmp_path / "resumed" / "last.pt")
    assert straight["config"]["method"] == "finetune"
    for key, value in straight["model"].items():
        assert torch.equal(value, resumed["model"][key]), key
    rows = [(tmp_path / run / "metrics.jsonl").read_text() for run in ("straight", "resumed")]
    assert [json.loads(line)["val_acc"] for line in rows[0].splitlines()] == [
        json.loads(line)["val_acc"] for line in rows[1].splitlines()
    ]

    out = tmp_path / "eval.json"
    best = str(tmp_path / "straight" / "best.pt")
    assert main(["eval", "--checkpoint", best, "--episodes", "10", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["episodes"] == 10 and 0 <= result["accuracy"] <= 100
    assert "accuracy:" in capsys.readouterr().out


def test_options_of_another_method_are_refused_naming_the_key(finetune, tmp_path, capsys):
    bad = ["train", "--method-options", '{"steps": 2}', "--out", str(tmp_path / "run")]
    assert main(bad) == 2
    assert "--method-options has no option 'steps' for embedding" in capsys.readouterr().err


ZOO = Path(__file__).resolve().parents[1] / "models" / "omniglot"


@pytest.fixture(scope="module", params=["protonet_conv4_trainval", "maml_conv4_5way1shot_cpu"])
def trained(request):
    """An embedding and an adaptation method of the zoo (1 x 28 x 28 images, 5-way)."""
    return load_trained(ZOO / f"{request.param}.pt", torch.device("cpu"))[0]


def test_the_accuracy_of_real_episodes_is_a_fraction_per_episode(trained, omniglot_test):
    index = torch.arange(2 * 5 * 4).view(2, 5, 4) + 20 * torch.arange(5).view(1, 5, 1)
    images = omniglot_test.images[index].float() / 255
    accuracy = trained.accuracy(images, 1)
    assert accuracy.shape == (2,) and ((accuracy >= 0) & (accuracy <= 1)).all()


@pytest.mark.parametrize(
    ("images", "shot", "message"),
    [
        # shot = pool leaves no query (NaN before); shot 0 has no support.
        (torch.zeros(2, 5, 4, 1, 28, 28), 4, "shot must be an integer with 1 <= shot < pool = 4"),
        (torch.zeros(2, 5, 4, 1, 28, 28), 0, "shot must be an integer with 1 <= shot < pool = 4"),
        (torch.zeros(2, 5, 4, 1, 28, 28), True, "shot must be an integer"),
        (torch.zeros(2, 5, 4, 1, 28, 28), 1.0, "shot must be an integer"),
        # 3 channels for a 1-channel model (a vmap or convolution error before); a 4-D tensor
        # (reported as a way mismatch before); another height, width; no class; uint8 pixels;
        # no tensor. The wrong dimension is named in words.
        (torch.zeros(2, 5, 4, 3, 28, 28), 1, "images expects 1 channel, got 3 (shape"),
        (torch.zeros(20, 1, 28, 28), 1, "images expects 6 dimensions [B, way, pool, C, H, W]"),
        (torch.zeros(2, 5, 4, 1, 84, 84), 1, "images expects height 28, got 84"),
        (torch.zeros(2, 5, 4, 1, 28, 14), 1, "images expects width 28, got 14"),
        (torch.zeros(2, 0, 4, 1, 28, 28), 1, "images expects at least 1 class, got 0"),
        (torch.zeros(2, 5, 4, 1, 28, 28, dtype=torch.uint8), 1, "images must be a float tensor"),
        ([[0.0]], 1, "images must be a float tensor [B, way, pool, 1, 28, 28] (support first"),
    ],
)
def test_accuracy_refuses_bad_episodes_in_one_line_naming_the_argument(
    trained, images, shot, message
):
    with pytest.raises(ValueError) as caught:
        trained.accuracy(images, shot)
    text = str(caught.value)
    assert text.startswith(f"{type(trained).__name__}.accuracy {message}"), text
    assert "\n" not in text
    if "images" in message:  # the value it got, named
        shown = tuple(images.shape) if isinstance(images, torch.Tensor) else "a list"
        assert str(shown) in text
    else:
        assert text.endswith(f"got {shot!r}")


@pytest.mark.parametrize(
    ("head", "options", "advice"),
    [
        ("protonet", {}, "the meta-training diverged: lower --lr"),
        (
            "ridge",
            {},
            "the meta-training diverged: lower --lr (the head's problem is scaled by "
            "--head-options lam 50)",
        ),
        (
            "ridge",
            {"lam": 1e-30},
            "the meta-training diverged; the head's problem is scaled by --head-options lam "
            "1e-30 (outside its usual range 0.01 to 10000): bring lam into range, or lower --lr",
        ),
        (
            "svm",
            {"dual_ridge": 0.0},
            "the meta-training diverged; the head's problem is scaled by --head-options C 0.1, "
            "dual_ridge 0 (outside its usual range 0.001 to 100): bring dual_ridge into range, "
            "or lower --lr",
        ),
    ],
)
def test_the_divergence_advice_names_the_heads_regularisation(head, options, advice):
    model = EmbeddingMethod(build_backbone("conv4", 1, 28), head, options)
    assert model.divergence_advice() == advice
