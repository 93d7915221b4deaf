"""Episode manifests: the omniglot-v1 cells' episodes are the seeded ones and keep their pinned
SHA-256; files round-trip, and a changed or malformed file, or a split the episodes were not
drawn from, is refused in one line."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from fewshot.benchmark.suites import load_suite
from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import seeded_episodes
from fewshot.evaluation.manifests import (
    Manifest,
    draw_manifest,
    labels_sha256,
    read_manifest,
    write_manifest,
)
from fewshot.runtime.errors import FewshotError

OMNIGLOT_TEST = {"dataset": "omniglot", "split": "test"}


def small_split(classes: int = 8, per_class: int = 6, seed: int = 0) -> ImageSplit:
    """A synthetic split: `classes` x `per_class` random 1x4x4 images, labels in class order."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (classes * per_class, 1, 4, 4), generator=generator)
    labels = torch.arange(classes).repeat_interleave(per_class)
    names = [f"c{i}" for i in range(classes)]
    return ImageSplit(images.to(torch.uint8), labels, names, (0.5,), (0.5,), source="synthetic")


@pytest.fixture
def small():
    """A small split and a manifest of 6 three-way 1-shot 2-query episodes drawn from it."""
    split = small_split()
    info = {"dataset": "folder", "split": "test"}
    return split, draw_manifest(split, info, EpisodeShape(3, 1, 2), seed=5, episodes=6)


def error_of(path) -> str:
    """The one-line refusal of reading `path`."""
    with pytest.raises(FewshotError) as error:
        read_manifest(path)
    message = str(error.value)
    assert "\n" not in message
    assert str(path) in message
    return message


def test_omniglot_v1_manifests_are_the_seeded_episodes_and_keep_their_pins(omniglot_test):
    suite = load_suite("omniglot-v1")
    first = suite.cells[0]
    assert first.name == "5w1s"
    manifest = draw_manifest(omniglot_test, OMNIGLOT_TEST, first.shape, first.seed, first.episodes)
    # The episodes every `fewshot eval` with this shape and seed draws, batched any way.
    for batch in (1, 7):
        shape = EpisodeShape(first.way, first.shot, first.query, batch)
        seeded = torch.cat(list(seeded_episodes(omniglot_test, shape, first.episodes, first.seed)))
        assert torch.equal(manifest.index, seeded)
    assert manifest.index.shape == (2000, 5, 16)
    assert torch.equal(manifest.classes, omniglot_test.labels[manifest.index[:, :, 0]])
    info = manifest.info
    assert (info.way, info.shot, info.query, info.episodes, info.seed) == (5, 1, 15, 2000, 0)
    assert info.labels_sha256 == labels_sha256(omniglot_test.labels)
    assert info.dataset_fingerprint == omniglot_test.fingerprint()
    manifest.check_split(omniglot_test, "the 5w1s manifest")
    # The same characters with one pixel changed, or a split of fewer images: refused.
    images = omniglot_test.images.clone()
    images[int(manifest.index[0, 0, 0]), 0, 0, 0] ^= 1
    fields = {"class_names": omniglot_test.class_names, "source": "changed"}
    fields |= {"mean": omniglot_test.mean, "std": omniglot_test.std}
    changed = ImageSplit(images, omniglot_test.labels, **fields)
    with pytest.raises(FewshotError, match="images of fingerprint"):
        manifest.check_split(changed, "the 5w1s manifest")
    half = len(images) // 2
    fewer = ImageSplit(images[:half], omniglot_test.labels[:half], **fields)
    with pytest.raises(FewshotError, match="with other classes than changed has now"):
        manifest.check_split(fewer, "the 5w1s manifest")
    # The pins of the shipped suite: what keeps the published numbers valid.
    assert manifest.sha256 == first.sha256
    for cell in suite.cells[1:]:
        drawn = draw_manifest(omniglot_test, OMNIGLOT_TEST, cell.shape, cell.seed, cell.episodes)
        assert drawn.sha256 == cell.sha256, cell.name
        assert drawn.index.shape == (2000, cell.way, cell.shot + cell.query)


