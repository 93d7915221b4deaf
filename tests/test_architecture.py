"""What the import and dead-code checks cannot see: a dataset reader that no registry lists."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import typing
from collections.abc import Callable
from pathlib import Path

import fewshot.datasets
from fewshot.datasets import READERS
from fewshot.datasets.base import ImageSplit
from fewshot.hpo.tasks.image_data import IMAGE_READERS

REPO = Path(__file__).resolve().parents[1]


def is_reader(fn: Callable) -> bool:
    """Whether `fn` has the reader signature: (data_root, split) -> ImageSplit."""
    names = list(inspect.signature(fn).parameters)
    return names == ["data_root", "split"] and typing.get_type_hints(fn).get("return") is ImageSplit


def defined_readers() -> dict[str, Callable]:
    """Every reader defined in a module of fewshot.datasets, by its qualified name."""
    found = {}
    for info in pkgutil.iter_modules(fewshot.datasets.__path__, "fewshot.datasets."):
        module = importlib.import_module(info.name)
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ == module.__name__ and not name.startswith("_") and is_reader(fn):
                found[f"{module.__name__}.{name}"] = fn
    return found


def test_the_reader_search_finds_the_known_readers():
    found = defined_readers()
    assert "fewshot.datasets.omniglot.read_omniglot" in found
    assert "fewshot.datasets.idx.read_mnist" in found


def test_every_dataset_reader_is_registered():
    # The few-shot registry (--dataset) or the HPO image tasks' one (example splits, 10 classes).
    registered = {*READERS.values(), *IMAGE_READERS.values()}
    missing = [name for name, fn in defined_readers().items() if fn not in registered]
    assert not missing, f"readers no registry lists (see fewshot/datasets/__init__.py): {missing}"


def test_the_registry_holds_only_readers():
    assert all(is_reader(fn) for fn in READERS.values())


def test_the_package_metadata_does_not_cap_torch():
    """Lower bounds only for torch, torchvision and Pillow: an upper bound in the package's
    metadata blocks every user on a newer release (the tested versions are pinned by
    scripts/setup.sh instead)."""
    import tomllib

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    pinned = ("torch", "torchvision", "pillow")
    found = [d for d in pyproject["project"]["dependencies"] if d.split(">")[0] in pinned]
    assert len(found) == 3 and all("<" not in d and "==" not in d for d in found), found
