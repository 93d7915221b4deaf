"""`fewshot convert`: turn a dataset's splits into memory-mapped arrays, once.

Afterwards every command reads those splits by mapping the arrays (see
`fewshot.datasets.memmap`): the processes of a torchrun job share one copy of the images.
"""

from __future__ import annotations

from dataclasses import dataclass

from fewshot.datasets import (
    channels_setting,
    check_data_options,
    convert_split,
    dataset_names,
    resize_setting,
)
from fewshot.datasets.memmap import describe
from fewshot.runtime.settings import Command, check_fields, setting


@dataclass(frozen=True)
class ConvertSettings:
    """`fewshot convert`: which dataset and splits, under which data root."""

    dataset: str = setting(help="dataset to convert", choices=dataset_names)
    splits: list[str] = setting(
        help="splits to convert", default_factory=lambda: ["train", "val", "test"]
    )
    data_root: str | None = setting(
        None, help="data folder (default: $FEWSHOT_DATA or the repository's data/)"
    )
    resize: int | None = resize_setting()
    channels: int | None = channels_setting()

    def __post_init__(self) -> None:
        check_fields(self)
        check_data_options(self)


def run_convert(settings: ConvertSettings) -> None:
    """Read each split through its reader (all its checks) and write its arrays."""
    for split in settings.splits:
        options = {"resize": settings.resize, "channels": settings.channels}
        print(describe(convert_split(settings.dataset, split, settings.data_root, **options)))


COMMANDS = [
    Command(
        ("convert",),
        "convert a dataset's splits into memory-mapped arrays shared by all processes",
        (ConvertSettings,),
        run_convert,
    )
]
