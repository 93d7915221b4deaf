"""Several data sets in one run (--extra-data): the training splits joined, each batch of
episodes from one source (as that source's own sampler draws it), resumable, refused in one
line when a source cannot join; trained end to end on real Omniglot and a folder of images."""

from __future__ import annotations

import pytest
import torch
from test_folder import TINY_TRAIN, refused, split_folders
from trainers import make_trainer

from fewshot.cli.main import main
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sampler import EpisodeSampler, EpisodeShape
from fewshot.datasets.sources import SourceSampler, join_splits, training_sampler
from fewshot.datasets.varied import VariedSampler, VariedShape
from fewshot.training.settings import TrainSettings

SHAPE = EpisodeShape(way=3, shot=1, query=2, episodes_per_batch=4)


def split(classes: int, per_class: int, value: int, name: str) -> ImageSplit:
    """`classes` classes of `per_class` 2x2 images, every pixel `value`."""
    labels = torch.arange(classes).repeat_interleave(per_class)
    images = torch.full((len(labels), 1, 2, 2), value, dtype=torch.uint8)
    return ImageSplit(images, labels, [f"c{i}" for i in range(classes)], (0.5,), (0.25,), name)


def joined() -> ImageSplit:
    return join_splits([("a", split(5, 4, 1, "a.npz")), ("b", split(4, 3, 2, "b.npz"))])


def test_joined_splits_keep_their_images_classes_and_order():
    data = joined()
    assert data.parts == (("a", 20), ("b", 12))
    assert data.labels.tolist() == [c for c in range(5) for _ in range(4)] + [
        c for c in range(5, 9) for _ in range(3)
    ]
    assert data.images[:20].eq(1).all() and data.images[20:].eq(2).all()
    assert data.class_names[4:6] == ["a/c4", "b/c0"]
    assert (data.mean, data.std, data.source) == ((0.5,), (0.25,), "a.npz + b.npz")


@pytest.mark.parametrize("varied", [False, True])
def test_every_batch_comes_from_one_source_as_its_own_sampler_draws_it(varied):
    data = joined()
    shape = VariedShape(3, 4, 2, 8, 1) if varied else SHAPE
    own = VariedSampler if varied else EpisodeSampler
    sampler = training_sampler(data, shape, seed=7)
    assert isinstance(sampler, SourceSampler)
    # The same draws, by hand: the source from the seed's generator, then that source's
    # own sampler (seed + 1 + its place) on its own labels.
    chooser = torch.Generator().manual_seed(7)
    alone = [own(data.labels[:20], shape, 8), own(data.labels[20:] - 5, shape, 9)]
    drawn = []
    for _ in range(40):
        index = sampler.sample()
        source = int(torch.randint(2, (), generator=chooser))
        want = alone[source].sample()
        shifted = torch.where(want >= 0, want + 20 * source, want)
        assert torch.equal(index, shifted)
        values = data.images[index[index >= 0]].unique()
        assert values.tolist() == [source + 1]  # one source per batch
        drawn.append(source)
    assert 10 <= sum(drawn) <= 30  # both sources, about evenly


def test_a_joined_sampler_resumes_exactly():
    sampler = training_sampler(joined(), SHAPE, seed=3)
    for _ in range(5):
        sampler.sample()
    state = sampler.state_dict()
    ahead = [sampler.sample() for _ in range(6)]
    again = training_sampler(joined(), SHAPE, seed=3)
    again.load_state_dict(state)
    assert all(torch.equal(ahead[k], again.sample()) for k in range(6))


def test_a_split_of_one_source_samples_as_before():
    data = split(5, 4, 1, "a.npz")
    ours, before = training_sampler(data, SHAPE, seed=1), EpisodeSampler(data.labels, SHAPE, 1)
    assert all(torch.equal(ours.sample(), before.sample()) for _ in range(5))


