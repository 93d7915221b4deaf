"""A frozen backbone's feature cache: every image embedded once into the run folder, read by
each training step, each validation, a resumed run and `fewshot eval`, with the same losses
and accuracies as embedding every step (real Omniglot images, 24 classes a split); a file that
fails its checksum or its shape is embedded again with one note, never read as features."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest
import torch
from test_cache import no_checksum, not_numpy, truncated, zeros
from trainers import make_trainer

from fewshot.cli.main import main
from fewshot.datasets.base import ImageSplit
from fewshot.methods.embedding import EmbeddingMethod
from fewshot.methods.feature_cache import FeatureCache, backbone_digest
from fewshot.runtime.cache import save_checked
from fewshot.runtime.signals import Interrupted
from fewshot.training.settings import PretrainSettings, TrainSettings


def frozen(tmp_path, root, **changes) -> TrainSettings:
    """Two epochs of 3-way 1-shot episodes on a frozen, randomly initialised Conv-4, under
    Matching Networks' full context embeddings (the weights that train: a frozen backbone
    under a head of none is refused)."""
    values = dict(
        method="matching", method_options={"fce": True},
        dataset="omniglot", data_root=str(root), way=3, shot=1, query=2, val_query=2,
        epochs=2, episodes_per_epoch=4, episodes_per_batch=2, val_episodes=4,
        freeze_backbone=True, device="cpu", amp="off", out=str(tmp_path / "run"),
    )  # fmt: skip
    return TrainSettings(**{**values, **changes})


def no_feature_cache(monkeypatch) -> None:
    """Every training step embeds its images, as before the cache."""
    monkeypatch.setattr(EmbeddingMethod, "use_feature_cache", lambda self, folder: False)


def metrics(run) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # The numbers a run's training and validation gave, not its timing or labels.
    return [
        {k: v for k, v in row.items() if k != "seconds" and isinstance(v, int | float)}
        for row in rows
    ]


def test_training_on_cached_features_equals_embedding_every_step(
    tmp_path, tiny_omniglot_root, monkeypatch
):
    cached = make_trainer(frozen(tmp_path / "cached", tiny_omniglot_root))
    cached.fit()
    files = sorted((cached.run_dir / "features").glob("*.npy"))
    sizes = sorted(len(np.load(f, mmap_mode="r")) for f in files)
    assert sizes == sorted([len(cached.train_data.labels), len(cached.val_data.labels)])
    method = cached.method.eval()
    assert torch.equal(
        cached.train_features, method.embed_split(cached.train_data, torch.device("cpu"))
    )
    no_feature_cache(monkeypatch)
    plain = make_trainer(frozen(tmp_path / "plain", tiny_omniglot_root))
    plain.fit()
    assert plain.train_features is None and not (plain.run_dir / "features").exists()
    for a, b in zip(metrics(cached.run_dir), metrics(plain.run_dir), strict=True):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    fresh = make_trainer(frozen(tmp_path / "fresh", tiny_omniglot_root)).method.comparator
    trained, again = cached.method.comparator.state_dict(), plain.method.comparator.state_dict()
    for name, value in trained.items():
        assert value == pytest.approx(again[name], rel=1e-5, abs=1e-6), name
    assert any(not torch.equal(v, fresh.state_dict()[k]) for k, v in trained.items())  # trained


def test_a_resumed_run_reads_its_features_without_embedding_again(
    tmp_path, tiny_omniglot_root, monkeypatch
):
    make_trainer(frozen(tmp_path, tiny_omniglot_root, epochs=1)).fit()

    def refuse(*args, **kwargs):
        raise AssertionError("embedded again")

    monkeypatch.setattr(EmbeddingMethod, "embed_split", refuse)
    resumed = make_trainer(
        frozen(tmp_path, tiny_omniglot_root), resume=str(tmp_path / "run" / "last.pt")
    )
    resumed.fit()  # trains and validates its second epoch on the cached features
    assert len(metrics(resumed.run_dir)) == 2


def test_augmented_or_trained_backbones_embed_every_step(tmp_path, tiny_omniglot_root):
    trained = make_trainer(frozen(tmp_path / "trained", tiny_omniglot_root, freeze_backbone=False))
    trained.fit()
    assert trained.train_features is None and not (trained.run_dir / "features").exists()
    augmented = make_trainer(frozen(tmp_path / "augmented", tiny_omniglot_root))
    # Omniglot takes no augmentation: the setting alone, as a 32x32 or 84x84 set's run has it.
    object.__setattr__(augmented.settings, "augment", True)
    assert augmented._cache_features() is None


def test_varied_episodes_on_cached_features_give_the_embedded_loss(tmp_path, tiny_omniglot_root):
    varied = dict(varied=True, way=3, max_way=5, shot=3, max_support=8, episodes_per_batch=2)
    losses = []
    for name in ("cached", "plain"):
        trainer = make_trainer(frozen(tmp_path / name, tiny_omniglot_root, **varied))
        if name == "cached":
            trainer.train_features = trainer._cache_features()
        trainer.method.train()
        trainer.method.backbone.eval()
        losses.append([value for _ in range(3) for value in trainer.train_step()])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_the_cache_file_names_what_its_features_depend_on(tmp_path, omniglot_val):
    split = omniglot_val
    cache = FeatureCache(tmp_path)
    backbone = torch.nn.Linear(2, 2)
    digest = backbone_digest(backbone, "float32")
    path = cache.path(split, digest)
    assert cache.path(split, backbone_digest(backbone, "float32")) == path
    assert cache.path(split, backbone_digest(backbone, "bfloat16")) != path
    with torch.no_grad():
        backbone.weight[0, 0] += 1e-3
    assert cache.path(split, backbone_digest(backbone, "float32")) != path
    other = type(split)(split.images, split.labels, split.class_names, mean=(0.5,), std=split.std)
    assert cache.path(other, digest) != path
    calls = []

    def embed(s):
        calls.append(s)
        return torch.arange(len(s.labels) * 2, dtype=torch.float32).view(-1, 2)

    first = cache.features(split, digest, embed)
    again = cache.features(split, digest, embed)
    assert len(calls) == 1 and torch.equal(first, again) and again[3].tolist() == [6.0, 7.0]


class Embedder:
    """An embedding function that counts its calls: features [N, 2] of a split, 1 onwards."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, split: ImageSplit) -> torch.Tensor:
        self.calls += 1
        return torch.arange(1, 2 * len(split.labels) + 1, dtype=torch.float32).view(-1, 2)


