"""One order for every command: what contradicts the settings or the data is said first, from
metadata, without allocating anything the size of an episode; then the memory estimate, on the
shapes that will run; then the work. Each case below breaks one check and must get the one
line naming it, whatever the free memory (probed with the probe pretending scarce, then
plenty)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fewshot.runtime.memory
from fewshot.backbones import Conv4
from fewshot.cli.main import main
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import evaluation_terms
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.runtime.io import load_checkpoint
from fewshot.training.settings import PretrainSettings

ZOO = Path(__file__).resolve().parents[1] / "models" / "omniglot"
PROTONET = ZOO / "protonet_conv4_1shot.pt"
MAML = ZOO / "maml_conv4_5way1shot_cpu.pt"
SCARCE, PLENTY = 2**10, 2**50  # bytes the memory probe reports


@pytest.fixture(params=[SCARCE, PLENTY], ids=["scarce-memory", "plenty-memory"])
def free_memory(request, monkeypatch) -> int:
    """Run the test once with too little memory for any work, once with room for all."""
    monkeypatch.setattr(fewshot.runtime.memory, "available_bytes", lambda device: request.param)
    return request.param


def refusal(capsys, words: list[str]) -> str:
    """Run the CLI, expect exit status 2 and one line on stderr; return it."""
    code = main(words)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    return err


def split_file(root: Path, split: str) -> Path:
    """The class list of a split of the tiny Omniglot root."""
    return root / "omniglot" / "splits" / "vinyals" / f"{split}.txt"


def first_class(root: Path, split: str) -> str:
    """The first class a split lists (its smallest, where all hold 20 images)."""
    return split_file(root, split).read_text().split()[0]


# (extra flags, the error line after "fewshot train: error: "); {train} and {val} are the
# tiny root's split lists, {train_class} and {val_class} their first classes (24 classes of 20
# images each).
TRAIN_CASES = [
    (["--way", "25", "--val-way", "5"], "25-way episodes need 25 classes, 24 in {train}"),
    (["--val-way", "25"], "25-way episodes need 25 classes, 24 in {val}"),
    # A million-way head check allocated 4 TB before the way was compared with the classes.
    (
        ["--way", "1000000", "--shot", "1", "--query", "1"],
        "1000000-way episodes need 1000000 classes, 24 in {train}",
    ),
    (
        ["--shot", "10", "--query", "11"],
        "class '{train_class}' of {train} has 20 images; the episodes need 21 per class "
        "(support + query)",
    ),
    (
        ["--val-shot", "10", "--val-query", "11"],
        "class '{val_class}' of {val} has 20 images; the episodes need 21 per class "
        "(support + query)",
    ),
    (["--head", "svm", "--way", "1"], "--head the SVM head needs way >= 2 classes, got way=1"),
    (
        ["--way", "3", "--shot", "1", "--query", "1", "--resplits", "9"],
        "--resplits must be <= 8, the distinct re-splits of a 3-way 1-shot 1-query episode "
        "(C(2,1)^3), got 9",
    ),
]


@pytest.mark.usefixtures("free_memory")
@pytest.mark.parametrize(("extra", "message"), TRAIN_CASES, ids=[m for _, m in TRAIN_CASES])
def test_train_names_the_contradiction_first(extra, message, tiny_omniglot_root, tmp_path, capsys):
    root = tiny_omniglot_root
    words = ["train", *extra, "--epochs", "1", "--episodes-per-epoch", "2"]
    words += ["--val-episodes", "2", "--device", "cpu", "--data-root", str(root)]
    words += ["--out", str(tmp_path / "run")]
    expected = message.format(
        train=split_file(root, "train"),
        val=split_file(root, "val"),
        train_class=first_class(root, "train"),
        val_class=first_class(root, "val"),
    )
    assert refusal(capsys, words) == f"fewshot train: error: {expected}"
    assert not (tmp_path / "run" / "last.pt").exists()


@pytest.mark.usefixtures("free_memory")
def test_train_refuses_an_init_of_other_geometry_before_the_data(tmp_path, capsys):
    """A pretrained backbone for 3-channel images, for a run on 1-channel Omniglot: named
    before any data is read (the data root does not exist)."""
    config = {**PretrainSettings().to_dict(), "stage": "pretrain"}
    config.update(in_channels=3, image_size=28, classes=5)
    init = tmp_path / "rgb.pt"
    torch.save({"config": config, "model": {}}, init)
    words = ["train", "--init", str(init), "--data-root", str(tmp_path / "none")]
    words += ["--device", "cpu", "--out", str(tmp_path / "run")]
    assert refusal(capsys, words) == (
        f"fewshot train: error: --init {init}: a conv4 backbone for 3x28x28 images; this run "
        "trains a conv4 on omniglot (1x28x28)"
    )


PRETRAIN_CASES = [
    (["--val-way", "25"], "25-way episodes need 25 classes, 24 in {val}"),
    (["--batch-size", "100000"], "--batch-size 100000 needs 100000 images, 480 in {train}"),
]


@pytest.mark.usefixtures("free_memory")
@pytest.mark.parametrize(("extra", "message"), PRETRAIN_CASES, ids=[m for _, m in PRETRAIN_CASES])
def test_pretrain_names_the_contradiction_first(
    extra, message, tiny_omniglot_root, tmp_path, capsys
):
    root = tiny_omniglot_root
    words = ["pretrain", *extra, "--epochs", "1", "--val-episodes", "2", "--device", "cpu"]
    words += ["--data-root", str(root), "--out", str(tmp_path / "run")]
    expected = message.format(train=split_file(root, "train"), val=split_file(root, "val"))
    assert refusal(capsys, words) == f"fewshot pretrain: error: {expected}"


# (checkpoint, extra flags, the error line after "fewshot eval: error: "); {test} is the tiny
# root's test list, {test_class} its first class, {ckpt} the checkpoint.
EVAL_CASES = [
    (PROTONET, ["--way", "25"], "25-way episodes need 25 classes, 24 in {test}"),
    # Which message came depended on the memory: the estimate of 25-way batches came first.
    (PROTONET, ["--way", "25", "--no-cache"], "25-way episodes need 25 classes, 24 in {test}"),
    (
        PROTONET,
        ["--shot", "10", "--query", "11"],
        "class '{test_class}' of {test} has 20 images; the episodes need 21 per class "
        "(support + query)",
    ),
    # From the dataset's geometry alone: the data root holds no miniImageNet to read.
    (
        PROTONET,
        ["--dataset", "miniimagenet"],
        "{ckpt} expects 1x28x28 images; miniimagenet split 'test' has 3x84x84",
    ),
    (
        MAML,
        ["--way", "4"],
        "maml was trained 5-way: its classifier has 5 outputs, so its episodes must be 5-way, "
        "got 4",
    ),
    (MAML, ["--cache"], "--cache does not apply to --method maml: it adapts to every episode"),
    (
        MAML,
        ["--classifier", "logistic"],
        "--classifier does not apply to --method maml: it adapts its whole network to every "
        "episode rather than classifying fixed features",
    ),
]


@pytest.mark.usefixtures("free_memory")
@pytest.mark.parametrize(
    ("checkpoint", "extra", "message"), EVAL_CASES, ids=[m for _, _, m in EVAL_CASES]
)
def test_eval_names_the_contradiction_first(
    checkpoint, extra, message, tiny_omniglot_root, tmp_path, capsys
):
    root = tiny_omniglot_root
    words = ["eval", "--checkpoint", str(checkpoint), *extra, "--episodes", "2"]
    words += ["--device", "cpu", "--data-root", str(root), "--out", str(tmp_path / "r.json")]
    expected = message.format(
        test=split_file(root, "test"), test_class=first_class(root, "test"), ckpt=checkpoint
    )
    assert refusal(capsys, words) == f"fewshot eval: error: {expected}"
    assert not (tmp_path / "r.json").exists()


COMPARE_CASES = [
    (["--way", "25"], "25-way episodes need 25 classes, 24 in {test}"),
    (["--dataset", "miniimagenet"], "{ckpt} expects 1x28x28 images; miniimagenet split 'test' "
     "has 3x84x84"),
]  # fmt: skip


@pytest.mark.usefixtures("free_memory")
@pytest.mark.parametrize("command", ["compare", "compare-seeds"])
@pytest.mark.parametrize(("extra", "message"), COMPARE_CASES, ids=[m for _, m in COMPARE_CASES])
def test_compare_names_the_contradiction_first(
    command, extra, message, tiny_omniglot_root, tmp_path, capsys
):
    root = tiny_omniglot_root
    models = [str(PROTONET)] * 2
    if command == "compare-seeds":
        models = ["--a", *models, "--b", *models]
    words = [command, *models, *extra, "--episodes", "2", "--device", "cpu"]
    words += ["--data-root", str(root), "--out", str(tmp_path / "r.json")]
    expected = message.format(test=split_file(root, "test"), ckpt=PROTONET)
    assert refusal(capsys, words) == f"fewshot {command}: error: {expected}"


def special_outputs(tmp_path: Path) -> list[tuple[Path, str]]:
    """Output paths that are not regular files, with what the refusal calls them."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    outputs = [(pipe, "not a regular file (a named pipe)"), (tmp_path, "a folder")]
    if Path("/proc/version").is_file():  # Linux: stat calls it regular; a write cannot replace it
        outputs.append((Path("/proc/version"), "not a regular file (a file of the kernel's proc "
                        "filesystem)"))  # fmt: skip
    return outputs


