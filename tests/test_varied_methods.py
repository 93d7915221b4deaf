"""Every method on varied episodes (a shot per class, padded pools, B = 1): equal shots given
as a tensor are the integer shot, the padding is never read, the loss is that of the unpadded
episode computed by hand, EHG re-splits average their losses; P>M>F fine-tunes on the unequal
support as a hand-written loop does; a Relation Networks sum refuses varied episodes."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fewshot.backbones import Conv4
from fewshot.datasets.augment import TrainAugment
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.varied import VariedShape
from fewshot.methods import build_method
from fewshot.methods.adapters import episode_seeds
from fewshot.methods.base import Method
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.methods.pmf import PmfAdapter, PmfOptions
from fewshot.methods.resplit import draw_varied_resplits, varied_entries
from fewshot.runtime.errors import FewshotError
from fewshot.training.settings import TrainSettings

WAY, QUERY, SIZE = 3, 2, 16
SHOTS = torch.tensor([[1, 3, 2]])  # unequal, so that class 0 and 2 rows hold padding
POOL = int(SHOTS.max()) + QUERY
# Each method's settings name and options (few, quick inner steps for the MAML family).
METHODS = {
    "protonet": ("embedding", {}),
    "matching": ("matching", {}),
    "matching_fce": ("matching", {"fce": True}),
    "relation": ("relation", {}),  # combine 'mean'
    "maml": ("maml", {"inner_steps": 2, "inner_lr": 0.3}),
    "fomaml": ("fomaml", {"inner_steps": 2, "inner_lr": 0.3}),
    "anil": ("anil", {"inner_steps": 2, "inner_lr": 0.3}),
    "imaml": ("imaml", {"inner_steps": 3, "inner_lr": 0.1, "solver_steps": 3}),
}
ADAPTATION = ("maml", "fomaml", "anil", "imaml")
TIGHT = {"rtol": 1e-10, "atol": 1e-12}


def build(name: str, **extra) -> Method:
    """A float64 method in training mode on a Conv-4 of 2 channels, 16x16 grey images."""
    method, options = METHODS[name]
    settings = TrainSettings(
        method=method, way=WAY, val_way=WAY, shot=2, query=QUERY, amp="off",
        backbone_options={"channels": 2}, method_options={**options, **extra},
        channels_last=False,
    )  # fmt: skip
    torch.manual_seed(0)
    config = {**asdict(settings), "in_channels": 1, "image_size": SIZE}
    return build_method(config).double().train()


def images(pool: int, seed: int = 1) -> torch.Tensor:
    """Random float64 images [1, WAY, pool, 1, SIZE, SIZE]."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, WAY, pool, 1, SIZE, SIZE, generator=generator, dtype=torch.float64)


def gradients(loss: torch.Tensor, model: Method) -> dict[str, torch.Tensor]:
    """The gradient of `loss` for every trainable parameter (zeros where it does not reach)."""
    params = {k: p for k, p in model.named_parameters() if p.requires_grad}
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    return {
        k: torch.zeros_like(p) if g is None else g
        for (k, p), g in zip(params.items(), grads, strict=True)
    }


def step(model: Method, batch: torch.Tensor, shot, resplits=None):
    """The loss, the accuracies and the gradients (`gradients`) of a training step."""
    loss, accuracy = model(batch, resplits, shot)
    return loss.detach(), accuracy, gradients(loss, model)


def assert_same(ours, theirs, **tolerance) -> None:
    """Equal losses, accuracies and gradients (two `step` results)."""
    torch.testing.assert_close(ours[0], theirs[0], **tolerance)
    torch.testing.assert_close(ours[1], theirs[1], **tolerance)
    for key, grad in theirs[2].items():
        torch.testing.assert_close(ours[2][key], grad, **tolerance, msg=key)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_equal_shots_as_a_tensor_are_the_integer_shot(name):
    model, shot = build(name), 2
    batch = images(shot + QUERY)
    assert_same(step(model, batch, torch.full((1, WAY), shot)), step(model, batch, shot), **TIGHT)