def small_split() -> ImageSplit:
    """Six 4x4 images of two classes."""
    images = torch.arange(96, dtype=torch.uint8).view(6, 1, 4, 4)
    return ImageSplit(images, torch.tensor([0, 0, 0, 1, 1, 1]), ["a", "b"], (0.0,), (1.0,))


def other_shape(entry) -> None:
    """An entry with its own checksum, but not this split's features: 3 rows, not 6."""
    save_checked(np.ones((3, 2), np.float32), entry)


def other_dtype(entry) -> None:
    """An entry with its own checksum, but float64 features."""
    save_checked(np.ones((6, 2), np.float64), entry)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (zeros, "failed its checksum"),
        (no_checksum, "has no checksum"),
        (truncated, "cannot be read"),
        (not_numpy, "cannot be read"),
        (other_shape, "holds float32 (3, 2), not the array expected"),
        (other_dtype, "holds float64 (6, 2), not the array expected"),
    ],
)
def test_a_damaged_cache_file_is_embedded_again_with_one_note(damage, problem, tmp_path, capsys):
    cache, split, embed = FeatureCache(tmp_path), small_split(), Embedder()
    want = cache.features(split, "d", embed).clone()
    assert embed.calls == 1 and capsys.readouterr().err == ""
    path = cache.path(split, "d")
    damage(path)
    got = cache.features(split, "d", embed)
    assert embed.calls == 2 and torch.equal(got, want)  # the true features, not zeros
    (note,) = capsys.readouterr().err.splitlines()
    assert note.startswith(f"note: feature cache {path} {problem}")
    assert note.endswith(": embedded again")
    # Rewritten with its checksum: the next read maps it without embedding or a word.
    assert torch.equal(cache.features(split, "d", embed), want)
    assert embed.calls == 2 and capsys.readouterr().err == ""


def test_an_intact_cache_file_is_read_without_embedding_or_a_note(tmp_path, capsys):
    cache, split, embed = FeatureCache(tmp_path), small_split(), Embedder()
    first = cache.features(split, "d", embed).clone()
    for _ in range(3):
        assert torch.equal(cache.features(split, "d", embed), first)
    assert embed.calls == 1 and capsys.readouterr().err == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [cache.path(split, "d").name, f"{cache.path(split, 'd').name}.sha256"]
    )