@pytest.mark.usefixtures("free_memory")
@pytest.mark.parametrize("command", ["eval", "compare"])
def test_an_output_that_is_not_a_regular_file_is_named_before_any_work(
    command, tiny_omniglot_root, tmp_path, capsys
):
    models = ["--checkpoint", str(PROTONET)] if command == "eval" else [str(PROTONET)] * 2
    words = [command, *models, "--episodes", "2", "--device", "cpu"]
    words += ["--data-root", str(tiny_omniglot_root)]
    for out, kind in special_outputs(tmp_path):
        for overwrite in ([], ["--overwrite"]):
            line = refusal(capsys, [*words, "--out", str(out), *overwrite])
            refused = f"cannot write {out}: it is {kind}; name a file"
            assert line == f"fewshot {command}: error: {refused}"
    if Path("/proc").is_dir():  # a new file in a folder of the kernel's
        line = refusal(capsys, [*words, "--out", "/proc/fewshot-result.json"])
        assert line == (
            f"fewshot {command}: error: cannot write /proc/fewshot-result.json: /proc is a folder "
            "of the kernel's proc filesystem, not one for data files; name a file elsewhere"
        )


def test_a_run_folder_that_is_not_a_folder_is_named(tiny_omniglot_root, tmp_path, capsys):
    words = ["train", "--data-root", str(tiny_omniglot_root), "--device", "cpu", "--out"]
    file, pipe = tmp_path / "file", tmp_path / "pipe"
    file.write_text("x")
    os.mkfifo(pipe)
    outputs = [(file, "a file"), (pipe, "a named pipe")]
    if Path("/proc/version").is_file():
        outputs.append((Path("/proc/version"), "a file of the kernel's proc filesystem"))
    for out, kind in outputs:
        line = refusal(capsys, [*words, str(out)])
        assert line == (
            f"fewshot train: error: run folder {out} is not a folder ({kind}); choose another --out"
        )


