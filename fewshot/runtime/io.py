"""Atomic writes and safe checkpoint loading."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from fewshot.errors import FewshotError, summary


def _umask() -> int:
    """The process umask (read by setting it, then putting it back)."""
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def _atomic_replace(path: Path, write) -> None:
    """Write through `write(file)` into a temp file beside `path`, then rename it into place.

    A failed write (disk full, permissions) or an interruption leaves the previous file and
    no temporary behind; failures are one FewshotError naming the path and the cause.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise FewshotError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_umask())  # mkstemp's 0600 would ignore the umask
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError | RuntimeError):  # torch reports a failed write as RuntimeError
            kept = f"; the previous {path.name} is intact" if path.exists() else ""
            raise FewshotError(f"cannot write {path}: {_write_failure(e, path)}{kept}") from None
        raise


def _write_failure(error: BaseException, path: Path) -> str:
    """A one-line cause of a failed write."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    free = shutil.disk_usage(path.parent).free
    return f"the write failed ({free / 2**20:.0f} MiB free on that disk)"


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


def check_writable(path: str | os.PathLike) -> None:
    """Fail now if `path` could not be written later (its folder made if needed)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise FewshotError(f"cannot write {path}: {e.strerror or e}") from None


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint with weights_only=True (no code runs), with a clear error if unreadable."""
    path = Path(path)
    if not path.is_file():
        raise FewshotError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise FewshotError(
            f"cannot read checkpoint {path} (not a torch checkpoint of plain tensors?): "
            f"{type(e).__name__}: {summary(e)}"
        ) from None
    if not isinstance(ckpt, dict):
        raise FewshotError(f"checkpoint {path} does not hold a dict of tensors")
    return ckpt
