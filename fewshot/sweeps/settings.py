"""The executor's settings of a command that runs jobs (fewshot sweep, fewshot bench): --executor
and each executor's flags, checked together, and the executor they make."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fewshot.runtime.settings import refuse_unused, setting
from fewshot.sweeps.executors import Executor, LocalExecutor
from fewshot.sweeps.slurm import SlurmExecutor, SlurmOptions, submitit_module

EXECUTORS = ("local", "slurm")
SLURM_FLAGS = ("partition", "time_min", "cpus", "gpus", "mem_gb", "parallelism")


def executor_setting(default: str | None) -> Any:
    """The --executor field; `default` None: the command runs its jobs itself unless one is
    given."""
    itself = "" if default else " (default: none, the jobs run one after another in this process)"
    return setting(
        default,
        help="where the jobs run: local (processes of this machine) or slurm (a job array "
        f"through submitit: pip install 'fewshot[slurm]'){itself}",
        choices=EXECUTORS,
    )


@dataclass(frozen=True, kw_only=True)
class ExecutorSettings:
    """A mixin of a command's settings: --executor and its executors' flags. A command whose
    --executor has a default redeclares it (`executor_setting`); its `__post_init__` calls
    `check_executor`."""

    executor: str | None = executor_setting(None)
    workers: int = setting(
        1, help="local executor: jobs run at once, the machine's cores divided among them", low=1
    )
    partition: str | None = setting(None, help="slurm: the partition (default: the cluster's)")
    time_min: int = setting(
        60, help="slurm: each job's time limit in minutes (a job near it is requeued)", low=1
    )
    cpus: int = setting(1, help="slurm: CPUs per job", low=1)
    gpus: int = setting(0, help="slurm: GPUs per job", low=0)
    mem_gb: float | None = setting(None, help="slurm: memory per job in GB", above=0)
    parallelism: int = setting(
        64, help="slurm: jobs running at once (shared by the arrays of a large batch)", low=1
    )

    def check_executor(self) -> None:
        """Refuse the flags of an executor other than the one given."""
        owner = f"--executor {self.executor}" if self.executor else "a run without --executor"
        if self.executor != "slurm":
            refuse_unused(self, SLURM_FLAGS, owner)
        if self.executor != "local":
            refuse_unused(self, ("workers",), owner)

    @property
    def slurm_options(self) -> SlurmOptions:
        """What each Slurm job asks for."""
        return SlurmOptions(**{key: getattr(self, key) for key in SLURM_FLAGS})

    def make_executor(self, folder: Path) -> Executor:
        """The executor --executor names; Slurm's keeps its submission files and logs in
        FOLDER/slurm, and is refused in one line where submitit or sbatch is missing."""
        if self.executor == "slurm":
            submitit_module()  # before any work, not when the first batch is submitted
            return SlurmExecutor(folder / "slurm", self.slurm_options)
        if self.executor == "local":
            return LocalExecutor(self.workers)
        raise ValueError("no --executor: the command runs its jobs itself")