def test_eval_memory_is_estimated_on_the_batches_that_run(tiny_omniglot_root, tmp_path, capsys):
    """--episodes-per-batch beyond --episodes: the batches hold --episodes episodes, so a
    million-episode batch is estimated (and runs) as two episodes, cache on or off."""
    words = ["eval", "--checkpoint", str(PROTONET), "--episodes", "2"]
    words += ["--episodes-per-batch", "1000000", "--device", "cpu"]
    words += ["--data-root", str(tiny_omniglot_root)]
    for cache in ("--cache", "--no-cache"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(fewshot.runtime.memory, "available_bytes", lambda device: 2**30)
            out = tmp_path / f"{cache}.json"
            assert main([*words, cache, "--out", str(out)]) == 0, capsys.readouterr().err
        assert out.is_file()
        capsys.readouterr()  # the progress bars
    # With no room at all the refusal is the memory's, naming the evaluation.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fewshot.runtime.memory, "available_bytes", lambda device: SCARCE)
        line = refusal(capsys, [*words, "--out", str(tmp_path / "none.json")])
    assert line.startswith("fewshot eval: error: the evaluation needs about ")


def test_the_evaluation_estimate_follows_the_cache():
    """With the cache: the backbone on one embedding batch of the split and the cached
    embeddings, no backbone per episode; without: the backbone on the batch's images. The
    batch is capped by the episodes either way."""
    method = EmbeddingMethod(Conv4(1, image_size=28), "protonet", amp="off").eval()
    shape = EpisodeShape(5, 1, 15, 1000)
    d = method.backbone.out_dim
    per_image = method.backbone_term(1, False, None).size  # peak activation bytes of one image
    uncached = evaluation_terms(method, shape, 3, 33840, cache=False)
    assert sum(t.size for t in uncached) == 3 * 80 * per_image + 4 * 3 * 80 * d
    cached = evaluation_terms(method, shape, 3, 33840, cache=True)
    assert [t.what for t in cached] == [
        "the backbone on 512 images",
        "the cached embeddings of 33840 images",
        "1 re-split(s) of their embeddings",
    ]
    assert sum(t.size for t in cached) == 512 * per_image + 4 * 33840 * d + 4 * 3 * 80 * d
    small = evaluation_terms(method, shape, 3, 100, cache=True)
    assert small[0].size == 100 * per_image  # a split smaller than one embedding batch


@pytest.mark.usefixtures("free_memory")
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--n-train", "1000000000"],
            "--n-train 1000000000 + n_val 2000 exceed the 2000 training images of mnist",
        ),
        (
            ["--n-train", "1000", "--n-val", "500", "--n-test", "20000"],
            "--n-test 20000 exceeds the 600 test images",
        ),
    ],
)
def test_hpo_cleaning_checks_its_counts_before_the_memory(
    extra, message, digits_root, tmp_path, capsys
):
    """The counts come from the IDX headers: asking for more examples than the files hold is
    not reported as a memory estimate of that many."""
    words = ["hpo", "cleaning", "--dataset", "mnist", "--model", "sr", "--method", "rhg"]
    words += [*extra, "--data-root", str(digits_root), "--out", str(tmp_path / "out")]
    assert refusal(capsys, words) == f"fewshot hpo cleaning: error: {message}"


