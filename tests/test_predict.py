"""`fewshot predict` and `Method.predict`: new images classified from a few labelled ones, by
every kind of method, equal to the episodes' own path; the command's output and refusals."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_errors import error_line
from PIL import Image

import fewshot
from fewshot.cli.main import main
from fewshot.datasets.batches import images_to_device
from fewshot.methods import build_method
from fewshot.training.settings import TrainSettings

REPO = Path(__file__).resolve().parents[1]
PROTONET = REPO / "models" / "omniglot" / "protonet_conv4_trainval.pt"
MAML = REPO / "models" / "omniglot" / "maml_conv4_5way1shot_cpu.pt"

# Every kind of method: embedding heads, the comparison modules, the MAML family, a
# transductive test-time classifier.
KINDS = {
    "protonet": {"method": "embedding"},
    "svm": {"method": "embedding", "head": "svm"},
    "matching": {"method": "matching"},
    "relation": {"method": "relation", "optimizer": "adam", "lr": 1e-3},
    "maml": {"method": "maml"},
    "anil": {"method": "anil"},
    "imaml": {"method": "imaml", "method_options": {"inner_steps": 2}},
}


def model(kind: str, way: int = 3):
    """An untrained model of `kind` for 1x28x28 images, in eval mode."""
    settings = TrainSettings(**KINDS[kind], way=way, shot=2, query=3, amp="off")
    torch.manual_seed(0)
    return build_method({**settings.to_dict(), "in_channels": 1, "image_size": 28}).eval()


def episode(way: int = 3, shot: int = 2, query: int = 4, seed: int = 0) -> torch.Tensor:
    """Images [1, way, shot + query, 1, 28, 28]: a pattern per class plus noise."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(way, 1, 1, 28, 28, generator=g)
    return (patterns + 0.8 * torch.randn(way, shot + query, 1, 28, 28, generator=g))[None]


@pytest.mark.parametrize("kind", KINDS)
def test_predict_classifies_as_the_episode_path_does(kind):
    """The accuracy of predict's argmax on an episode's queries is the method's own accuracy of
    that episode (the trained path of evaluation), for every kind of method."""
    method = model(kind)
    for seed in range(3):
        images = episode(seed=seed)
        support, query = images[0, :, :2].flatten(0, 1), images[0, :, 2:].flatten(0, 1)
        labels = torch.arange(3).repeat_interleave(2)
        scores = method.predict(support, labels, query, batch=5)
        assert scores.shape == (12, 3)
        right = (scores.argmax(1) == torch.arange(3).repeat_interleave(4)).float().mean()
        assert right.item() == pytest.approx(method.accuracy(images, 2).item())
        if method.score_name == "probability":
            assert torch.allclose(scores.sum(1), torch.ones(12), atol=1e-5)


@pytest.mark.parametrize("kind", ["protonet", "matching", "relation"])
def test_predict_does_not_depend_on_the_support_order_or_the_batch(kind):
    method = model(kind)
    images = episode()
    support, query = images[0, :, :2].flatten(0, 1), images[0, :, 2:].flatten(0, 1)
    labels = torch.arange(3).repeat_interleave(2)
    scores = method.predict(support, labels, query, batch=256)
    shuffled = torch.randperm(6, generator=torch.Generator().manual_seed(1))
    again = method.predict(support[shuffled], labels[shuffled], query, batch=1)
    assert torch.allclose(scores, again, atol=1e-5)


