"""`fewshot convert`: turn a dataset's splits into memory-mapped arrays, once.

Afterwards every command reads those splits by mapping the arrays (see
`fewshot.datasets.memmap`): the processes of a torchrun job share one copy of the images.
"""

from __future__ import annotations

from dataclasses import dataclass

from fewshot.datasets import dataset_names, load_split, resolve_data_root
from fewshot.datasets.memmap import describe, memmap_folder, write_memmap
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

    def __post_init__(self) -> None:
        check_fields(self)


def run_convert(settings: ConvertSettings) -> None:
    """Read each split through its reader (all its checks) and write its arrays."""
    root = resolve_data_root(settings.data_root)
    for split in settings.splits:
        folder = memmap_folder(root, settings.dataset, split)
        write_memmap(load_split(settings.dataset, split, root, converted=False), folder)
        print(describe(folder))


COMMANDS = [
    Command(
        ("convert",),
        "convert a dataset's splits into memory-mapped arrays shared by all processes",
        (ConvertSettings,),
        run_convert,
    )
]
