"""P>M>F's test-time fine-tuning (`--classifier pmf`): the per-episode SGD against a hand-written
loop, lr 0 as the model's own accuracy, the weights restored bit for bit, episodes that do not
depend on their batch, the lr chosen on validation episodes, and its options refused before
any data is read."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from fewshot.backbones import Conv4, build_backbone
from fewshot.cli.main import main
from fewshot.datasets import REPO_DATA
from fewshot.datasets.augment import TrainAugment
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import episode_accuracies, seeded_episodes
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.methods.pmf import PmfAdapter, PmfOptions
from fewshot.runtime.errors import FewshotError
from fewshot.training.checkpoint import load_trained

CPU = torch.device("cpu")
ZOO = REPO_DATA.parent / "models" / "omniglot" / "protonet_conv4_1shot.pt"
ZOO_MATCHING = REPO_DATA.parent / "models" / "omniglot" / "matching_conv4_5way1shot.pt"


def small_split(omniglot_test, classes: int = 20) -> ImageSplit:
    """The first `classes` classes of the Omniglot test split, normalised as the zoo's."""
    keep = omniglot_test.labels < classes
    images, labels = omniglot_test.images[keep], omniglot_test.labels[keep]
    return ImageSplit(images, labels, omniglot_test.class_names[:classes], (0.0,), (1.0,), "sub")


def small_model(head: str = "protonet") -> EmbeddingMethod:
    """A Conv-4 of 8 channels on 28x28 grey images, seeded, in eval mode."""
    torch.manual_seed(0)
    return EmbeddingMethod(Conv4(1, channels=8, image_size=28), head, amp="off").eval()


def with_pmf(model: EmbeddingMethod, **options) -> PmfAdapter:
    """Give `model` the pmf adapter of `options`; return the adapter."""
    adapter = PmfAdapter(model, PmfOptions(**options))
    model.use_adapter(adapter)
    return adapter


def test_fine_tuning_matches_a_hand_written_loop(omniglot_test):
    """`fit`'s weights equal plain SGD with momentum 0.9 on the ProtoNet loss, written out:
    prototypes of the support, pseudo-queries its augmented copies, separate forwards."""
    model = small_model()
    model.scale.data.fill_(0.5)
    adapter = PmfAdapter(model, PmfOptions(steps=4, lr=0.05))
    split = small_split(omniglot_test)
    way, shot = 3, 2
    index = torch.cat([torch.nonzero(split.labels == c)[:shot, 0] for c in range(way)])
    raw = split.images[index]
    support = raw.float() / 255  # mean 0, std 1
    augment = TrainAugment((0.0,), (1.0,), 28, padding=3, jitter=0.0)

    reference = copy.deepcopy(model.backbone).eval()
    params = list(reference.parameters())
    velocity = [torch.zeros_like(p) for p in params]
    generator = torch.Generator().manual_seed(7)
    labels = torch.arange(way).repeat_interleave(shot)
    for _ in range(4):
        pseudo = augment(raw, generator)
        prototypes = reference(support).view(way, shot, -1).mean(dim=1)
        distances = ((reference(pseudo)[:, None] - prototypes[None]) ** 2).sum(dim=2)
        logits = 0.5 * -distances
        loss = -logits.log_softmax(dim=1)[torch.arange(way * shot), labels].mean()
        for p, v, g in zip(params, velocity, torch.autograd.grad(loss, params), strict=True):
            v.mul_(0.9).add_(g)
            p.data.sub_(0.05 * v)

    before = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    adapter.fit(raw, support, shot, augment, torch.Generator().manual_seed(7))
    after = model.backbone.state_dict()
    for (key, value), want in zip(after.items(), reference.state_dict().values(), strict=True):
        torch.testing.assert_close(value, want, rtol=1e-4, atol=1e-5, msg=key)
        if "running" in key or "num_batches" in key:  # BatchNorm kept in eval mode
            assert torch.equal(value, before[key]), key
    assert not torch.equal(after["encoder.0.0.weight"], before["encoder.0.0.weight"])
    assert all(p.grad is None for p in model.parameters())


