"""Property tests of the command line: for every command, argument lists built from its declared
settings with one bad value (or junk) end in one line and exit status 2, never a traceback, and
before any work (a refused command reads no data and writes nothing)."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fewshot.cli.main import COMMANDS, main
from fewshot.runtime.settings import flag_name

# (command, field, hint, metadata) for every flag of every command
FLAGS = [
    (command, f, typing.get_type_hints(cls)[f.name])
    for command in COMMANDS
    for cls in command.settings
    for f in dataclasses.fields(cls)
    if f.metadata.get("flag", True) and not f.metadata.get("positional")
]


def _base(hint) -> type:
    """X for `X | None`, else the hint's origin or the hint."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    inner = args[0] if typing.get_origin(hint) in (typing.Union, type(int | None)) else hint
    return typing.get_origin(inner) or inner


def bad_values(f: dataclasses.Field, hint) -> st.SearchStrategy[str]:
    """Values of a flag that its declaration refuses."""
    base, meta = _base(hint), f.metadata
    options = [st.text(alphabet="xyz!@", min_size=1, max_size=5)]  # never a number
    if base in (int, float):
        if meta.get("low") is not None:
            options.append(st.just(str(meta["low"] - 1)))
        if meta.get("above") is not None:
            options.append(st.just(str(meta["above"])))
        if base is int:
            options.append(st.just("1.5"))
    if base is str and meta.get("choices") is not None:
        options = [st.text(alphabet="QZ", min_size=1, max_size=4)]
    if base is dict:
        options = [st.sampled_from(["[", "{bad", "3", '"x"'])]
    if base is list:  # a list flag takes space-separated items: each must be refused
        options = [st.sampled_from(["[", "{bad", '"x"', "0.5"])]
    return st.one_of(options)


REFUSABLE = [(c, f, h) for c, f, h in FLAGS if _base(h) in (int, float, dict, list)]
REFUSABLE += [(c, f, h) for c, f, h in FLAGS if _base(h) is str and f.metadata.get("choices")]


@pytest.mark.parametrize(
    ("command", "field", "hint"),
    REFUSABLE,
    ids=[f"{' '.join(c.path)}{flag_name(f.name)}" for c, f, _ in REFUSABLE],
)
@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_bad_value_of_any_flag_is_one_line_and_exit_2(
    command, field, hint, data, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    value = data.draw(bad_values(field, hint))
    required = [  # positional or required values, valid, so the bad flag is what is refused
        arg
        for cls in command.settings
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        for arg in ([] if f.name == field.name else [flag_name(f.name), "x"])
    ]
    try:
        code = main([*command.path, *required, flag_name(field.name), value])
    except SystemExit as e:  # argparse refuses values it cannot parse itself
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2, (value, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not list(tmp_path.iterdir()), "a refused command wrote something"


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=st.sampled_from([c.path for c in COMMANDS]),
    junk=st.lists(st.text(alphabet="-abz=1", min_size=1, max_size=6), min_size=1, max_size=3),
)
def test_junk_arguments_are_one_line_and_exit_2(path, junk, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        code = main([*path, "--no-such-flag", *junk])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
