"""Test-time classifiers against independent references: numpy, scikit-learn, plain PyTorch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.linear_model import LogisticRegression
from test_evaluate import small_split

from fewshot.cli.main import main
from fewshot.datasets import REPO_DATA
from fewshot.datasets.batches import images_to_device
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import episode_accuracies
from fewshot.heads import (
    CLASSIFIERS,
    HEADS,
    TRANSDUCTIVE,
    bd_cspn,
    centroid,
    cosine,
    finetune,
    logistic,
    pt_map,
    tim,
)
from fewshot.methods.adapters import episode_seeds
from fewshot.runtime.errors import FewshotError
from fewshot.training.checkpoint import load_trained

CHECKPOINT = REPO_DATA.parent / "models" / "omniglot" / "protonet_conv4_trainval.pt"
OMNIGLOT_CLASSES = 40  # embedded once: 40 test classes x 20 drawings


def episodes(
    batch: int, way: int, shot: int, queries: int, dim: int, seed: int, dtype=torch.float64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random query [B, nq, d], support [B, ns, d], shuffled labels [B, ns] (`shot` per class)."""
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, queries, dim, generator=gen, dtype=dtype)
    support = torch.randn(batch, way * shot, dim, generator=gen, dtype=dtype)
    labels = torch.stack([torch.randperm(way * shot, generator=gen) % way for _ in range(batch)])
    return query, support, labels


def class_means(support: np.ndarray, labels: np.ndarray, way: int) -> np.ndarray:
    """The mean support feature of each class [way, d], by a loop."""
    return np.stack([support[labels == m].mean(axis=0) for m in range(way)])


