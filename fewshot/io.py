"""Atomic writes and safe checkpoint loading."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from fewshot.errors import FewshotError


def _atomic_replace(path: Path, write) -> None:
    """Write through `write(file)` into a temp file beside `path`, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """torch.save that never leaves a half-written file, even on Ctrl-C."""
    _atomic_replace(Path(path), lambda f: torch.save(obj, f))


def atomic_write_text(text: str, path: str | os.PathLike) -> None:
    """Write a text file atomically."""
    _atomic_replace(Path(path), lambda f: f.write(text.encode()))


def atomic_write_json(obj: Any, path: str | os.PathLike) -> None:
    """Write `obj` as indented JSON atomically."""
    data = (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()
    _atomic_replace(Path(path), lambda f: f.write(data))


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint with weights_only=True (no code runs), with a clear error if unreadable."""
    path = Path(path)
    if not path.is_file():
        raise FewshotError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        # torch's messages run over many lines; the first one says what went wrong.
        first = next((line for line in str(e).splitlines() if line.strip()), "")
        raise FewshotError(
            f"cannot read checkpoint {path} (not a torch checkpoint of plain tensors?): "
            f"{type(e).__name__}: {first}"
        ) from None
    if not isinstance(ckpt, dict):
        raise FewshotError(f"checkpoint {path} does not hold a dict of tensors")
    return ckpt
