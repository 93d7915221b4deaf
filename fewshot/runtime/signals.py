"""Interruption by signals: honoured between steps in training, at once everywhere else.

Schedulers stop jobs with SIGTERM (SLURM can be told to send SIGUSR1 early); a person presses
Ctrl-C (SIGINT) or closes the terminal (SIGHUP). While training, `StopRequests` turns the first
of these into a request that the trainer honours at the next step boundary, so a saved state
is always one the run passed through; a second signal stops at once. Elsewhere
`signals_raise` makes each of them an `Interrupted` exception, which the command line reports
on one line; during an import, and in the `fewshot` command outside its run (loading, parsing
its flags, after its work), a signal ends the process at once, in one line too (`stop_at_once`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
Stop = Callable[[], int | None]  # the number of a signal that asks to stop, or None


class Interrupted(Exception):
    """The run was stopped by a signal (`signum`)."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message)
        self.signum = signum


def exit_status(error: BaseException) -> int:
    """128 + the signal number, the shell's convention for a process ended by a signal."""
    return 128 + getattr(error, "signum", signal.SIGINT)


def check_stop(stop: Stop | None) -> None:
    """Raise Interrupted when `stop` reports a signal."""
    signum = stop() if stop is not None else None
    if signum:
        raise Interrupted(signum)


def stop_at_once(signum: int, frame: FrameType | None) -> None:
    """Signal handler: end the process now, saying so in one line, with 128 + the signal's
    number. For a signal while modules load, where an exception would leave a half-imported
    module behind (numpy's C core cannot load twice, its lazy attributes then recurse) and
    nothing of the command's has been written yet."""
    os.write(2, b"fewshot: interrupted\n")
    os._exit(128 + signum)


def _importing(frame: FrameType | None) -> bool:
    """Whether `frame` runs within an import (an importlib frame below it)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _raise(signum: int, frame: FrameType | None) -> None:
    if _importing(frame):
        stop_at_once(signum, frame)
    raise Interrupted(signum)


def ignore_signals() -> None:
    """Ignore every signal of SIGNALS from now on (main thread only)."""
    _handle_all(signal.SIG_IGN)


def stop_signals_at_once() -> None:
    """From now on every signal of SIGNALS ends the process at once (`stop_at_once`), where no
    block handles it otherwise (main thread only): for the `fewshot` command, from its start
    to its end but for the command's own run."""
    _handle_all(stop_at_once)


def _handle_all(handler: Callable[[int, FrameType | None], None] | signal.Handlers) -> None:
    if threading.current_thread() is threading.main_thread():
        for signum in SIGNALS:
            signal.signal(signum, handler)


@contextlib.contextmanager
def _handled(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """Within the block, `handler` handles every signal of SIGNALS (main thread only)."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {signum: signal.signal(signum, handler) for signum in SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """Within the block, every signal of SIGNALS raises `Interrupted` (main thread only), or
    ends the process at once while a module is being imported (see `stop_at_once`)."""
    with _handled(_raise):
        yield


class StopRequests:
    """Context manager: the first signal sets `signum`; a second one raises `Interrupted`."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def request(self, signum: int) -> None:
        """Ask the run to stop at the next step boundary (what a signal does)."""
        self.signum = signum

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            if _importing(frame):
                stop_at_once(signum, frame)
            raise Interrupted(signum, "second signal: stopped at once")
        self.request(signum)

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