@pytest.mark.parametrize("cl2n", [False, True])
def test_centroid_matches_numpy(cl2n):
    way, shot = 4, 3
    query, support, labels = episodes(3, way, shot, 5, 7, seed=0)
    center = torch.randn(7, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    logits = centroid(query, support, labels, way, shot, cl2n=cl2n, center=center if cl2n else None)
    for b in range(3):
        q, s = query[b].numpy(), support[b].numpy()
        if cl2n:
            q, s = q - center.numpy(), s - center.numpy()
            q = q / np.linalg.norm(q, axis=1, keepdims=True)
            s = s / np.linalg.norm(s, axis=1, keepdims=True)
        means = class_means(s, labels[b].numpy(), way)
        expected = -((q[:, None, :] - means[None]) ** 2).sum(-1)
        np.testing.assert_allclose(logits[b].numpy(), expected, rtol=1e-10, atol=1e-12)


def test_centroid_refuses_bad_center():
    query, support, labels = episodes(2, 3, 2, 4, 5, seed=2)
    with pytest.raises(FewshotError, match="cl2n=True needs center"):
        centroid(query, support, labels, 3, 2, cl2n=True)
    with pytest.raises(FewshotError, match=r"center expects 5 features, got 4 \(shape \(4,\)"):
        centroid(query, support, labels, 3, 2, cl2n=True, center=torch.zeros(4))
    with pytest.raises(FewshotError, match=r"center must be a tensor \[dim\] = \[5\], got a list"):
        centroid(query, support, labels, 3, 2, cl2n=True, center=[0.0] * 5)
    with pytest.raises(FewshotError, match="only used with cl2n"):
        centroid(query, support, labels, 3, 2, center=torch.zeros(5))


def test_cosine_matches_numpy_and_gradcheck():
    way, shot = 5, 2
    query, support, labels = episodes(2, way, shot, 6, 9, seed=3)
    logits = cosine(query, support, labels, way, shot)
    for b in range(2):
        means = class_means(support[b].numpy(), labels[b].numpy(), way)
        q = query[b].numpy()
        norms = np.linalg.norm(q, axis=1)[:, None] * np.linalg.norm(means, axis=1)[None]
        np.testing.assert_allclose(logits[b].numpy(), q @ means.T / norms, rtol=1e-12)
    assert logits.abs().max() <= 1
    query, support, labels = episodes(1, 3, 2, 2, 4, seed=4)
    assert torch.autograd.gradcheck(
        lambda q, s: cosine(q, s, labels, 3, 2),
        (query.requires_grad_(), support.requires_grad_()),
    )


@pytest.fixture(scope="module")
def omniglot_features(omniglot_test) -> torch.Tensor:
    """Features [classes, 20, 64] of the first test classes by the zoo's Conv-4 ProtoNet."""
    method, _ = load_trained(CHECKPOINT, torch.device("cpu"))
    index = torch.cat(
        [torch.nonzero(omniglot_test.labels == c)[:, 0] for c in range(OMNIGLOT_CLASSES)]
    )
    with torch.no_grad():
        features = method.embed(images_to_device(omniglot_test, index, torch.device("cpu")))
    return features.view(OMNIGLOT_CLASSES, -1, features.shape[1])


def real_episodes(
    features: torch.Tensor, batch: int, way: int, shot: int, queries: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Episodes of real features: `shot` support and `queries` query drawings of `way` classes."""
    gen = torch.Generator().manual_seed(seed)
    support, query = [], []
    for _ in range(batch):
        classes = torch.randperm(len(features), generator=gen)[:way]
        drawings = torch.stack([torch.randperm(features.shape[1], generator=gen) for _ in classes])
        chosen = features[classes[:, None], drawings]  # [way, 20, d]
        support.append(chosen[:, :shot].flatten(0, 1))
        query.append(chosen[:, shot : shot + queries].flatten(0, 1))
    labels = torch.arange(way).repeat_interleave(shot).expand(batch, -1)
    return torch.stack(query), torch.stack(support), labels


def sklearn_probabilities(
    query: torch.Tensor, support: torch.Tensor, labels: torch.Tensor, C: float, normalize: bool
) -> np.ndarray:
    """scikit-learn's LogisticRegression (lbfgs, multinomial from 3 classes) per episode."""
    way = int(labels.max()) + 1
    probabilities = []
    for q, s, y in zip(query.double(), support.double(), labels, strict=True):
        if normalize:
            q, s = F.normalize(q, dim=1), F.normalize(s, dim=1)
        # With 2 classes scikit-learn fits one weight vector w with penalty |w|^2 / 2; the
        # softmax's two (w_1 = -w_2 = w / 2 at the optimum) cost |w|^2 / 4: C doubles.
        model = LogisticRegression(C=C if way > 2 else 2 * C, tol=1e-10, max_iter=10000)
        probabilities.append(model.fit(s.numpy(), y.numpy()).predict_proba(q.numpy()))
    return np.stack(probabilities)


@pytest.mark.parametrize(
    ("way", "shot", "C", "normalize"),
    [
        (5, 1, 1.0, True),  # d = 64 > ns: the Gram route
        (5, 5, 0.1, True),
        (20, 5, 1.0, True),  # d < ns = 100: the covariance route
        (10, 10, 10.0, True),
        (2, 3, 1.0, True),  # binary: scikit-learn's single weight vector
        (5, 2, 0.01, False),  # raw features (|x|^2 about 190)
    ],
)
def test_logistic_matches_sklearn_on_omniglot_features(omniglot_features, way, shot, C, normalize):
    query, support, labels = real_episodes(omniglot_features, 3, way, shot, 4, seed=way + shot)
    logits = logistic(query, support, labels, way, shot, C=C, normalize=normalize)
    assert logits.dtype == torch.float32
    expected = sklearn_probabilities(query, support, labels, C, normalize)
    np.testing.assert_allclose(logits.double().exp().numpy(), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize(("way", "shot", "C"), [(3, 2, 1.0), (5, 5, 100.0)])
def test_logistic_matches_sklearn_on_1600d_features(way, shot, C):
    query, support, labels = episodes(2, way, shot, 6, 1600, seed=5, dtype=torch.float32)
    support = support + 0.3 * torch.randn(1, way * shot, 1600)  # correlated support
    logits = logistic(query, support, labels, way, shot, C=C)
    expected = sklearn_probabilities(query, support, labels, C, True)
    np.testing.assert_allclose(logits.double().exp().numpy(), expected, atol=1e-4, rtol=0)


def test_logistic_batch_and_order_do_not_matter():
    way, shot = 4, 3
    query, support, labels = episodes(3, way, shot, 5, 16, seed=6)
    options = {"C": 2.0, "tol": 1e-10}
    together = logistic(query, support, labels, way, shot, **options)
    alone = [
        logistic(query[b : b + 1], support[b : b + 1], labels[b : b + 1], way, shot, **options)
        for b in range(3)
    ]
    torch.testing.assert_close(together, torch.cat(alone), rtol=0, atol=1e-9)
    order = torch.randperm(way * shot, generator=torch.Generator().manual_seed(7))
    shuffled = logistic(query, support[:, order], labels[:, order], way, shot, **options)
    torch.testing.assert_close(shuffled, together, rtol=0, atol=1e-9)


def reference_finetune(query, support, labels, way, classifier, steps, lr, seed):
    """A Closer Look's classifier per episode: an nn.Linear (or its cosine form) and
    torch.optim.SGD, from the init that `finetune` documents."""
    batch, _, dim = support.shape
    gen = torch.Generator().manual_seed(seed)
    bound = 1 / math.sqrt(dim)
    weights = (2 * torch.rand(batch, dim, way, generator=gen, dtype=support.dtype) - 1) * bound
    biases = (2 * torch.rand(batch, way, generator=gen, dtype=support.dtype) - 1) * bound
    logits = []
    for b in range(batch):
        layer = torch.nn.Linear(dim, way, bias=classifier == "linear", dtype=support.dtype)
        with torch.no_grad():
            layer.weight.copy_(weights[b].T)
            if layer.bias is not None:
                layer.bias.copy_(biases[b])

        def scores(x, layer=layer):
            if layer.bias is not None:
                return layer(x)
            return 10.0 * F.normalize(x, dim=1) @ F.normalize(layer.weight, dim=1).T

        optimizer = torch.optim.SGD(
            layer.parameters(), lr=lr, momentum=0.9, dampening=0.9, weight_decay=0.001
        )
        for _ in range(steps):
            optimizer.zero_grad()
            F.cross_entropy(scores(support[b]), labels[b]).backward()
            optimizer.step()
        logits.append(scores(query[b]).detach())
    return torch.stack(logits)


@pytest.mark.parametrize("classifier", ["linear", "cosine"])
def test_finetune_equals_per_episode_sgd_loop(classifier):
    way, shot = 5, 2
    query, support, labels = episodes(3, way, shot, 4, 12, seed=8, dtype=torch.float32)
    with torch.no_grad():  # as evaluation calls it: trains all the same
        logits = finetune(query, support, labels, way, shot, classifier=classifier, seed=3)
    expected = reference_finetune(query, support, labels, way, classifier, 100, 0.01, seed=3)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    assert not logits.requires_grad


def test_finetune_deterministic_and_separates_toy_support():
    way, shot, dim = 4, 3, 8
    gen = torch.Generator().manual_seed(9)
    labels = torch.stack([torch.randperm(way * shot, generator=gen) % way for _ in range(2)])
    # Separable: class c sits at 3 e_c, with small noise.
    support = 3 * F.one_hot(labels, dim).float() + 0.1 * torch.randn(2, way * shot, dim)
    for classifier in ("linear", "cosine"):
        logits = finetune(support, support, labels, way, shot, classifier=classifier, lr=0.1)
        assert torch.equal(logits.argmax(-1), labels), classifier
        again = finetune(support, support, labels, way, shot, classifier=classifier, lr=0.1)
        assert torch.equal(logits, again)
        other = finetune(support, support, labels, way, shot, classifier=classifier, seed=1)
        assert not torch.equal(logits, other)


@pytest.mark.parametrize("name", sorted(CLASSIFIERS))
def test_inconsistent_episode_is_rejected(name):
    query, support, labels = episodes(2, 3, 2, 4, 5, seed=10)
    with pytest.raises(FewshotError, match="way=3 x shot=3"):
        CLASSIFIERS[name](query, support, labels, 3, 3)
    with pytest.raises(FewshotError, match="query"):
        CLASSIFIERS[name](query[:, :, :4], support, labels, 3, 2)


@pytest.mark.parametrize(
    ("head", "options", "message"),
    [
        (finetune, {"classifier": "svm"}, "classifier must be one of linear, cosine, got 'svm'"),
        (finetune, {"steps": 0}, "steps must be at least 1"),
        (logistic, {"C": 0.0}, "C must be positive"),
        (logistic, {"max_iter": 0}, "max_iter must be at least 1"),
    ],
)
def test_bad_options_are_named(head, options, message):
    query, support, labels = episodes(1, 3, 2, 4, 5, seed=11)
    with pytest.raises(FewshotError, match=message):
        head(query, support, labels, 3, 2, **options)


def test_registry():
    assert set(HEADS) == {"protonet", "ridge", "svm", "cosine"}
    expected = {**HEADS, "centroid": centroid, "logistic": logistic, "finetune": finetune}
    expected |= {"bd-cspn": bd_cspn, "tim": tim, "pt-map": pt_map}
    assert expected == CLASSIFIERS
    assert {"bd-cspn", "tim", "pt-map"} == TRANSDUCTIVE


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["centroid", "cosine", "logistic", "finetune"])
def test_cuda_equals_cpu(name):
    query, support, labels = episodes(4, 5, 5, 15, 1600, seed=12, dtype=torch.float32)
    options = {"cl2n": True, "center": support.mean((0, 1))} if name == "centroid" else {}
    on_cpu = CLASSIFIERS[name](query, support, labels, 5, 5, **options)
    cuda = torch.device("cuda")
    moved = {k: v.to(cuda) if isinstance(v, torch.Tensor) else v for k, v in options.items()}
    on_gpu = CLASSIFIERS[name](query.to(cuda), support.to(cuda), labels.to(cuda), 5, 5, **moved)
    assert on_gpu.device.type == "cuda" and on_gpu.dtype == torch.float32
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("classifier", "options", "message"),
    [
        ("logistic", '{"C": 0}', "logistic C must be positive"),
        ("logistic", '{"max_iter": 0}', "max_iter must be at least 1"),
        ("finetune", '{"steps": 0}', "steps must be at least 1"),
        ("finetune", '{"classifier": "svm"}', "must be one of linear, cosine"),
        ("tim", '{"temperature": 0}', "temperature > 0"),
        ("pt-map", '{"beta": 0}', "beta > 0"),
        ("bd-cspn", '{"epsilon": 0}', "epsilon must be positive"),
        ("logistic", None, "--way logistic needs at least 2 classes"),
    ],
)
def test_a_classifiers_bad_option_is_refused_before_any_data(
    classifier, options, message, monkeypatch, capsys
):
    def no_data(*args, **kwargs):
        raise AssertionError("the data was read before the classifier's options were checked")

    monkeypatch.setattr("fewshot.cli.episode_settings.load_split", no_data)
    checkpoint = str(REPO_DATA.parent / "models" / "omniglot" / "protonet_conv4_trainval.pt")
    argv = ["--classifier-options", options] if options else ["--way", "1"]
    argv = ["eval", "--checkpoint", checkpoint, "--classifier", classifier, *argv]
    assert main([*argv, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_finetune_per_episode_seeds_equal_batches_of_one():
    way, shot = 5, 2
    query, support, labels = episodes(3, way, shot, 4, 12, seed=13, dtype=torch.float32)
    seeds = torch.tensor([5, 0, 2**40])
    for classifier in ("linear", "cosine"):
        with torch.no_grad():
            logits = finetune(query, support, labels, way, shot, classifier=classifier, seed=seeds)
        expected = torch.cat(
            [
                reference_finetune(
                    query[b : b + 1],
                    support[b : b + 1],
                    labels[b : b + 1],
                    way,
                    classifier,
                    100,
                    0.01,
                    seed=int(s),
                )
                for b, s in enumerate(seeds)
            ]
        )
        torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    with pytest.raises(FewshotError, match=r"3 integer seeds \(one per episode\), got a "):
        finetune(query, support, labels, way, shot, seed=torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(FewshotError, match=r"of shape \(2,\)"):
        finetune(query, support, labels, way, shot, seed=torch.tensor([1, 2]))


def test_episode_seeds_follow_the_episode_not_its_batch():
    index = torch.randint(0, 1000, (6, 5, 3), generator=torch.Generator().manual_seed(14))
    seeds = episode_seeds(index, 0)
    assert seeds.dtype == torch.long and seeds.min() >= 0 and len(set(seeds.tolist())) == 6
    assert torch.equal(episode_seeds(index[3:], 0), seeds[3:])
    assert torch.equal(episode_seeds(index.flip(0), 0), seeds.flip(0))
    assert not set(episode_seeds(index, 1).tolist()) & set(seeds.tolist())
    # Another episode of the same images: another class order.
    assert episode_seeds(index[:1, [1, 0, 2, 3, 4]], 0) != seeds[0]


# Options that keep the iterative classifiers quick; fine-tuning's 2 steps leave its result
# to its initial weights, which a per-batch draw would change with the batch.
BATCHING_OPTIONS = {
    "finetune": {"steps": 2},
    "tim": {"steps": 40, "lr": 1e-2},
    "pt-map": {"steps": 5},
    "svm": {"max_iter": 3},
}


@pytest.mark.parametrize("name", sorted(CLASSIFIERS))
def test_accuracies_do_not_depend_on_the_episodes_per_batch(omniglot_test, name):
    model, _ = load_trained(CHECKPOINT, torch.device("cpu"))
    model.use_classifier(name, BATCHING_OPTIONS.get(name, {}))
    split = small_split(omniglot_test)
    accuracies = [
        episode_accuracies(model, split, EpisodeShape(5, 1, 5, batch), 16, 3, torch.device("cpu"))
        for batch in (1, 3, 8)
    ]
    assert torch.equal(accuracies[0], accuracies[1]) and torch.equal(accuracies[0], accuracies[2])
    if name == "finetune":  # the cache and the episodes' own embeddings: the same seeds
        uncached = episode_accuracies(
            model, split, EpisodeShape(5, 1, 5, 8), 16, 3, torch.device("cpu"), cache=False
        )
        assert torch.equal(uncached, accuracies[0])
