"""TensorBoard event files of a run: scalars and histograms per step, the settings as
hyper-parameters, written by the one process that owns the run folder.

`tensorboard` is an optional extra (scripts/setup.sh installs it). Without it an `EventLog`
writes nothing and the first one opened says so, once per process.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

EVENT_FILES = "events.out.tfevents.*"
# The writer's own thread also flushes this often, for steps logged between explicit flushes.
FLUSH_SECONDS = 10


@functools.cache
def summary_writer_class() -> type | None:
    """torch's SummaryWriter, or None (said once) when tensorboard is not installed."""
    try:
        import tensorboard  # noqa: F401 (the optional extra, which torch's writer needs)
    except ImportError:
        print(
            "note: tensorboard is not installed, so no TensorBoard event files are written "
            '(install it with: pip install "tensorboard>=2.14", or scripts/setup.sh)',
            flush=True,
        )
        return None
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter


def _hparam_value(value: Any) -> bool | int | float | str:
    """A settings value as the hparams plugin takes it: lists and None as their JSON text."""
    if isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value)


class EventLog:
    """The event files of one run in `folder` (None: this process writes none, as on a rank
    other than 0).

    `resume_step`: None starts the run's events afresh (event files already in the folder are
    removed); a step continues them, and TensorBoard drops whatever the earlier process logged
    at that step or later (a killed run's steps after its checkpoint), so no step appears twice.
    """

    def __init__(self, folder: Path | None, resume_step: int | None = None) -> None:
        self._writer = None
        writer_class = summary_writer_class() if folder is not None else None
        if writer_class is None:
            return
        if resume_step is None:
            for stale in Path(folder).glob(EVENT_FILES):
                stale.unlink()
        # Each process marks where it starts (a SessionLog START at that step): TensorBoard's
        # readers take every later start as a restart and drop the steps logged from it on
        # (the web app's reader ignores the first start it sees, so a fresh run marks one too).
        start = 0 if resume_step is None else resume_step
        self._writer = writer_class(str(folder), purge_step=start, flush_secs=FLUSH_SECONDS)

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """One value per tag at `step`."""
        if self._writer is not None:
            for tag, value in values.items():
                self._writer.add_scalar(tag, value, step)

    def histogram(self, tag: str, values: torch.Tensor, step: int) -> None:
        """The distribution of a tensor's values at `step`."""
        if self._writer is not None:
            self._writer.add_histogram(tag, values.detach().float().cpu(), step)

    def hparams(self, settings: dict[str, Any], metrics: Sequence[str]) -> None:
        """The run's settings in the hparams dashboard, with the scalar tags it compares runs by."""
        if self._writer is None:
            return
        from torch.utils.tensorboard.summary import hparams

        values = {key: _hparam_value(value) for key, value in settings.items()}
        # Written into the run's own file (torch's add_hparams would open a sub-folder run).
        for summary in hparams(values, dict.fromkeys(metrics, 0.0)):
            self._writer.file_writer.add_summary(summary)

    def margin_chart(self, title: str, value: str, lower: str, upper: str) -> None:
        """A chart of the tag `value` within the band of tags `lower`..`upper` (once per log)."""
        if self._writer is not None:
            self._writer.add_custom_scalars_marginchart([value, lower, upper], title=title)

    def flush(self) -> None:
        """Write what was logged to disk now, so a running job can be watched."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
