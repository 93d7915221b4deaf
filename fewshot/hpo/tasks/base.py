"""The contract of a `fewshot hpo` task: its settings' shared fields and checks, and `Task`.

A task is one file: a settings dataclass (a subclass of `TaskSettings`, or of `HpoSettings` when
it learns hyperparameters with one of `METHODS`, with its table of the fields each method does
not read), a `load` that checks the run's memory estimate (`check_memory`) and reads the data
(and puts it on the device), a `run` that takes a step callback, and a `Task` value naming the
command, its result file and its report. `fewshot.hpo.cli` turns every registered `Task` into a
command.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from fewshot.hpo.ensemble import StepCallback
from fewshot.hpo.optimize import METHODS, OEHG_RESPLITS, Budget
from fewshot.hpo.splits import MAX_RESPLITS, RESPLITS_LIMIT_REASON
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_write_json, describe_differences
from fewshot.runtime.memory import MemoryTerm
from fewshot.runtime.settings import (
    SettingError,
    check_fields,
    refuse_unused,
    seed_setting,
    setting,
)

# The methods that re-train from theta0 every outer step (Algorithms 1-3); OEHG runs online.
OFFLINE_METHODS = tuple(m for m in METHODS if m != "oehg")
# The fields every HPO task has that a method does not read: K is the offline methods' inner
# steps (OEHG takes its own steps per outer step), the window T-RHG's, the solver steps AID's.
METHOD_UNUSED: dict[str, frozenset[str]] = {
    "rhg": frozenset({"truncate", "solver_steps"}),
    "trhg": frozenset({"solver_steps"}),
    "aid-fp": frozenset({"truncate"}),
    "aid-cg": frozenset({"truncate"}),
    "oehg": frozenset({"inner_steps", "truncate", "solver_steps"}),
}


@dataclass(frozen=True, kw_only=True)
class TaskSettings:
    """What every task has: a seed and an output folder, checked when built."""

    seed: int = seed_setting(0, help="seed of the data draw, re-splits, model and mini-batches")
    out: str = setting(help="folder for the results")
    overwrite: bool = setting(False, help="replace results of other settings in --out")

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.out.strip():
            raise SettingError("out", "must name a folder")


@dataclass(frozen=True, kw_only=True)
class HpoSettings(TaskSettings):
    """The fields and checks of a task that learns hyperparameters with `optimize`.

    Subclasses declare `outer_steps` and `outer_step_count()` (their default budgets differ)
    and may redeclare a field to change its default.
    """

    # The task's own fields that some methods do not read, {method: fields}: with METHOD_UNUSED
    # the table `unused` gives (a task whose flags depend on its data or model extends that).
    TASK_UNUSED: ClassVar[dict[str, frozenset[str]]] = {}

    method: str = setting(help="hypergradient method", choices=METHODS)
    resplits: int | None = setting(
        None,
        help=f"U, train/validation re-splits (default {OEHG_RESPLITS} for oehg, else 1)",
        low=1,
    )
    data_root: str | None = setting(None, help="folder holding the data sets (default: data/)")
    inner_steps: int = setting(128, help="K of RHG / T-RHG / AID (not oehg)", low=1)
    truncate: int = setting(16, help="T-RHG window (trhg)", low=1)
    solver_steps: int = setting(20, help="Z for AID (aid-fp, aid-cg)", low=1)
    outer_lr: float = setting(0.01, help="Adam on the hyperparameters", above=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.resplits is not None and self.resplits > MAX_RESPLITS:
            raise SettingError(
                "resplits",
                f"must be <= {MAX_RESPLITS}, got {self.resplits}: {RESPLITS_LIMIT_REASON}",
            )
        for owner, fields in self.unused().items():
            # U = 1 is what a method without re-splits does: --resplits 1 changes nothing.
            refuse_unused(self, sorted(fields), owner, {"resplits": frozenset({None, 1})})
        # Only T-RHG reads the window: other methods run with any inner_steps.
        if self.method == "trhg" and self.truncate > self.inner_steps:
            raise SettingError(
                "truncate", f"must be <= inner_steps ({self.inner_steps}), got {self.truncate}"
            )

    def unused(self) -> dict[str, frozenset[str]]:
        """{the flag and value that rule them out: the fields they leave unread}; each of those
        fields must keep its default (`refuse_unused`)."""
        fields = METHOD_UNUSED[self.method] | self.TASK_UNUSED.get(self.method, frozenset())
        return {f"--method {self.method}": fields}

    def kept_steps(self) -> tuple[int, str | None]:
        """The inner steps one hypergradient back-propagates through, all kept in memory at
        once, and the flag that sets them (None: fixed): K for RHG, the window for T-RHG, OEHG's
        steps per outer step, one for AID (it solves its linear system at theta_K)."""
        steps = {
            "rhg": (self.inner_steps, "--inner-steps"),
            "trhg": (self.truncate, "--truncate"),
            "oehg": (self.budget().oehg_inner_steps, None),
        }
        return steps.get(self.method, (1, None))

    def kept_steps_memory(self, step_bytes: int, otherwise: str) -> MemoryTerm:
        """The memory term of the kept inner steps, `step_bytes` each; `otherwise` is the flag
        to lower where the method fixes their count."""
        steps, flag = self.kept_steps()
        what = f"{steps} kept inner step{'s' * (steps != 1)}"
        return MemoryTerm(steps * step_bytes, what, flag or otherwise)

    def resplit_count(self) -> int:
        """U: `resplits` if given, else OEHG's default for oehg and 1 for the other methods."""
        if self.resplits is not None:
            return self.resplits
        return OEHG_RESPLITS if self.method == "oehg" else 1

    def outer_step_count(self) -> int:
        """T, the task's default when `outer_steps` is not given."""
        raise NotImplementedError

    def budget(self) -> Budget:
        """The step counts of the run."""
        steps = self.outer_step_count()
        return Budget(steps, self.inner_steps, self.truncate, self.solver_steps)


