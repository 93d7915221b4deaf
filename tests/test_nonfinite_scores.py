"""Scores checked where they are formed: a loaded model whose features are finite but so large
that the classifier's squared distances overflow float32 gets NaN scores, which argmax would
rank as the first class. eval, compare and predict refuse them in one line naming the model
and the features' scale, for every head and test-time classifier; a classifier that reads
them right (logistic regression, fitted in float64 on normalised features) still does, and a
model in training is left to its loss's own check."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from datafiles import cut_omniglot_root
from PIL import Image

from fewshot.cli.main import main
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import load_checkpoint
from fewshot.training.checkpoint import load_trained

ZOO = Path(__file__).resolve().parents[1] / "models" / "omniglot"
PROTONET = ZOO / "protonet_conv4_trainval.pt"
MAML = ZOO / "maml_conv4_5way1shot_cpu.pt"
# The features' scale float32 holds in a squared distance over Conv-4's 64 dimensions.
LIMIT = math.sqrt(torch.finfo(torch.float32).max / 64)
SCALE = "in magnitude, beyond 2.31e+18, where squared distances and products over their 64 "
# A data root of the protonet model's training split and the test split, cut to 24 classes.
CUT = {"trainval": 24, "test": 24}
# What reads them: an embedding method's features, by a classifier fitted in float64.
REMEDY = (
    "out of scale (rescale or retrain it; --classifier logistic, fitted in float64, reads them)"
)


def huge(tmp_path: Path, checkpoint: Path, factor: float = 1e36) -> Path:
    """`checkpoint` with its last BatchNorm's scale and shift times `factor`: finite weights
    whose features (ReLU and max-pooling are positively homogeneous) are exactly `factor`
    times the model's own, about 1e37."""
    ckpt = load_checkpoint(checkpoint)
    for name, value in ckpt["model"].items():
        if name.endswith(("encoder.3.1.weight", "encoder.3.1.bias")):
            ckpt["model"][name] = value * factor
    path = tmp_path / f"huge_{checkpoint.name}"
    torch.save(ckpt, path)
    return path


def run(capsys, words: list[str]) -> tuple[int, str]:
    """The command's exit status and the last line of its stderr (after any progress bar,
    which clears itself with a carriage return)."""
    code = main(words)
    err = capsys.readouterr().err.strip()
    return code, err.split("\r")[-1].strip() if err else ""


def evaluation(root: Path, out: Path, *flags: str) -> list[str]:
    """Arguments of a small seeded evaluation on the tiny Omniglot root, in float32."""
    words = ["--episodes", "4", "--episodes-per-batch", "2", "--query", "3", "--amp", "off"]
    return [*flags, *words, "--data-root", str(root), "--device", "cpu", "--out", str(out)]


def support_folder(root: Path, way: int) -> tuple[Path, Path]:
    """A support folder of `way` classes of two dark Omniglot-sized images each, and a query
    folder of four."""
    rng = np.random.default_rng(0)
    for i in range(way):
        (root / "support" / f"c{i}").mkdir(parents=True)
        for j in range(2):
            image = rng.integers(0, 100, (28, 28), dtype=np.uint8)
            Image.fromarray(image).save(root / "support" / f"c{i}" / f"{j}.png")
    (root / "query").mkdir()
    for j in range(4):
        image = rng.integers(0, 100, (28, 28), dtype=np.uint8)
        Image.fromarray(image).save(root / "query" / f"{j}.png")
    return root / "support", root / "query"


@pytest.mark.parametrize(
    ("flags", "refused"),
    [
        ([], "gives non-finite scores (inf or nan) for 30 of the 30 queries of a batch"),
        (["--no-cache"], "gives non-finite scores (inf or nan) for 30 of the 30 queries"),
        (["--batch-norm", "transductive"], "gives non-finite scores (inf or nan) for 15 of"),
        (["--classifier", "centroid"], "gives non-finite scores (inf or nan) for 30 of the"),
        (["--classifier", "ridge"], "cannot classify a batch"),
        (["--classifier", "svm"], "cannot classify a batch"),
    ],
    ids=["own-head", "no-cache", "episode-statistics", "centroid", "ridge", "svm"],
)
def test_eval_refuses_scores_that_overflow_naming_the_model_and_the_scale(
    flags, refused, tiny_omniglot_root, tmp_path, capsys
):
    model, out = huge(tmp_path, PROTONET), tmp_path / "r.json"
    words = evaluation(tiny_omniglot_root, out, "--checkpoint", str(model), *flags)
    code, line = run(capsys, ["eval", *words])
    assert code == 2, line
    assert line.startswith(f"fewshot eval: error: {model} {refused}"), line
    assert SCALE in line and REMEDY in line
    reach = float(line.split("features reach ")[1].split(" ")[0])
    assert 1e36 < reach < 1e39
    assert not out.exists()
    # The model's own features: evaluated as before.
    words = evaluation(tiny_omniglot_root, out, "--checkpoint", str(PROTONET), *flags)
    assert run(capsys, ["eval", *words])[0] == 0
    assert json.loads(out.read_text())["accuracy"] > 80


def test_logistic_regression_reads_overflowing_features_as_the_models_own(
    tiny_omniglot_root, tmp_path, capsys
):
    """Fitted in float64 on L2-normalised features, it is blind to their scale: the same
    accuracy as the unscaled model's, episode for episode."""
    results = []
    for model in (huge(tmp_path, PROTONET), PROTONET):
        out = tmp_path / f"{model.stem}.json"
        flags = ["--checkpoint", str(model), "--classifier", "logistic", "--per-episode"]
        code, line = run(capsys, ["eval", *evaluation(tiny_omniglot_root, out, *flags)])
        assert code == 0, line
        results.append(json.loads(out.read_text()))
    assert results[0]["accuracies"] == results[1]["accuracies"]
    assert results[0]["accuracy"] > 80


