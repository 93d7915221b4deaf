"""What the repository records (evaluations, metrics logs, configs, shipped models) names files
as typed from the repository root or a driver's run folder, never by a training machine's path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath

from tracked import REPO, tracked

from fewshot.runtime.io import load_checkpoint

SUFFIXES = (".json", ".jsonl", ".pt")


def recorded() -> list[Path]:
    """The JSON, JSON-lines and checkpoint files git tracks (outside git: those of experiments/
    and models/)."""
    files = tracked(*(f"*{suffix}" for suffix in SUFFIXES))
    if files is None:
        return sorted(
            path
            for folder in ("experiments", "models")
            for path in (REPO / folder).rglob("*")
            if path.suffix in SUFFIXES
        )
    return files


def strings(value: object) -> Iterator[str]:
    """Every string inside nested dicts and lists (keys too)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from strings(key)
            yield from strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from strings(item)


def contents(path: Path) -> list[object]:
    """A record's data: a JSON file's value, each line of a JSON-lines file, a checkpoint's
    settings and training history."""
    if path.suffix == ".pt":
        checkpoint = load_checkpoint(path)
        return [checkpoint.get("config"), checkpoint.get("progress")]
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [json.loads(path.read_text())]


def is_absolute(text: str) -> bool:
    """Whether a string reads as an absolute path on POSIX or Windows."""
    return PurePosixPath(text).is_absolute() or PureWindowsPath(text).is_absolute()


RECORDS = recorded()


def test_records_are_found():
    names = {path.relative_to(REPO).as_posix() for path in RECORDS}
    assert "models/omniglot/protonet_conv4_trainval.pt" in names
    assert "models/bench/omniglot-v1/protonet/5w1s.json" in names


def test_no_record_names_an_absolute_path():
    found = {
        path.relative_to(REPO).as_posix(): absolute[:3]
        for path in RECORDS
        if (absolute := [text for text in strings(contents(path)) if is_absolute(text)])
    }
    assert not found, f"records naming a machine's path: {found}"


def test_an_absolute_path_is_found_where_a_record_hides_it():
    record = {"rows": [{"checkpoint": "models/x.pt"}, {"runs": ["runs/a", "/home/me/runs/b"]}]}
    assert [text for text in strings(record) if is_absolute(text)] == ["/home/me/runs/b"]
    assert is_absolute("C:\\runs\\b") and not is_absolute("runs\\b")