def test_a_manifest_batches_its_first_episodes(small):
    _, manifest = small
    assert torch.equal(torch.cat(list(manifest.batches(4))), manifest.index)
    assert [len(b) for b in manifest.batches(4, 5)] == [4, 1]
    assert torch.equal(torch.cat(list(manifest.batches(2, 3))), manifest.index[:3])
    with pytest.raises(FewshotError, match="7 episodes asked of a manifest of 6"):
        list(manifest.batches(2, 7))


def test_write_read_round_trip(tmp_path, small):
    split, manifest = small
    path = tmp_path / "m.npz"
    write_manifest(manifest, path)
    back = read_manifest(path)
    assert back.info == manifest.info
    assert back.sha256 == manifest.sha256
    assert torch.equal(back.index, manifest.index) and back.index.dtype == torch.int64
    assert torch.equal(back.classes, manifest.classes)
    back.check_split(split, "m.npz")
    with np.load(path) as data:
        assert data["index"].dtype == np.uint16  # the smallest type that holds the indices
        meta = json.loads(str(data["meta"]))
    assert meta["sha256"] == manifest.sha256 and meta["format"] == 1
    assert not list(tmp_path.glob(".*"))  # no temporary file left beside it


def test_the_sha256_does_not_depend_on_when_or_how_the_file_was_written(tmp_path, small):
    _, manifest = small
    a, b, c = (tmp_path / name for name in ("a.npz", "b.npz", "c.npz"))
    write_manifest(manifest, a)
    write_manifest(manifest, b)
    assert read_manifest(a).sha256 == read_manifest(b).sha256 == manifest.sha256
    # The same content stored otherwise (uncompressed, arrays in another order, other
    # integer types): other bytes, the same identity.
    with np.load(a) as data:
        meta, index, classes = str(data["meta"]), data["index"], data["classes"]
        rewrite(c, meta, classes=classes.astype(np.uint32), index=index.astype(np.uint64))
    assert c.read_bytes() != a.read_bytes()
    assert read_manifest(c).sha256 == manifest.sha256


def rewrite(path, meta: str | None = None, **arrays) -> None:
    """Write `path` again as np.savez does, with `arrays` and the `meta` string given."""
    buffer = io.BytesIO()
    members = dict(arrays)
    if meta is not None:
        members["meta"] = np.array(meta)
    np.savez(buffer, **members)
    path.write_bytes(buffer.getvalue())


def test_a_changed_manifest_is_refused(tmp_path, small):
    _, manifest = small
    path = tmp_path / "m.npz"
    write_manifest(manifest, path)
    with np.load(path) as data:
        meta, index, classes = str(data["meta"]), data["index"].copy(), data["classes"].copy()
    changed = index.copy()
    changed[2, 1, 0] = changed[2, 1, 1]  # one index, the old meta and its digest
    rewrite(path, meta, index=changed, classes=classes)
    assert "SHA-256" in error_of(path)
    # The classes changed instead.
    rewrite(path, meta, index=index, classes=classes[::-1].copy())
    assert "SHA-256" in error_of(path)
    # Its info changed (another seed claimed), the arrays kept.
    other = json.loads(meta) | {"seed": 6}
    rewrite(path, json.dumps(other), index=index, classes=classes)
    assert "SHA-256" in error_of(path)
    # Unchanged, written again by hand: read.
    rewrite(path, meta, index=index, classes=classes)
    assert read_manifest(path).sha256 == manifest.sha256


