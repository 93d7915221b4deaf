"""A frozen backbone in place of a checkpoint: `fewshot eval`, `compare` and `predict` with
`--backbone`, the Python API's `backbone=` (a name or an nn.Module) and `FewShotClassifier`,
checked against a checkpoint of the same weights and against nearest centroid by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from cli_errors import error_line
from PIL import Image
from torch import nn

import fewshot
from fewshot.backbones import Conv4
from fewshot.cli.eval import shipped
from fewshot.cli.main import main
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.runtime.cache import cache_folder
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import file_sha256, load_checkpoint

REPO = Path(__file__).resolve().parents[1]
PROTONET = REPO / "models" / "omniglot" / "protonet_conv4_trainval.pt"
MAML = REPO / "models" / "omniglot" / "maml_conv4_5way1shot_cpu.pt"


@pytest.fixture(scope="module")
def zoo_backbone(tmp_path_factory) -> Path:
    """The zoo ProtoNet's Conv-4 weights as a plain state dict file."""
    model = load_checkpoint(PROTONET)["model"]
    state = {k.removeprefix("backbone."): v for k, v in model.items() if k.startswith("backbone.")}
    path = tmp_path_factory.mktemp("weights") / "conv4.pth"
    torch.save(state, path)
    return path


def episodes_flags(root: Path) -> list[str]:
    """Thirty seeded 5-way 1-shot episodes of the cut Omniglot's test split, in float32."""
    return ["--data-root", str(root), "--episodes", "30", "--amp", "off", "--device", "cpu"]


