"""`FewShotClassifier` held to its contract: transductive classifiers refuse too few queries in
one line naming their assumption; `fit` replaces all state; arguments that do nothing for the
model given are refused; one ValueError naming the argument for every bad input; the polarity
guard and `invert=` as `fewshot predict` has them; queries converted `batch_size` at a time."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

import fewshot
import fewshot.classifier
from fewshot.heads import TRANSDUCTIVE, query_assumption

REPO = Path(__file__).resolve().parents[1]
PROTONET = REPO / "models" / "omniglot" / "protonet_conv4_trainval.pt"
WAY = 5
# The colours of the WAY classes: a frozen nn.Flatten tells them apart.
COLOURS = torch.tensor(
    [[220, 30, 30], [30, 220, 30], [30, 30, 220], [220, 220, 30], [30, 220, 220]]
)


def colour_images(classes: list[int], side: int = 8, seed: int = 0) -> torch.Tensor:
    """uint8 RGB images [n, 3, side, side], image i of colour classes[i] with noise."""
    g = torch.Generator().manual_seed(seed)
    base = COLOURS[classes].float()[:, :, None, None]
    noise = 25 * torch.randn(len(classes), 3, side, side, generator=g)
    return (base + noise).clamp(0, 255).to(torch.uint8)


def flatten(**options) -> fewshot.FewShotClassifier:
    """A classifier of a frozen nn.Flatten (pixels as features), fitted on two images of each
    of the WAY colours."""
    clf = fewshot.FewShotClassifier(
        nn.Flatten(), amp="off", device="cpu", mean=[0.5] * 3, std=[0.25] * 3, **options
    )
    classes = [c for c in range(WAY) for _ in range(2)]
    return clf.fit(colour_images(classes), classes)


@pytest.mark.parametrize("name", sorted(TRANSDUCTIVE))
def test_a_transductive_classifier_refuses_a_single_query(name):
    """One query leaves nothing to transduce from: PT-MAP gave uniform scores (0.2 x 5) and the
    first class, exit 0; now every transductive classifier refuses, naming its assumption and
    the classifiers that can."""
    clf = flatten(classifier=name)
    fewest = 5 if name == "pt-map" else 3
    with pytest.raises(ValueError) as refusal:
        clf.predict(colour_images([3]))
    assert str(refusal.value) == (
        f"classifier {query_assumption(name, WAY)}; 1 query: use centroid or logistic, or give "
        f"{fewest} queries or more"
    )
    assert query_assumption(name, WAY).startswith(f"{name} assumes the queries ")
    # An inductive classifier classifies it alone.
    assert flatten(classifier="centroid").predict(colour_images([3])) == [3]


def test_pt_map_refuses_fewer_queries_than_classes():
    """PT-MAP's transport gives every class an equal share of the queries: with WAY - 1 of
    them no query can be given a class whole. The refusal offers the classifiers that can."""
    clf = flatten(classifier="pt-map")
    assumption = (
        "classifier pt-map assumes the queries are balanced over the 5 classes (it divides them "
        "equally among them)"
    )
    with pytest.raises(ValueError) as refusal:
        clf.predict_proba(colour_images([0]))
    assert str(refusal.value) == (
        f"{assumption}; 1 query: use centroid or logistic, or give 5 queries or more"
    )
    with pytest.raises(ValueError) as refusal:
        clf.predict_proba(colour_images([0, 1, 2, 4]))
    assert str(refusal.value) == (
        f"{assumption}; 4 queries: use centroid, logistic, bd-cspn or tim, or give 5 queries or "
        "more"
    )


@pytest.mark.parametrize(
    ("name", "queries"),
    [("bd-cspn", WAY - 1), ("tim", WAY - 1), ("bd-cspn", WAY), ("tim", WAY), ("pt-map", WAY)],
)
def test_a_transductive_classifier_classifies_the_queries_it_accepts(name, queries):
    """BD-CSPN and TIM classify WAY - 1 queries (of distinct classes; PT-MAP refuses them:
    `test_pt_map_refuses_fewer_queries_than_classes`) and every transductive classifier WAY
    of them, each query right, with scores that are not uniform."""
    clf = flatten(classifier=name)
    classes = [4, 2, 0, 3, 1][:queries]
    scores = clf.predict_proba(colour_images(classes, seed=1))
    assert clf.transductive and scores.shape == (queries, WAY)
    assert torch.allclose(scores.sum(1), torch.ones(queries), atol=1e-4)
    assert scores.argmax(1).tolist() == classes and bool((scores.max(1).values > 1.5 / WAY).all())


def test_a_second_fit_replaces_the_first_supports_normalisation_and_geometry():
    """A frozen module without constants is normalised with the support's statistics and read
    at its size: a second fit on other images gives what a fresh classifier gives."""

    def fitted(clf: fewshot.FewShotClassifier, side: int, seed: int) -> fewshot.FewShotClassifier:
        classes = [c for c in range(3) for _ in range(2)]
        images = colour_images(classes, side, seed)
        return clf.fit(images // 2 if seed else images, classes)

    queries = colour_images([0, 1, 2], side=12, seed=5)
    reused = fitted(fewshot.FewShotClassifier(nn.Flatten(), amp="off", device="cpu"), 8, 0)
    reused.predict_proba(queries)
    fitted(reused, 12, 1)
    fresh = fitted(fewshot.FewShotClassifier(nn.Flatten(), amp="off", device="cpu"), 12, 1)
    assert torch.equal(reused.predict_proba(queries), fresh.predict_proba(queries))
    assert reused.model.config["image_size"] == 12


def test_a_fit_that_fails_leaves_the_classifier_unfitted():
    clf = flatten()
    with pytest.raises(ValueError, match=r"images must be uint8 or float, got torch\.int32"):
        clf.fit(colour_images([0, 1]).int(), [0, 1])
    with pytest.raises(ValueError, match=r"call fit\(support_images, support_labels\) before"):
        clf.predict(colour_images([0]))


@pytest.mark.parametrize(
    ("model", "argument", "value", "owner"),
    [
        (PROTONET, "backbone_weights", "conv4.pth", "a checkpoint"),
        (PROTONET, "backbone_options", {"pooled_blocks": 3}, "a checkpoint"),
        (PROTONET, "normalization", "dataset", "a checkpoint"),
        (PROTONET, "image_size", 84, "a checkpoint"),
        (PROTONET, "mean", [0.5], "a checkpoint"),
        ("conv4", "std", [0.5], "a backbone's name"),
        (nn.Flatten(), "backbone_weights", "conv4.pth", "an nn.Module"),
        (nn.Flatten(), "backbone_options", {"pooled_blocks": 3}, "an nn.Module"),
    ],
)
def test_arguments_that_do_nothing_for_the_model_are_refused(model, argument, value, owner):
    """As the command line refuses --backbone-weights with a checkpoint: accepted and ignored
    before."""
    with pytest.raises(ValueError, match=f"^{argument} does not apply to {owner}: "):
        fewshot.FewShotClassifier(model, **{argument: value})


def test_normalization_is_honoured_for_a_module():
    """normalization='dataset' normalises a module's images with the support's statistics, not
    the constants the module says (ignored before); with mean and std given it is refused."""
    module = nn.Flatten()
    module.pretrained_cfg = {"input_size": (3, 8, 8), "mean": (0.5,) * 3, "std": (0.25,) * 3}
    classes = [c for c in range(WAY) for _ in range(2)]
    means = {}
    for normalization in ("auto", "dataset"):
        clf = fewshot.FewShotClassifier(
            module, amp="off", device="cpu", normalization=normalization
        )
        means[normalization] = clf.fit(colour_images(classes), classes).model.config["mean"]
    assert list(means["auto"]) == [0.5] * 3
    assert len(means["dataset"]) == 3 and all(0.3 < m < 0.6 for m in means["dataset"])
    assert list(means["dataset"]) != [0.5] * 3
    with pytest.raises(ValueError, match="mean and std do not apply with normalization='dataset'"):
        fewshot.FewShotClassifier(nn.Flatten(), normalization="dataset", mean=[0.5] * 3)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.fit(torch.zeros(0, 3, 8, 8), []), r"support_images holds no image"),
        (lambda c: c.fit([], []), r"support_images must be image tensors, .* non-empty list"),
        (lambda c: c.fit(torch.zeros(3, 0, 8), [0]), r"support_images: an image must be"),
        (
            lambda c: c.fit([torch.zeros(3, 8, 8), torch.zeros(3, 0, 0)], [0, 1]),
            r"support_images: an image must be \[C, H, W\] with 1 or 3 channels and H, W >= 1",
        ),
        (lambda c: flatten().predict(torch.zeros(0, 3, 8, 8)), "query_images holds no image"),
        (lambda c: flatten().predict([]), r"query_images must be image tensors"),
        (lambda c: flatten().predict(torch.zeros(2, 8, 8)), "query_images: an image must be"),
    ],
)
def test_every_bad_input_is_one_value_error_naming_the_argument(call, message):
    """Empty support or queries raised IndexError / RuntimeError before."""
    clf = fewshot.FewShotClassifier(nn.Flatten(), amp="off", device="cpu")
    with pytest.raises(ValueError, match=message):
        call(clf)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"invert": 1}, "invert must be True, False or None, got 1"),
        ({"image_size": True}, "image_size must be an integer >= 1, got True"),
        ({"mean": [0.5, 0.5]}, r"mean must be 1 or 3 finite numbers \(std > 0\)"),
        ({"std": [0.0]}, r"std must be 1 or 3 finite numbers \(std > 0\), got \[0.0\]"),
        ({"mean": "a"}, "mean must be 1 or 3 numbers, got 'a'"),
    ],
)
def test_bad_arguments_are_one_value_error(options, message):
    with pytest.raises(ValueError, match=message):
        fewshot.FewShotClassifier(nn.Flatten(), **options)


def omniglot_problem(omniglot_test) -> tuple[torch.Tensor, list[int], torch.Tensor, list[int]]:
    """A 5-way 1-shot problem of the library's Omniglot test images (light ink on dark), with
    three queries per class: support, labels, queries, their classes."""
    first = [20 * c for c in (0, 40, 80, 120, 160)]
    support = omniglot_test.images[first]
    queries = omniglot_test.images[[i + j for i in first for j in (1, 2, 3)]]
    return support, list(range(5)), queries, [c for c in range(5) for _ in range(3)]


def test_queries_of_the_other_polarity_are_refused(omniglot_test):
    """Queries drawn as dark ink on light paper for a model of light-on-dark Omniglot: 15 %,
    without a word, before; now refused naming the queries, as predict does."""
    support, labels, queries, truth = omniglot_problem(omniglot_test)
    clf = fewshot.FewShotClassifier(PROTONET, amp="off", device="cpu").fit(support, labels)
    assert sum(a == b for a, b in zip(clf.predict(queries), truth, strict=True)) >= 13
    with pytest.raises(ValueError) as refusal:
        clf.predict(255 - queries)
    message = str(refusal.value)
    assert re.match(
        r"query_images: its images are mostly light \(mean 0\.\d\d of 1\) and ", message
    )
    assert message.endswith(
        "unlike support_images: give both in one polarity (invert=False reads them as they are)"
    )
    read = fewshot.FewShotClassifier(PROTONET, amp="off", device="cpu", invert=False)
    assert len(read.fit(support, labels).predict(255 - queries)) == len(queries)


def test_a_support_of_the_other_polarity_is_refused_unless_read_as_negatives(omniglot_test):
    support, labels, queries, _ = omniglot_problem(omniglot_test)
    clf = fewshot.FewShotClassifier(PROTONET, amp="off", device="cpu")
    with pytest.raises(ValueError, match=r"^support_images: its images are mostly light .*: "):
        clf.fit(255 - support, labels)
    want = fewshot.FewShotClassifier(PROTONET, amp="off", device="cpu").fit(support, labels)
    inverted = fewshot.FewShotClassifier(PROTONET, amp="off", device="cpu", invert=True)
    got = inverted.fit(255 - support, labels).predict_proba(255 - queries)
    assert torch.allclose(got, want.predict_proba(queries), atol=1e-5)


@pytest.mark.parametrize("classifier", [None, "pt-map"])
def test_queries_are_converted_batch_size_at_a_time(classifier, monkeypatch):
    """Large queries are converted to float32 `batch_size` at a time, also for a transductive
    classifier (their features are classified together): 1500 RGB 224x224 queries took over
    3.3 GB before, every one converted before any batching. The scores do not depend on it."""
    converted = []
    real = fewshot.classifier._as_floats

    def spy(items, *args):
        converted.append(len(items))
        return real(items, *args)

    monkeypatch.setattr(fewshot.classifier, "_as_floats", spy)
    module = nn.Sequential(nn.Conv2d(3, 4, 16, stride=16), nn.AdaptiveAvgPool2d(2), nn.Flatten())
    torch.manual_seed(0)
    options = {"classifier": classifier} if classifier else {}
    scores = []
    for batch in (6, 40):
        clf = fewshot.FewShotClassifier(
            module, amp="off", device="cpu", batch_size=batch, image_size=224, **options
        )
        classes = [c for c in range(WAY) for _ in range(2)]
        clf.fit(colour_images(classes, side=224), classes)
        converted.clear()
        scores.append(clf.predict_proba(colour_images(list(range(WAY)) * 8, side=224, seed=3)))
        assert converted == [batch] * (40 // batch) + ([40 % batch] if 40 % batch else [])
    assert torch.allclose(scores[0], scores[1], atol=1e-5)
