"""Benchmark suites: the shipped YAML files, one-line refusals of malformed suite files, and
`fewshot bench --list`."""

from __future__ import annotations

import pytest

from fewshot.benchmark.suites import SHIPPED, Cell, load_suite, read_suite, shipped_suites
from fewshot.cli.main import main
from fewshot.runtime.errors import FewshotError

# A valid suite's top: every cell below it needs only a name, a way and a shot.
HEAD = """\
name: small
version: 1
description: a small suite
dataset: omniglot
query: 5
episodes: 20
"""
CELL = "  - {name: a, way: 5, shot: 1}\n"


def test_every_shipped_suite_loads_under_its_own_name():
    names = shipped_suites()
    assert names == sorted(path.stem for path in SHIPPED.glob("*.yaml"))
    assert {"omniglot-v1", "miniimagenet-v1", "cross-domain-v1"} <= set(names)
    for name in names:
        suite = load_suite(name)
        assert suite.id == name == suite.path.stem
        assert suite.cells and all(isinstance(cell, Cell) for cell in suite.cells)
        assert suite.description
        assert len({cell.name for cell in suite.cells}) == len(suite.cells)
    # By path too: the same suite.
    by_path = load_suite(str(SHIPPED / "omniglot-v1.yaml"))
    assert by_path == load_suite("omniglot-v1")


def test_omniglot_v1_is_the_reproduction_protocol():
    suite = load_suite("omniglot-v1")
    assert (suite.name, suite.version) == ("omniglot", 1)
    assert [cell.name for cell in suite.cells] == ["5w1s", "5w5s", "20w1s", "20w5s"]
    shapes = [(cell.way, cell.shot) for cell in suite.cells]
    assert shapes == [(5, 1), (5, 5), (20, 1), (20, 5)]
    for cell in suite.cells:
        assert (cell.dataset, cell.split, cell.root) == ("omniglot", "test", None)
        assert (cell.query, cell.episodes, cell.seed) == (15, 2000, 0)
        assert cell.sha256 is not None and len(cell.sha256) == 64
        assert cell.shape.way == cell.way and cell.shape.query == 15
    assert suite.cell("20w5s") is suite.cells[3]
    with pytest.raises(FewshotError, match="has no cell 'x'; its cells: 5w1s, 5w5s"):
        suite.cell("x")