def test_compare_and_predict_refuse_scores_that_overflow(tiny_omniglot_root, tmp_path, capsys):
    model = huge(tmp_path, PROTONET)
    out = tmp_path / "c.json"
    words = evaluation(tiny_omniglot_root, out, str(PROTONET), str(model))
    code, line = run(capsys, ["compare", *words])
    assert code == 2 and line.startswith(f"fewshot compare: error: {model} gives non-finite")
    assert SCALE in line and not out.exists()
    support, query = support_folder(tmp_path, 3)
    predict = ["predict", "--support", str(support), "--query", str(query), "--device", "cpu"]
    code, line = run(capsys, [*predict, "--checkpoint", str(model), "--amp", "off"])
    assert code == 2
    assert line.startswith(
        f"fewshot predict: error: {model} gives non-finite scores (inf or nan) for 4 of the 4 "
        "queries of a batch: its features reach "
    )
    assert SCALE in line
    assert run(capsys, [*predict, "--checkpoint", str(PROTONET)])[0] == 0


def test_an_adapting_method_refuses_scores_that_overflow(tiny_omniglot_root, tmp_path, capsys):
    """MAML's linear classifier on features of 1e37, adapted on each episode's support: NaN
    logits after its inner steps, in eval and in predict."""
    model, out = huge(tmp_path, MAML), tmp_path / "m.json"
    code, line = run(
        capsys, ["eval", *evaluation(tiny_omniglot_root, out, "--checkpoint", str(model))]
    )
    assert code == 2
    assert line.startswith(f"fewshot eval: error: {model} gives non-finite scores"), line
    assert SCALE in line and not out.exists()
    # MAML has no test-time classifier to choose.
    assert line.endswith(
        "its weights are out of scale (rescale or retrain it); not classifying them"
    )
    support, query = support_folder(tmp_path, 5)
    predict = ["predict", "--support", str(support), "--query", str(query), "--device", "cpu"]
    code, line = run(capsys, [*predict, "--checkpoint", str(model)])
    assert code == 2, line
    assert line.startswith(f"fewshot predict: error: {model} gives non-finite scores"), line


def nan_head(query: torch.Tensor, support: torch.Tensor, *rest, **options) -> torch.Tensor:
    """Logits [B, nq, way = 5] that are NaN for the first query of each episode."""
    logits = torch.zeros(*query.shape[:2], 5)
    logits[:, 0] = float("nan")
    return logits


def test_the_cause_is_named_by_the_features_scale_and_training_is_left_alone():
    """Non-finite scores from features of an ordinary scale blame the classifier, not them; a
    model with no source (in training, validated) is not checked: its loss has its own."""
    method, _ = load_trained(PROTONET, torch.device("cpu"))
    embeddings = torch.randn(2, 5, 4, 64)  # 2 episodes, 5-way 1-shot, 3 queries per class
    with pytest.raises(FewshotError) as refused:
        method.test_accuracy(embeddings, nan_head, 1)
    largest = embeddings.abs().max()
    assert str(refused.value) == (
        f"{PROTONET} gives non-finite scores (inf or nan) for 2 of the 30 queries of a batch: "
        f"its features are at most {largest:.3g} in magnitude (no overflow): the classifier "
        "diverged on them (its options: --classifier-options); not classifying them"
    )
    # Just beyond the limit, the scale is named.
    with pytest.raises(
        FewshotError, match=re.escape(f"features reach {2 * LIMIT:.3g} in magnitude")
    ):
        method.test_accuracy(embeddings / largest * 2 * LIMIT, nan_head, 1)
    training = EmbeddingMethod(method.backbone, "protonet")
    assert training.source is None
    accuracy = training.test_accuracy(embeddings, nan_head, 1)
    assert accuracy.shape == (2,)


@pytest.mark.parametrize(
    "flags",
    [
        ["--classifier", "cosine"],
        ["--classifier", "centroid", "--classifier-options", '{"cl2n": true}'],
        ["--classifier", "bd-cspn"],
        ["--classifier", "tim", "--classifier-options", '{"steps": 5}'],
    ],
    ids=["cosine", "cl2n", "bd-cspn", "tim"],
)
def test_the_normalising_classifiers_read_huge_features_as_their_directions(tmp_path, flags):
    """Cosine, CL2N, BD-CSPN and TIM read directions only: features 2^120 times the model's
    (exact in float32, as the weights are scaled) give its very accuracies, not the zeros an
    overflowed squared norm would normalise them to."""
    # CL2N centres on the mean feature of the model's training split (trainval).
    root = cut_omniglot_root(tmp_path / "data", ZOO.parents[1] / "data", CUT)
    scaled = huge(tmp_path, PROTONET, factor=2.0**120)
    accuracies = []
    for name, checkpoint in (("own", PROTONET), ("scaled", scaled)):
        out = tmp_path / f"{name}.json"
        argv = evaluation(root, out, "--checkpoint", str(checkpoint), *flags)
        assert main(["eval", *argv, "--per-episode", "--cache"]) == 0
        accuracies.append(json.loads(out.read_text())["accuracies"])
    assert accuracies[1] == accuracies[0]
