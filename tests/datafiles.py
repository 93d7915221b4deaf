"""Small data files written by the tests in the readers' formats, in place of a real data set."""

from __future__ import annotations

import gzip
import io
import struct
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image


def write_idx(path: Path, array: np.ndarray, compress: bool) -> None:
    """Write an uint8 IDX file: magic 0 0 8 ndim, big-endian dims, raw bytes."""
    raw = bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    raw += array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)


def write_mnist(folder: Path, n: int, compress: bool, seed: int = 0) -> tuple[np.ndarray, ...]:
    """A tiny MNIST-format train/test pair of random images; returns (train images, labels)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    suffix = ".gz" if compress else ""
    for prefix in ("train", "t10k"):
        write_idx(folder / f"{prefix}-images-idx3-ubyte{suffix}", images, compress)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte{suffix}", labels, compress)
    return images, labels


def write_digits(root: Path, n_train: int, n_test: int) -> Path:
    """MNIST and Fashion-MNIST files under `root` (mnist/, fashion_mnist/) that look like MNIST to
    a classifier (bright strokes on a dark background) and that a linear model learns, though
    not perfectly: each class has a stroke mask over a fifth of the pixels, an image keeps 60 %
    of its class's strokes and adds 8 % stray ones. The two sets differ. Returns `root`."""
    for seed, folder in enumerate(("mnist", "fashion_mnist")):
        rng = np.random.default_rng(seed)
        strokes = rng.random((10, 28, 28)) < 0.2
        (root / folder).mkdir(parents=True, exist_ok=True)
        for prefix, n in (("train", n_train), ("t10k", n_test)):
            labels = rng.integers(0, 10, size=n)
            lit = strokes[labels] & (rng.random((n, 28, 28)) < 0.6)
            lit |= rng.random((n, 28, 28)) < 0.08
            images = np.where(lit, rng.integers(128, 256, size=(n, 28, 28)), 0)
            write_idx(root / folder / f"{prefix}-images-idx3-ubyte", images, compress=False)
            write_idx(root / folder / f"{prefix}-labels-idx1-ubyte", labels, compress=False)
    return root


def jpeg(color: tuple[int, int, int]) -> bytes:
    """A 32x32 JPEG of one color."""
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), color).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def tar_bytes(members: dict[str, bytes], mode: str = "w:gz") -> bytes:
    """A tar archive (gzip-compressed by default) of the named members, in the order given."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode=mode) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def write_tar(path: Path, members: dict[str, bytes]) -> None:
    """Write a tar.gz of the named members."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(tar_bytes(members))


def cut_omniglot_root(root: Path, source: Path, classes: dict[str, int | None]) -> Path:
    """A data root at `root` reading the real Omniglot files of `source` (linked, not copied)
    with each Vinyals split list cut to its first `classes[split]` classes (None: whole; a
    split not named: absent). Returns `root`."""
    folder = root / "omniglot"
    (folder / "splits" / "vinyals").mkdir(parents=True)
    for name in ("images_background.npz", "images_evaluation.npz", "omniglot_index.csv"):
        (folder / name).symlink_to(source / "omniglot" / name)
    for split, count in classes.items():
        lines = (source / "omniglot" / "splits" / "vinyals" / f"{split}.txt").read_text().split()
        cut = lines if count is None else lines[:count]
        (folder / "splits" / "vinyals" / f"{split}.txt").write_text("\n".join(cut) + "\n")
    return root
