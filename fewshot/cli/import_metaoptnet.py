"""`fewshot import-metaoptnet`: a MetaOptNet checkpoint as a fewshot checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fewshot.runtime.io import atomic_torch_save, load_checkpoint, prepare_output
from fewshot.runtime.settings import Command, check_fields, setting
from fewshot.training.metaoptnet_import import IMAGE_SIZES, METAOPTNET_HEADS, import_metaoptnet


@dataclass(frozen=True)
class ImportSettings:
    """`fewshot import-metaoptnet`: which MetaOptNet checkpoint, what it holds, where to write."""

    checkpoint: str = setting(help="MetaOptNet .pth file (embedding + head)")
    backbone: str = setting(help="its embedding network", choices=("resnet12", "conv4"))
    head: str = setting(
        help="its head: ProtoNet, Ridge, R2D2 or SVM (SVM-CS)", choices=tuple(METAOPTNET_HEADS)
    )
    dataset: str = setting(help="the dataset it was trained on", choices=tuple(IMAGE_SIZES))
    out: str = setting(help="fewshot checkpoint to write (.pt)")
    overwrite: bool = setting(False, help="replace an existing --out file")

    def __post_init__(self) -> None:
        check_fields(self)


def run_import(settings: ImportSettings) -> Path:
    """`fewshot import-metaoptnet`: convert a MetaOptNet checkpoint and write it atomically."""
    out = prepare_output(settings.out, settings.overwrite)
    ckpt = load_checkpoint(settings.checkpoint)
    converted = import_metaoptnet(
        ckpt, settings.backbone, settings.head, settings.dataset, settings.checkpoint
    )
    atomic_torch_save(converted, out)
    print(f"wrote {out}; evaluate it with: fewshot eval --checkpoint {out}")
    return out


COMMANDS = [
    Command(
        ("import-metaoptnet",),
        "convert a MetaOptNet checkpoint into a fewshot checkpoint",
        (ImportSettings,),
        run_import,
    )
]