# ------------------------------------------- what a model cannot read, or gives, said first

RELATION = ZOO / "relation_conv4_5way1shot.pt"


def summed_relation(tmp_path: Path) -> Path:
    """The zoo's 1-shot Relation model as if trained with the paper's sum over the shots (the
    same weights: the combination has none)."""
    ckpt = load_checkpoint(RELATION)
    assert ckpt["config"]["shot"] == 1
    ckpt["config"]["method_options"] = {**ckpt["config"]["method_options"], "combine": "sum"}
    path = tmp_path / "relation_sum.pt"
    torch.save(ckpt, path)
    return path


def support_folder(tmp_path: Path, shot: int) -> tuple[Path, Path]:
    """A support folder of two classes of `shot` Omniglot-sized images, and one query image."""
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        (tmp_path / "support" / name).mkdir(parents=True)
        for i in range(shot):
            image = rng.integers(0, 256, (28, 28), dtype=np.uint8)
            Image.fromarray(image).save(tmp_path / "support" / name / f"{i}.png")
    Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)).save(tmp_path / "q.png")
    return tmp_path / "support", tmp_path / "q.png"


@pytest.mark.usefixtures("free_memory")
def test_a_relation_model_summed_over_its_shots_reads_its_training_shot_only(
    tiny_omniglot_root, tmp_path, capsys
):
    """A sum of 5 shots is 5 times what a 1-shot sum model learned (41 % instead of 98 %):
    refused in eval, compare and predict before any data, and in training when validation
    would read another shot; the mean (the default) reads any shot."""
    model = summed_relation(tmp_path)
    refused = (
        "relation was trained with method_options combine 'sum' on 1-shot episodes, so its "
        "episodes must be 1-shot, got {}: a class map sums its shots, {} times the scale it "
        "learned (combine 'mean' reads any shot)"
    )
    data = ["--data-root", str(tmp_path / "none"), "--device", "cpu"]  # no data to read
    words = ["eval", "--checkpoint", str(model), "--shot", "5", *data]
    line = refusal(capsys, [*words, "--out", str(tmp_path / "r.json")])
    assert line == f"fewshot eval: error: {refused.format(5, 5)}"
    line = refusal(capsys, ["compare", str(RELATION), str(model), "--shot", "5", *data])
    assert line == f"fewshot compare: error: {refused.format(5, 5)}"
    support, query = support_folder(tmp_path, 2)
    words = ["predict", "--checkpoint", str(model), "--support", str(support)]
    line = refusal(capsys, [*words, "--query", str(query), "--device", "cpu"])
    assert line == f"fewshot predict: error: {refused.format(2, 2)}"
    words = ["train", "--method", "relation", "--method-options", '{"combine": "sum"}']
    line = refusal(capsys, [*words, "--val-shot", "5", *data, "--out", str(tmp_path / "run")])
    assert line == (
        "fewshot train: error: --val-shot must be --shot (1) with method_options combine 'sum' "
        "(a sum of another number of shots is on another scale), got 5"
    )
    # Its own shot, and the mean model at any shot, are evaluated (where memory allows).
    for checkpoint, shot in ((model, "1"), (RELATION, "5")):
        words = ["eval", "--checkpoint", str(checkpoint), "--shot", shot, "--episodes", "2"]
        words += ["--data-root", str(tiny_omniglot_root), "--device", "cpu"]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(fewshot.runtime.memory, "available_bytes", lambda device: PLENTY)
            assert main([*words, "--out", str(tmp_path / f"{shot}.json")]) == 0
    capsys.readouterr()