def evaluation(args: list[str], out: Path) -> dict:
    """Run `fewshot eval` with `args` and --per-episode, return its JSON record."""
    assert main(["eval", *args, "--per-episode", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_a_frozen_backbone_evaluates_as_a_checkpoint_of_its_weights(
    tmp_path, tiny_omniglot_root, zoo_backbone
):
    flags = episodes_flags(tiny_omniglot_root)
    trained = ["--checkpoint", str(PROTONET), "--classifier", "centroid"]
    frozen = ["--backbone", "conv4", "--backbone-weights", str(zoo_backbone)]
    a = evaluation([*trained, *flags], tmp_path / "a.json")
    b = evaluation([*frozen, "--dataset", "omniglot", *flags], tmp_path / "b.json")
    assert b["accuracies"] == a["accuracies"]
    assert 0.9 < np.mean(b["accuracies"]) < 1  # the trained weights, not an initialisation
    assert b["dataset_fingerprint"] == a["dataset_fingerprint"]
    assert b["classifier"] == "centroid" and b["stage"] == "frozen"
    assert b["backbone_weights_sha256"] == file_sha256(zoo_backbone)
    assert "checkpoint" not in b and "checkpoint_sha256" in a
    # The features of the split were kept: a second evaluation reads them, the same result.
    assert list((cache_folder() / "features").glob("*.npy"))
    again = evaluation([*frozen, "--dataset", "omniglot", *flags], tmp_path / "c.json")
    assert again["accuracies"] == b["accuracies"]


def test_a_checkpoint_lends_its_backbone(tmp_path, tiny_omniglot_root, zoo_backbone):
    flags = [*episodes_flags(tiny_omniglot_root), "--dataset", "omniglot"]
    file = evaluation(["--backbone", "conv4", "--backbone-weights", str(zoo_backbone), *flags],
                      tmp_path / "a.json")  # fmt: skip
    lent = evaluation(["--backbone", "conv4", "--backbone-weights", str(PROTONET), *flags],
                      tmp_path / "b.json")  # fmt: skip
    assert lent["accuracies"] == file["accuracies"]
    # A MAML-family backbone keeps no running statistics: each episode's normalise it.
    stride = ["--backbone-options", '{"downsample": "stride"}']
    maml = evaluation(["--backbone", "conv4", *stride, "--backbone-weights", str(MAML), *flags],
                      tmp_path / "c.json")  # fmt: skip
    assert maml["transductive"] and np.mean(maml["accuracies"]) > 0.6


def test_a_pretrained_backbone_frozen_and_fine_tuned_is_p_then_f(tmp_path, tiny_omniglot_root):
    # P>M>F's "P>F" row (experiments/pmf_omniglot/): stage P's backbone given to --backbone and
    # fine-tuned on each support is its pretraining checkpoint's own pmf, episode by episode.
    run = tmp_path / "p"
    pretrain = ["pretrain", "--dataset", "omniglot", "--data-root", str(tiny_omniglot_root)]
    pretrain += ["--epochs", "1", "--val-episodes", "2", "--device", "cpu", "--amp", "off"]
    assert main([*pretrain, "--out", str(run)]) == 0
    weights = str(run / "last.pt")
    flags = [*episodes_flags(tiny_omniglot_root), "--classifier", "pmf"]
    flags += ["--classifier-options", '{"steps": 3, "lr": 0.01}']
    own = evaluation(["--checkpoint", weights, *flags], tmp_path / "a.json")
    frozen = evaluation(["--backbone", "conv4", "--backbone-weights", weights,
                         "--dataset", "omniglot", *flags], tmp_path / "b.json")  # fmt: skip
    assert frozen["accuracies"] == own["accuracies"]
    assert frozen["stage"] == "frozen" and frozen["pmf_lr"] == 0.01
    assert frozen["backbone_weights_sha256"] == own["checkpoint_sha256"]
    # Not vacuous: the fine-tuning changed predictions of the backbone's nearest centroid.
    plain = [*episodes_flags(tiny_omniglot_root), "--dataset", "omniglot"]
    centroid = evaluation(["--backbone", "conv4", "--backbone-weights", weights, *plain],
                          tmp_path / "c.json")  # fmt: skip
    assert centroid["accuracies"] != frozen["accuracies"]


def test_a_frozen_backbone_is_compared_paired_with_a_checkpoint(
    tmp_path, tiny_omniglot_root, zoo_backbone, capsys
):
    flags = [*episodes_flags(tiny_omniglot_root), "--classifier", "centroid"]
    out = tmp_path / "c.json"
    args = [str(PROTONET), "conv4", "--backbone-weights", str(zoo_backbone), "--out", str(out)]
    assert main(["compare", *args, *flags]) == 0
    record = json.loads(out.read_text())
    assert record["a"]["accuracies"] == record["b"]["accuracies"]
    assert record["difference"]["mean"] == 0
    # A random initialisation (seeded: the same in every command) is the floor.
    assert main(["compare", str(PROTONET), "conv4", *flags, "--out", str(tmp_path / "d.json")]) == 0
    floor = json.loads((tmp_path / "d.json").read_text())
    assert floor["difference"]["mean"] < -0.2
    assert "B conv4:" in capsys.readouterr().out


def test_the_python_api_takes_a_module(tmp_path, tiny_omniglot_root, zoo_backbone):
    module = nn.Sequential(Conv4(in_channels=1, image_size=28))  # a plain module of the same net
    module[0].load_state_dict(torch.load(zoo_backbone, weights_only=True))
    flags = dict(data_root=str(tiny_omniglot_root), episodes=30, amp="off", device="cpu")
    result = fewshot.evaluate(
        backbone=module, dataset="omniglot", per_episode=True, out=str(tmp_path / "m.json"), **flags
    )
    record = json.loads((tmp_path / "m.json").read_text())
    named = fewshot.evaluate(
        backbone="conv4", backbone_weights=zoo_backbone, dataset="omniglot",
        out=str(tmp_path / "n.json"), per_episode=True, **flags,
    )  # fmt: skip
    assert record["backbone"] == "module:Sequential" and record["classifier"] == "centroid"
    assert result.accuracy == named.accuracy
    difference = fewshot.compare(PROTONET, module, classifier="centroid", **flags)
    assert difference.mean == 0


def test_a_module_of_the_wrong_output_is_named_before_any_image_is_embedded(tiny_omniglot_root):
    flat = nn.Flatten(0)  # one vector for the whole batch
    with pytest.raises(FewshotError, match=r"module:Flatten must map images \[B, C, H, W\]"):
        fewshot.evaluate(backbone=flat, dataset="omniglot", data_root=str(tiny_omniglot_root))
    with pytest.raises(FewshotError, match="image_size, mean: apply to a backbone given as"):
        fewshot.evaluate(PROTONET, image_size=28, mean=[0.5])


BAD = [
    (["--backbone", "conv5", "--dataset", "omniglot"], "unknown backbone 'conv5'; choose"),
    (["--backbone", "conv4"], "--dataset must be given with --backbone"),
    (["--backbone", "conv4", "--checkpoint", str(PROTONET)], "--backbone and --checkpoint both"),
    (
        ["--checkpoint", str(PROTONET), "--backbone-options", '{"channels": 3}'],
        "--backbone-options does not apply to a checkpoint",
    ),
    (
        ["--backbone", "conv4", "--dataset", "omniglot", "--backbone-options", '{"chanels": 3}'],
        "--backbone-options for conv4: ",
    ),
    (
        ["--backbone", "conv4", "--dataset", "omniglot", "--backbone-weights", str(MAML)],
        """the checkpoint of a conv4 backbone with options {"downsample": "stride"}; give""",
    ),
    (
        [
            "--backbone",
            "conv4",
            "--backbone-options",
            '{"downsample": "stride"}',
            "--dataset",
            "omniglot",
            "--backbone-weights",
            str(MAML),
            "--batch-norm",
            "running",
        ],
        "--batch-norm running does not apply to a frozen backbone of a MAML-family checkpoint",
    ),
    (
        ["--backbone", "resnet12", "--dataset", "omniglot", "--backbone-weights", "{weights}"],
        "does not fit --backbone resnet12: first mismatching key",
    ),
    (
        ["--backbone", "module:Net", "--dataset", "omniglot"],
        "a module: name stands for an nn.Module given from Python",
    ),
    (
        [
            "--backbone",
            "conv4",
            "--dataset",
            "omniglot",
            "--backbone-weights",
            "w.pth",
            "--backbone-options",
            '{"pretrained": true}',
        ],
        "--backbone-weights and pretrained both give the backbone's weights",
    ),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_a_bad_backbone_is_one_line(capsys, zoo_backbone, tiny_omniglot_root, args, message):
    args = [a.replace("{weights}", str(zoo_backbone)) for a in args]
    line = error_line(capsys, ["eval", *args, "--data-root", str(tiny_omniglot_root)])
    assert message in line


def test_two_frozen_arms_take_no_shared_weights(capsys, zoo_backbone):
    args = ["compare", "conv4", "resnet12", "--backbone-weights", str(zoo_backbone)]
    assert "applies to one frozen backbone, and both arms are" in error_line(capsys, args)


def support_folder(root: Path) -> tuple[Path, list[Path]]:
    """Three classes of four 20x20 RGB images (a colour each, with noise), and six queries."""
    rng = np.random.default_rng(0)
    colours = {"red": (200, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 200)}
    queries = []
    for name, colour in colours.items():
        for i in range(6):
            pixels = np.clip(np.array(colour) + rng.normal(0, 40, (20, 20, 3)), 0, 255)
            image = Image.fromarray(pixels.astype(np.uint8))
            if i < 4:
                (root / "support" / name).mkdir(parents=True, exist_ok=True)
                image.save(root / "support" / name / f"{i}.png")
            else:
                queries.append(root / "query" / f"{name}{i}.png")
                queries[-1].parent.mkdir(exist_ok=True)
                image.save(queries[-1])
    return root / "support", queries


def test_predict_with_a_frozen_backbone(tmp_path):
    support, queries = support_folder(tmp_path)
    out = tmp_path / "p.json"
    argv = ["predict", "--backbone", "conv4", "--support", str(support), "--query"]
    assert main([*argv, *map(str, queries), "--out", str(out), "--amp", "off"]) == 0
    record = json.loads(out.read_text())
    assert record["backbone"] == "conv4" and len(record["backbone_sha256"]) == 64
    predicted = [row["class"] for row in record["predictions"]]
    assert predicted == [q.name[:-5] for q in queries]  # a colour each: even a random net
    # In Python, the same scores.
    prediction = fewshot.predict(backbone="conv4", support=support, query=queries, amp="off")
    scores = [list(row["scores"].values()) for row in record["predictions"]]
    assert torch.allclose(prediction.scores, torch.tensor(scores), atol=1e-6)
    with pytest.raises(FewshotError, match="support must be a folder or image paths, got a Tensor"):
        fewshot.predict(PROTONET, support=torch.zeros(2), query=queries)


def test_fewshot_classifier_is_nearest_centroid_by_hand(tmp_path):
    support, queries = support_folder(tmp_path)
    paths = sorted(support.glob("*/*.png"))
    labels = [p.parent.name for p in paths]
    clf = fewshot.FewShotClassifier(nn.Flatten(), amp="off", mean=[0.5] * 3, std=[0.25] * 3)
    clf.fit(paths, labels)
    assert clf.classes_ == ["blue", "green", "red"] and not clf.transductive

    # By hand: features are the normalised pixels, classes their means.
    def features(files):
        return np.stack([(np.asarray(Image.open(f), np.float64) / 255 - 0.5) / 0.25 for f in files])

    x, q = features(paths).reshape(len(paths), -1), features(queries).reshape(len(queries), -1)
    means = np.stack([x[[lab == c for lab in labels]].mean(0) for c in clf.classes_])
    logits = -((q[:, None] - means[None]) ** 2).sum(-1)
    expected = np.exp(logits - logits.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    proba = clf.predict_proba(queries)
    assert np.allclose(proba.numpy(), expected, atol=1e-5)
    assert clf.predict(queries) == [clf.classes_[i] for i in expected.argmax(1)]
    # Tensors (uint8, or float in [0, 1], float64 cast) and PIL images give the same scores.
    images = torch.stack(
        [torch.from_numpy(np.array(Image.open(f))).permute(2, 0, 1) for f in queries]
    )
    assert torch.allclose(clf.predict_proba(images), proba, atol=1e-6)
    assert torch.allclose(clf.predict_proba(images.double() / 255), proba, atol=1e-5)
    assert torch.allclose(clf.predict_proba([Image.open(f) for f in queries]), proba, atol=1e-6)


def test_fewshot_classifier_of_a_checkpoint_matches_predict(tmp_path):
    support, queries = support_folder(tmp_path)
    paths = sorted(support.glob("*/*.png"))
    clf = fewshot.FewShotClassifier(PROTONET, amp="off").fit(paths, [p.parent.name for p in paths])
    expected = fewshot.predict(PROTONET, support, queries, amp="off", invert=False)
    assert torch.allclose(clf.predict_proba(queries), expected.scores, atol=1e-5)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c, x: c.fit(x, [0, 1]), "support_labels has 2 labels for 4 support_images"),
        (lambda c, x: c.fit(x, [0, 0, 0, 0]), "support_labels must hold two classes or more"),
        (lambda c, x: c.fit(x[None], [0, 1]), r"support_images must be \[N, C, H, W\] or"),
        (lambda c, x: c.fit(x[:, 0], [0, 1]), r"an image must be \[C, H, W\] with 1 or 3"),
        (
            lambda c, x: c.fit(x.int(), [0, 1, 0, 1]),
            "images must be uint8 or float, got torch.int32",
        ),
        (lambda c, x: c.fit(x * 2, [0, 1, 0, 1]), r"float images must be in \[0, 1\]"),
        (lambda c, x: c.predict(x), r"call fit\(support_images, support_labels\) before"),
        (lambda c, x: c.fit(x, "abab"), "support_labels must be a sequence of labels, got str"),
    ],
)
def test_fewshot_classifier_refuses_in_one_value_error(call, message):
    clf = fewshot.FewShotClassifier("conv4", amp="off")
    images = torch.rand(4, 1, 28, 28) * 0.9
    with pytest.raises(ValueError, match=message):
        call(clf, images)


def test_fewshot_classifier_refuses_bad_settings():
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        fewshot.FewShotClassifier("conv4", batch_size=0)
    with pytest.raises(ValueError, match="--classifier must be one of"):
        fewshot.FewShotClassifier("conv4", classifier="nearest")
    with pytest.raises(ValueError, match="model must be a checkpoint path, a backbone name"):
        fewshot.FewShotClassifier(3)


def test_results_of_a_frozen_backbone_and_of_shipped_models_go_to_results(
    tmp_path, tiny_omniglot_root, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    flags = episodes_flags(tiny_omniglot_root)
    assert main(["eval", "--backbone", "conv4", "--dataset", "omniglot", *flags]) == 0
    [result] = (tmp_path / "results" / "backbones" / "conv4").glob("eval_omniglot_test_*.json")
    assert json.loads(result.read_text())["backbone"] == "conv4"
    # A checkout's shipped model is one under its models/ beside hubconf.py, wherever the
    # installed package is.
    checkout = tmp_path / "checkout"
    (checkout / "models" / "omniglot").mkdir(parents=True)
    copy = checkout / "models" / "omniglot" / "p.pt"
    shutil.copy(PROTONET, copy)
    assert not shipped(copy)
    (checkout / "hubconf.py").write_text("")
    assert shipped(copy) and shipped(PROTONET) and not shipped(tmp_path / "p.pt")


def test_predict_with_a_frozen_backbone_reads_the_features_it_kept(tmp_path, monkeypatch):
    support, queries = support_folder(tmp_path)
    argv = ["predict", "--backbone", "conv4", "--support", str(support), "--amp", "off"]
    argv += ["--query", *map(str, queries)]
    assert main([*argv, "--out", str(tmp_path / "a.json")]) == 0

    def refuse(*args, **kwargs):
        raise AssertionError("embedded again")

    monkeypatch.setattr(EmbeddingMethod, "embed_split", refuse)
    assert main([*argv, "--out", str(tmp_path / "b.json")]) == 0
    first, again = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab")
    assert again["predictions"] == first["predictions"]


def test_a_torchvision_weights_file_is_the_module_it_came_from(tmp_path, tiny_omniglot_root):
    """A torchvision model's state dict, saved as the library saves it (its classifier `fc`
    included), evaluated by name equals the same network given from Python as a module."""
    torch.manual_seed(1)
    network = torchvision.models.resnet18(weights=None)
    torch.save(network.state_dict(), tmp_path / "r18.pth")
    network.fc = nn.Identity()
    grayscale = nn.Sequential(Repeat3(), network)  # torchvision's models take RGB
    flags = dict(data_root=str(tiny_omniglot_root), episodes=6, amp="off", device="cpu")
    flags |= dict(dataset="omniglot", per_episode=True, normalization="dataset")
    by_name = fewshot.evaluate(
        backbone="torchvision:resnet18", backbone_weights=tmp_path / "r18.pth",
        out=str(tmp_path / "a.json"), **flags,
    )  # fmt: skip
    flags.pop("normalization")  # a module takes the data's unless told
    by_module = fewshot.evaluate(backbone=grayscale, out=str(tmp_path / "b.json"), **flags)
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab")
    assert a["accuracies"] == b["accuracies"] and by_name.accuracy == by_module.accuracy
    assert a["backbone_weights_sha256"] == file_sha256(tmp_path / "r18.pth")


class Repeat3(nn.Module):
    """Grayscale images [B, 1, H, W] as three equal channels."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The channel repeated three times."""
        return x.expand(-1, 3, -1, -1)


def test_a_frozen_backbone_fine_tunes_at_test_time(tmp_path, tiny_omniglot_root):
    """P>M>F's fine-tuning of a frozen backbone (through nearest centroid, the prototype head
    at scale 1): with lr 0 it is nearest centroid itself, episode by episode."""
    flags = [*episodes_flags(tiny_omniglot_root), "--episodes", "4"]
    lent = ["--backbone", "conv4", "--backbone-weights", str(PROTONET), "--dataset", "omniglot"]
    pmf = ["--classifier", "pmf", "--classifier-options"]
    still = evaluation([*lent, *flags, *pmf, '{"steps": 2, "lr": 0}'], tmp_path / "a.json")
    centroid = evaluation([*lent, *flags], tmp_path / "b.json")
    assert still["accuracies"] == centroid["accuracies"] and still["classifier"] == "pmf"
    tuned = evaluation([*lent, *flags, *pmf, '{"steps": 2, "lr": 0.01}'], tmp_path / "c.json")
    assert tuned["accuracies"] != centroid["accuracies"]  # it fine-tuned
