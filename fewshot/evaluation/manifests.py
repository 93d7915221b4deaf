"""Episode manifests: a cell's test episodes written once, and their identity.

A manifest holds every episode's classes (split labels) and the split indices of its support
and query images (`index[e, c, :shot]` are class c's support, the rest its queries), with what
they were drawn from: the data set, split, shape, seed, and the fingerprint of the split's
labels and of its images. Its SHA-256 is taken over that content, not over the file's bytes (a
zip archive records times), so the same episodes have the same identity on every machine;
with the data's fingerprint it is what a result is paired by. A file whose content no longer
matches its recorded digest is refused, never evaluated.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from fewshot.datasets.base import ImageSplit
from fewshot.datasets.sampler import EpisodeShape
from fewshot.evaluation.episodes import seeded_episodes
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_write_bytes

FORMAT = 1
# The largest array a manifest may make a reader allocate: 2^28 bytes is 10,000 twenty-way
# episodes of 100 images a class many times over.
MAX_ARRAY_BYTES = 1 << 28
KEYS = ("index", "classes", "meta")


def labels_sha256(labels: torch.Tensor) -> str:
    """SHA-256 of a split's labels (int64, little-endian): what episodes index."""
    return hashlib.sha256(labels.long().cpu().numpy().astype("<i8").tobytes()).hexdigest()


@dataclass(frozen=True)
class ManifestInfo:
    """What a manifest's episodes were drawn from, and their shape."""

    dataset: str
    split: str
    way: int
    shot: int
    query: int
    episodes: int
    seed: int
    labels_sha256: str
    dataset_fingerprint: str

    @property
    def shape(self) -> EpisodeShape:
        """The episodes' shape (one episode per batch)."""
        return EpisodeShape(self.way, self.shot, self.query)


@dataclass(frozen=True)
class Manifest:
    """A cell's episodes: `index` [episodes, way, shot + query] split indices, `classes`
    [episodes, way] their split labels, `info` what they were drawn from."""

    info: ManifestInfo
    index: torch.Tensor
    classes: torch.Tensor

    @property
    def sha256(self) -> str:
        """The episodes' identity: SHA-256 of the info and both arrays."""
        digest = hashlib.sha256(json.dumps(asdict(self.info), sort_keys=True).encode())
        for array in (self.index, self.classes):
            digest.update(repr(tuple(array.shape)).encode())
            digest.update(array.numpy().astype("<i8").tobytes())
        return digest.hexdigest()

    def batches(self, batch: int, episodes: int | None = None) -> Iterator[torch.Tensor]:
        """The first `episodes` episodes (default all) as index tensors [b, way, pool], in
        batches of `batch`."""
        count = self.info.episodes if episodes is None else episodes
        if count > self.info.episodes:
            raise FewshotError(f"{count} episodes asked of a manifest of {self.info.episodes}")
        for start in range(0, count, batch):
            yield self.index[start : min(start + batch, count)]

    def check_split(self, split: ImageSplit, where: str) -> None:
        """Refuse a split these episodes were not drawn from (`where` names the manifest):
        other labels, or other images (another version of the data, or read at another
        geometry)."""
        if labels_sha256(split.labels) != self.info.labels_sha256:
            raise FewshotError(
                f"{where} was drawn from {self.info.dataset} split {self.info.split!r} with other "
                f"classes than {split.source} has now ({len(split.labels)} images of "
                f"{split.num_classes} classes): another version of the data set"
            )
        if split.fingerprint() != self.info.dataset_fingerprint:
            raise FewshotError(
                f"{where} was drawn from images of fingerprint "
                f"{self.info.dataset_fingerprint[:12]}, {split.source} reads as "
                f"{split.fingerprint()[:12]}: another version of the data set, or read at "
                "another geometry"
            )
        # A hand-made file can hold any digest: its indices are checked against the split too.
        top = int(self.index.max()) if self.index.numel() else -1
        if top >= len(split.labels) or not bool(
            (split.labels[self.index] == self.classes[:, :, None]).all()
        ):
            raise FewshotError(f"{where}: its episodes are not episodes of {split.source}")