def test_lr_0_is_the_models_own_accuracy(omniglot_test):
    split, shape = small_split(omniglot_test), EpisodeShape(5, 1, 3, 4)
    plain = small_model()
    own = episode_accuracies(plain, split, shape, 10, 3, CPU, cache=True)
    model = small_model()
    with_pmf(model, lr=0.0, steps=3)
    assert not model.caches
    assert torch.equal(episode_accuracies(model, split, shape, 10, 3, CPU, cache=True), own)
    # Any other lr fine-tunes: some episode's accuracy moves.
    with_pmf(model, lr=0.5, steps=3)
    assert not torch.equal(episode_accuracies(model, split, shape, 10, 3, CPU), own)


def test_weights_are_restored_bit_for_bit_after_each_episode(omniglot_test, monkeypatch):
    model, _ = load_trained(ZOO, CPU)
    with_pmf(model, lr=0.01, steps=3)
    tuned = []  # whether the weights that classified each episode were the fine-tuned ones
    first = model.backbone.state_dict()["encoder.0.0.weight"].clone()
    accuracy = model.accuracy

    def spy(images, shot):
        tuned.append(not torch.equal(model.backbone.state_dict()["encoder.0.0.weight"], first))
        return accuracy(images, shot)

    monkeypatch.setattr(model, "accuracy", spy)
    split, shape = small_split(omniglot_test), EpisodeShape(5, 1, 3, 2)
    episode_accuracies(model, split, shape, 4, 0, CPU)
    assert tuned == [True] * 4
    fresh, _ = load_trained(ZOO, CPU)
    for key, value in fresh.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    assert all(p.grad is None for p in model.parameters())
    # Evaluated as a plain model after those episodes, it gives what a fresh load gives.
    monkeypatch.undo()
    assert torch.equal(model.embed_split(split, CPU), fresh.embed_split(split, CPU))


def test_episodes_do_not_depend_on_the_episodes_per_batch(omniglot_test):
    split = small_split(omniglot_test)
    model = small_model()
    with_pmf(model, lr=0.1, steps=2)
    one = episode_accuracies(model, split, EpisodeShape(5, 1, 3, 1), 6, 2, CPU)
    four = episode_accuracies(model, split, EpisodeShape(5, 1, 3, 4), 6, 2, CPU)
    assert torch.equal(one, four)
    # The fifth episode alone, first of its solver: the same as fifth among six.
    [*_, fifth, _] = seeded_episodes(split, EpisodeShape(5, 1, 3, 1), 6, 2)
    alone = model.solver(split, 1, CPU, False, None)(fifth)
    assert torch.equal(alone, one[4:5])


def test_the_lr_is_chosen_on_validation_episodes_first_of_equals(omniglot_test):
    model = small_model()
    adapter = with_pmf(model, lrs=[0.0, 0.1, 1e9], steps=2)
    split, shape = small_split(omniglot_test), EpisodeShape(5, 1, 3, 4)
    means = adapter.choose_lr(lambda: episode_accuracies(model, split, shape, 6, 1, CPU))
    assert means[1e9] is None  # diverged: skipped
    by_hand = {}
    for lr in (0.0, 0.1):
        adapter.lr = lr
        by_hand[lr] = float(episode_accuracies(model, split, shape, 6, 1, CPU).double().mean())
    assert {lr: means[lr] for lr in by_hand} == by_hand
    adapter.choose_lr(lambda: episode_accuracies(model, split, shape, 6, 1, CPU))
    best = 0.1 if by_hand[0.1] > by_hand[0.0] else 0.0
    assert adapter.lr == best
    assert adapter.record()["pmf_validation"]["1e+09"] is None