def test_a_suite_file_of_the_users_own(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(HEAD + "seed: 3\ncells:\n" + CELL + "  - {name: b-2, way: 10, shot: 5}\n")
    suite = load_suite(str(path))
    assert suite.id == "small-v1" and suite.path == path
    a, b = suite.cells
    assert (a.way, a.shot, a.query, a.episodes, a.seed, a.split) == (5, 1, 5, 20, 3, "test")
    assert (b.name, b.way, b.shot) == ("b-2", 10, 5)
    # A cell's own value wins over the suite's default.
    path.write_text(HEAD + "cells:\n  - {name: a, way: 5, shot: 1, query: 2, episodes: 4}\n")
    [cell] = read_suite(path).cells
    assert (cell.query, cell.episodes) == (2, 4)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (HEAD + "colour: red\ncells:\n" + CELL, 'unknown key "colour"'),
        (HEAD + "cells:\n  - {name: a, way: 5, shot: 1, colour: red}\n", "colour"),
        (HEAD + "cells:\n  - {name: a, way: five, shot: 1}\n", '"way" must be an integer'),
        (HEAD + "cells:\n  - {name: a, way: 5, shot: 1, episodes: 1.5}\n", '"episodes" must be'),
        (HEAD + "cells:\n  - {name: a, way: true, shot: 1}\n", '"way" must be an integer'),
        (HEAD + "cells:\n  - {name: a, way: 1, shot: 1}\n", '"way" must be >= 2'),
        (HEAD + "cells:\n  - {name: a, way: 5}\n", '"shot" is missing'),
        (HEAD.replace("episodes: 20\n", "") + "cells:\n" + CELL, '"episodes" is missing'),
        (HEAD + "cells: []\n", '"cells" must be a list of one cell or more'),
        (HEAD, '"cells" must be a list of one cell or more'),
        (HEAD + "cells:\n  - a\n", "cell 1 must be a mapping"),
        (HEAD + "cells:\n" + CELL + "  - {name: a, way: 5, shot: 5}\n", "cells a and a are"),
        (HEAD + "cells:\n" + CELL + "  - {name: b, way: 5, shot: 1}\n", "cells a and b are"),
        (HEAD + "cells: [\n", "is not valid YAML"),
        ("- a list\n", "must hold a mapping of keys"),
        (HEAD + "cells:\n  - {name: a, way: 5, shot: 1, root: ../x}\n", '"root" must be a folder'),
        (HEAD + "cells:\n  - {name: a, way: 5, shot: 1, root: /x}\n", '"root" must be a folder'),
        (HEAD + "cells:\n  - {name: a, way: 5, shot: 1, resize: 28}\n", '"resize" applies to'),
        (HEAD + "cells:\n  - {name: a, way: 5, shot: 1, channels: 3}\n", '"channels" applies'),
        (HEAD + "cells:\n  - {name: A5, way: 5, shot: 1}\n", '"name" must be lower-case'),
        (HEAD.replace("name: small", "name: Small") + "cells:\n" + CELL, '"name" must be lower'),
        (HEAD.replace("version: 1", "version: one") + "cells:\n" + CELL, '"version" must be'),
        (HEAD.replace("version: 1", "version: 0") + "cells:\n" + CELL, '"version" must be'),
        (HEAD + "cells:\n  - {name: a, way: 5, shot: 1, dataset: nope}\n", '"dataset" must be'),
        (HEAD + "cells:\n  - {name: a, way: 5, shot: 1, seed: -1}\n", '"seed" must be'),
        (HEAD + "sha256: abc\ncells:\n" + CELL, 'unknown key "sha256"'),
    ],
    ids=[
        "unknown-top-key",
        "unknown-cell-key",
        "way-five",
        "episodes-float",
        "way-bool",
        "way-one",
        "missing-shot",
        "missing-episodes",
        "empty-cells",
        "no-cells",
        "cell-not-mapping",
        "same-name",
        "same-episodes",
        "invalid-yaml",
        "not-a-mapping",
        "root-escapes",
        "root-absolute",
        "resize-builtin",
        "channels-builtin",
        "cell-capitals",
        "suite-capitals",
        "version-text",
        "version-zero",
        "unknown-dataset",
        "negative-seed",
        "suite-wide-pin",
    ],
)
def test_a_malformed_suite_file_is_one_line_naming_file_and_key(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(FewshotError) as error:
        load_suite(str(path))
    message = str(error.value)
    assert "\n" not in message
    assert str(path) in message
    assert expected in message


def test_a_suite_file_that_is_not_text_or_too_large(tmp_path):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(FewshotError, match="is not valid YAML") as error:
        read_suite(binary)
    assert "\n" not in str(error.value)
    large = tmp_path / "large.yaml"
    large.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(FewshotError, match="not a suite"):
        read_suite(large)


def test_a_folder_cell_without_root_names_the_file(tmp_path):
    path = tmp_path / "folder.yaml"
    path.write_text(HEAD + "cells:\n  - {name: a, way: 5, shot: 1, dataset: folder}\n")
    with pytest.raises(FewshotError) as error:
        read_suite(path)
    assert str(path) in str(error.value) and '"dataset" folder needs a root' in str(error.value)


def test_no_such_suite_is_one_line(tmp_path, capsys):
    with pytest.raises(FewshotError, match="no suite 'omniglot-v9': give one of cifar-fs-v1"):
        load_suite("omniglot-v9")
    text = tmp_path / "suite.txt"
    text.write_text(HEAD + "cells:\n" + CELL)
    with pytest.raises(FewshotError, match=r"or a suite's \.yaml file"):
        load_suite(str(text))
    assert main(["bench", "omniglot-v9", "model.pt", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no suite 'omniglot-v9'" in err
    assert not (tmp_path / "b").exists()


def test_bench_list_prints_every_shipped_suite_and_cell(capsys):
    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for name in shipped_suites():
        suite = load_suite(name)
        assert any(line.startswith(f"{suite.id}: {suite.description}") for line in lines)
        for cell in suite.cells:
            assert any(
                line.startswith(f"  {cell.name}: {cell.dataset}")
                and f"{cell.way}-way {cell.shot}-shot {cell.query} queries" in line
                and f"{cell.episodes} episodes, seed {cell.seed}" in line
                for line in lines
            ), cell
    assert "  5w1s: omniglot test, 5-way 1-shot 15 queries, 2000 episodes, seed 0" in lines
    assert any("cross_domain_data/mnist" in line for line in lines)  # a folder cell's root
    count = sum(len(load_suite(name).cells) + 1 for name in shipped_suites())
    assert len(lines) == count


def test_bench_without_a_suite_is_one_line(capsys):
    assert main(["bench"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "suite" in err
