"""A run folder belongs to one run: locked while it runs, never overwritten unless asked."""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from fewshot.runtime.errors import FewshotError
from fewshot.runtime.file_kinds import kernel_folder_refusal, non_regular_kind

# The files of a run; a folder holding any of them holds a run.
RUN_FILES = ("config.json", "metrics.jsonl", "last.pt", "best.pt")
LOCK_NAME = ".lock"


def _os_error(path: Path, e: OSError) -> FewshotError:
    return FewshotError(f"run folder {path} is not usable: {e.strerror or e}")


class RunFolder:
    """The locked folder of one run. `fresh=True` (a new run) refuses a folder that holds a run
    unless `overwrite`, which deletes that run's files once the lock is held."""

    def __init__(self, path: str | os.PathLike, fresh: bool, overwrite: bool = False):
        self.path = Path(path)
        self._lock_file = None
        kind = non_regular_kind(self.path) or "a file"
        if self.path.exists() and kind != "a folder":
            raise FewshotError(
                f"run folder {self.path} is not a folder ({kind}); choose another --out"
            )
        self._made = not self.path.exists()  # removed again if the run is refused at once
        refusal = None if not self._made else kernel_folder_refusal(self.path)
        if refusal:
            raise FewshotError(f"run folder {self.path} is not usable: {refusal}")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _os_error(self.path, e) from None
        self._lock()
        try:
            self._check_writable()
            held = [name for name in RUN_FILES if (self.path / name).exists()]
            if fresh and held and not overwrite:
                last = self.path / "last.pt"
                resume = f"continue it with --resume {last}, " if last.exists() else ""
                raise FewshotError(
                    f"run folder {self.path} already holds a run ({', '.join(held)}); {resume}"
                    "replace it with --overwrite, or choose another --out"
                )
            if fresh and overwrite:
                for name in held:
                    (self.path / name).unlink()
            self._remove_stale_temporaries()
        except BaseException:
            self.release()
            raise

    def _lock(self) -> None:
        """Take the folder's lock (released by the OS if the process dies), or name its holder."""
        lock_path = self.path / LOCK_NAME
        try:
            lock_file = open(lock_path, "a+")  # noqa: SIM115 (held open while the run lives)
        except OSError as e:
            raise _os_error(self.path, e) from None
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_file.seek(0)
            holder = lock_file.read().strip() or "another process"
            lock_file.close()
            raise FewshotError(
                f"run folder {self.path} is in use by {holder}; wait for it, or choose another "
                "--out"
            ) from None
        lock_file.seek(0)
        lock_file.truncate()
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        lock_file.write(f"pid {os.getpid()} on {socket.gethostname()} since {started}\n")
        lock_file.flush()
        self._lock_file = lock_file

    def _check_writable(self) -> None:
        """Fail now, not after an epoch, when checkpoints could not be written here."""
        probe = self.path / f".write-test-{os.getpid()}"
        try:
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise _os_error(self.path, e) from None

    def _remove_stale_temporaries(self) -> None:
        """Half-written files of a killed run (atomic writes name them .NAME.*.tmp)."""
        for stale in self.path.glob(".*.tmp"):
            stale.unlink(missing_ok=True)

    def release(self) -> None:
        """Give the lock back (also done by the OS when the process ends)."""
        if self._lock_file is not None:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.release()
        if kind is not None and self._made:
            self._remove_if_unused()

    def _remove_if_unused(self) -> None:
        """A run refused before it wrote anything (its data checks) leaves no folder behind."""
        try:
            if [p.name for p in self.path.iterdir()] == [LOCK_NAME]:
                (self.path / LOCK_NAME).unlink()
                self.path.rmdir()
        except OSError:  # another process took the folder meanwhile: it is theirs
            pass