def test_a_frozen_backbones_zeroed_features_are_embedded_again_with_the_same_accuracy(
    tmp_path, tiny_omniglot_root, monkeypatch, capsys
):
    """`fewshot eval` of a frozen Conv-4 keeps its features in the user's cache; the file then
    overwritten with zeros of the same shape (read as they were, 20 %: chance), the next
    evaluation embeds again, with the first accuracy and one note naming the file."""
    monkeypatch.setenv("FEWSHOT_CACHE", str(tmp_path / "cache"))
    argv = ["eval", "--backbone", "conv4", "--dataset", "omniglot"]
    argv += ["--data-root", str(tiny_omniglot_root), "--episodes", "20", "--way", "5"]
    argv += ["--device", "cpu"]
    assert main([*argv, "--out", str(tmp_path / "first.json")]) == 0
    (path,) = (tmp_path / "cache" / "features").glob("*.npy")
    zeros(path)
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "again.json")]) == 0
    first, again = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("first", "again"))
    assert again["accuracy"] == first["accuracy"] > 30  # percent: chance is 20
    notes = [line for line in capsys.readouterr().err.splitlines() if "checksum" in line]
    assert notes == [f"note: feature cache {path} failed its checksum: embedded again"]


def test_evaluating_a_frozen_run_reads_and_adds_to_its_feature_cache(
    tmp_path, tiny_omniglot_root, monkeypatch, capsys
):
    make_trainer(frozen(tmp_path, tiny_omniglot_root, epochs=1)).fit()
    run = tmp_path / "run"
    argv = [
        "eval",
        "--checkpoint",
        str(run / "last.pt"),
        "--episodes",
        "30",
        "--way",
        "3",
        "--shot",
        "1",
    ]
    argv += ["--data-root", str(tiny_omniglot_root), "--device", "cpu", "--cache"]
    results = []
    for name in ("first", "again", "plain"):
        if name == "plain":
            no_feature_cache(monkeypatch)
        assert main([*argv, "--out", str(tmp_path / f"{name}.json")]) == 0
        results.append(json.loads((tmp_path / f"{name}.json").read_text())["accuracy"])
        if name == "first":  # the test split's features joined the train and val splits'
            assert len(list((run / "features").glob("*.npy"))) == 3
    assert results[0] == results[1] == pytest.approx(results[2], abs=1e-9)


def test_a_linear_probe_on_cached_features_equals_embedding_every_step(
    tmp_path, tiny_omniglot_root, monkeypatch
):
    values = dict(
        dataset="omniglot", data_root=str(tiny_omniglot_root), batch_size=16, epochs=1,
        val_episodes=4, freeze_backbone=True, device="cpu", amp="off",
    )  # fmt: skip
    rows = []
    for name in ("cached", "plain"):
        if name == "plain":
            no_feature_cache(monkeypatch)
        trainer = make_trainer(PretrainSettings(**values, out=str(tmp_path / name)))
        trainer.fit()
        assert (trainer.train_features is None) == (name == "plain")
        [row] = metrics(trainer.run_dir)
        rows.append(row)
    assert rows[0] == pytest.approx(rows[1], rel=1e-5, abs=1e-6)


def test_a_stop_while_embedding_leaves_a_checkpoint_to_resume(
    tmp_path, tiny_omniglot_root, monkeypatch
):
    settings = frozen(tmp_path, tiny_omniglot_root, epochs=1)
    trainer = make_trainer(settings)

    def stopped(*args, **kwargs):
        raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(trainer.method, "split_features", stopped)
    with pytest.raises(Interrupted, match="embedding the features: again on resume"):
        trainer.fit()
    monkeypatch.undo()
    last = tmp_path / "run" / "last.pt"
    resumed = make_trainer(settings, resume=str(last))
    resumed.fit()
    assert resumed.train_features is not None and len(metrics(resumed.run_dir)) == 1


def test_a_splits_fingerprint_is_hashed_once_until_its_tensors_change(monkeypatch):
    """The cache asks for the split's fingerprint at every validation: hashed once for the
    same tensors, again after an in-place change or new tensors, always the hash of what the
    split holds now."""
    images = torch.randint(0, 256, (6, 1, 4, 4), dtype=torch.uint8)
    split = ImageSplit(images, torch.tensor([0, 0, 0, 1, 1, 1]), ["a", "b"], (0.0,), (1.0,))
    hashed = []
    digest = ImageSplit._digest
    monkeypatch.setattr(ImageSplit, "_digest", lambda self: hashed.append(1) or digest(self))
    first = split.fingerprint()
    assert split.fingerprint() == first and len(hashed) == 1
    split.images[0, 0, 0, 0] ^= 1  # in place
    changed = split.fingerprint()
    assert changed != first and len(hashed) == 2
    split.images[0, 0, 0, 0] ^= 1
    split.labels = torch.tensor([0, 0, 0, 1, 1, 0])  # a new tensor
    assert split.fingerprint() not in (first, changed) and len(hashed) == 3
    fresh = ImageSplit(split.images.clone(), split.labels.clone(), ["a", "b"], (0.0,), (1.0,))
    assert fresh.fingerprint() == split.fingerprint() and len(hashed) == 4
