"""Atomic writes and safe checkpoint loading."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import pickle
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy
import torch

from fewshot.runtime.errors import FewshotError, summary
from fewshot.runtime.file_kinds import kernel_folder_refusal, non_regular_kind


def _umask() -> int:
    """The process umask (read by setting it, then putting it back)."""
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def _destination(path: Path) -> Path:
    """The file a write to `path` replaces: a symlink's target (the link itself is kept); a
    folder, device node or other non-regular file (a kernel file of /proc among them) is
    refused."""
    target = path.resolve() if path.is_symlink() else path
    kind = non_regular_kind(target)
    if kind:
        what = kind if kind == "a folder" else f"not a regular file ({kind})"
        raise FewshotError(f"cannot write {path}: it is {what}; name a file")
    refusal = None if target.exists() else kernel_folder_refusal(target)
    if refusal:
        raise FewshotError(f"cannot write {path}: {refusal}; name a file elsewhere")
    return target


def _atomic_replace(path: Path, write) -> None:
    """Write through `write(file)` into a temp file beside `path`, then rename it into place.

    A failed write (disk full, permissions) or an interruption leaves the previous file and
    no temporary behind; failures are one FewshotError naming the path and the cause.
    """
    path = _destination(path)
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


def atomic_write_bytes(data: bytes, path: str | os.PathLike) -> None:
    """Write a file atomically."""
    _atomic_replace(Path(path), lambda f: f.write(data))


def atomic_save_figure(figure: Any, path: str | os.PathLike, dpi: int) -> None:
    """Save a matplotlib figure atomically (rendered in memory first), in the format of the
    path's suffix."""
    image = io.BytesIO()
    figure.savefig(image, dpi=dpi, format=Path(path).suffix.lower()[1:])
    atomic_write_bytes(image.getvalue(), path)


def atomic_save_npy(array: Any, path: str | os.PathLike) -> None:
    """numpy.save that never leaves a half-written .npy file."""
    _atomic_replace(Path(path), lambda f: numpy.save(f, array, allow_pickle=False))


def atomic_write_text(text: str, path: str | os.PathLike) -> None:
    """Write a text file atomically."""
    atomic_write_bytes(text.encode(), path)


# A JSON list of numbers alone, as json.dumps indents it: one item a line.
_NUMBER_LIST = re.compile(r"\[\n\s+([-+0-9.eE]+(?:,\n\s+[-+0-9.eE]+)*)\n\s*\]")


def atomic_write_json(obj: Any, path: str | os.PathLike) -> None:
    """Write `obj` as indented JSON atomically, a list of numbers on one line (per-episode
    results read as a row, not thousands of lines)."""
    text = json.dumps(obj, indent=2, sort_keys=True)
    text = _NUMBER_LIST.sub(lambda m: "[" + re.sub(r",\n\s+", ", ", m.group(1)) + "]", text)
    atomic_write_bytes((text + "\n").encode(), path)


def check_writable(path: str | os.PathLike) -> None:
    """Fail now if `path` could not be written later (its folder made then if needed: a check
    that refuses leaves nothing behind, so the nearest existing folder above is probed)."""
    path = _destination(Path(path))
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        if not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, f"{folder} is not a folder")
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise FewshotError(f"cannot write {path}: {e.strerror or e}") from None


def prepare_output(
    path: str | os.PathLike,
    overwrite: bool,
    differences: Callable[[Path], list[str]] | None = None,
) -> Path:
    """Check a command's output before its work: writable, a file (a symlink is followed), and
    an existing file kept unless `overwrite` or `differences(file)` finds that it holds this
    very result (an empty list; otherwise what differs, named in the refusal)."""
    path = Path(path)
    target = _destination(path)
    if target.exists() and not overwrite:
        differ = ["another file"] if differences is None else differences(target)
        if differ:
            raise FewshotError(
                f"{path} already holds another result ({'; '.join(differ)}); "
                "pass --overwrite to replace it"
            )
    check_writable(target)
    return target


def describe_differences(old: dict, new: dict) -> list[str]:
    """'key: old there, new here' for every key of `new` whose value `old` holds otherwise
    (values compared as they read back from JSON; long values named by their key only)."""
    new = json.loads(json.dumps(new))
    lines = []
    for key, value in new.items():
        if key in old and old[key] == value:
            continue
        there, here = json.dumps(old.get(key)), json.dumps(value)
        short = len(there) + len(here) <= 60
        lines.append(f"{key}: {there} there, {here} here" if short else f"{key} differs")
    return lines


def json_differences(record: dict) -> Callable[[Path], list[str]]:
    """For `prepare_output`: how the JSON object in a file differs from `record`."""

    def differences(path: Path) -> list[str]:
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            return ["a file that is not a JSON result"]
        if not isinstance(old, dict):
            return ["a file that is not a JSON result"]
        return describe_differences(old, record)

    return differences


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's content, read a MiB at a time."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as e:
        raise FewshotError(f"cannot read {path}: {e.strerror or e}") from None
    return digest.hexdigest()


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint with weights_only=True (no code runs), with a clear error if unreadable."""
    path = Path(path)
    if not path.is_file():
        raise FewshotError(f"checkpoint not found: {path}")
    # torch warns about a foreign file's pickle protocol before refusing it: a refusal stays
    # one line, and a file that loads gets its warnings shown as usual.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = _load_weights_only(path, map_location)
        if not isinstance(ckpt, dict):
            raise FewshotError(f"checkpoint {path} does not hold a dict of tensors")
    for warning in caught:
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return ckpt


def _load_weights_only(path: Path, map_location: str | torch.device) -> Any:
    """torch.load with weights_only=True, any failure one FewshotError naming the file."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        # torch's own message advises weights_only=False, which would run the file's code.
        raise FewshotError(
            f"cannot read checkpoint {path}: not a torch checkpoint of plain tensors (fewshot "
            "loads no file that could run code)"
        ) from None
    except Exception as e:
        raise FewshotError(
            f"cannot read checkpoint {path} (not a torch checkpoint of plain tensors?): "
            f"{type(e).__name__}: {summary(e)}"
        ) from None