@pytest.mark.parametrize("kind", ["maml", "anil", "imaml"])
def test_a_single_image_is_predicted_alone_as_among_a_hundred_per_query(kind):
    """Under the non-transductive BatchNorm (per-query), a query's probabilities do not depend
    on the other queries; under the transductive one (training's way) they do."""
    method = model(kind)
    images = episode(query=34)
    support, query = images[0, :, :2].flatten(0, 1), images[0, :, 2:].flatten(0, 1)
    labels = torch.arange(3).repeat_interleave(2)
    method.transductive = False
    many = method.predict(support, labels, query, batch=32)
    alone = method.predict(support, labels, query[5:6])
    assert torch.allclose(many[5:6], alone, atol=1e-5)
    method.transductive = True
    assert not torch.allclose(method.predict(support, labels, query)[5:6], alone, atol=1e-4)


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (torch.zeros(6, dtype=torch.long), "at least two classes"),
        (torch.tensor([0, 0, 2, 2, 2, 2]), "counts [2, 0, 4]"),  # no class 1
        (torch.tensor([0.0, 0, 1, 1, 2, 2]), "integer class ids"),
        (torch.tensor([0, 1, 2]), "one per support image"),
    ],
)
def test_predict_refuses_bad_support_labels(labels, message):
    method = model("protonet")
    images = episode()[0].flatten(0, 1)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        method.predict(images[:6], labels, images[6:])


def test_predict_refuses_images_of_another_geometry():
    method = model("protonet")
    with pytest.raises(ValueError, match="predict query"):
        method.predict(
            torch.zeros(6, 1, 28, 28), torch.arange(3).repeat(2), torch.zeros(2, 3, 28, 28)
        )


def write_folders(
    root: Path, split, classes: list[int], shots: int, queries: int
) -> tuple[Path, Path]:
    """support/<class>/*.png and query/*.png from the shipped Omniglot's test images (the
    queries: RGB JPEGs at 56x56, as photos of another geometry), per class `shots` and
    `queries` of its drawings."""
    support, query = root / "support", root / "query"
    query.mkdir(parents=True)
    for c in classes:
        folder = support / split.class_names[c].replace("/", "_")
        folder.mkdir(parents=True)
        first = 20 * c
        for j in range(shots):
            Image.fromarray(split.images[first + j, 0].numpy()).save(folder / f"{j}.png")
        for j in range(shots, shots + queries):
            image = Image.fromarray(split.images[first + j, 0].numpy()).convert("RGB")
            image.resize((56, 56)).save(query / f"{c:04d}_{j}.jpg")
    return support, query