def by_class(batch: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each class's support and query images of a varied episode, read with SHOTS by hand."""
    shots = SHOTS[0].tolist()
    support = [batch[0, c, :k] for c, k in enumerate(shots)]
    query = [batch[0, c, k : k + QUERY] for c, k in enumerate(shots)]
    return support, query


def labels_of(counts: list[int]) -> torch.Tensor:
    """Class ids 0, 0, 1, ... with class c `counts[c]` times."""
    return torch.arange(len(counts)).repeat_interleave(torch.tensor(counts))


def embedding_reference(name: str, model, support: list, query: list) -> torch.Tensor:
    """The query loss of an embedding method: the backbone on the episode's real images in
    one pass (its BatchNorm statistics), then the head written out class by class."""
    features = model.backbone(torch.cat([*support, *query]))
    counts = [len(s) for s in support]
    s_feat, q_feat = features.split([sum(counts), WAY * QUERY])
    s_labels, q_labels = labels_of(counts), labels_of([QUERY] * WAY)
    if name == "protonet":
        prototypes = torch.stack([s_feat[s_labels == c].mean(0) for c in range(WAY)])
        logits = -model.scale * ((q_feat[:, None] - prototypes[None]) ** 2).sum(-1)
        return F.cross_entropy(logits, q_labels)
    if name.startswith("matching"):
        if name.endswith("fce"):
            s_feat = model.comparator.encode_support(s_feat[None])[0]
            q_feat = model.comparator.encode_query(q_feat[None], s_feat[None])[0]
        attention = torch.softmax(-((q_feat[:, None] - s_feat[None]) ** 2).sum(-1), dim=1)
        probs = torch.stack([attention[:, s_labels == c].sum(1) for c in range(WAY)], 1)
        return F.nll_loss(probs.log(), q_labels)
    head = model.comparator
    maps = head.feature_map
    classes = torch.stack([s_feat[s_labels == c].mean(0) for c in range(WAY)])
    pairs = torch.stack(
        [torch.cat([classes[c].view(maps), q.view(maps)]) for q in q_feat for c in range(WAY)]
    )
    scores = head.score(head.blocks(pairs)).view(len(q_feat), WAY)
    return F.mse_loss(torch.sigmoid(scores), F.one_hot(q_labels, WAY).double())


def adaptation_reference(name: str, model, support: list, query: list) -> torch.Tensor:
    """The query loss after the inner steps written out on the unpadded support: plain
    gradient steps on every layer (MAML, first-order, iMAML with its proximal term) or on
    the classifier over one backbone pass of the real images (ANIL)."""
    s_labels = labels_of([len(s) for s in support])
    q_labels = labels_of([QUERY] * WAY)
    s_in, q_in = torch.cat(support), torch.cat(query)
    if name == "anil":
        features = model.network.backbone(torch.cat([s_in, q_in]))
        s_in, q_in = features.split([len(s_in), len(q_in)])
        module = model.network.classifier
    else:
        module = model.network
    init = dict(module.named_parameters())
    fast = dict(init)
    for _ in range(model.inner_steps):
        loss = F.cross_entropy(functional_call(module, fast, (s_in,)), s_labels)
        if name == "imaml":
            loss = loss + model.proximal / 2 * sum(
                ((fast[k] - init[k].detach()) ** 2).sum() for k in fast
            )
        grads = torch.autograd.grad(loss, list(fast.values()), create_graph=name != "fomaml")
        fast = {k: v - model.inner_lr * g for (k, v), g in zip(fast.items(), grads, strict=True)}
    return F.cross_entropy(functional_call(module, fast, (q_in,)), q_labels)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_padding_is_never_read_and_the_loss_is_the_unpadded_episodes(name):
    model, batch = build(name), images(POOL)
    ours = step(model, batch, SHOTS)
    padded = batch.clone()
    padded[~varied_entries(SHOTS, POOL)] = float("nan")  # read anywhere, it would spread
    assert_same(step(model, padded, SHOTS), ours, rtol=0, atol=0)
    model.eval()  # and the accuracy of a test episode
    assert torch.equal(model.accuracy(padded, SHOTS), model.accuracy(batch, SHOTS))
    model.train()

    by_hand = adaptation_reference if name in ADAPTATION else embedding_reference
    reference = by_hand(name, model, *by_class(batch))
    torch.testing.assert_close(ours[0], reference.detach(), **TIGHT)
    if name == "imaml":  # its gradient is implicit (conjugate gradient): its own tests
        return
    for key, want in gradients(reference, model).items():
        torch.testing.assert_close(ours[2][key], want, rtol=1e-8, atol=1e-10, msg=key)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_predict_with_unequal_shots_scores_the_queries_as_the_unpadded_episode(name):
    # A user's support folder of 1, 3 and 2 images, given shuffled: the scores' loss is the
    # hand-written episode's (test mode; the MAML family adapts its evaluation steps).
    steps = {"eval_inner_steps": METHODS[name][1]["inner_steps"]} if name in ADAPTATION else {}
    model = build(name, **steps).eval()
    support, query = by_class(images(POOL))
    labels = labels_of([len(s) for s in support])
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(3))
    scores = model.predict(torch.cat(support)[order], labels[order], torch.cat(query))
    q_labels = labels_of([QUERY] * WAY)
    if name == "relation":  # sigmoid relation scores, trained on their squared error
        loss = F.mse_loss(scores, F.one_hot(q_labels, WAY).double())
    else:
        loss = F.nll_loss(scores.log(), q_labels)
    by_hand = adaptation_reference if name in ADAPTATION else embedding_reference
    with torch.no_grad() if name not in ADAPTATION else torch.enable_grad():
        reference = by_hand(name, model, support, query)
    # predict's scores are float32, whatever the model's precision
    torch.testing.assert_close(loss.double(), reference.detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_ehg_of_a_varied_episode_is_the_mean_of_its_resplits(name):
    model, batch = build(name), images(POOL)
    if name == "relation":  # its BatchNorm would see the pairs of all re-splits at once
        model.comparator.eval()
    resplits = draw_varied_resplits(SHOTS, POOL, 3, torch.Generator().manual_seed(2))
    together = step(model, batch, SHOTS, resplits)
    alone = []
    for order in resplits:  # [1, way, pool]: each class's real entries permuted in place
        index = order[..., None, None, None].expand_as(batch)
        alone.append(step(model, torch.gather(batch, 2, index), SHOTS))
    mean = (
        torch.stack([a[0] for a in alone]).mean(),
        torch.cat([a[1] for a in alone]),
        {k: torch.stack([a[2][k] for a in alone]).mean(0) for k in together[2]},
    )
    assert_same(together, mean, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("name", ["maml", "anil", "imaml"])
def test_every_batching_takes_varied_episodes_alike(name):
    batch = images(POOL)
    resplits = draw_varied_resplits(SHOTS, POOL, 3, torch.Generator().manual_seed(2))
    loop = step(build(name, batching="loop"), batch, SHOTS, resplits)
    for batching in ("vmap", "threads"):
        assert_same(step(build(name, batching=batching), batch, SHOTS, resplits), loop, **TIGHT)


def test_a_relation_sum_refuses_varied_episodes_naming_the_option():
    model = build("relation", combine="sum")
    with pytest.raises(FewshotError, match="--method-options combine") as caught:
        model(images(POOL), None, SHOTS)
    assert "\n" not in str(caught.value)
    with pytest.raises(FewshotError, match="--method-options combine"):
        model.check_shot(None)
    support, query = by_class(images(POOL))  # predict's support of unequal counts too
    with pytest.raises(FewshotError, match="--method-options combine"):
        model.eval().predict(torch.cat(support), labels_of([1, 3, 2]), torch.cat(query))
    build("relation").check_shot(None)  # the mean reads them


def test_the_maml_family_refuses_a_varied_way_other_than_its_classifiers():
    with pytest.raises(FewshotError, match=r"must be 3-way, got 2$"):
        build("maml")(images(POOL)[:, :2], None, SHOTS[:, :2])


@pytest.mark.parametrize("name", sorted(METHODS))
def test_memory_terms_of_the_largest_varied_episode(name):
    """Sized as the largest episode (largest way and shot), every term is positive."""
    model, largest, query = build(name), 5, QUERY
    terms = model.memory_terms(1, WAY, largest + query, largest, 2, True)
    smaller = model.memory_terms(1, WAY, 1 + query, 1, 2, True)
    assert terms and all(term.size > 0 for term in terms)
    assert sum(t.size for t in terms) > sum(t.size for t in smaller)


# P>M>F on a split of random grey images: 3 classes of 6.
PMF_OPTIONS = {"steps": 3, "lr": 0.05}


def pmf_split() -> ImageSplit:
    """18 random uint8 images, 3 classes of 6, normalised by mean 0 and std 1."""
    generator = torch.Generator().manual_seed(4)
    pixels = torch.randint(0, 256, (18, 1, SIZE, SIZE), generator=generator, dtype=torch.uint8)
    return ImageSplit(pixels, torch.arange(3).repeat_interleave(6), ["a", "b", "c"], (0.0,), (1.0,))


def pmf_model() -> tuple[EmbeddingMethod, PmfAdapter]:
    """A seeded 4-channel Conv-4 ProtoNet in eval mode with its pmf adapter; `model.tuned`
    records the (fine-tuned) backbone weights each episode is classified with."""
    torch.manual_seed(0)
    model = EmbeddingMethod(Conv4(1, channels=4, image_size=SIZE), "protonet", amp="off").eval()
    model.scale.data.fill_(0.5)
    adapter = PmfAdapter(model, PmfOptions(**PMF_OPTIONS))
    model.use_adapter(adapter)
    model.tuned = []
    accuracy = model.accuracy

    def spy(batch, shot):
        model.tuned.append({k: v.clone() for k, v in model.backbone.state_dict().items()})
        return accuracy(batch, shot)

    model.accuracy = spy
    return model, adapter


def pmf_index(shots: list[int]) -> torch.Tensor:
    """A varied episode [1, 3, pool] of the pmf split: class c's first shots[c] + QUERY
    images, -1 after."""
    pool = max(shots) + QUERY
    index = torch.full((1, 3, pool), -1)
    for c, k in enumerate(shots):
        index[0, c, : k + QUERY] = 6 * c + torch.arange(k + QUERY)
    return index


def test_pmf_equal_shots_of_a_varied_shape_are_the_integer_shot():
    split, index = pmf_split(), pmf_index([2, 2, 2])
    results = []
    for shot in (2, VariedShape(3, 3, 2, 6, QUERY)):
        model, _ = pmf_model()
        accuracy = model.solver(split, shot, torch.device("cpu"), False, None)(index)
        results.append((accuracy, model.tuned[0]))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
    for key, value in results[0][1].items():
        torch.testing.assert_close(results[1][1][key], value, rtol=1e-6, atol=1e-7, msg=key)


def test_pmf_fine_tunes_on_the_unequal_support_as_a_hand_written_loop():
    split, shots = pmf_split(), [1, 3, 2]
    index = pmf_index(shots)
    seed = int(episode_seeds(index, PmfOptions.seed)[0])  # the episode's own
    model, adapter = pmf_model()
    reference = Conv4(1, channels=4, image_size=SIZE).eval()
    reference.load_state_dict(model.backbone.state_dict())
    accuracy = model.solver(split, VariedShape(3, 3, 3, 6, QUERY), torch.device("cpu"), False, None)
    got = accuracy(index)

    # By hand: SGD with momentum 0.9 on the prototypes of the unpadded support against its
    # augmented copies, the episode's own seed drawing the augmentation.
    raw_support = torch.cat([split.images[6 * c : 6 * c + k] for c, k in enumerate(shots)])
    raw_query = torch.cat(
        [split.images[6 * c + k : 6 * c + k + QUERY] for c, k in enumerate(shots)]
    )
    support, queries = raw_support.float() / 255, raw_query.float() / 255
    s_labels, q_labels = labels_of(shots), labels_of([QUERY] * 3)
    augment = TrainAugment((0.0,), (1.0,), SIZE, padding=SIZE // 8, jitter=0.0)
    generator = torch.Generator().manual_seed(seed)
    params = list(reference.parameters())
    velocity = [torch.zeros_like(p) for p in params]

    def prototypes() -> torch.Tensor:
        features = reference(support)
        return torch.stack([features[s_labels == c].mean(0) for c in range(3)])

    for _ in range(PMF_OPTIONS["steps"]):
        pseudo = augment(raw_support, generator)
        logits = -0.5 * ((reference(pseudo)[:, None] - prototypes()[None]) ** 2).sum(-1)
        loss = F.cross_entropy(logits, s_labels)
        for p, v, g in zip(params, velocity, torch.autograd.grad(loss, params), strict=True):
            v.mul_(0.9).add_(g)
            p.data.sub_(PMF_OPTIONS["lr"] * v)
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(model.tuned[0][key], value, rtol=1e-4, atol=1e-5, msg=key)
    with torch.no_grad():
        distances = ((reference(queries)[:, None] - prototypes()[None]) ** 2).sum(-1)
        want = (distances.argmin(1) == q_labels).float().mean()
    torch.testing.assert_close(got, want[None])

    # The padding's content is never read: other pixels there, the same result.
    raw = split.images[index[0].clamp(min=0)]
    noisy = raw.clone()
    noisy[index[0] < 0] = 255 - noisy[index[0] < 0]
    shot = torch.tensor([shots])
    accuracies = [adapter.episode_accuracy(r, split, shot, augment, seed) for r in (raw, noisy)]
    assert torch.equal(accuracies[0], accuracies[1])
    for key, value in model.tuned[-2].items():
        assert torch.equal(model.tuned[-1][key], value), key