def test_a_file_that_is_not_a_manifest_is_refused(tmp_path, small):
    _, manifest = small
    path = tmp_path / "m.npz"
    write_manifest(manifest, path)
    with np.load(path) as data:
        meta, index, classes = str(data["meta"]), data["index"].copy(), data["classes"].copy()
    shape = tuple(index.shape)
    bad = tmp_path / "bad.npz"
    assert "not found" in error_of(tmp_path / "missing.npz")
    bad.write_bytes(b"not a zip archive at all")
    assert "is not a manifest" in error_of(bad)
    rewrite(bad, meta, index=index)  # no classes
    assert "holds index, meta, not index, classes, meta" in error_of(bad)
    rewrite(bad, meta, index=index, classes=classes, extra=classes)
    assert "is not a manifest" in error_of(bad)
    rewrite(bad, "{not json", index=index, classes=classes)
    assert "is not a manifest" in error_of(bad)
    rewrite(bad, json.dumps(json.loads(meta) | {"format": 2}), index=index, classes=classes)
    assert "not a manifest of format 1" in error_of(bad)
    rewrite(bad, json.dumps(json.loads(meta) | {"colour": "red"}), index=index, classes=classes)
    assert "its info is not a manifest's" in error_of(bad)
    # An index array of the wrong shape, or of a signed type.
    rewrite(bad, meta, index=index[:, :, :-1].copy(), classes=classes)
    assert f"its info says {shape}" in error_of(bad)
    rewrite(bad, meta, index=index[:-1].copy(), classes=classes)
    assert f"its info says {shape}" in error_of(bad)
    rewrite(bad, meta, index=index, classes=classes[:, :-1].copy())
    assert f"its info says {shape}" in error_of(bad)
    rewrite(bad, meta, index=index.astype(np.int64), classes=classes)
    assert "int64" in error_of(bad)
    # Pickled objects are never loaded.
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.array(meta), index=np.array([{"a": 1}], dtype=object), classes=classes)
    bad.write_bytes(buffer.getvalue())
    assert "is not a manifest" in error_of(bad)


def test_check_split_refuses_a_split_the_episodes_are_not_of(small):
    split, manifest = small
    manifest.check_split(split, "m.npz")
    # Other labels: one more class.
    more = small_split(classes=9)
    with pytest.raises(FewshotError, match=r"m\.npz was drawn from folder split 'test' with other"):
        manifest.check_split(more, "m.npz")
    # The same labels, other images (another version of the data, or another geometry).
    redrawn = small_split(seed=1)
    assert torch.equal(redrawn.labels, split.labels)
    with pytest.raises(FewshotError, match=r"m\.npz was drawn from images of fingerprint") as error:
        manifest.check_split(redrawn, "m.npz")
    assert "\n" not in str(error.value)


def hand_made(manifest: Manifest, index: torch.Tensor, classes: torch.Tensor) -> Manifest:
    """A manifest of other arrays under the same info: its recorded digest is its own."""
    return Manifest(manifest.info, index, classes)


def test_check_split_refuses_hand_made_episodes_of_another_split(tmp_path, small):
    split, manifest = small
    # Indices outside the split, their digest recorded as a writer records it: read, refused.
    outside = manifest.index.clone()
    outside[0, 0, 0] = len(split.labels) + 3
    made = hand_made(manifest, outside, manifest.classes)
    path = tmp_path / "outside.npz"
    write_manifest(made, path)
    back = read_manifest(path)
    assert back.sha256 == made.sha256 != manifest.sha256
    with pytest.raises(FewshotError, match="its episodes are not episodes of synthetic"):
        back.check_split(split, str(path))
    # Indices in the split, at images of other classes than the episode's.
    swapped = manifest.index.clone()
    swapped[0, [0, 1]] = swapped[0, [1, 0]]  # two classes' images swapped, their labels kept
    path = tmp_path / "swapped.npz"
    write_manifest(hand_made(manifest, swapped, manifest.classes), path)
    with pytest.raises(FewshotError, match="its episodes are not episodes of synthetic"):
        read_manifest(path).check_split(split, str(path))
    # One query of another class.
    mixed = manifest.index.clone()
    other = int((split.labels != manifest.classes[1, 2]).nonzero()[0])
    mixed[1, 2, -1] = other
    with pytest.raises(FewshotError, match="its episodes are not episodes of synthetic"):
        hand_made(manifest, mixed, manifest.classes).check_split(split, "mixed")


def test_labels_sha256_is_of_the_values_not_the_dtype():
    labels = torch.tensor([0, 0, 1, 2])
    assert labels_sha256(labels) == labels_sha256(labels.int())
    assert labels_sha256(labels) != labels_sha256(torch.tensor([0, 1, 1, 2]))
