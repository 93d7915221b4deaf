"""Decoding image files or encoded bytes (PNG/JPEG) once, straight into one uint8 array."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from fewshot.runtime.errors import FewshotError

# An encoded image: a file path, raw bytes, a uint8 array of the bytes (cv2.imencode's output),
# or a str holding the bytes (a Python 2 byte string read with latin1 decoding).
Encoded = Path | bytes | np.ndarray | str

# The most pixels an image may declare (a 48-megapixel photo fits): a file of a few bytes can
# declare billions, and decoding allocates them all.
MAX_PIXELS = 1 << 26
# What Pillow raises for a file it cannot decode: unidentified or truncated (OSError), broken
# chunks (SyntaxError), bad values, an early end, or more pixels than its own bound.
DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)


def open_image(item: Encoded) -> Image.Image:
    """A PIL image from a path or encoded bytes, its header read (the pixels are decoded on
    first use); refused (ValueError) when it declares more than MAX_PIXELS pixels."""
    if isinstance(item, Path):
        img = Image.open(item)
    else:
        raw = item.tobytes() if isinstance(item, np.ndarray) else item
        img = Image.open(io.BytesIO(raw.encode("latin1") if isinstance(raw, str) else raw))
    if img.width * img.height > MAX_PIXELS:
        img.close()
        raise ValueError(f"{img.width}x{img.height} pixels, over the {MAX_PIXELS} allowed")
    return img


def in_parallel(count: int, work: Callable[[int], None]) -> None:
    """work(0), ..., work(count - 1) on threads (Pillow releases the GIL while decoding, so
    they give a real speed-up); the first failure by index is raised, and what had not started
    by then never runs."""
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        futures = [pool.submit(work, i) for i in range(count)]
        try:
            for future in futures:
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise


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
            with open_image(items[i]) as img:
                pixels = np.asarray(resized(converted(img, "RGB"), size))
        except DECODE_ERRORS as e:
            name = items[i] if isinstance(items[i], Path) else f"image {i}"
            raise FewshotError(f"{source}: cannot decode {name}: {e}") from None
        out[i] = pixels[..., ::-1] if reverse_channels else pixels

    in_parallel(len(items), decode)
    return out


def converted(img: Image.Image, mode: str) -> Image.Image:
    """`img` in `mode` ('L' or 'RGB'). 16-bit grayscale is scaled to 8 bits over its full
    range, and 32-bit integer grayscale (Pillow's mode for some 16-bit files) too when it
    holds values over 255: Pillow's own conversion clips them at 255, a blank image."""
    if img.mode.startswith("I;16") or img.mode == "I":
        values = np.asarray(img).astype(np.int64)
        if img.mode.startswith("I;16") or values.max(initial=0) > 255:
            values = values * 255 // 65535
        img = Image.fromarray(values.clip(0, 255).astype(np.uint8), "L")
    return img.convert(mode)


def resized(img: Image.Image, size: int) -> Image.Image:
    """`img` at size x size: resized with Lanczos filtering, as Ravi & Larochelle's script did,
    when it is of another size."""
    return img if img.size == (size, size) else img.resize((size, size), Image.LANCZOS)


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