def draw_manifest(
    split: ImageSplit, info: dict, shape: EpisodeShape, seed: int, episodes: int
) -> Manifest:
    """The manifest of the first `episodes` seeded episodes of `split` (those every
    evaluation with this shape and seed draws); `info` names the data set and split."""
    index = torch.cat(list(seeded_episodes(split, shape, episodes, seed)))
    full = ManifestInfo(
        **info,
        way=shape.way,
        shot=shape.shot,
        query=shape.query,
        episodes=episodes,
        seed=seed,
        labels_sha256=labels_sha256(split.labels),
        dataset_fingerprint=split.fingerprint(),
    )
    return Manifest(full, index, split.labels[index[:, :, 0]])


def write_manifest(manifest: Manifest, path: str | Path) -> None:
    """Write a manifest (npz: the two arrays at the smallest integer type that holds them, and
    the info with the SHA-256 as JSON), atomically."""
    meta = {"format": FORMAT, **asdict(manifest.info), "sha256": manifest.sha256}
    arrays = {name: _compact(getattr(manifest, name)) for name in ("index", "classes")}
    buffer = io.BytesIO()  # written whole, then renamed into place
    np.savez_compressed(buffer, meta=np.array(json.dumps(meta, sort_keys=True)), **arrays)
    atomic_write_bytes(buffer.getvalue(), path)


def _compact(values: torch.Tensor) -> np.ndarray:
    """Indices as the smallest unsigned type that holds them."""
    top = int(values.max()) if values.numel() else 0
    dtype = np.uint16 if top < 2**16 else np.uint32 if top < 2**32 else np.int64
    return values.numpy().astype(dtype)


def read_manifest(path: str | Path) -> Manifest:
    """A manifest file, checked: the arrays its info promises, and their SHA-256 equal to the
    one recorded when it was written (a changed file is refused in one line)."""
    path = Path(path)
    if not path.is_file():
        raise FewshotError(f"episodes file {path} not found (a manifest written by fewshot bench)")
    try:
        with zipfile.ZipFile(path) as archive:
            sizes = {Path(item.filename).stem: item.file_size for item in archive.infolist()}
        if sorted(sizes) != sorted(KEYS):
            held = ", ".join(sorted(sizes)) or "nothing"
            raise ValueError(f"holds {held}, not {', '.join(KEYS)}")
        big = [name for name, size in sizes.items() if size > MAX_ARRAY_BYTES]
        if big:
            raise ValueError(f"its {big[0]} array is over {MAX_ARRAY_BYTES >> 20} MiB")
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            index, classes = data["index"], data["classes"]
    except (OSError, ValueError, zipfile.BadZipFile, json.JSONDecodeError, KeyError) as e:
        raise FewshotError(f"episodes file {path} is not a manifest: {e}") from None
    where = f"episodes file {path}"
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise FewshotError(f"{where}: not a manifest of format {FORMAT}")
    recorded = meta.pop("sha256", None)
    meta.pop("format")
    try:
        info = ManifestInfo(**meta)
    except TypeError as e:
        raise FewshotError(f"{where}: its info is not a manifest's ({e})") from None
    expected = (info.episodes, info.way, info.shot + info.query)
    if index.shape != expected or classes.shape != expected[:2] or index.dtype.kind != "u":
        raise FewshotError(
            f"{where}: its episodes are {index.dtype} {index.shape}, its info says {expected}"
        )
    manifest = Manifest(
        info, torch.from_numpy(index.astype(np.int64)), torch.from_numpy(classes.astype(np.int64))
    )
    if manifest.sha256 != recorded:
        raise FewshotError(
            f"{where}: its content does not match its recorded SHA-256 (the file was changed "
            "after it was written): write it again with fewshot bench, or restore it"
        )
    return manifest
