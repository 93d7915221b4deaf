"""Omniglot with the Vinyals class split: 28x28, rotations by 90/180/270 degrees as new classes."""

from __future__ import annotations

import csv
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fewshot.datasets.base import ImageSplit
from fewshot.runtime.cache import cached_array
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import file_sha256

SPLITS = ("train", "val", "trainval", "test")
NPZ_FILES = ("images_background.npz", "images_evaluation.npz")
IMAGE_SIZE = 28
# Ink 1 on paper 0, not standardised further.
MEAN, STD = (0.0,), (1.0,)


def _read_index(folder: Path) -> dict[tuple[str, str], tuple[str, int]]:
    """(alphabet, characterNN) -> (npz file, row)."""
    path = folder / "omniglot_index.csv"
    if not path.is_file():
        raise FewshotError(f"missing {path}: copy the Omniglot files into {folder}")
    index = {}
    with open(path, newline="") as f:
        for line, r in enumerate(csv.DictReader(f), start=2):
            try:
                file, row = r["npz_file"], int(r["npz_row"])
                key = (r["alphabet"], r["character"])
            except (KeyError, TypeError, ValueError):
                raise FewshotError(
                    f"{path} line {line}: expected alphabet,character,npz_file,npz_row with an "
                    f"integer row, got {list(r.values())}"
                ) from None
            if file not in NPZ_FILES or row < 0:
                raise FewshotError(f"{path} line {line}: no row {row} of {file!r}")
            index[key] = (file, row)
    return index


def _read_npz(path: Path) -> np.ndarray:
    """Boolean drawings [chars, 20, 105, 105] with True = background."""
    try:
        with np.load(path, allow_pickle=False) as d:
            images = d["images"]
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise FewshotError(f"corrupt Omniglot file {path}: {e}") from None
    if images.ndim != 4 or images.shape[1:] != (20, 105, 105):
        raise FewshotError(f"{path}: expected images [chars, 20, 105, 105], got {images.shape}")
    return images


def _resize(drawings: np.ndarray) -> torch.Tensor:
    """[n, 105, 105] bool (True = paper) -> [n, 28, 28] uint8 with ink = 255, antialiased."""
    out = []
    for chunk in np.array_split(drawings, max(1, len(drawings) // 2048)):
        ink = torch.from_numpy(~chunk).float().unsqueeze(1)
        small = F.interpolate(ink, size=(IMAGE_SIZE, IMAGE_SIZE), mode="area")
        out.append((small * 255).round().to(torch.uint8))
    return torch.cat(out)


def _small_drawings(path: Path) -> torch.Tensor:
    """Every character of an npz file at 28x28, [chars, 20, 28, 28] uint8: decoded and resized
    once (seconds a file), then read from the cache (runtime.cache) by later processes,
    under the SHA-256 of the file's bytes; an entry that fails its checksum is decoded again."""
    if not path.is_file():
        raise FewshotError(f"missing {path}: copy the Omniglot npz files into {path.parent}")
    digest = file_sha256(path)[:32]  # read a MiB at a time, not the whole file at once

    def decoded() -> np.ndarray:
        images = _read_npz(path)
        return _resize(images.reshape(-1, 105, 105)).view(len(images), 20, 28, 28).numpy()

    def valid(array: np.ndarray) -> bool:
        return array.dtype == np.uint8 and array.shape[1:] == (20, IMAGE_SIZE, IMAGE_SIZE)

    name = f"omniglot-{digest}-{IMAGE_SIZE}.npy"
    return torch.from_numpy(cached_array(name, decoded, valid))


def read_omniglot(data_root: Path, split: str) -> ImageSplit:
    """Read a Vinyals split of Omniglot from data_root/omniglot."""
    if split not in SPLITS:
        raise FewshotError(f"omniglot has splits {', '.join(SPLITS)}, not {split!r}")
    folder = data_root / "omniglot"
    split_file = folder / "splits" / "vinyals" / f"{split}.txt"
    if not split_file.is_file():
        raise FewshotError(f"missing split list {split_file}")
    names = split_file.read_text().split()
    index = _read_index(folder)

    parsed = []
    for name in names:
        try:
            alphabet, character, rot = name.split("/")
            index[(alphabet, character)]
            degrees = int(rot.removeprefix("rot"))
        except (ValueError, KeyError):
            raise FewshotError(f"{split_file}: unknown class {name!r}") from None
        if degrees % 90:
            raise FewshotError(f"{split_file}: {name!r} is not rotated by a multiple of 90")
        parsed.append(((alphabet, character), degrees // 90))

    # Each character resized once (and cached); rotations are exact on the 28x28 grid.
    needed = list(dict.fromkeys(key for key, _ in parsed))
    drawings, position = [], {}
    files = [split_file, folder / "omniglot_index.csv"]
    for file in NPZ_FILES:
        keys = [key for key in needed if index[key][0] == file]
        if keys:
            files.append(folder / file)
            small, rows = _small_drawings(folder / file), torch.tensor([index[k][1] for k in keys])
            if rows.max() >= len(small):
                raise FewshotError(
                    f"{folder / 'omniglot_index.csv'}: row {rows.max()} is past the "
                    f"{len(small)} characters of {folder / file}"
                )
            drawings.append(small[rows])
            position.update((key, len(position)) for key in keys)
    stacked = torch.cat(drawings)

    # Every class's drawings gathered and turned, by quarter turns.
    order = torch.tensor([position[key] for key, _ in parsed])
    turns = torch.tensor([k for _, k in parsed])
    images = torch.empty(len(parsed), 20, IMAGE_SIZE, IMAGE_SIZE, dtype=torch.uint8)
    for k in turns.unique().tolist():
        chosen = (turns == k).nonzero().squeeze(1)
        images[chosen] = torch.rot90(stacked[order[chosen]], k, dims=(-2, -1))
    images_t = images.reshape(-1, 1, IMAGE_SIZE, IMAGE_SIZE)
    labels = torch.arange(len(names)).repeat_interleave(20)
    return ImageSplit(
        images_t.contiguous(),
        labels,
        names,
        mean=MEAN,
        std=STD,
        source=str(split_file),
        files=tuple(map(str, files)),
    )