def test_a_source_that_cannot_give_the_episodes_is_named():
    data = join_splits([("a", split(5, 4, 1, "a.npz")), ("b", split(2, 4, 2, "b.npz"))])
    with pytest.raises(Exception, match="3-way episodes need 3 classes, 2 in b"):
        training_sampler(data, SHAPE, seed=0)


def test_omniglot_and_a_folder_of_photos_train_together(tmp_path, tiny_omniglot_root):
    photos = split_folders(tmp_path / "photos")  # RGB 16x16, read as Omniglot's 1x28x28
    settings = TrainSettings(
        dataset="omniglot", data_root=str(tiny_omniglot_root),
        extra_data=[f"folder:{photos}"], way=3, shot=1, query=2, val_query=2, epochs=1,
        episodes_per_epoch=8, episodes_per_batch=1, val_episodes=2, device="cpu", amp="off",
        out=str(tmp_path / "run"),
    )  # fmt: skip
    trainer = make_trainer(settings)
    data = trainer.train_data
    assert [name for name, _ in data.parts] == ["omniglot", "folder:photos"]
    assert data.parts[1][1] == 16 and data.images.shape[1:] == (1, 28, 28)
    assert data.num_classes == 24 + 4
    trainer.fit()
    assert (tmp_path / "run" / "last.pt").is_file()
    argv = ["train", "--dataset", "omniglot", "--data-root", str(tiny_omniglot_root)]
    argv += ["--extra-data", f"folder:{photos}", *TINY_TRAIN, "--out", str(tmp_path / "cli")]
    assert main(argv) == 0
    # Evaluated as any model, on one data set: --dataset's test split by default.
    argv = ["eval", "--checkpoint", str(tmp_path / "cli" / "last.pt"), "--episodes", "4"]
    argv += ["--way", "3", "--shot", "1", "--data-root", str(tiny_omniglot_root)]
    assert main([*argv, "--device", "cpu"]) == 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("imagenet", "--extra-data imagenet: unknown dataset 'imagenet'"),
        ("miniimagenet", "miniimagenet: its images are 3x84x84, the run's 1x28x28"),
        ("folder", "folder: a folder needs its root, folder:ROOT"),
        ("omniglot", "omniglot: the run trains on it already"),
        (":x", "':x' names no dataset"),
        ("folder:/nonexistent", "folder:/nonexistent: /nonexistent is not a folder"),
    ],
)
def test_a_source_that_cannot_join_is_refused_before_any_data(extra, message, tmp_path, capsys):
    argv = ["train", "--extra-data", extra, "--out", str(tmp_path / "run")]
    assert message in refused(argv, capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("main_data", "extras"),
    [
        (["--dataset", "folder", "--data-root", "{photos}"], ["folder:{photos}/"]),
        (["--dataset", "folder", "--data-root", "{photos}"], ["folder:{photos}/../photos"]),
        (["--dataset", "folder", "--data-root", "{photos}"], ["folder:{link}"]),
        (["--dataset", "omniglot"], ["folder:{photos}", "folder:{photos}//"]),
        # The default data root ($FEWSHOT_DATA here) given by its path.
        (["--dataset", "omniglot"], ["omniglot:{omniglot}/."]),
        (["--dataset", "omniglot", "--data-root", "{omniglot}/"], ["omniglot"]),
    ],
)
def test_a_data_set_given_twice_is_refused_however_its_root_is_spelled(
    main_data, extras, tmp_path, tiny_omniglot_root, monkeypatch, capsys
):
    monkeypatch.setenv("FEWSHOT_DATA", str(tiny_omniglot_root))
    photos = split_folders(tmp_path / "photos")
    (tmp_path / "link").symlink_to(photos)
    names = {"photos": photos, "link": tmp_path / "link", "omniglot": tiny_omniglot_root}
    extras = [extra.format(**names) for extra in extras]
    argv = ["train", *(a.format(**names) for a in main_data), "--extra-data", *extras]
    err = refused([*argv, "--out", str(tmp_path / "run")], capsys)
    assert err.endswith(f"--extra-data {extras[-1]}: the run trains on it already")
    assert not (tmp_path / "run").exists()
