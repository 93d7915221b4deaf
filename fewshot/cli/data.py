"""`fewshot data fetch DATASET`: download a data set into the data root, checked and resumable."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fewshot.datasets import resolve_data_root
from fewshot.datasets.fetch import DATASETS, fetch
from fewshot.runtime.settings import Command, check_fields, setting


@dataclass(frozen=True)
class FetchSettings:
    """`fewshot data fetch`: which data set, into which data root."""

    dataset: str = setting(
        help="dataset to download", choices=lambda: list(DATASETS), positional=True
    )
    data_root: str | None = setting(
        None, help="data folder, made if missing (default: $FEWSHOT_DATA or the repository's data/)"
    )

    def __post_init__(self) -> None:
        check_fields(self)


def run_fetch(settings: FetchSettings) -> None:
    """Land every file of the data set under the data root, then say where."""
    if settings.data_root:
        Path(settings.data_root).mkdir(parents=True, exist_ok=True)
    root = resolve_data_root(settings.data_root)
    fetch(DATASETS[settings.dataset], root)
    print(f"{settings.dataset}: every file in place under {root}")


COMMANDS = [
    Command(
        ("data", "fetch"),
        "download a data set (MNIST, Fashion-MNIST, CIFAR-10, the LIBSVM sets) into the data root, "
        "checked against its checksums; an interrupted download resumes",
        (FetchSettings,),
        run_fetch,
    )
]
