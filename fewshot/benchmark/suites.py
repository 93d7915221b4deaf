"""Benchmark suites: named, versioned sets of cells, each one kind of test episodes.

A suite is a small YAML file (the shipped ones in `suites/`, named NAME-vVERSION.yaml, or a
user's own by path): its name, version and description, defaults for its cells, and the cells,
each a data set and split, a shape (way, shot, query), a number of episodes and a seed. Every
key is typed and checked when read; an unknown key or a wrong type is one line naming the file
and the key. A cell may pin its episodes' SHA-256 (`sha256`), so that a change to the sampler
or the data is found before anything is evaluated.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

from fewshot.datasets import FOLDER, dataset_names
from fewshot.datasets.sampler import EpisodeShape
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.settings import SettingError, build, check_fields, seed_setting, setting

SHIPPED = Path(__file__).resolve().parent / "suites"
MAX_SUITE_BYTES = 1 << 20  # a suite is a few lines; a larger file is not one
NAME = re.compile(r"[a-z0-9][a-z0-9-]*\Z")  # suite and cell names become file names


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One cell of a suite: which episodes, from which data."""

    name: str = setting(help="the cell's name: lower-case letters, digits and '-'")
    dataset: str = setting(help="the data set's name (folder: a folder data set)")
    split: str = setting("test", help="the split the episodes are drawn from")
    way: int = setting(help="classes per episode", low=2)
    shot: int = setting(help="support images per class", low=1)
    query: int = setting(15, help="query images per class", low=1)
    episodes: int = setting(help="episodes", low=2)
    seed: int = seed_setting(0, help="seed of the episodes")
    root: str | None = setting(None, help="the data set's folder under the data root")
    resize: int | None = setting(None, help="folder data set: read at N x N", low=1)
    channels: int | None = setting(None, help="folder data set: read with 1 or 3 channels")
    sha256: str | None = setting(None, help="the SHA-256 its episodes must have")

    def __post_init__(self) -> None:
        check_fields(self)
        if not NAME.match(self.name):
            raise SettingError(
                "name", f"must be lower-case letters, digits and '-', got {self.name!r}"
            )
        if self.dataset not in dataset_names():
            raise SettingError(
                "dataset", f"must be one of {', '.join(dataset_names())}, got {self.dataset!r}"
            )
        if self.dataset != FOLDER and (self.resize or self.channels):
            raise SettingError(
                "resize" if self.resize else "channels",
                "applies to a folder data set (a built-in one has its own geometry)",
            )
        if self.dataset == FOLDER and self.root is None:  # named by the key that was given
            raise SettingError("dataset", "folder needs a root: the data set's folder")
        if self.channels not in (None, 1, 3):
            raise SettingError("channels", f"must be 1 or 3, got {self.channels}")
        if self.root is not None and (
            Path(self.root).is_absolute() or ".." in Path(self.root).parts
        ):
            raise SettingError("root", f"must be a folder under the data root, got {self.root!r}")

    @property
    def shape(self) -> EpisodeShape:
        """The cell's episode shape."""
        return EpisodeShape(self.way, self.shot, self.query)

    @property
    def data(self) -> tuple:
        """What the episodes are drawn from and how: two cells with equal data and shape,
        episodes and seed are one cell twice."""
        return (self.dataset, self.root, self.split, self.resize, self.channels)


CELL_KEYS = tuple(f.name for f in fields(Cell) if f.name not in ("name", "sha256"))
REQUIRED = tuple(f.name for f in fields(Cell) if f.default is MISSING)


@dataclass(frozen=True)
class Suite:
    """A named, versioned suite of cells, read from `path`."""

    name: str
    version: int
    description: str
    cells: tuple[Cell, ...]
    path: Path

    @property
    def id(self) -> str:
        """NAME-vVERSION: how results and commands name the suite."""
        return f"{self.name}-v{self.version}"

    def cell(self, name: str) -> Cell:
        """The cell of that name."""
        for cell in self.cells:
            if cell.name == name:
                return cell
        raise FewshotError(
            f"suite {self.id} has no cell {name!r}; its cells: "
            + ", ".join(c.name for c in self.cells)
        )


def shipped_suites() -> list[str]:
    """The shipped suites' names (NAME-vVERSION), sorted."""
    return sorted(path.stem for path in SHIPPED.glob("*.yaml"))


def load_suite(name: str) -> Suite:
    """A shipped suite by name (NAME-vVERSION), or a suite file by path."""
    path = SHIPPED / f"{name}.yaml"
    if not path.is_file():
        path = Path(name)
        if path.suffix not in (".yaml", ".yml") or not path.is_file():
            raise FewshotError(
                f"no suite {name!r}: give one of {', '.join(shipped_suites())} "
                "(fewshot bench --list) or a suite's .yaml file"
            )
    return read_suite(path)


def read_suite(path: Path) -> Suite:
    """Read and check one suite file."""
    import yaml  # here: only the commands that read suites need it

    if path.stat().st_size > MAX_SUITE_BYTES:
        raise FewshotError(f"suite file {path} is over {MAX_SUITE_BYTES >> 10} KiB: not a suite")
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        summary = str(e).replace("\n", " ")
        raise FewshotError(f"suite file {path} is not valid YAML: {summary}") from None
    if not isinstance(values, dict):
        raise FewshotError(f"suite file {path} must hold a mapping of keys")
    header = {key: values.pop(key, None) for key in ("name", "version", "description", "cells")}
    unknown = sorted(key for key in values if key not in CELL_KEYS)
    if unknown:
        raise FewshotError(f'suite file {path}: unknown key "{unknown[0]}"')
    name, version, cells = header["name"], header["version"], header["cells"]
    if not isinstance(name, str) or not NAME.match(name):
        raise FewshotError(f'suite file {path}: "name" must be lower-case letters, digits and -')
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise FewshotError(f'suite file {path}: "version" must be an integer >= 1')
    if not isinstance(header["description"], str):
        raise FewshotError(f'suite file {path}: "description" must be a string')
    if not isinstance(cells, list) or not cells:
        raise FewshotError(f'suite file {path}: "cells" must be a list of one cell or more')
    built: list[Cell] = []
    for number, cell in enumerate(cells, 1):
        if not isinstance(cell, dict):
            raise FewshotError(f"suite file {path}: cell {number} must be a mapping of keys")
        label = f"suite file {path} cell {cell.get('name', number)}"
        missing = [key for key in REQUIRED if key not in cell and key not in values]
        if missing:
            raise FewshotError(f'{label}: "{missing[0]}" is missing (in the cell or the suite)')
        built.append(build(Cell, [(label, values), (label, cell)]))
    seen: dict = {}
    for cell in built:
        twice = seen.get(cell.name) or seen.get(_episodes(cell))
        if twice:
            raise FewshotError(
                f"suite file {path}: cells {twice} and {cell.name} are the same cell "
                "(a name, or the same data, shape, episodes and seed, given twice)"
            )
        seen[cell.name] = seen[_episodes(cell)] = cell.name
    return Suite(name, version, header["description"], tuple(built), path)


def _episodes(cell: Cell) -> tuple:
    """What decides a cell's episodes."""
    return (*cell.data, cell.way, cell.shot, cell.query, cell.episodes, cell.seed)
