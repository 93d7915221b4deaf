"""Decoding image files or encoded bytes (PNG/JPEG) once, straight into one uint8 array."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from fewshot.runtime.errors import FewshotError

# An encoded image: a file path, raw bytes, a uint8 array of the bytes (cv2.imencode's output),
# or a str holding the bytes (a Python 2 byte string read with latin1 decoding).
Encoded = Path | bytes | np.ndarray | str


def _open(item: Encoded) -> Image.Image:
    """A PIL image from a path or encoded bytes."""
    if isinstance(item, Path):
        return Image.open(item)
    if isinstance(item, np.ndarray):
        item = item.tobytes()
    raw = item.encode("latin1") if isinstance(item, str) else item
    return Image.open(io.BytesIO(raw))


def decode_images(
    items: Sequence[Encoded], size: int, source: str, reverse_channels: bool = False
) -> np.ndarray:
    """Decode each item once into a preallocated uint8 [N, size, size, 3] array (RGB order).

    Images of another size are resized with Lanczos filtering, as Ravi & Larochelle's script did.
    `reverse_channels` stores BGR instead, to match arrays written by OpenCV.
    """
    out = np.empty((len(items), size, size, 3), dtype=np.uint8)

    def decode(i: int) -> None:
        try:
            with _open(items[i]) as img:
                rgb = img.convert("RGB")
        except (OSError, UnidentifiedImageError, ValueError) as e:
            name = items[i] if isinstance(items[i], Path) else f"image {i}"
            raise FewshotError(f"{source}: cannot decode {name}: {e}") from None
        if rgb.size != (size, size):
            rgb = rgb.resize((size, size), Image.LANCZOS)
        pixels = np.asarray(rgb)
        out[i] = pixels[..., ::-1] if reverse_channels else pixels

    # PIL releases the GIL while decoding, so threads give a real speed-up on large splits.
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(decode, range(len(items))))
    return out


def read_csv_list(path: Path) -> tuple[list[str], list[str]]:
    """Ravi & Larochelle split list: CSV with header `filename,label` -> (filenames, labels)."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or not {"filename", "label"} <= set(reader.fieldnames):
            raise FewshotError(f"{path}: expected a CSV with header 'filename,label'")
        rows = [(row["filename"], row["label"]) for row in reader]
    if not rows:
        raise FewshotError(f"{path}: the split list is empty")
    filenames, labels = zip(*rows, strict=True)
    return list(filenames), list(labels)


def read_image_folder(
    csv_path: Path, images_dir: Path, size: int
) -> tuple[np.ndarray, list[str], list[Path]]:
    """Images listed in a `filename,label` CSV, read from images_dir -> (HWC array, labels,
    the image files read)."""
    filenames, labels = read_csv_list(csv_path)
    paths = [images_dir / name for name in filenames]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise FewshotError(
            f"{csv_path}: {len(missing)} of {len(paths)} listed images are missing from "
            f"{images_dir}, e.g. {missing[0].name}"
        )
    return decode_images(paths, size, source=str(csv_path)), labels, paths
