"""Shared fixtures: the shipped Omniglot splits and the data root of the larger sets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fewshot.datasets import REPO_DATA, load_split

REPO = Path(__file__).resolve().parents[1]
# Read once at start-up, before any test points FEWSHOT_DATA at a small folder of its own.
SHARED_DATA = Path(os.environ.get("FEWSHOT_DATA") or REPO.parent / "shared" / "data")


@pytest.fixture(scope="session")
def shared_data_root() -> Path:
    """The folder with MNIST, CIFAR-10 and the larger LIBSVM sets: $FEWSHOT_DATA when set,
    else the project's shared data beside the repository; tests skip without it."""
    if not (SHARED_DATA / "mnist").is_dir():
        pytest.skip(f"no shared data root with mnist/ at {SHARED_DATA} (set FEWSHOT_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def omniglot_test():
    """The Vinyals test split of the shipped Omniglot (1692 classes)."""
    return load_split("omniglot", "test", REPO_DATA)


@pytest.fixture(scope="session")
def omniglot_val():
    """The Vinyals validation split of the shipped Omniglot (688 classes)."""
    return load_split("omniglot", "val", REPO_DATA)


@pytest.fixture(scope="session")
def tiny_omniglot_root(tmp_path_factory):
    """A data root with the real Omniglot files but split lists cut to 24 classes each."""
    root = tmp_path_factory.mktemp("data")
    folder = root / "omniglot"
    (folder / "splits" / "vinyals").mkdir(parents=True)
    source = REPO_DATA / "omniglot"
    for name in ("images_background.npz", "images_evaluation.npz", "omniglot_index.csv"):
        (folder / name).symlink_to(source / name)
    for split in ("train", "val", "test"):
        lines = (source / "splits" / "vinyals" / f"{split}.txt").read_text().split()
        (folder / "splits" / "vinyals" / f"{split}.txt").write_text("\n".join(lines[:24]) + "\n")
    return root
