"""`fewshot hpo ...`: one `Command` per registered task (settings checked before data is read)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from functools import partial
from pathlib import Path

from tqdm import tqdm

from fewshot.hpo.outer_log import VAL_LOSS, logging_to
from fewshot.hpo.tasks import bias_variance, cleaning, image_regularization, regularization
from fewshot.hpo.tasks.base import Task, TaskSettings, check_out_folder, result_differences
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.events import EventLog
from fewshot.runtime.io import prepare_output
from fewshot.runtime.settings import Command, SettingError, flag_name

# The registry: a new task adds its TASK here.
TASKS: tuple[Task, ...] = (
    regularization.TASK,
    bias_variance.TASK,
    cleaning.TASK,
    image_regularization.TASK,
)


@contextmanager
def _progress(total: int | None, label: str) -> Iterator[Callable[..., None]]:
    """A step counter whose bar appears at the first step (an error before it prints one line)."""
    bar: tqdm | None = None

    def update(*_: object) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc=label, unit="step", leave=False)
        bar.update(1)

    try:
        yield update
    finally:
        if bar is not None:
            bar.close()


@contextmanager
def _event_log(settings: TaskSettings, result: Path, steps: int) -> Iterator[None]:
    """The TensorBoard log of the run's `steps` outer steps in --out/events/NAME (NAME: its
    result file's, so the runs of one --out are told apart), replaced by a rerun."""
    folder = Path(settings.out) / "events" / result.stem
    with EventLog(folder) as log, logging_to(log, steps):
        log.hparams(asdict(settings), [VAL_LOSS])
        yield


def run_task(task: Task, settings: TaskSettings) -> None:
    """Check the outputs, load the data, run with a progress bar, write and print the report."""
    # Before any work: --out is a folder, the files are writable, results of other settings kept.
    check_out_folder(settings.out)
    outputs = task.outputs(settings)
    differences = result_differences(settings)
    for path in outputs:  # the first output holds the settings of all
        prepare_output(path, settings.overwrite, lambda _: differences(outputs[0]))
    try:
        data = task.load(settings)
        steps = task.steps(settings)
        # A task without outer steps (None) has nothing to log.
        events = _event_log(settings, outputs[0], steps) if steps is not None else nullcontext()
        with events, _progress(steps, task.name) as step:
            result = task.run(settings, data, step)
    except SettingError as e:  # a value that the data rules out: name its flag
        raise FewshotError(f"{flag_name(e.key)} {e.problem}") from None
    task.write(settings, result, outputs)
    for line in task.report(settings, result):
        print(line)
    print(f"wrote {' and '.join(map(str, outputs))}")


COMMANDS: list[Command] = [
    Command(("hpo", task.name), task.help, (task.settings,), partial(run_task, task))
    for task in TASKS
]