def overflowing(tmp_path: Path) -> Path:
    """The zoo ProtoNet with finite weights (the loader's check passes) whose features overflow
    float32 on every image: its last BatchNorm's mean far below any input, its scale at the
    edge of the range."""
    ckpt = load_checkpoint(PROTONET)
    norm = "backbone.encoder.3.1."
    ckpt["model"][norm + "running_mean"] = torch.full_like(
        ckpt["model"][norm + "running_mean"], -1e30
    )
    ckpt["model"][norm + "weight"] = torch.full_like(ckpt["model"][norm + "weight"], 3e38)
    path = tmp_path / "overflow.pt"
    torch.save(ckpt, path)
    return path


@pytest.mark.parametrize(
    "classifier", [[], ["--classifier", "centroid"], ["--classifier", "logistic"]]
)
def test_features_that_overflow_are_refused_naming_the_checkpoint(
    classifier, tiny_omniglot_root, tmp_path, capsys
):
    model = overflowing(tmp_path)
    words = ["--checkpoint", str(model), *classifier, "--amp", "off", "--device", "cpu"]
    refused = f"{model} gives non-finite features (inf or nan) for "
    why = ": its weights overflow on them; not classifying them"
    # The cache embeds the split's 480 images in one batch; without it, a batch of 2 episodes
    # of 5 x 16 images.
    for cache, batch in (("--cache", 480), ("--no-cache", 2 * 5 * 16)):
        evaluation = ["eval", *words, "--episodes", "2", "--episodes-per-batch", "2", cache]
        evaluation += ["--data-root", str(tiny_omniglot_root), "--out", str(tmp_path / "r.json")]
        assert main(evaluation) == 2
        # After the episodes' progress bar, which clears itself (a carriage return).
        line = capsys.readouterr().err.split("\r")[-1].strip()
        assert (
            line == f"fewshot eval: error: {refused}{batch} of the {batch} images of a batch{why}"
        )
        assert not (tmp_path / "r.json").exists()
    support, query = support_folder(tmp_path, 1)
    # Noise images have no ink polarity (about half light): read as they are.
    argv = ["predict", *words, "--support", str(support), "--query", str(query), "--no-invert"]
    line = refusal(capsys, argv)
    assert line == f"fewshot predict: error: {refused}2 of the 2 images of a batch{why}"


def test_relations_hidden_layer_enters_the_memory_estimate(
    tiny_omniglot_root, tmp_path, monkeypatch, capsys
):
    """A million hidden units: 12 bytes (about three float32 copies in training) per unit and
    (query, class) pair, 750 pairs per step of 2 episodes of 5 x 15 queries x 5 classes, 8.4
    GiB where 4 are available: refused naming the option, not by the allocator."""
    monkeypatch.setattr(fewshot.runtime.memory, "available_bytes", lambda device: 4 * 2**30)
    words = ["train", "--method", "relation", "--method-options", '{"hidden": 1000000}']
    words += ["--data-root", str(tiny_omniglot_root), "--device", "cpu"]
    line = refusal(capsys, [*words, "--out", str(tmp_path / "run")])
    assert f"the hidden layer on 750 pairs: {12 * 750 * 10**6 / 2**30:.1f} GiB" in line, line
    assert line.startswith("fewshot train: error: one training step needs about ")
    assert line.endswith("lower --method-options hidden")


def test_fetching_into_a_file_is_one_line(tmp_path, capsys):
    file = tmp_path / "file"
    file.write_text("x")
    for root, why in ((file, "File exists"), (file / "data", "Not a directory")):
        line = refusal(capsys, ["data", "fetch", "mnist", "--data-root", str(root)])
        assert line == (
            f"fewshot data fetch: error: --data-root {root}: cannot make the folder: {why}"
        )
    assert file.read_text() == "x"