def test_eval_chooses_the_lr_says_it_and_records_it(tiny_omniglot_root, tmp_path, capsys):
    data = ["--episodes", "4", "--query", "3", "--data-root", str(tiny_omniglot_root)]
    model = ["eval", "--checkpoint", str(ZOO), "--device", "cpu", *data]
    options = '{"steps": 2, "lrs": [0, 0.001], "val_episodes": 3}'
    out = tmp_path / "pmf.json"
    argv = [*model, "--classifier", "pmf", "--classifier-options", options, "--out", str(out)]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    record = json.loads(out.read_text())
    validation = record["pmf_validation"]
    assert list(validation) == ["0", "0.001"]
    best = max(validation, key=validation.__getitem__)
    assert record["pmf_lr"] == float(best) and record["cache"] is False
    assert f"pmf: lr {best} chosen for {ZOO} on 3 episodes of omniglot split 'val'" in lines[0]
    # lr given: no search, and lr 0 is the model's own result on the same episodes.
    argv = [*model, "--classifier", "pmf", "--classifier-options", '{"lr": 0}']
    assert main([*argv, "--out", str(out), "--overwrite"]) == 0
    record = json.loads(out.read_text())
    assert record["pmf_lr"] == 0 and "pmf_validation" not in record
    assert main([*model, "--out", str(tmp_path / "own.json")]) == 0
    assert json.loads((tmp_path / "own.json").read_text())["accuracy"] == record["accuracy"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (['{"steps": 0}'], "--classifier-options pmf steps must be at least 1, got 0"),
        (['{"lr": -1}'], "--classifier-options pmf lr must be >= 0, got -1"),
        (['{"lrs": []}'], "pmf lrs must be distinct learning rates >= 0, at least one, got []"),
        (['{"lr": 0.1, "val_episodes": 5}'], "they do not apply with lr given"),
        (['{"momentum": 0.5}'], "has no option 'momentum' for pmf; known: steps, lr, lrs"),
        (['{"lr": "big"}'], "--classifier-options.lr must be"),
        (["{}", "--cache"], "--cache does not apply to --classifier pmf"),
        (["{}", "--save-episodes", "e.json"], "--save-episodes does not apply to --classifier"),
        (
            ["{}", "--checkpoint", str(ZOO_MATCHING)],
            "pmf fine-tunes through a prototype head (protonet, cosine); this model's head is "
            "matching",
        ),
    ],
)
def test_bad_pmf_settings_are_refused_before_any_data(argv, message, monkeypatch, capsys):
    def no_data(*args, **kwargs):
        raise AssertionError("the data was read before pmf's settings were checked")

    monkeypatch.setattr("fewshot.cli.episode_settings.load_split", no_data)
    options, *rest = argv
    command = ["eval", "--checkpoint", str(ZOO), "--classifier", "pmf", "--device", "cpu"]
    assert main([*command, "--classifier-options", options, *rest]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_compare_fine_tunes_each_model_and_lr_0_changes_nothing(tiny_omniglot_root, capsys):
    zoo_trainval = REPO_DATA.parent / "models" / "omniglot" / "protonet_conv4_trainval.pt"
    argv = ["compare", str(ZOO), str(zoo_trainval), "--episodes", "6", "--query", "3"]
    argv += ["--data-root", str(tiny_omniglot_root), "--device", "cpu"]
    assert main(argv) == 0
    own = capsys.readouterr().out.splitlines()
    assert main([*argv, "--classifier", "pmf", "--classifier-options", '{"lr": 0}']) == 0
    assert capsys.readouterr().out.splitlines() == own[-3:]  # A, B, B - A (no cache line)


def test_a_diverging_lr_is_one_line_naming_it(capsys):
    options = '{"lr": 1e9, "steps": 2}'
    argv = ["eval", "--checkpoint", str(ZOO), "--classifier", "pmf", "--device", "cpu"]
    assert main([*argv, "--classifier-options", options, "--episodes", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("the fine-tuning diverged (non-finite loss) at lr 1e+09: lower lr"), err


def test_predict_refuses_pmf_before_reading_images(tmp_path, capsys):
    argv = ["predict", "--checkpoint", str(ZOO), "--support", str(tmp_path / "none")]
    assert main([*argv, "--query", str(tmp_path / "none"), "--classifier", "pmf"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--classifier pmf fine-tunes the backbone on the seeded episodes of fewshot eval" in err


def small_backbone(name: str) -> torch.nn.Module:
    """A small seeded backbone of each kind batched fine-tuning vmaps: Conv-4, a narrow
    ResNet-12, a timm model (at 32x32 grey)."""
    torch.manual_seed(0)
    if name == "resnet12":
        return build_backbone("resnet12", 1, 32, channels=(8, 8, 16, 16), avg_pool=True)
    return build_backbone(name, 1, 32)


@pytest.mark.parametrize("name", ["conv4", "resnet12", "timm:resnet10t"])
def test_batched_fine_tuning_equals_one_episode_at_a_time(omniglot_test, name):
    """`fit_batched`'s stacked weights are, episode by episode, `fit`'s on the module (the
    same augmentation draws), and the module is untouched; the accuracies of a batched
    solver are those of one episode at a time."""
    if name.startswith("timm"):
        pytest.importorskip("timm")
    split = small_split(omniglot_test)
    split = ImageSplit(
        torch.nn.functional.pad(split.images, (2, 2, 2, 2)),
        split.labels,
        split.class_names,
        (0.0,),
        (1.0,),
        "padded",
    )  # 32x32: a size every backbone here takes
    model = EmbeddingMethod(small_backbone(name), "protonet", amp="off").eval()
    adapter = PmfAdapter(model, PmfOptions(steps=3, lr=0.05))
    augment = TrainAugment((0.0,), (1.0,), 32, padding=4, jitter=0.0)
    way, shot, episodes = 3, 2, 3
    index = torch.stack(
        [
            torch.cat([torch.nonzero(split.labels == c)[e : e + shot, 0] for c in range(way)])
            for e in range(episodes)
        ]
    )
    raw = split.images[index]  # [E, way * shot, 1, 32, 32]
    before = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    generators = [torch.Generator().manual_seed(seed) for seed in range(episodes)]
    stacked = adapter.fit_batched(raw, raw.float() / 255, shot, augment, generators)
    for key, value in model.backbone.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert stacked and all(len(w) == episodes for w in stacked.values())
    for e in range(episodes):
        adapter.fit(raw[e], raw[e].float() / 255, shot, augment, torch.Generator().manual_seed(e))
        tuned = dict(model.backbone.named_parameters())
        for key, weights in stacked.items():
            torch.testing.assert_close(weights[e], tuned[key], rtol=1e-4, atol=1e-5, msg=key)
        assert any(not torch.equal(stacked[k][e], before[k]) for k in stacked)
        model.backbone.load_state_dict(before)

    shape = EpisodeShape(5, 1, 3, 4)
    one_at_a_time = episode_accuracies(model, split, shape, 8, 0, CPU)
    adapter.options = PmfOptions(steps=3, lr=0.05, batched=True)
    assert torch.equal(episode_accuracies(model, split, shape, 8, 0, CPU), one_at_a_time)


def test_batched_fine_tuning_holds_every_episodes_weights_and_refuses_fp16():
    """The memory estimate of a batch fine-tuned at once is that of one episode times the
    batch; fp16 (its loss scale one episode's) is refused batched and runs one at a time
    by default."""
    model = small_model()
    one = PmfAdapter(model, PmfOptions(batched=False)).memory_terms(8, 5, 1, CPU)
    eight = PmfAdapter(model, PmfOptions(batched=True)).memory_terms(8, 5, 1, CPU)
    assert [term.size * 8 for term in one] == [term.size for term in eight]
    assert eight[0].what == "fine-tuning on 80 images" and eight[0].lower == "--episodes-per-batch"
    weights = sum(p.numel() * 4 for p in model.backbone.parameters())
    assert one[1].size == 3 * weights and one[1].lower is None
    assert not PmfAdapter(model, PmfOptions()).batches(CPU)
    model.amp = "fp16"
    assert not PmfAdapter(model, PmfOptions()).batches(torch.device("cuda"))
    with pytest.raises(FewshotError, match="pmf batched fine-tuning does not take fp16"):
        PmfAdapter(model, PmfOptions(batched=True)).batches(CPU)
