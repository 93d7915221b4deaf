"""The documentation site's build hooks (docs/hooks.py): a public object without a docstring on a
reference page is a warning that fails `mkdocs build --strict`; help markers become the parser's
help."""

from __future__ import annotations

import importlib.util
import logging
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

griffe = pytest.importorskip("griffe")  # the docs extra (scripts/setup.sh test installs it)

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
hooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hooks)
PAGE = SimpleNamespace(file=SimpleNamespace(src_uri="reference/toy.md"))

TOY_MODULE = '''
"""A module."""

LIMIT = 3  # attributes need no docstring


def documented():
    """Yes."""


def bare():
    pass


def _private():
    pass


class Thing:
    """A class."""

    def __init__(self):
        pass

    def method(self):
        pass

    def done(self):
        """Yes."""


class Bare:
    pass
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A package `toy` (documented) with a module `mod` of documented and undocumented objects
    and an undocumented submodule `sub`, as the hooks read it."""
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "__init__.py").write_text('"""A toy package."""\n')
    (tmp_path / "toy" / "mod.py").write_text(textwrap.dedent(TOY_MODULE))
    (tmp_path / "toy" / "sub.py").write_text("def f():\n    pass\n")
    package = griffe.load("toy", search_paths=[str(tmp_path)])
    monkeypatch.setattr(hooks, "package", lambda name: package)
    return package


def test_undocumented_lists_public_functions_classes_and_methods(toy):
    found = list(hooks.undocumented(toy["mod"]))
    assert found == ["toy.mod.bare", "toy.mod.Thing.method", "toy.mod.Bare"]
    # A package's page renders the package, not its submodules.
    assert list(hooks.undocumented(toy)) == []
    assert list(hooks.undocumented(toy["sub"])) == ["toy.sub", "toy.sub.f"]


def test_a_reference_without_docstrings_is_a_warning_mkdocs_counts(toy, caplog):
    assert hooks.log.name.startswith("mkdocs.")  # --strict fails on the mkdocs loggers' warnings
    with caplog.at_level(logging.WARNING, logger=hooks.log.name):
        hooks.on_page_markdown("# Toy\n\n::: toy.mod.Thing\n\n::: toy.mod.documented\n", page=PAGE)
    assert caplog.messages == ["reference/toy.md: toy.mod.Thing.method has no docstring"]


def test_help_marker_becomes_the_command_help(caplog):
    from fewshot.cli.main import build_parser

    page = hooks.on_page_markdown("Options:\n\n<!-- fewshot-help: hpo cleaning -->\n", page=PAGE)
    head, block = page.split("\n\n", 1)
    assert head == "Options:"
    lines = block.splitlines()
    assert lines[:2] == ["```text", "$ fewshot hpo cleaning --help"] and lines[-1] == "```"
    # Every flag of the command, with its help text's first words, as the parser has them.
    parser = build_parser()
    hpo = next(a for a in parser._actions if a.dest == "command").choices["hpo"]
    cleaning = next(a for a in hpo._actions if a.choices).choices["cleaning"]
    for action in cleaning._actions:
        assert action.option_strings[-1] in block
    with caplog.at_level(logging.WARNING, logger=hooks.log.name):
        hooks.on_page_markdown("<!-- fewshot-help: no-such-command -->\n", page=PAGE)
    assert caplog.messages == ["reference/toy.md: fewshot-help names no command: 'no-such-command'"]