def test_predict_command_writes_csv_and_json(tmp_path, omniglot_test, capsys):
    support, query = write_folders(tmp_path, omniglot_test, [0, 40, 80, 120, 160], 1, 3)
    out = tmp_path / "predictions.csv"
    argv = ["predict", "--checkpoint", str(PROTONET), "--support", str(support)]
    assert main([*argv, "--query", str(query), "--out", str(out), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("are read as 1x28x28") == 1  # the conversion said once
    rows = list(csv.DictReader(out.open()))
    classes = sorted(p.name for p in support.iterdir())
    assert list(rows[0]) == ["path", "class", *classes]
    assert len(rows) == 15
    truth = [classes[i // 3] for i in range(15)]  # queries sorted by class, then drawing
    right = sum(r["class"] == t for r, t in zip(rows, truth, strict=True))
    assert right >= 13  # the zoo ProtoNet: 98.75 % on 5-way 1-shot episodes
    for row in rows:
        assert sum(float(row[c]) for c in classes) == pytest.approx(1.0, abs=1e-4)
        assert row["class"] == max(classes, key=lambda c: float(row[c]))
    for name in classes:
        assert f"{name}: " in printed
    # The same from Python, and as JSON.
    result = fewshot.predict(PROTONET, support=support, query=query, device="cpu")
    assert result.classes == classes and result.predicted == [r["class"] for r in rows]
    assert result.paths == [r["path"] for r in rows]
    record_path = tmp_path / "predictions.json"
    assert main([*argv, "--query", str(query), "--out", str(record_path), "--device", "cpu"]) == 0
    record = json.loads(record_path.read_text())
    assert record["classes"] == classes and record["score"] == "probability"
    assert [p["class"] for p in record["predictions"]] == result.predicted
    assert not record["transductive"]


def test_predict_with_the_maml_model_says_it_is_transductive(tmp_path, omniglot_test, capsys):
    support, query = write_folders(tmp_path, omniglot_test, [0, 40, 80, 120, 160], 1, 2)
    argv = ["predict", "--checkpoint", str(MAML), "--support", str(support), "--device", "cpu"]
    assert main([*argv, "--query", str(query)]) == 0
    assert "transductive: each query's scores also depend" in capsys.readouterr().out
    one = sorted(query.iterdir())[0]
    alone = fewshot.predict(MAML, support, one, batch_norm="per-query", device="cpu")
    among = fewshot.predict(MAML, support, query, batch_norm="per-query", device="cpu")
    assert torch.allclose(alone.scores[0], among.scores[0], atol=1e-5)
    assert not among.transductive


def test_predict_on_each_batch_of_statistics_says_it_is_transductive(
    tmp_path, omniglot_test, capsys
):
    support, query = write_folders(tmp_path, omniglot_test, [0, 40, 80, 120, 160], 1, 2)
    argv = ["predict", "--checkpoint", str(PROTONET), "--support", str(support), "--device", "cpu"]
    assert main([*argv, "--query", str(query)]) == 0
    assert "transductive" not in capsys.readouterr().out
    assert main([*argv, "--query", str(query), "--batch-norm", "transductive"]) == 0
    assert "transductive: each query's scores also depend" in capsys.readouterr().out
    one = sorted(query.iterdir())[:2]
    pair = fewshot.predict(PROTONET, support, one, batch_norm="transductive", device="cpu")
    among = fewshot.predict(PROTONET, support, query, batch_norm="transductive", device="cpu")
    assert pair.paths == among.paths[:2]
    assert pair.transductive and not torch.allclose(pair.scores, among.scores[:2])


def bad_inputs(root: Path, omniglot_test) -> dict[str, tuple[list[str], str]]:
    """Each refused case: its arguments and the line that names the fault."""
    support, query = write_folders(root, omniglot_test, [0, 40, 80], 2, 1)
    empty = root / "empty_class"
    (empty / "a").mkdir(parents=True)
    (empty / "b").mkdir()
    Image.new("L", (28, 28)).save(empty / "a" / "x.png")
    one = root / "one_class"
    (one / "a").mkdir(parents=True)
    Image.new("L", (28, 28)).save(one / "a" / "x.png")
    not_image = root / "notes.png"
    not_image.write_text("not an image")
    foreign = root / "foreign.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, foreign)
    existing = root / "taken.csv"
    existing.write_text("mine\n")
    ok = ["--support", str(support), "--query", str(query)]
    return {
        "empty class": (["--support", str(empty), "--query", str(query)], "'b' of"),
        "one class": (["--support", str(one), "--query", str(query)], "two classes or more"),
        "not an image": (["--support", str(support), "--query", str(not_image)], "notes.png"),
        "missing query": (["--support", str(support), "--query", str(root / "nope")], "nope"),
        "foreign checkpoint": (["--checkpoint", str(foreign), *ok], "foreign.pt"),
        "taken out": ([*ok, "--out", str(existing)], "pass --overwrite"),
        "bad suffix": ([*ok, "--out", str(root / "p.txt")], "--out must end in .csv or .json"),
        "batch norm": ([*ok, "--batch-norm", "per-query"], "--batch-norm per-query does not apply"),
        "cl2n": (
            [*ok, "--classifier", "centroid", "--classifier-options", '{"cl2n": true}'],
            "cl2n needs the training split's mean feature",
        ),
    }


def test_bad_input_is_one_line_and_exit_2(tmp_path, omniglot_test, capsys):
    for case, (arguments, message) in bad_inputs(tmp_path, omniglot_test).items():
        argv = ["predict", "--device", "cpu", *arguments]
        if "--checkpoint" not in argv:
            argv += ["--checkpoint", str(PROTONET)]
        assert main(argv) == 2, case
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, (case, err)
    assert (tmp_path / "taken.csv").read_text() == "mine\n"  # nothing overwritten


def test_a_support_of_unequal_counts_predicts_with_each_class_mean(tmp_path, omniglot_test):
    """A user's support folder of 1, 3 and 2 drawings: the shipped ProtoNet scores each query
    by the softmax of its scaled distances to each class's own mean, computed here by hand."""
    classes, counts = [0, 40, 80], [1, 3, 2]
    support, _ = write_folders(tmp_path, omniglot_test, classes, 3, 0)
    for folder, count in zip(sorted(support.iterdir()), counts, strict=True):
        for extra in sorted(folder.iterdir())[count:]:
            extra.unlink()
    queries = [20 * c + j for c in classes for j in range(3, 7)]  # as PNGs: the same pixels
    files = [tmp_path / f"q{i:04d}.png" for i in queries]
    for i, file in zip(queries, files, strict=True):
        Image.fromarray(omniglot_test.images[i, 0].numpy()).save(file)
    # float32 as the hand computation (amp 'auto' is bf16 on a CPU with native bf16)
    result = fewshot.predict(PROTONET, support, files, device="cpu", amp="off")
    model = torch.hub.load(str(REPO), "protonet_conv4_omniglot", source="local")
    shots = [20 * c + j for c, k in zip(classes, counts, strict=True) for j in range(k)]
    cpu = torch.device("cpu")
    with torch.no_grad():
        features = model.embed(images_to_device(omniglot_test, torch.tensor(shots), cpu))
        labels = torch.arange(3).repeat_interleave(torch.tensor(counts))
        means = torch.stack([features[labels == c].mean(0) for c in range(3)])
        embedded = model.embed(images_to_device(omniglot_test, torch.tensor(queries), cpu))
        want = torch.softmax(-model.scale * torch.cdist(embedded, means) ** 2, dim=1)
    assert torch.allclose(result.scores, want, atol=1e-4)
    right = (result.scores.argmax(1) == torch.arange(3).repeat_interleave(4)).float().mean()
    assert right >= 0.9


def test_images_are_read_at_the_models_normalisation(tmp_path, omniglot_test):
    """PNGs written from the shipped Omniglot, read back by predict, score as the split's own
    images do (the same pixels, normalised as the model's training images)."""
    classes = [0, 40, 80]
    support, _ = write_folders(tmp_path, omniglot_test, classes, 2, 0)
    files = sorted(support.rglob("1.png"))
    result = fewshot.predict(PROTONET, support, files, device="cpu")
    model = torch.hub.load(str(REPO), "protonet_conv4_omniglot", source="local")
    index = torch.tensor([20 * c + j for c in classes for j in range(2)])
    images = images_to_device(omniglot_test, index, torch.device("cpu"))
    want = model.predict(images, torch.arange(3).repeat_interleave(2), images[1::2])
    assert torch.allclose(result.scores, want, atol=1e-5)


def original_drawings(root: Path, way: int, queries: int) -> tuple[Path, Path]:
    """support/<class>/0.png and query/<class>_<j>.png: `way` Vinyals test characters as
    Omniglot's own files draw them (105x105, dark ink on white paper), from the shipped npz
    files (True = paper), their first drawer in the support and the next `queries` as queries."""
    data = REPO / "data" / "omniglot"
    with (data / "omniglot_index.csv").open() as f:
        index = {(r["alphabet"], r["character"]): r for r in csv.DictReader(f)}
    lines = (data / "splits" / "vinyals" / "test.txt").read_text().split()
    names = [line for line in lines if line.endswith("rot000")]
    support, query = root / "support", root / "query"
    query.mkdir(parents=True)
    drawings = {}
    for name in names[:: len(names) // way][:way]:
        alphabet, character, _ = name.split("/")
        row = index[(alphabet, character)]
        if row["npz_file"] not in drawings:
            with np.load(data / row["npz_file"]) as npz:
                drawings[row["npz_file"]] = npz["images"]
        pages = drawings[row["npz_file"]][int(row["npz_row"])].astype(np.uint8) * 255
        label = f"{alphabet}_{character}"
        (support / label).mkdir(parents=True)
        Image.fromarray(pages[0]).save(support / label / "0.png")
        for j in range(1, 1 + queries):
            Image.fromarray(pages[j]).save(query / f"{label}_{j:02d}.png")
    return support, query


def test_omniglots_own_drawings_are_refused_unless_read_as_negatives(tmp_path, capsys):
    support, query = original_drawings(tmp_path, way=20, queries=5)
    argv = ["predict", "--checkpoint", str(PROTONET), "--support", str(support)]
    assert main([*argv, "--query", str(query), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "mostly light (mean 0.9" in err and "--invert reads them as negatives" in err
    assert len(err.strip().splitlines()) == 1
    accuracy = {}
    for invert in (True, False):
        result = fewshot.predict(PROTONET, support, query, device="cpu", invert=invert)
        truth = [Path(p).name.rsplit("_", 1)[0] for p in result.paths]
        right = [t == p for t, p in zip(truth, result.predicted, strict=True)]
        accuracy[invert] = sum(right) / len(right)
    # The zoo ProtoNet at 20-way 1-shot: 95.90 % on the split's own images; on these 100
    # queries 91 % read as negatives, 53 % as they are.
    assert accuracy[True] >= 0.85 and accuracy[False] <= 0.7
    assert "read as negatives (--invert)" in capsys.readouterr().out


def test_invert_reads_every_image_as_its_negative(tmp_path, omniglot_test):
    """The split's images written as negatives and read with --invert score exactly as the
    images themselves, support and queries."""
    index = [20 * c + j for c in (0, 40, 80) for j in range(3)]
    for name, pixels in (("as_is", lambda a: a), ("negative", lambda a: 255 - a)):
        for i in index:
            folder = tmp_path / name / "support" / f"{i // 20:04d}"
            folder.mkdir(parents=True, exist_ok=True)
            image = Image.fromarray(pixels(omniglot_test.images[i, 0].numpy()))
            image.save(folder / f"{i}.png")
            image.save(tmp_path / name / f"q{i:04d}.png")
    as_is, negative = tmp_path / "as_is", tmp_path / "negative"
    want = fewshot.predict(PROTONET, as_is / "support", sorted(as_is.glob("q*.png")))
    queries = sorted(negative.glob("q*.png"))
    got = fewshot.predict(PROTONET, negative / "support", queries, invert=True)
    assert torch.equal(got.scores, want.scores)
    read_as_they_are = fewshot.predict(PROTONET, negative / "support", queries, invert=False)
    assert not torch.allclose(read_as_they_are.scores, want.scores, atol=0.1)


def polarity_folders(root: Path, omniglot_test, support_negative: bool) -> tuple[Path, Path]:
    """support/<class>/0.png and query/*.png of five test characters (three queries each), in
    the library's Omniglot polarity (light ink on dark) but for the support's or the queries'
    negatives (255 - value)."""
    for c in (0, 40, 80, 120, 160):
        for j in range(4):
            pixels = omniglot_test.images[20 * c + j, 0].numpy()
            if (j == 0) == support_negative:
                pixels = 255 - pixels
            path = root / "support" / f"{c:04d}" / "0.png" if j == 0 else root / "query"
            path = path if j == 0 else path / f"{c:04d}_{j}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(path)
    return root / "support", root / "query"


@pytest.mark.parametrize("negative", ["query", "support"])
def test_support_or_queries_alone_of_the_other_polarity_are_refused(
    negative, tmp_path, omniglot_test, capsys
):
    """Queries drawn in the other polarity than the support and the model's data: 15 %, exit 0,
    no word, before; now the queries are checked as the support is, and a set of the other
    polarity alone is refused naming it (--invert would turn both)."""
    support, query = polarity_folders(tmp_path, omniglot_test, negative == "support")
    argv = ["predict", "--checkpoint", str(PROTONET), "--support", str(support), "--query"]
    err = error_line(capsys, [*argv, str(query), "--device", "cpu"])
    where, other = ("--query", "the support") if negative == "query" else (support, "the queries")
    assert err.startswith(f"fewshot predict: error: {where}: its images are mostly light (mean 0.")
    assert err.endswith(
        f", unlike {other}: give support and queries in one polarity (--no-invert reads them as "
        "they are)"
    )
    assert main([*argv, str(query), "--device", "cpu", "--no-invert"]) == 0


TRANSDUCTIVE_CASES = {  # (classifier, queries): the refusal, or None: classified
    ("pt-map", 1): "--classifier pt-map assumes the queries are balanced over the 5 classes (it "
    "divides them equally among them); 1 query: use centroid or logistic, or give 5 queries or "
    "more",
    ("pt-map", 4): "--classifier pt-map assumes the queries are balanced over the 5 classes (it "
    "divides them equally among them); 4 queries: use centroid, logistic, bd-cspn or tim, or "
    "give 5 queries or more",
    ("bd-cspn", 1): "--classifier bd-cspn assumes the queries are spread over the 5 classes as "
    "the support is (it shifts them by the difference of the two sets' means); 1 query: use "
    "centroid or logistic, or give 3 queries or more",
    ("tim", 4): None,
    ("bd-cspn", 5): None,
}


@pytest.mark.parametrize(("classifier", "queries"), TRANSDUCTIVE_CASES)
def test_a_transductive_classifier_refuses_too_few_queries_or_says_its_assumption(
    classifier, queries, tmp_path, omniglot_test, capsys
):
    """PT-MAP given one query returned uniform scores (0.2 x 5) and the first class, exit 0;
    now too few queries are refused in one line naming the assumption and the classifiers
    that can, and a transductive result says what it assumes."""
    support, query = write_folders(tmp_path, omniglot_test, [0, 40, 80, 120, 160], 1, 1)
    files = [str(f) for f in sorted(query.iterdir())[:queries]]
    argv = ["predict", "--checkpoint", str(PROTONET), "--support", str(support), "--device"]
    argv += ["cpu", "--classifier", classifier, "--query", *files]
    refusal = TRANSDUCTIVE_CASES[classifier, queries]
    if refusal is not None:
        assert error_line(capsys, argv) == f"fewshot predict: error: {refusal}"
        return
    assert main(argv) == 0
    said = "transductive: each query's scores also depend on the other queries; "
    assert f"{said}{classifier} assumes the queries are spread " in capsys.readouterr().out
    result = fewshot.predict(PROTONET, support, files, classifier=classifier, device="cpu")
    truth = [result.classes[int(Path(f).name[:4]) // 40] for f in files]
    assert result.predicted == truth


@pytest.mark.parametrize("classifier", [None, "logistic", "pt-map"])
def test_a_pretrained_model_predicts_with_its_test_time_classifier(
    classifier, tmp_path, tiny_omniglot_root, omniglot_test, monkeypatch
):
    """A `fewshot pretrain` checkpoint predicts by nearest centroid or a --classifier, with
    probabilities; a transductive classifier says so."""
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))
    run = fewshot.pretrain(epochs=1, batch_size=64, val_episodes=2, out=str(tmp_path / "p"))
    support, query = write_folders(tmp_path, omniglot_test, [0, 40, 80], 1, 3)
    options = {"classifier": classifier} if classifier else {}
    result = fewshot.predict(run / "last.pt", support, query, device="cpu", **options)
    assert result.scores.shape == (9, 3) and result.transductive == (classifier == "pt-map")
    assert torch.allclose(result.scores.sum(1), torch.ones(9), atol=1e-4)


def test_predict_casts_float64_images_and_refuses_a_batch_of_none():
    method = model("protonet")
    images = episode()
    support, query = images[0, :, :2].flatten(0, 1), images[0, :, 2:].flatten(0, 1)
    labels = torch.arange(3).repeat_interleave(2)
    scores = method.predict(support, labels, query, batch=5)
    assert torch.equal(method.predict(support.double(), labels, query.double(), batch=5), scores)
    for batch in (0, 2.5, True):
        with pytest.raises(ValueError, match=f"predict batch must be an integer >= 1, got {batch}"):
            method.predict(support, labels, query, batch=batch)
