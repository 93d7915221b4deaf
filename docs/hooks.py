"""MkDocs hooks of the documentation site (`hooks:` in mkdocs.yml; not a page of it).

- A line `<!-- fewshot-help: train -->` becomes the text of `fewshot train --help`, so the user
  guide lists every option with its default exactly as the command has them.
- A line `<!-- fewshot-layers -->` becomes the layers contract of pyproject.toml.
- Every `::: fewshot.X` of mkdocstrings: the object and its public functions, classes, methods
  and (for a module) its public members must have a docstring. A missing one is logged as a
  warning, which fails `mkdocs build --strict`.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import griffe
import tomllib

ROOT = Path(__file__).resolve().parents[1]
HELP = re.compile(r"^<!-- fewshot-help: ([a-z -]+?) -->$", re.M)
LAYERS = re.compile(r"^<!-- fewshot-layers -->$", re.M)
IDENTIFIER = re.compile(r"^::: ([\w.]+)", re.M)
HELP_COLUMNS = "100"

# A child of the "mkdocs" logger: its warnings count for --strict.
log = logging.getLogger("mkdocs.hooks.fewshot")


def command_help(command: str) -> str:
    """The `--help` text of a `fewshot` command ("train", "hpo cleaning"), or "" if unknown."""
    from fewshot.cli.main import build_parser  # imports torch: only when a page asks

    out = io.StringIO()
    # argparse wraps to the terminal's width: a fixed one, whatever builds the site.
    with (
        mock.patch.dict(os.environ, {"COLUMNS": HELP_COLUMNS}),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(io.StringIO()),
        contextlib.suppress(SystemExit),
    ):
        build_parser().parse_args([*command.split(), "--help"])
    return out.getvalue()


def help_block(match: re.Match, page: str) -> str:
    """The fenced `--help` text a marker stands for."""
    command = match.group(1)
    text = command_help(command)
    if not text.startswith("usage:"):
        log.warning(f"{page}: fewshot-help names no command: {command!r}")
    return f"```text\n$ fewshot {command} --help\n{text.rstrip()}\n```"


def layers_list() -> str:
    """The layers of the import-linter contract in pyproject.toml, top to bottom."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    items = [" | ".join(f"`fewshot.{n.strip()}`" for n in layer.split("|")) for layer in layers]
    return "\n".join(f"{i}. {item}" for i, item in enumerate(items, 1))


@functools.cache
def package(name: str) -> griffe.Object:
    """The package as griffe reads it from the repository (what mkdocstrings renders)."""
    return griffe.load(name, search_paths=[str(ROOT)])


def undocumented(obj: griffe.Object | griffe.Alias, top: bool = True) -> Iterator[str]:
    """Paths of `obj` and of its public members (recursively through classes, not submodules)
    that are functions, classes or modules without a docstring."""
    if obj.is_alias:
        try:
            obj = obj.final_target
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return  # defined outside the package: not ours to document
    if obj.is_attribute or (obj.is_module and not top):
        return
    if not obj.docstring:
        yield obj.path
    if obj.is_module or obj.is_class:
        for name, member in obj.members.items():
            if not name.startswith("_") and member.is_public:
                yield from undocumented(member, top=False)


def on_pre_build(config: object) -> None:
    """A rebuild (mkdocs serve) reads the package again."""
    package.cache_clear()


def on_page_markdown(markdown: str, page: object, **_: object) -> str:
    """Check the docstrings of the page's references, expand its help and layers markers."""
    name = page.file.src_uri
    for identifier in IDENTIFIER.findall(markdown):
        top, _, rest = identifier.partition(".")
        try:
            obj = package(top)[rest] if rest else package(top)
        except (KeyError, ModuleNotFoundError):
            continue  # mkdocstrings reports an unknown identifier itself
        for path in undocumented(obj):
            log.warning(f"{name}: {path} has no docstring")
    markdown = HELP.sub(lambda m: help_block(m, name), markdown)
    return LAYERS.sub(lambda _: layers_list(), markdown)
