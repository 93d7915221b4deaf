"""`fewshot data fetch DATASET`: download a data set into the data root, checked and resumable;
`fewshot data arrange SET SOURCE --out FOLDER`: a BSCD-FSL download as a folder data set."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fewshot.datasets import resolve_data_root
from fewshot.datasets.bscd import SETS, arrange
from fewshot.datasets.fetch import DATASETS, fetch
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.settings import Command, SettingError, check_fields, setting


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
        try:
            Path(settings.data_root).mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a file there, or on its way
            raise FewshotError(
                f"--data-root {settings.data_root}: cannot make the folder: {e.strerror or e}"
            ) from None
    root = resolve_data_root(settings.data_root)
    fetch(DATASETS[settings.dataset], root)
    print(f"{settings.dataset}: every file in place under {root}")


@dataclass(frozen=True)
class ArrangeSettings:
    """`fewshot data arrange`: which BSCD-FSL set, from which download, into which folder."""

    set: str = setting(help="BSCD-FSL target set", choices=lambda: list(SETS), positional=True)
    source: str = setting(help="the unpacked download", positional=True)
    out: str = setting(
        help="new folder data set to make (OUT/test/<class>/, links): a new or empty folder, "
        "outside the download"
    )

    def __post_init__(self) -> None:
        check_fields(self)
        out = Path(self.out)
        # Resolved: the download spelled another way (a link, `..`) is still the download.
        if out.resolve().is_relative_to(Path(self.source).resolve()):
            raise SettingError(
                "out", f"{self.out} is inside the download {self.source}: name a folder outside it"
            )
        if os.path.lexists(out) and (out.is_symlink() or not out.is_dir() or any(out.iterdir())):
            raise SettingError(
                "out",
                f"{self.out} exists and is not an empty folder: arrange into a new folder "
                "(nothing was changed)",
            )


def run_arrange(settings: ArrangeSettings) -> None:
    """Link the set's images into OUT/test/<class>/, then say what is there and how to use it."""
    counts = arrange(settings.set, Path(settings.source), Path(settings.out))
    print(
        f"{settings.set}: {len(counts)} classes, {sum(counts.values())} images linked into "
        f"{Path(settings.out) / 'test'} (use --dataset folder --data-root {settings.out})"
    )


COMMANDS = [
    Command(
        ("data", "fetch"),
        "download a data set (MNIST, Fashion-MNIST, CIFAR-10, the LIBSVM sets) into the data root, "
        "checked against its checksums; an interrupted download resumes",
        (FetchSettings,),
        run_fetch,
    ),
    Command(
        ("data", "arrange"),
        "arrange a BSCD-FSL download (CropDisease, EuroSAT, ISIC 2018, ChestX-ray8) as a folder "
        "data set: its images linked into OUT/test/<class>/ by the benchmark's labels",
        (ArrangeSettings,),
        run_arrange,
    ),
]