def check_out_folder(out: str) -> None:
    """Refuse an --out that is, or lies under, something other than a folder (before any work:
    writing the results into it would fail only after the run)."""
    path = Path(out)
    existing = next((p for p in (path, *path.parents) if p.exists() or p.is_symlink()), None)
    if existing is None or existing.is_dir():
        return
    what = "a file" if existing.is_file() else "not a folder"
    where = f"is {what}" if existing == path else f"lies under {existing}, which is {what}"
    raise FewshotError(f"--out {out} {where}: it must name a folder")


# Settings that do not change a result: where it goes and where the data and work are.
_NOT_IDENTITY = frozenset({"out", "overwrite", "data_root", "device"})


def identity(settings: dict) -> dict:
    """The settings that decide a result, as they read back from its JSON file."""
    kept = {k: v for k, v in settings.items() if k not in _NOT_IDENTITY}
    return json.loads(json.dumps(kept))


def result_differences(settings: TaskSettings) -> Callable[[Path], list[str]]:
    """For `prepare_output`: how the settings of a result JSON differ from these."""
    wanted = identity(asdict(settings))

    def differences(path: Path) -> list[str]:
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            old = None
        if not (isinstance(old, dict) and isinstance(old.get("settings"), dict)):
            return ["a file that is not a result of this command"]
        return describe_differences(identity(old["settings"]), wanted)

    return differences


def write_json(settings: TaskSettings, result: Any, paths: list[Path]) -> None:
    """`Task.write` of a task whose one output is its result dataclass as JSON."""
    atomic_write_json(asdict(result), paths[0])


def run_stem(prefix: str, dataset: str, model: str, method: str, seed: int) -> str:
    """The shared file-name pattern of one run: PREFIX + DATASET_MODEL_METHOD_seedS."""
    return f"{prefix}{dataset}_{model}_{method}_seed{seed}"


@dataclass(frozen=True)
class Task:
    """One `fewshot hpo NAME` command.

    load(settings) -> data; run(settings, data, on_step) -> result; steps(settings): the outer
    steps on_step counts (None: no progress bar); outputs(settings) -> the files it writes, the
    JSON result (holding the settings) first; write(settings, result, outputs);
    report(settings, result) -> the lines printed.
    """

    name: str
    help: str
    settings: type[TaskSettings]
    load: Callable[[Any], Any]
    run: Callable[[Any, Any, StepCallback | None], Any]
    steps: Callable[[Any], int | None]
    outputs: Callable[[Any], list[Path]]
    write: Callable[[Any, Any, list[Path]], None]
    report: Callable[[Any, Any], list[str]]
